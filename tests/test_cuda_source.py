"""CPU checks of cuda/microgpt_cuda.cu: it compiles cleanly for the GPUs we support, it holds the kernels
the launch layer and the reference expect, and the numbers it shares with Python are the same on both
sides."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from microgpt import kernels, reference
from microgpt.kernels.source import LAUNCH_BOUNDS

SOURCE_DIR = kernels.cuda_source_dir()
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_89", "sm_90", "sm_90a"])
def test_compiles_without_warnings(arch, tmp_path, request):
    if arch == "sm_90a":  # the session's one sm_90a build, whose PTX test_plans.py reads too
        res = request.getfixturevalue("hopper_build").result
    else:
        cmd = ["nvcc", "--cubin", f"-arch={arch}", "-Werror", "all-warnings", *kernels.NVCC_OPTIONS,
               "-o", str(tmp_path / "m.cubin"), str(SOURCE_DIR / "microgpt_cuda.cu")]
        res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", res.stdout + res.stderr


@needs_nvcc
def test_the_literal_scores_line_is_compiled():
    line = "scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k));"
    assert line in (SOURCE_DIR / "attention.cuh").read_text()
    assert line in kernels.preprocessed()  # in what nvcc compiles, not only in a file beside it
    assert re.search(r"j > i \? MASK_VALUE", (SOURCE_DIR / "attention.cuh").read_text())


def _define(name):
    m = re.search(rf"^#define {name} \(?(-?[0-9.]+(?:e-?[0-9]+)?)f\)?", (SOURCE_DIR / "common.cuh").read_text(), re.M)
    assert m, f"common.cuh defines no {name}"
    return float(m.group(1))


def test_the_constants_python_mirrors_are_those_of_the_kernels():
    assert np.float32(_define("MASK_VALUE")) == np.float32(reference.MASK_VALUE) == np.float32(kernels.MASK_VALUE)
    assert np.float32(_define("LN_EPS")) == np.float32(reference.LN_EPS)


@needs_nvcc
def test_the_causal_enum_is_mirrored_once_in_python():
    cuda_enum = {k[len("CAUSAL_"):]: v for k, v in kernels.int_constants().items() if k.startswith("CAUSAL_")}
    assert cuda_enum == {c.name: int(c) for c in kernels.Causal}


@needs_nvcc
def test_the_decode_shared_memory_python_computes_is_the_headers(tmp_path):
    # the header's constexpr decode_shared_floats, compiled into a host program (PTX only: no ptxas, no GPU)
    from microgpt.kernels.decode import decode_shared_bytes
    sizes = [(d_k, threads) for d_k in range(1, 257) for threads in (32, 128, 256, 1024)]
    calls = "".join(f'std::printf("%d\\n", decode_shared_floats({d}, {t}));\n' for d, t in sizes)
    (tmp_path / "p.cu").write_text(f'#include <cstdio>\n#include "decode.cuh"\nint main() {{\n{calls}}}\n')
    res = subprocess.run(["nvcc", "-gencode", "arch=compute_90a,code=compute_90a", f"-I{SOURCE_DIR}", "-o",
                          str(tmp_path / "p"), str(tmp_path / "p.cu")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    floats = [int(x) for x in subprocess.run([str(tmp_path / "p")], capture_output=True, text=True,
                                             check=True).stdout.split()]
    assert [4 * f for f in floats] == [decode_shared_bytes(d, t) for d, t in sizes]


@needs_nvcc
def test_every_reference_op_has_a_forward_and_a_backward_kernel():
    names = set(kernels.kernel_names())
    ops = sorted({n[:-4] for n in dir(reference) if n.endswith("_fwd")} - {"linear"})
    assert len(ops) >= 11
    for op in ops + ["matmul"]:
        assert f"k_{op}_fwd" in names and f"k_{op}_bwd" in names, op
    assert {"k_adamw", "k_global_norm"} <= names


@needs_nvcc
def test_every_kernel_of_the_translation_unit_is_extern_c_with_a_mappable_signature():
    text = kernels.preprocessed()
    sigs = kernels.kernel_signatures(text)
    ours = set(kernels.kernel_headers(text).values())
    assert ours == {f.name for f in SOURCE_DIR.glob("*.cuh")} - {"common.cuh"}  # every header is included
    declared = set(re.findall(r"__attribute__\(\(global\)\) void\s+" + LAUNCH_BOUNDS + r"(\w+)\s*\(", text))
    assert declared == set(sigs)  # a __global__ function that is not extern "C" could not be found by name
    assert sigs["k_attn_scores_fwd"] == "PPPiii"
    assert sigs["k_adamw"] == "PPPPqfffffPffPf"
    assert sigs["k_sgemm_tn_n64"] == "PPPPiiiiiiqqqffifP"  # enum Causal travels as an int; last, a_sums


def test_argument_formats_come_from_the_preprocessed_text():
    text = '''enum Mode : int { A = 0 };
# 1 "x/one.cuh" 1
extern "C" __attribute__((global)) void __attribute__((launch_bounds(256, 2))) k_a(float* p, long long n, Mode m, float f) {}
# 9 "x/two.cuh" 1
extern "C" __attribute__((global)) void k_b(const int* __restrict__ q, int n) {}
extern "C" __attribute__((global)) void __attribute__((launch_bounds(32 * (4 * 2), 1))) k_c(int n) {}
extern "C" __attribute__((global)) void __attribute__((maxnreg(REGS))) k_d(float* p, int n) {}
'''
    assert kernels.kernel_signatures(text) == {"k_a": "Pqif", "k_b": "Pi", "k_c": "i", "k_d": "Pi"}
    assert kernels.kernel_headers(text) == {"k_a": "one.cuh", "k_b": "two.cuh", "k_c": "two.cuh", "k_d": "two.cuh"}
    assert kernels.int_constants(text) == {"A": 0}
    assert kernels.int_constants("enum L : int { X = 2 * 2 * 128 * (32 + 8) * 4, Y = -3, Z = 7 / 2 };") == \
        {"X": 81920, "Y": -3, "Z": 3}
    with pytest.raises(ValueError, match=r"k_c: cannot map parameter 'char c'"):
        kernels.kernel_signatures('extern "C" __attribute__((global)) void k_c(char c) {}')


def test_launch_layer_refuses_host_arrays_before_touching_cuda():
    with pytest.raises(TypeError, match="x must be a device array, got a NumPy array"):
        kernels.ptr("x", np.zeros(3, np.float32), (3,))
    with pytest.raises(TypeError, match="w must be a device array"):
        kernels.ptr("w", [1.0], (1,))


@needs_nvcc
def test_only_what_the_translation_unit_includes_counts(tmp_path, monkeypatch):
    copy = tmp_path / "cuda"
    shutil.copytree(SOURCE_DIR, copy)
    (copy / "stray.cuh").write_text('extern "C" __global__ void k_stray(float* x) { x[0] = 0.0f; }\n')
    monkeypatch.setenv("MICROGPT_CUDA_DIR", str(copy))
    assert "k_stray" not in kernels.kernel_names() and "k_stray" not in kernels.full_source()
    assert kernels.full_source().count("#pragma once") == len(list(SOURCE_DIR.glob("*.cuh")))  # each header once
    with open(copy / "microgpt_cuda.cu", "a") as f:
        f.write('#include "stray.cuh"\n')
    assert kernels.kernel_signatures()["k_stray"] == "P"  # an edit is seen without restarting
    assert "k_stray" in kernels.full_source()
