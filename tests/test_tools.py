"""The tools in tools/: each answers --help anywhere, and without a GPU stops with a one-line reason."""
import json
import os
import subprocess
import sys

import pytest

from conftest import GPU_REASON

TOOLS = os.path.join(os.path.dirname(__file__), "..", "tools")
GPU_TOOLS = ["profile_kernels.py", "bench_attention.py", "bench_train.py", "ncu_kernel.py", "sanitize_kernels.py"]


def run(script, *args, timeout=300):
    return subprocess.run([sys.executable, os.path.join(TOOLS, script), *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("script", GPU_TOOLS)
def test_help(script):
    res = run(script, "--help")
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is here: the tools run instead of stopping")
@pytest.mark.parametrize("script,args", [("profile_kernels.py", ["--quick"]), ("bench_attention.py", ["--quick"]),
                                         ("bench_train.py", ["--quick"]), ("ncu_kernel.py", ["k_gelu_fwd"])])
def test_without_a_gpu_one_line_and_no_traceback(script, args):
    res = run(script, *args)
    assert res.returncode == 2
    out = (res.stdout + res.stderr).strip()
    assert len(out.splitlines()) == 1 and "Traceback" not in out and "no CUDA GPU" in out, out


# ---------------------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
def test_profile_kernels_quick(tmp_path):
    out, png = tmp_path / "p.json", tmp_path / "roofline.png"
    res = run("profile_kernels.py", "--quick", "--json", str(out), "--plot", str(png))
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(out.read_text())
    names = {row["kernel"] for row in r["rows"]}
    assert {"k_attn_scores_fwd", "attn_scores_fwd_fast", "k_adamw", "matmul_fwd_fast (qkv)"} <= names
    assert r["copy_gbs"] > 100 and r["matmul_tflops"] > 1
    for row in r["rows"]:
        assert row["ms"] > 0 and row["gbs"] >= 0 and 0 < row["pct_of_floor"] <= 150, row
    assert "k_layernorm_fwd" in res.stdout  # the table
    try:
        import matplotlib  # noqa: F401
        assert png.stat().st_size > 10_000
    except ImportError:
        assert r["plot"] is None and "matplotlib" in r["plot_note"]


@pytest.mark.gpu
def test_bench_attention_quick():
    res = run("bench_attention.py", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    for k in ("reference_fwd_ms", "reference_fwd_bwd_ms", "fast_fwd_ms", "fast_fwd_bwd_ms"):
        assert r[k] > 0
    assert r["fast_fwd_bwd_ms"] >= r["fast_fwd_ms"]
    assert (r["torch_sdpa_fwd_ms"] is None) == (r["torch_note"] is not None)


@pytest.mark.gpu
def test_bench_train_quick():
    res = run("bench_train.py", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    assert r["microgpt_tokens_per_s"] > 0 and r["losses_finite"]
    assert (r["ratio_vs_torch"] is None) == (r["torch_tokens_per_s"] is None)


@pytest.mark.gpu
def test_ncu_kernel_quick():
    import shutil
    if shutil.which("ncu") is None:
        pytest.skip("ncu is not on PATH")
    res = run("ncu_kernel.py", "k_softmax_fwd", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    assert r["launches"] and r["launches"][0]["kernel"].startswith("k_softmax_fwd")
    assert r["launches"][0]["time_us"] > 0
