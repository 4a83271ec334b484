"""The tools in tools/: each answers --help anywhere, and without a GPU stops with a one-line reason."""
import pytest

from helpers import GPU_REASON, run_tool as run

GPU_TOOLS = ["profile_kernels.py", "bench_attention.py", "bench_train.py", "ncu_kernel.py", "sanitize_kernels.py"]


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
