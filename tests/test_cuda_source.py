"""CPU checks of cuda/microgpt_cuda.cu: it compiles cleanly for the GPUs we support, and it holds the
kernels the launch layer and the reference expect."""
import re
import shutil
import subprocess

import pytest

from microgpt import kernels, reference

SOURCE_DIR = kernels.cuda_source_dir()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_compiles_without_warnings(arch, tmp_path):
    cmd = ["nvcc", "--cubin", f"-arch={arch}", "-Werror", "all-warnings", *kernels.NVCC_OPTIONS,
           "-o", str(tmp_path / "m.cubin"), str(SOURCE_DIR / "microgpt_cuda.cu")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr


def test_the_literal_scores_line_is_there():
    assert "scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k));" in kernels.full_source()
    assert re.search(r"j > i \? MASK_VALUE", kernels.full_source())
    assert "#define MASK_VALUE (-1e9f)" in kernels.full_source()


def test_every_reference_op_has_a_forward_and_a_backward_kernel():
    names = set(kernels.kernel_names())
    ops = sorted({n[:-4] for n in dir(reference) if n.endswith("_fwd") and n != "attention_fwd"} - {"linear"})
    assert len(ops) >= 11
    for op in ops + ["matmul"]:
        assert f"k_{op}_fwd" in names and f"k_{op}_bwd" in names, op
    assert {"k_adamw", "k_global_norm"} <= names


def test_every_kernel_is_extern_c_with_a_mappable_signature():
    sigs = kernels.kernel_signatures(kernels.full_source())
    declared = re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)", kernels.full_source())
    assert sorted(sigs) == sorted(declared)
    assert sigs["k_attn_scores_fwd"] == "PPPiii"
    assert sigs["k_adamw"] == "PPPPqfffffPffPf"


def test_every_kernel_is_launched_by_the_launch_layer():
    launch_layer = open(kernels.__file__).read()
    for name in kernels.kernel_names():
        if name.startswith("k_sgemm_"):  # sgemm() composes the name from its transposes
            assert '"k_sgemm_" + ' in launch_layer
        else:
            assert f'"{name}"' in launch_layer, name
    for name in kernels.kernel_names():
        if name.endswith(("_fwd", "_bwd")) and not name.startswith("k_sgemm"):
            assert callable(getattr(kernels, name[2:], None)), name  # k_embed_fwd -> kernels.embed_fwd
        if name.endswith(("_fwd_fast", "_bwd_fast")):
            assert callable(getattr(kernels, name[2:], None)), name


def test_launch_layer_refuses_host_arrays_before_touching_cuda():
    import numpy as np
    with pytest.raises(TypeError, match="x must be a device array, got a NumPy array"):
        kernels.ptr("x", np.zeros(3, np.float32), (3,))
    with pytest.raises(TypeError, match="w must be a device array"):
        kernels.ptr("w", [1.0], (1,))
