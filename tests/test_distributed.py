"""Data-parallel training on the CPU: torchrun with two processes over gloo, each with --batch-size b, against
one process with --batch-size 2b: the same batches, so the same losses, and weights equal up to the summation
order; a resumed two-process run equals an uninterrupted one; rank 0 alone writes and speaks."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from microgpt import checkpoint

pytest.importorskip("torch.distributed")

ARGS = ["--backend", "numpy", "--n-layer", "1", "--n-head", "2", "--d-model", "32", "--block-size", "32",
        "--eval-batches", "2", "--no-progress", "--sample-tokens", "10", "--eval-every", "3"]


def run(args, procs=None, timeout=240):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}"] \
        if procs else [sys.executable]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    res = subprocess.run([*launcher, "-m", "microgpt", "train", *ARGS, *args], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def losses(out):
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]


def test_two_processes_train_as_one_with_the_global_batch(tmp_path, corpus):
    two = run(["--data", corpus, "--steps", "6", "--batch-size", "2", "--out", str(tmp_path / "two")], procs=2)
    one = run(["--data", corpus, "--steps", "6", "--batch-size", "4", "--out", str(tmp_path / "one")])
    assert "B=4 (2 x 2)" in two and two.count("training ") == 1  # rank 0 alone speaks
    np.testing.assert_allclose(losses(two), losses(one), rtol=1e-4)
    a, b = checkpoint.read(tmp_path / "two" / "model.ckpt"), checkpoint.read(tmp_path / "one" / "model.ckpt")
    assert a.step == b.step == 6 and a.extra["train_sampler"]["B"] == 4
    # Adam divides each gradient by its own scale: where a gradient is near zero the summation order shows
    # at the size of a step (lr), so the weights agree as a whole and to a small fraction of lr each
    diff = np.abs(a.weights.astype(np.float64) - b.weights)
    assert np.linalg.norm(diff) / np.linalg.norm(b.weights) < 1e-5 and diff.max() < 1e-5, diff.max()


def test_a_resumed_two_process_run_equals_an_uninterrupted_one(tmp_path, corpus):
    base = ["--data", corpus, "--batch-size", "2"]
    run([*base, "--steps", "6", "--out", str(tmp_path / "whole")], procs=2)
    run([*base, "--steps", "6", "--stop-after", "3", "--out", str(tmp_path / "parts")], procs=2)
    run([*base, "--steps", "6", "--resume", "--out", str(tmp_path / "parts")], procs=2)
    a, b = checkpoint.read(tmp_path / "whole" / "model.ckpt"), checkpoint.read(tmp_path / "parts" / "model.ckpt")
    assert a.step == b.step == 6
    for field in ("weights", "m", "v"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_a_rank_that_fails_stops_the_others_without_a_hang(tmp_path, corpus):
    """Rank 0 cannot take the run folder (another trainer holds it): it says so in one line and exits; rank 1,
    already waiting at the first collective, stops in one line too (or torchrun ends it) -- no hang, and no
    Python traceback of ours."""
    from microgpt.runs import RunFolder
    held = RunFolder(tmp_path / "busy")
    held.open()
    try:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
        res = subprocess.run([*launcher, "-m", "microgpt", "train", *ARGS, "--data", corpus, "--steps", "3",
                              "--batch-size", "2", "--out", str(tmp_path / "busy")], capture_output=True, text=True,
                             timeout=120, env=env)
    finally:
        held.close()
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "microgpt: error: --out" in out and "is in use by another trainer" in out, out
    assert "[rank1]: Traceback" not in out and "[rank0]: Traceback" not in out, out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_ctrl_c_on_one_rank_stops_every_rank_at_the_same_step_and_saves(tmp_path, corpus, rank):
    """SIGINT reaches one rank during step 5's gradient all-reduce, after the step's agreement: every rank
    finishes step 6, rank 0 saves it, and all exit as interrupted."""
    script = tmp_path / "interrupt.py"
    script.write_text(f"""
import os, signal, sys
from microgpt import distributed
from microgpt.cli import main
average = distributed.DataParallel.average_gradients
calls = [0]
def interrupting(self, model):
    average(self, model)
    calls[0] += 1
    if self.rank == {rank} and calls[0] == 5:
        os.kill(os.getpid(), signal.SIGINT)
distributed.DataParallel.average_gradients = interrupting
sys.exit(main(sys.argv[1:]))
""")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(script), "train", *ARGS, "--data", corpus, "--steps", "20", "--batch-size", "2",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120, env=env)
    out = res.stdout + res.stderr
    assert "interrupted after step 6" in out, out
    assert checkpoint.read(tmp_path / "run" / "model.ckpt").step == 6
    assert "another process of the run stopped" not in out, out


def test_the_scaling_benchmark_times_one_process_and_two():
    """tools/bench_distributed.py on CPUs (gloo): torchrun of 1 and of 2 processes, microgpt and PyTorch DDP."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    tool = os.path.join(os.path.dirname(__file__), "..", "tools", "bench_distributed.py")
    res = subprocess.run([sys.executable, tool, "--backend", "numpy", "--quick", "--nproc", "2", "--json"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    one, two = out["rows"]
    assert (one["world"], two["world"]) == (1, 2)
    assert two["tokens_per_step"] == 2 * one["tokens_per_step"] == 2 * out["B_per_process"] * out["T"]
    for r in (one, two):
        assert r["losses_finite"] and r["microgpt_step_ms"] > 0 and r["torch_step_ms"] > 0
    assert two["microgpt_scaling"] == pytest.approx(two["microgpt_tokens_per_s"] / one["microgpt_tokens_per_s"])
    assert two["torch_scaling"] == pytest.approx(two["torch_tokens_per_s"] / one["torch_tokens_per_s"])
