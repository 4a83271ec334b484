"""A newcomer's fault test: nothing lost, nothing cryptic. A run is never replaced without a word; SIGTERM and
SIGHUP save as Ctrl-C does; bad memory sizes, run folders, token caches, Hugging Face configs, sidecars, data
that is not text, non-finite weights, pipes and terminals each get one line and exit 2, never a traceback."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from microgpt import GPT, GPTConfig, checkpoint
from microgpt.cli import main
from microgpt import kernels
from microgpt.kernels import runtime

from helpers import GPU_REASON, SMALL_RUN as SMALL, one_line_error

TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=257)


def train(tmp_path, corpus, *extra, out="run", steps=3):
    return main(["train", *SMALL, "--data", corpus, "--steps", str(steps), "--out", str(tmp_path / out), *extra])


def cli(*args, **kw):
    """The real entry point in a subprocess: what a user's shell sees."""
    return subprocess.run([sys.executable, "-m", "microgpt", *args], capture_output=True, timeout=300, **kw)


# ---------------------------------------------------------------------------------------------- a run is kept
def test_train_into_a_run_refuses_before_touching_it_and_overwrite_replaces_it(tmp_path, corpus, capsys):
    assert train(tmp_path, corpus) == 0
    ckpt = tmp_path / "run" / "model.ckpt"
    before = (ckpt.read_bytes(), (tmp_path / "run" / "model.ckpt.json").read_bytes())
    capsys.readouterr()
    line = one_line_error(capsys, train(tmp_path, corpus, steps=5))
    assert f"--out {tmp_path / 'run'} already holds a run" in line and "--resume" in line and "--overwrite" in line
    assert (ckpt.read_bytes(), (tmp_path / "run" / "model.ckpt.json").read_bytes()) == before
    line = one_line_error(capsys, train(tmp_path, corpus, "--resume", "--overwrite", steps=5))
    assert "--resume" in line and "--overwrite" in line and ckpt.read_bytes() == before[0]
    assert train(tmp_path, corpus, "--overwrite", steps=2) == 0 and checkpoint.read(ckpt).step == 2


def test_the_default_out_is_refused_the_second_time(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["train", *SMALL, "--data", corpus, "--steps", "2"]
    assert main(base) == 0
    capsys.readouterr()
    assert "--out runs/microgpt already holds a run" in one_line_error(capsys, main(base))
    assert checkpoint.read(tmp_path / "runs" / "microgpt" / "model.ckpt").step == 2


@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_and_sighup_finish_the_step_save_and_exit_128_plus_the_signal(tmp_path, corpus, signame, code):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "microgpt", "train", *SMALL, "--data", corpus, "--steps",
                             "100000", "--eval-every", "1", "--ckpt-every", "100000", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step     2 |"):
            break
    proc.send_signal(getattr(signal, signame))
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err and f"interrupted ({signame})" in err
    step = int(rest.split("interrupted after step ")[1].split(":")[0])
    assert f"saved {out / 'model.ckpt'}; continue with --resume" in rest
    assert step >= 2 and checkpoint.read(out / "model.ckpt").step == step


# ---------------------------------------------------------------------------------------------- one line each
@pytest.mark.parametrize("flags, named", [
    (["--batch-size", "100000000"], "--batch-size 100000000"),
    (["--block-size", "4096000", "--seq-len", "4096000"], "--block-size 4096000"),
    (["--d-model", "2000000", "--n-head", "2"], "--d-model 2000000"),
])
def test_sizes_too_large_for_memory_are_refused_before_anything_is_allocated(tmp_path, corpus, capsys, flags,
                                                                             named):
    line = one_line_error(capsys, train(tmp_path, corpus, *flags))
    assert named in line and "GiB is free on this machine" in line and "needs about" in line
    assert not (tmp_path / "run").exists()


def test_eval_batches_too_many_for_memory_are_refused_before_any_is_drawn(tmp_path, corpus, capsys):
    line = one_line_error(capsys, train(tmp_path, corpus, "--eval-batches", "1000000000"))
    assert "--eval-batches 1000000000" in line and "GiB is free on this machine" in line


@pytest.mark.parametrize("argv", [["sample", "{ckpt}", "--backend", "numpy", "--num-samples", "1000000000"],
                                  ["eval", "{ckpt}", "--data", "{corpus}", "--backend", "numpy", "--batch-size",
                                   "1000000000"]])
def test_sample_and_eval_batches_too_large_for_memory_are_one_line(tmp_path, corpus, capsys, argv):
    assert train(tmp_path, corpus) == 0
    capsys.readouterr()
    fill = dict(ckpt=str(tmp_path / "run" / "model.ckpt"), corpus=corpus)
    line = one_line_error(capsys, main([a.format(**fill) for a in argv]))
    assert f"{argv[-2]} 1000000000" in line and "GiB is free on this machine" in line


@pytest.mark.parametrize("where", ["host", "device"])
def test_running_out_of_memory_after_the_estimate_is_one_line(tmp_path, corpus, capsys, monkeypatch, where):
    class DeviceMemoryError(Exception):  # as pycuda._driver.MemoryError: not a subclass of MemoryError
        pass
    DeviceMemoryError.__name__, DeviceMemoryError.__module__ = "MemoryError", "pycuda._driver"
    error = MemoryError() if where == "host" else DeviceMemoryError("cuMemAlloc failed: out of memory")

    def allocate(*a, **k):
        raise error
    monkeypatch.setattr(GPT, "__init__", allocate)
    line = one_line_error(capsys, train(tmp_path, corpus))
    assert line.startswith("microgpt: error: out of memory") and "--batch-size" in line


@pytest.mark.parametrize("what", ["model.ckpt", ".lock", "model.ckpt.json"])
def test_an_out_whose_run_files_are_folders_is_refused(tmp_path, corpus, capsys, what):
    (tmp_path / "run" / what).mkdir(parents=True)
    line = one_line_error(capsys, train(tmp_path, corpus, "--overwrite"))
    assert f"{tmp_path / 'run' / what} is a folder" in line


@pytest.mark.parametrize("damage", ["sidecar null", "sidecar a list", "count a string", "ids past the vocabulary",
                                    "tokens cut short"])
def test_a_damaged_token_cache_is_made_again(tmp_path, corpus, capsys, damage):
    assert train(tmp_path, corpus, out="a", steps=1) == 0
    tokens = next(p for p in (tmp_path).iterdir() if p.name.endswith(".tokens"))
    sidecar = tokens.with_name(tokens.name + ".json")
    meta = json.loads(sidecar.read_text())
    if damage == "sidecar null":
        sidecar.write_text("null")
    elif damage == "sidecar a list":
        sidecar.write_text("[1, 2]")
    elif damage == "count a string":
        sidecar.write_text(json.dumps(meta | {"count": str(meta["count"])}))
    elif damage == "ids past the vocabulary":
        tokens.write_bytes(np.full(meta["count"], 60000, np.uint16).tobytes())
    else:
        tokens.write_bytes(tokens.read_bytes()[:100])
    capsys.readouterr()
    assert train(tmp_path, corpus, out="b", steps=2) == 0, capsys.readouterr().err
    assert checkpoint.read(tmp_path / "b" / "model.ckpt").step == 2


def hf_folder(tmp_path, config_text):
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_bytes(config_text if isinstance(config_text, bytes) else config_text.encode())
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    return d


GOOD_HF = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 8, "vocab_size": 257}


@pytest.mark.parametrize("config_text, message", [
    ("[1, 2]", "expected a JSON object, got list"),
    ("null", "expected a JSON object, got NoneType"),
    ('"gpt2"', "expected a JSON object, got str"),
    ("{", "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    (json.dumps(GOOD_HF | {"n_embd": None}), "n_embd must be an integer, got None"),
    (json.dumps(GOOD_HF | {"n_embd": "16"}), "n_embd must be an integer, got '16'"),
    (json.dumps(GOOD_HF | {"n_layer": 1.5}), "n_layer must be an integer, got 1.5"),
    (json.dumps(GOOD_HF | {"vocab_size": True}), "vocab_size must be an integer, got True"),
    (json.dumps(GOOD_HF | {"n_inner": "64"}), "n_inner must be null or 4 * n_embd"),
    (json.dumps({k: v for k, v in GOOD_HF.items() if k != "n_head"}), "n_head must be an integer, got None"),
])
def test_convert_from_a_malformed_hugging_face_config_is_one_line(tmp_path, capsys, config_text, message):
    src = hf_folder(tmp_path, config_text)
    line = one_line_error(capsys, main(["convert", str(src), str(tmp_path / "out.ckpt")]))
    assert message in line and "config.json" in line


def test_sidecar_fields_of_the_wrong_type_are_one_line(tmp_path, corpus, capsys):
    """A version-2 sidecar (no checksum: editable) with extra fields of the wrong type."""
    assert train(tmp_path, corpus) == 0
    capsys.readouterr()
    side = tmp_path / "run" / "model.ckpt.json"
    meta = json.loads(side.read_text())
    legacy = {k: v for k, v in meta.items() if k != "checksum"} | {"version": 2}
    for extra, cmd in [({"T": "32"}, "train"), ({"T": 0}, "train"), ({"tokenizer": "tok.json"}, "sample"),
                       ({"train_sampler": [1]}, "train"), ({"train_sampler": {"B": "4"}}, "train")]:
        side.write_text(json.dumps(legacy | {"extra": meta["extra"] | extra}))
        argv = ["train", *SMALL, "--data", corpus, "--steps", "5", "--resume", "--out", str(tmp_path / "run")] \
            if cmd == "train" else ["sample", str(tmp_path / "run" / "model.ckpt"), "--backend", "numpy"]
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and err.startswith("microgpt: error: "), (extra, err)


def test_an_edited_config_is_refused_by_resume_sample_and_info(tmp_path, corpus, capsys):
    assert train(tmp_path, corpus) == 0
    capsys.readouterr()
    side = tmp_path / "run" / "model.ckpt.json"
    meta = json.loads(side.read_text())
    side.write_text(json.dumps(meta | {"config": meta["config"] | {"n_head": 1}}))  # same n_params
    ckpt = str(tmp_path / "run" / "model.ckpt")
    for argv in (["train", *SMALL, "--n-head", "1", "--data", corpus, "--steps", "5", "--resume", "--out",
                  str(tmp_path / "run")], ["sample", ckpt, "--backend", "numpy"], ["info", ckpt]):
        assert "does not match its checksum" in one_line_error(capsys, main(argv))


@pytest.mark.parametrize("data, offset", [(bytes(np.random.default_rng(0).integers(128, 256, 4000, np.uint8)), 0),
                                          ("plain text, then UTF-16".encode("utf-16"), 0),
                                          (b"ok so far " * 100 + b"\xc0\x80", 1000)])
def test_data_that_is_not_utf8_is_refused_naming_the_offset(tmp_path, corpus, capsys, data, offset):
    (tmp_path / "bad.txt").write_bytes(data)
    line = one_line_error(capsys, main(["train", *SMALL, "--data", str(tmp_path / "bad.txt"),
                                        "--out", str(tmp_path / "run")]))
    assert f"--data {tmp_path / 'bad.txt'} is not UTF-8 text" in line and f"at offset {offset}" in line
    assert not (tmp_path / "run" / "model.ckpt").exists()
    line = one_line_error(capsys, main(["tokenizer", "train", "--data", str(tmp_path / "bad.txt"),
                                        "--out", str(tmp_path / "t.json")]))
    assert f"at offset {offset}" in line


# ---------------------------------------------------------------------------------------------- non-finite
def nan_checkpoint(path):
    """A checkpoint whose sidecar and binary agree, holding a NaN weight: what a faulty writer could leave."""
    GPT(TINY).save(path)
    data = bytearray(path.read_bytes())
    data[8:12] = np.float32(np.nan).tobytes()
    path.write_bytes(bytes(data))
    side = path.with_name(path.name + ".json")
    meta = json.loads(side.read_text())
    meta["sha256"] = __import__("hashlib").sha256(bytes(data)).hexdigest()
    meta["checksum"] = checkpoint.checksum(meta)
    side.write_text(json.dumps(meta))


@pytest.mark.parametrize("argv", [["sample", "{ckpt}", "--backend", "numpy"], ["info", "{ckpt}"],
                                  ["convert", "{ckpt}", "{tmp}/hf"]])
def test_a_checkpoint_holding_nan_is_refused_by_every_command(tmp_path, capsys, argv):
    nan_checkpoint(tmp_path / "nan.ckpt")
    fill = dict(ckpt=str(tmp_path / "nan.ckpt"), tmp=str(tmp_path))
    line = one_line_error(capsys, main([a.format(**fill) for a in argv]))
    assert "weights hold non-finite values (NaN or inf), the first in wte" in line


def test_convert_refuses_hugging_face_weights_holding_inf(tmp_path, capsys):
    pytest.importorskip("safetensors")
    GPT(TINY).save_hf(tmp_path / "hf")
    from safetensors.numpy import load_file, save_file
    tensors = load_file(tmp_path / "hf" / "model.safetensors")
    tensors["transformer.h.0.mlp.c_fc.weight"][1, 2] = np.inf
    save_file(tensors, tmp_path / "hf" / "model.safetensors")
    line = one_line_error(capsys, main(["convert", str(tmp_path / "hf"), str(tmp_path / "x.ckpt")]))
    assert "h.0.mlp.c_fc.weight holds non-finite values" in line and not (tmp_path / "x.ckpt").exists()


def test_weights_that_turn_non_finite_stop_the_run_keeping_the_last_finite_checkpoint(tmp_path, corpus, capsys,
                                                                                      monkeypatch):
    real_step = GPT.step

    def step_that_blows_up(self, *a, **k):  # as an inf gradient would: the weights NaN after a finite loss
        real_step(self, *a, **k)
        if self.step_count == 6:  # saved right after (--ckpt-every 2), before any loss sees it
            w = self.backend.pull("params").copy()
            w[7] = np.nan
            self.backend.push("params", w)
    monkeypatch.setattr(GPT, "step", step_that_blows_up)
    code = train(tmp_path, corpus, "--ckpt-every", "2", "--eval-every", "1000", steps=10)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "step 6: the weights are no longer finite" in err and "the last good checkpoint is" in err
    saved = checkpoint.read(tmp_path / "run" / "model.ckpt")
    assert saved.step == 4 and np.isfinite(saved.weights).all()


def test_a_loss_that_turns_nan_keeps_the_last_checkpoint_and_warns_nothing(tmp_path, corpus):
    res = cli("train", *SMALL, "--data", corpus, "--steps", "50", "--lr", "1e30", "--warmup", "0",
              "--ckpt-every", "1", "--out", str(tmp_path / "run"), text=True)
    assert res.returncode == 1 and "Traceback" not in res.stderr and "Warning" not in res.stderr, res.stderr
    assert "stopping (the last good checkpoint is" in res.stderr
    assert np.isfinite(checkpoint.read(tmp_path / "run" / "model.ckpt").weights).all()


# ---------------------------------------------------------------------------------------------- pipes, terminals
@pytest.fixture
def small_ckpt(tmp_path):
    GPT(TINY, seed=3).save(tmp_path / "m.ckpt")
    return str(tmp_path / "m.ckpt")


def test_sample_into_a_pipe_that_closes_ends_quietly(small_ckpt):
    proc = subprocess.Popen([sys.executable, "-m", "microgpt", "sample", small_ckpt, "--backend", "numpy",
                             "--max-new-tokens", "2000", "--num-samples", "64"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # as head does once it has its lines; the 128 KB of samples outgrow the pipe's buffer
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGPIPE and "Traceback" not in err and "Broken" not in err, err


def test_a_terminal_that_is_not_utf8_gets_text_not_a_traceback(small_ckpt):
    res = cli("sample", small_ckpt, "--backend", "numpy", "--prompt", "café ☃", "--max-new-tokens", "20",
              env=dict(os.environ, PYTHONIOENCODING="ascii"))
    assert res.returncode == 0 and b"Traceback" not in res.stderr, res.stderr
    assert res.stdout.startswith(b"caf\\xe9 \\u2603")


def test_a_sample_from_no_prompt_does_not_print_the_end_of_text_token(small_ckpt, capsys):
    for n in ("1", "3"):
        assert main(["sample", small_ckpt, "--backend", "numpy", "--max-new-tokens", "5", "--num-samples", n,
                     "--temperature", "0"]) == 0
        out = capsys.readouterr().out
        assert "<|endoftext|>" not in out.split("\n", 1)[0 if n == "1" else 1][:13], out


def test_resume_with_other_steps_says_the_schedule_changes(tmp_path, corpus, capsys):
    assert train(tmp_path, corpus) == 0
    capsys.readouterr()
    assert train(tmp_path, corpus, "--resume", steps=6) == 0
    assert "the run was started for 3 steps; with --steps 6 the learning rate follows the schedule to step 6" \
        in capsys.readouterr().err
    assert train(tmp_path, corpus, "--resume", steps=6) == 0 and "note" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- no GPU
@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is here")
def test_the_cuda_backend_without_pycuda_or_a_gpu_says_what_is_missing_and_how_to_install():
    with pytest.raises(runtime.NoDevice, match=r"the cuda backend cannot start: .*(pip install 'microgpt\[cuda\]'|"
                                               r"nvidia-smi|nvcc)"):
        GPT(TINY, backend="cuda")


def test_a_driver_without_a_device_is_named(monkeypatch):
    class DriverError(Exception):
        pass

    def no_device():
        raise DriverError("cuInit failed: no CUDA-capable device is detected")
    monkeypatch.setattr(kernels, "engine", runtime.engine.__wrapped__)  # made anew, past the one cached
    monkeypatch.setattr(runtime, "_Engine", no_device)
    with pytest.raises(runtime.NoDevice, match="no usable CUDA GPU \\(cuInit failed: no CUDA-capable device is "
                                               "detected\\); check the GPU with nvidia-smi"):
        GPT(TINY, backend="cuda")
