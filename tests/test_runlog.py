"""The run's log, log.jsonl: a line a step with its figures, whole lines after a kill, and a resumed run that goes
on from its checkpoint's step with no gap and no repeated step."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from microgpt import GPT, GPTConfig, checkpoint, runlog
from microgpt.cli import main
from microgpt.runlog import LOG_NAME, LogError, RunLog, StepLog, flops_per_token, read_log
from microgpt.train import lr_at

from helpers import SMALL_RUN as SMALL


def train(tmp_path, corpus, capsys, *args, out="run"):
    code = main(["train", *SMALL, "--data", corpus, "--out", str(tmp_path / out), *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured


def steps_of(records):
    return [r["step"] for r in records]


def test_each_step_is_a_line_with_its_figures(tmp_path, corpus, capsys):
    out = train(tmp_path, corpus, capsys, "--steps", "12", "--eval-every", "5", "--warmup", "4").out
    records = read_log(tmp_path / "run")
    assert steps_of(records) == list(range(13))
    assert set(records[0]) == {"step", "elapsed", "val_loss"}  # the evaluation before the first step
    assert all(set(r) - {"val_loss"} == {"step", "elapsed", "train_loss", "lr", "grad_norm", "tok_s"}
               for r in records[1:])  # no mfu on the CPU
    assert [r["step"] for r in records if "val_loss" in r] == [0, 5, 10, 12]
    for r in records[1:]:
        assert r["lr"] == pytest.approx(lr_at(r["step"] - 1, 3e-3, 4, 12, 0.1), rel=1e-6)
        assert r["grad_norm"] > 0 and r["tok_s"] > 0 and math.isfinite(r["train_loss"])
    assert all(a["elapsed"] <= b["elapsed"] for a, b in zip(records, records[1:]))
    printed = {int(s): (float(t), float(v))
               for s, t, v in re.findall(r"step +(\d+) \| train loss (\S+) \| val loss (\S+)", out)}
    for r in records:
        if r["step"] in printed:
            assert (r["train_loss"], r["val_loss"]) == pytest.approx(printed[r["step"]], abs=6e-5)


def test_log_every_n_steps_and_at_every_evaluation(tmp_path, corpus, capsys):
    train(tmp_path, corpus, capsys, "--steps", "12", "--eval-every", "5", "--log-every", "4")
    assert steps_of(read_log(tmp_path / "run")) == [0, 4, 5, 8, 10, 12]


def test_a_new_run_over_an_old_one_starts_a_new_log(tmp_path, corpus, capsys):
    train(tmp_path, corpus, capsys, "--steps", "6")
    train(tmp_path, corpus, capsys, "--steps", "4", "--overwrite")
    assert steps_of(read_log(tmp_path / "run")) == list(range(5))


def test_resume_goes_on_from_the_checkpoint_as_an_unbroken_run_would(tmp_path, corpus, capsys):
    """The lines a killed run wrote past its last checkpoint (and a torn one) are dropped, and the resumed run's
    losses are the unbroken run's, step for step."""
    common = ["--steps", "20", "--eval-every", "6", "--ckpt-every", "5", "--warmup", "3"]
    train(tmp_path, corpus, capsys, *common, out="straight")
    train(tmp_path, corpus, capsys, *common, "--stop-after", "10", out="stopped")
    log = tmp_path / "stopped" / LOG_NAME
    with open(log, "a") as f:  # as if killed after logging steps 11 and 12, in the middle of 13's line
        f.write('{"step": 11, "elapsed": 1.0, "train_loss": 99.0}\n{"step": 12, "elapsed": 1.1, "train_loss": 99.0}\n'
                '{"step": 13, "ela')
    train(tmp_path, corpus, capsys, *common, "--resume", out="stopped")
    straight, resumed = read_log(tmp_path / "straight"), read_log(tmp_path / "stopped")
    assert steps_of(resumed) == steps_of(straight) == list(range(21))
    for key in ("train_loss", "val_loss", "lr", "grad_norm"):
        assert [r.get(key) for r in resumed] == [r.get(key) for r in straight], key
    assert all(line.endswith(b"}\n") for line in log.read_bytes().splitlines(keepends=True))
    assert resumed[11]["elapsed"] >= resumed[10]["elapsed"]  # the clock carries on


def test_a_killed_trainer_leaves_whole_lines_and_resume_repeats_no_step(tmp_path, corpus):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "microgpt", "train", *SMALL, "--data", corpus, "--steps", "100000",
                             "--ckpt-every", "7", "--eval-every", "1000", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / LOG_NAME).exists() and len(read_lines(out)) > 30):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines = read_lines(out)
    assert len(lines) > 30 and all(json.loads(line)["step"] == i for i, line in enumerate(lines))
    saved = checkpoint.read(out / "model.ckpt").step
    assert saved % 7 == 0 and saved <= len(lines) - 1
    assert main(["train", *SMALL, "--data", corpus, "--steps", str(saved + 5), "--ckpt-every", "7",
                 "--eval-every", "1000", "--out", str(out), "--resume"]) == 0
    assert steps_of(read_log(out)) == list(range(saved + 6))


def read_lines(folder):
    """The whole lines of a log being written (the last one may still be on its way)."""
    return [line for line in (folder / LOG_NAME).read_bytes().splitlines(keepends=True) if line.endswith(b"\n")]


def test_every_checkpoint_is_saved_after_its_steps_lines_reach_the_disk(tmp_path, corpus, capsys, monkeypatch):
    events = []
    sync, save = RunLog.sync, GPT.save
    monkeypatch.setattr(RunLog, "sync", lambda self: (events.append(("sync", self.last["step"])), sync(self)))
    monkeypatch.setattr(GPT, "save", lambda self, *a, **k: (events.append(("save", self.step_count)),
                                                            save(self, *a, **k)))
    train(tmp_path, corpus, capsys, "--steps", "9", "--ckpt-every", "4")
    assert events == [("sync", 4), ("save", 4), ("sync", 8), ("save", 8), ("sync", 9), ("save", 9)]


def test_tok_s_leaves_out_the_time_of_checkpoints_and_evaluations(tmp_path, corpus, capsys, monkeypatch):
    save = GPT.save
    monkeypatch.setattr(GPT, "save", lambda self, *a, **k: (time.sleep(0.5), save(self, *a, **k)))
    train(tmp_path, corpus, capsys, "--steps", "4", "--ckpt-every", "1", "--eval-every", "1")
    records = read_log(tmp_path / "run")
    for before, r in zip(records[1:], records[2:]):
        seconds = r["elapsed"] - before["elapsed"]  # a step, its evaluation and the checkpoint before it
        assert seconds > 0.5 and r["tok_s"] > 3 * 4 * 32 / seconds, (before, r)


def test_a_log_that_cannot_be_written_is_warned_of_once_and_training_goes_on(tmp_path, corpus, capsys, monkeypatch):
    def full(self, record):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(RunLog, "append", full)
    err = train(tmp_path, corpus, capsys, "--steps", "5").err
    assert err.count("microgpt: warning: could not write") == 1 and "No space left on device" in err
    assert checkpoint.read(tmp_path / "run" / "model.ckpt").step == 5


def test_a_log_that_is_a_folder_is_one_line_before_any_step(tmp_path, corpus, capsys):
    (tmp_path / "run" / LOG_NAME).mkdir(parents=True)
    code = main(["train", *SMALL, "--data", corpus, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == f"microgpt: error: --out {tmp_path / 'run'}: {tmp_path / 'run' / LOG_NAME} is a folder; a run " \
        f"keeps a file there"
    assert not (tmp_path / "run" / "model.ckpt").exists()


# ---------------------------------------------------------------------------------------------- the file itself
def test_readers_skip_a_torn_last_line_and_a_resume_cuts_the_log_back(tmp_path):
    path = tmp_path / LOG_NAME
    path.write_bytes(b'{"step": 0, "val_loss": 5.5}\n{"step": 1, "train_loss": 5.4}\n{"step": 2, "train_loss": 5.3}\n'
                     b'{"step": 3, "train_lo')
    assert steps_of(read_log(path)) == steps_of(read_log(tmp_path)) == [0, 1, 2]
    log = RunLog(path)
    log.open(keep_through=1)
    log.append({"step": 2, "train_loss": 1.0})
    log.close()
    assert path.read_bytes() == b'{"step": 0, "val_loss": 5.5}\n{"step": 1, "train_loss": 5.4}\n' \
                                b'{"step": 2, "train_loss": 1.0}\n'
    log.open(keep_through=None)  # a new run
    log.close()
    assert path.read_bytes() == b""


@pytest.mark.parametrize("content, message", [
    (None, "no such run folder or log file"),
    (b"", "holds no log line"),
    (b'{"step": 1, "tra', "holds no log line"),
    (b'not json\n[1, 2]\n{"step": "one"}\n', "holds no log line"),
])
def test_a_log_with_no_line_is_an_error_naming_it(tmp_path, content, message):
    path = tmp_path / LOG_NAME
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(LogError, match=message):
        read_log(path)


def test_a_run_folder_without_a_log_is_an_error_naming_it(tmp_path):
    with pytest.raises(LogError, match=f"{tmp_path}: no {LOG_NAME} in it"):
        read_log(tmp_path)


# ---------------------------------------------------------------------------------------------- MFU
def test_the_model_flops_a_token_are_nanogpts_estimate():
    # nanoGPT's estimate_mfu for GPT-2 124M at T=1024: N = 123.65M (the position embedding left out)
    assert flops_per_token(GPTConfig.preset("gpt2-124m"), 1024) == 6 * 123_653_376 + 12 * 12 * 768 * 1024


def test_the_model_flops_a_token_are_three_passes_of_its_products():
    """Counted by hand: a token's forward products (2 FLOPs a multiply-add; the attention's over all T positions,
    as nanoGPT counts it), three times for the forward and backward, and 6 a parameter outside them."""
    L, NH, C, T, V = 2, 2, 16, 8, 11
    config = GPTConfig(n_layer=L, n_head=NH, d_model=C, block_size=32, vocab_size=V)
    block = 2 * (3 * C * C + C * C + 4 * C * C + 4 * C * C)  # qkv, attn.proj, mlp.fc, mlp.proj
    attention = 2 * T * C + 2 * T * C                          # q . k over T keys, probs @ v
    forward = L * (block + attention) + 2 * C * V              # and the tied lm_head
    outside = L * (3 * C + C + 4 * C + C + 2 * 2 * C) + 2 * C  # biases, layernorms, the final layernorm
    assert flops_per_token(config, T) == 3 * forward + 6 * outside


def test_the_progress_bar_shows_the_mfu_on_the_gpu(monkeypatch):
    assert runlog.progress_postfix(2.41318, 103456.4, 0.41873) == {"loss": "2.413", "tok_s": "103,456",
                                                                    "mfu": "41.9%"}
    assert runlog.progress_postfix(2.41318, 103456.4, None) == {"loss": "2.413", "tok_s": "103,456"}  # the CPU
    model = GPT(GPTConfig(1, 2, 8, 4, 11))
    assert StepLog(None, model, T=4, tokens_per_step=8, every=1).mfu(1000.0) is None
    monkeypatch.setattr(runlog, "peak_flops", lambda model: 1e9)  # a GPU's: the bar's figure is the log's
    watch = StepLog(None, model, T=4, tokens_per_step=8, every=1, world=2)
    assert watch.mfu(1000.0) == pytest.approx(flops_per_token(model.config, 4) * 1000.0 / 2e9)


def test_mfu_is_the_model_flops_per_second_over_the_peak(tmp_path, monkeypatch):
    model = GPT(GPTConfig(1, 2, 8, 4, 11))
    assert runlog.peak_flops(model) is None  # the CPU: no mfu
    monkeypatch.setattr(runlog, "peak_flops", lambda model: 1e9)
    log = RunLog(tmp_path / LOG_NAME)
    log.open(None)
    watch = StepLog(log, model, T=4, tokens_per_step=8, every=1, world=2)
    watch.start(0, 2.0)
    model.backend.last_grad_norm = 0.5
    watch.step(1, 1.5, 1e-3)
    record = read_log(tmp_path)[-1]
    assert record["mfu"] == pytest.approx(flops_per_token(model.config, 4) * record["tok_s"] / 2e9, rel=1e-3)
    assert record["grad_norm"] == 0.5 and os.path.getsize(tmp_path / LOG_NAME) > 0


def test_the_progress_bar_shows_tok_s_and_a_resumed_run_counts_from_its_step(tmp_path, corpus, capsys):
    """tqdm's rate, and so its ETA, counts the steps from `initial` on: a resumed run's first steps are not
    taken for fast ones."""
    bar = [a for a in SMALL if a != "--no-progress"]
    assert main(["train", *bar, "--data", corpus, "--steps", "20", "--stop-after", "12", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["train", *bar, "--data", corpus, "--steps", "20", "--out", str(tmp_path), "--resume"]) == 0
    err = capsys.readouterr().err
    counts = [int(n) for n in re.findall(r"\| *(\d+)/20 \[", err)]
    assert counts[0] == 12 and counts[-1] == 20 and "tok_s=" in err and "mfu=" not in err, err  # no mfu: the CPU
