"""The command's bad days: every user error is one line, `microgpt: error: ...`, naming what was typed, with
exit status 2 and before the first step; a folder in use, a Ctrl-C and a full disk lose nothing."""
import argparse
import errno
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from microgpt import GPT, GPTConfig, checkpoint
from microgpt.cli import main
from microgpt.train import config_from_args
from microgpt.runs import RunFolder

from helpers import GPU_REASON, SMALL_RUN as SMALL, one_line_error



def files_of(tmp_path, name):
    return [p.name for p in (tmp_path / name).iterdir()] if (tmp_path / name).exists() else []


# (extra arguments, what the one line says); {corpus} and {tmp} are filled in
TRAIN_ERRORS = {
    "missing data": (["--data", "{tmp}/nope.txt"], "--data {tmp}/nope.txt: no such file"),
    "data folder": (["--data", "{tmp}"], "--data {tmp} is a folder"),
    "empty data": (["--data", "{tmp}/empty.txt"], "--data {tmp}/empty.txt holds no text"),
    "short data": (["--data", "{tmp}/short.txt"], "are too few"),
    "batch size 0": (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got '0'"),
    "negative lr": (["--lr", "-1"], "argument --lr: must be a finite number >= 0, got '-1'"),
    "infinite lr": (["--lr", "inf"], "argument --lr: must be a finite number >= 0, got 'inf'"),
    "negative weight decay": (["--weight-decay", "-0.1"], "argument --weight-decay: must be a finite number >= 0"),
    "grad clip 0": (["--grad-clip", "0"], "argument --grad-clip: must be a finite number > 0, got '0'"),
    "n_head not dividing": (["--n-head", "5"], "--n-head 5 --d-model 32 --block-size 32: GPTConfig.n_head=5 must "
                                               "divide d_model=32"),
    "block size 0": (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
    "steps 0": (["--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    "eval every 0": (["--eval-every", "0"], "argument --eval-every: must be an integer >= 1, got '0'"),
    "ckpt every 0": (["--ckpt-every", "0"], "argument --ckpt-every: must be an integer >= 1, got '0'"),
    "eval batches 0": (["--eval-batches", "0"], "argument --eval-batches: must be an integer >= 1, got '0'"),
    "seq len 0": (["--seq-len", "0"], "argument --seq-len: must be an integer >= 1, got '0'"),
    "seq len above block": (["--seq-len", "33"], "--seq-len 33 is above the model's block_size 32"),
    "min lr ratio -1": (["--min-lr-ratio", "-1"], "argument --min-lr-ratio: must be a number in [0, 1], got '-1'"),
    "val fraction 0": (["--val-fraction", "0"], "argument --val-fraction: must be a number in (0, 1), got '0'"),
    "val fraction 1": (["--val-fraction", "1"], "argument --val-fraction: must be a number in (0, 1), got '1'"),
    "negative seed": (["--seed", "-1"], "argument --seed: must be an integer in [0, 2**63), got '-1'"),
    "not a number": (["--lr", "fast"], "argument --lr: expected a number, got 'fast'"),
    "preset of another vocabulary": (["--preset", "andrea-120m"], "--preset andrea-120m: vocab_size"),
    "out is a file": (["--out", "{corpus}"], "--out {corpus} is a file, not a folder"),
    "out under a file": (["--out", "{corpus}/run"], "--out {corpus}/run cannot be written"),
}


@pytest.mark.parametrize("case", list(TRAIN_ERRORS))
def test_a_bad_train_flag_is_one_line_before_any_step(tmp_path, corpus, capsys, case):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("tiny")
    args, message = TRAIN_ERRORS[case]
    fill = dict(corpus=corpus, tmp=str(tmp_path))
    out = ["--out", str(tmp_path / "run")] if "--out" not in args else []
    code = main(["train", *SMALL, "--data", corpus, *out, *(a.format(**fill) for a in args)])
    line = one_line_error(capsys, code)
    assert message.format(**fill) in line, line
    assert "model.ckpt" not in files_of(tmp_path, "run")  # nothing trained


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is here: --backend cuda works")
def test_backend_cuda_without_a_gpu_is_one_line(tmp_path, corpus, capsys):
    line = one_line_error(capsys, main(["train", *SMALL, "--backend", "cuda", "--data", corpus,
                                        "--out", str(tmp_path / "run")]))
    assert "--backend cuda: no usable CUDA GPU here" in line and "--backend numpy" in line


def trained_run(tmp_path, corpus, capsys, steps=3):
    assert main(["train", *SMALL, "--data", corpus, "--steps", str(steps), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    return tmp_path / "run" / "model.ckpt"


def test_resume_refuses_flags_that_would_change_the_run(tmp_path, corpus, capsys):
    ckpt = trained_run(tmp_path, corpus, capsys)
    base = ["train", "--backend", "numpy", "--no-progress", "--data", corpus, "--steps", "5", "--resume",
            "--out", str(tmp_path / "run")]
    line = one_line_error(capsys, main([*base, "--d-model", "64", "--n-layer", "1"]))
    assert "--d-model 64 (the checkpoint's is 32)" in line and "--n-layer" not in line  # the same value is fine
    line = one_line_error(capsys, main([*base, "--seq-len", "16"]))
    assert "--seq-len 16 (the checkpoint's run uses 32)" in line
    line = one_line_error(capsys, main([*base, "--batch-size", "8"]))
    assert "--batch-size 8 (the checkpoint's run uses 4)" in line
    other = tmp_path / "other.txt"
    other.write_text("a different text, of another length. " * 300)
    line = one_line_error(capsys, main([*base[:4], "--data", str(other), *base[6:]]))
    assert "--resume: the run's batches cannot continue on this data" in line
    assert checkpoint.read(ckpt).step == 3
    assert main([*base, "--n-head", "2"]) == 0 and checkpoint.read(ckpt).step == 5


def test_a_broken_checkpoint_is_one_line_for_resume_sample_and_info(tmp_path, corpus, capsys):
    ckpt = trained_run(tmp_path, corpus, capsys)
    ckpt.write_bytes(ckpt.read_bytes()[:-10])  # truncated
    line = one_line_error(capsys, main(["train", *SMALL, "--data", corpus, "--resume", "--out", str(ckpt.parent)]))
    assert "--resume: checkpoint" in line and "is truncated" in line
    assert "is truncated" in one_line_error(capsys, main(["sample", str(ckpt), "--backend", "numpy"]))
    assert "is truncated" in one_line_error(capsys, main(["info", str(ckpt)]))  # info reads it whole
    line = one_line_error(capsys, main(["sample", str(tmp_path / "nope.ckpt")]))
    assert "nope.ckpt' does not exist (no such file)" in line


@pytest.mark.parametrize("args, message", [
    (["--top-k", "0"], "argument --top-k: must be an integer >= 1, got '0'"),
    (["--top-k", "300"], "--top-k 300 is above the model's vocab_size 257"),
    (["--temperature", "-1"], "argument --temperature: must be a finite number >= 0, got '-1'"),
    (["--max-new-tokens", "-5"], "argument --max-new-tokens: must be an integer >= 0, got '-5'"),
    (["--top-p", "0"], "argument --top-p: must be a number in (0, 1], got '0'"),
    (["--top-p", "1.5"], "argument --top-p: must be a number in (0, 1], got '1.5'"),
    (["--num-samples", "0"], "argument --num-samples: must be an integer >= 1, got '0'"),
])
def test_a_bad_sample_flag_is_one_line(tmp_path, corpus, capsys, args, message):
    ckpt = trained_run(tmp_path, corpus, capsys)
    assert message in one_line_error(capsys, main(["sample", str(ckpt), "--backend", "numpy", *args]))


def test_through_the_real_entry_point_no_traceback_and_a_non_utf8_prompt(tmp_path, corpus, capsys):
    ckpt = trained_run(tmp_path, corpus, capsys)
    for argv in ([b"sample", str(ckpt).encode(), b"--backend", b"numpy", b"--prompt", b"caf\xe9"],
                 [b"train", b"--batch-size", b"0"]):
        res = subprocess.run([sys.executable, "-m", "microgpt", *argv], capture_output=True, timeout=120)
        err = res.stderr.decode("utf-8", "replace")
        assert res.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    res = subprocess.run([sys.executable, "-m", "microgpt", "sample", str(ckpt), "--backend", "numpy", "--prompt",
                          b"caf\xe9"], capture_output=True, timeout=120)
    assert b"microgpt: error: --prompt b'caf\\xe9' is not valid UTF-8" in res.stderr, res.stderr


# ---------------------------------------------------------------------------------------------- the run folder
def test_a_second_trainer_on_the_same_out_is_refused_naming_the_first(tmp_path, corpus, capsys):
    with RunFolder(tmp_path / "run"):
        line = one_line_error(capsys, main(["train", *SMALL, "--data", corpus, "--out", str(tmp_path / "run")]))
        assert f"--out {tmp_path / 'run'} is in use by another trainer (pid {os.getpid()} on" in line
    assert main(["train", *SMALL, "--data", corpus, "--steps", "2", "--out", str(tmp_path / "run")]) == 0


def test_a_killed_trainer_does_not_leave_the_folder_locked(tmp_path, corpus, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from microgpt.runs import RunFolder; "
                               "RunFolder(sys.argv[1]).open(); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert "is in use" in one_line_error(capsys, main(["train", *SMALL, "--data", corpus,
                                                       "--out", str(tmp_path / "run")]))
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert main(["train", *SMALL, "--data", corpus, "--steps", "2", "--out", str(tmp_path / "run")]) == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_refused_before_training(tmp_path, corpus, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    line = one_line_error(capsys, main(["train", *SMALL, "--data", corpus, "--out", str(ro / "run")]))
    assert f"--out {ro / 'run'} cannot be written" in line


def test_ctrl_c_finishes_the_step_saves_and_exits_130(tmp_path, corpus):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "microgpt", "train", *SMALL, "--data", corpus, "--steps", "100000",
                             "--eval-every", "1", "--ckpt-every", "100000", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step     2 |"):  # training is under way
            break
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    step = int(rest.split("interrupted after step ")[1].split(":")[0])
    assert f"saved {out / 'model.ckpt'}; continue with --resume" in rest
    assert step >= 2 and checkpoint.read(out / "model.ckpt").step == step  # the steps since the last save kept


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_checkpoint(tmp_path, corpus, capsys, monkeypatch):
    writes = []

    def fills_up(*args):
        writes.append(1)
        if len(writes) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(*args)
    original = checkpoint._fs.write_vectors
    monkeypatch.setattr(checkpoint._fs, "write_vectors", fills_up)
    code = main(["train", *SMALL, "--data", corpus, "--steps", "10", "--ckpt-every", "2",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0] == (f"microgpt: error: could not write the checkpoint at step 4: No space left on device; "
                      f"{tmp_path / 'run' / 'model.ckpt'} (step 2) is intact")
    assert checkpoint.read(tmp_path / "run" / "model.ckpt").step == 2
    assert sorted(os.listdir(tmp_path / "run")) == [".lock", "log.jsonl", "model.ckpt", "model.ckpt.json"]


# ---------------------------------------------------------------------------------------------- the API
def test_each_size_flag_replaces_one_field_of_the_default_it_starts_from():
    flags = dict(preset=None, n_layer=None, n_head=None, d_model=None, block_size=None)
    cpu = config_from_args(argparse.Namespace(**flags | {"d_model": 32}), "numpy", 257)
    assert (cpu.n_layer, cpu.n_head, cpu.d_model, cpu.block_size) == (2, 4, 32, 64)  # CPU defaults kept
    gpu = config_from_args(argparse.Namespace(**flags | {"n_layer": 2}), "cuda", 257)
    assert gpu == GPTConfig(n_layer=2, n_head=12, d_model=384, block_size=1024, vocab_size=257)


@pytest.mark.parametrize("bad", [dict(lr=float("inf")), dict(lr=float("nan")), dict(lr=1e-3, eps=float("inf")),
                                 dict(lr=1e-3, weight_decay=float("nan")), dict(lr=1e-3, grad_clip=float("inf"))])
def test_step_refuses_numbers_that_would_turn_every_weight_into_nan(bad):
    model = GPT(GPTConfig(1, 2, 8, 4, 11))
    before = model.state_dict()
    with pytest.raises(ValueError, match="must be (finite|a finite number)"):
        model.step(**bad)
    assert model.step_count == 0 and all((before[k] == v).all() for k, v in model.state_dict().items())


def test_generate_takes_a_one_dimensional_list_as_it_takes_an_array():
    model = GPT(GPTConfig(1, 2, 8, 4, 11))
    a = model.generate(np.array([1, 2, 3]), 4, temperature=0)
    assert (model.generate([1, 2, 3], 4, temperature=0) == a).all() and a.shape == (1, 7)
    with pytest.raises(TypeError, match="idx must be an integer array"):
        model.generate([[1, 2], [3]], 2)
