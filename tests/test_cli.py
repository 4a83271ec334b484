"""The microgpt command on the numpy backend: training with checkpoints, resuming, stopping on NaN,
sampling and info."""
import re
import subprocess
import sys

import numpy as np
import pytest

from microgpt import checkpoint
from microgpt.cli import main
from microgpt.train import lr_at

from helpers import SMALL_RUN as SMALL



def train(args, capsys):
    code = main(["train", *SMALL, *args])
    return code, capsys.readouterr()


def test_train_prints_a_falling_loss_and_writes_a_checkpoint(tmp_path, corpus, capsys):
    code, out = train(["--data", corpus, "--steps", "60", "--eval-every", "20", "--lr", "1e-2",
                       "--out", str(tmp_path / "run")], capsys)
    assert code == 0
    val = [float(v) for v in re.findall(r"val loss (\d+\.\d+)", out.out)]
    assert len(val) == 4 and val[-1] < val[0] - 1.0, out.out
    assert "sample:" in out.out
    assert checkpoint.read_meta(tmp_path / "run" / "model.ckpt")["step"] == 60


def test_resume_continues_exactly_as_not_stopping(tmp_path, corpus, capsys):
    common = ["--data", corpus, "--eval-every", "10", "--ckpt-every", "7", "--warmup", "5"]
    assert train([*common, "--steps", "30", "--out", str(tmp_path / "straight")], capsys)[0] == 0
    code, out = train([*common, "--steps", "30", "--stop-after", "20", "--out", str(tmp_path / "stopped")], capsys)
    assert code == 0 and "stopped after step 20" in out.out
    code, out = train([*common, "--steps", "30", "--out", str(tmp_path / "stopped"), "--resume"], capsys)
    assert code == 0 and "resumed" in out.out and "at step 20" in out.out
    a = checkpoint.read(tmp_path / "straight" / "model.ckpt")
    b = checkpoint.read(tmp_path / "stopped" / "model.ckpt")
    assert a.step == b.step == 30
    for x, y in ((a.weights, b.weights), (a.m, b.m), (a.v, b.v)):
        np.testing.assert_array_equal(x, y)


def test_resume_without_a_checkpoint_says_so(tmp_path, corpus, capsys):
    assert main(["train", *SMALL, "--data", corpus, "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert capsys.readouterr().err.startswith("microgpt: error: --resume: no checkpoint at")


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    code, out = train(["--data", corpus, "--steps", "50", "--lr", "1e6", "--warmup", "1", "--grad-clip", "1e9",
                       "--ckpt-every", "1", "--eval-every", "100", "--out", str(run)], capsys)
    assert code == 1
    m = re.search(r"step (\d+): the loss is (nan|inf)", out.err)
    assert m, out.err
    kept = checkpoint.read(run / "model.ckpt").step
    assert kept == int(m.group(1)) - 1  # the checkpoint of the last step whose loss was finite
    assert f"the last good checkpoint is {run / 'model.ckpt'} (step {kept})" in out.err


def test_sample_and_info(tmp_path, corpus, capsys):
    train(["--data", corpus, "--steps", "5", "--out", str(tmp_path / "run")], capsys)
    ckpt = str(tmp_path / "run" / "model.ckpt")
    assert main(["sample", ckpt, "--backend", "numpy", "--prompt", "the ", "--max-new-tokens", "12",
                 "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("the ")
    assert main(["info", ckpt]) == 0
    info = capsys.readouterr().out
    assert "k_attn_scores_fwd" in info and "step 5" in info and "d_model=32" in info


def test_python_dash_m_microgpt_help():
    res = subprocess.run([sys.executable, "-m", "microgpt", "train", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--resume" in res.stdout and "--ckpt-every" in res.stdout


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 1.0, 10, 100, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_the_variant_flag_is_the_one_kernel_switch(tmp_path, corpus, capsys):
    code, out = train(["--data", corpus, "--steps", "2", "--variant", "reference", "--out", str(tmp_path / "r")],
                      capsys)
    assert code == 0  # the numpy backend takes either name: it has one set of operations
    assert main(["train", *SMALL, "--variant", "fastest", "--steps", "1", "--out", str(tmp_path / "s")]) == 2
    assert "--variant: invalid choice: 'fastest'" in capsys.readouterr().err
    assert main(["info"]) == 0
    info = capsys.readouterr().out
    assert "variant tc (default)" in info and "variant fast:" in info and "variant reference" in info
