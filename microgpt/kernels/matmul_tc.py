"""Launchers of cuda/matmul_tc.cuh: the model's matrix products on the tensor cores at FP32 accuracy (3xTF32).

The same products as matmul_fast (MatrixProducts over a gemm), through the same Gemm description, causal
tile skipping and deterministic split-K; only the unsplit launch differs. Where the device has no TF32
tensor cores (before sm_80), and for products with K < TC_MIN_K, the launch is the SIMT SGEMM's: the variant
runs everywhere, and never less accurately than 1.5x the SIMT kernel.
"""
from __future__ import annotations

from .matmul_fast import Gemm, MatrixProducts, gemm, sgemm, sgemm_product
from .runtime import engine, launch
from .source import int_constants

# Below this K the split's own rounding outweighs the sum's, and the tensor cores' error would pass 1.5x the
# SIMT kernel's (dev/NOTES.md: the ratio is 3.3 at K = 1, 1.3 at 16, 1.0 at 32): such products run on SIMT.
TC_MIN_K = 32

_smem_bytes = None


def tensor_cores() -> bool:
    """Whether this device runs mma.sync TF32 (compute capability 8.0 and later)."""
    return int(engine().arch.removeprefix("sm_")) >= 80


def smem_bytes() -> int:
    """The dynamic shared memory of one block: TC_SMEM_BYTES of cuda/matmul_tc.cuh."""
    global _smem_bytes
    if _smem_bytes is None:
        _smem_bytes = int_constants()["TC_SMEM_BYTES"]
    return _smem_bytes


def tc_kernel(g: Gemm) -> str:
    ops = ("t" if g.trans_a else "n") + ("t" if g.trans_b else "n")
    return f"k_gemm_tc_{ops}" + ("_n64" if g.tile_n == 64 else "")


def tc_product(g: Gemm, c: int, a: int, b: int, bias: int, stream) -> None:
    """One unsplit launch of g on the tensor cores (the SIMT SGEMM where there are none, or where K is too
    short for them to be as accurate); the tile and grid are the SGEMM's."""
    if g.K < TC_MIN_K or not tensor_cores():
        sgemm_product(g, c, a, b, bias, stream)
        return
    launch(tc_kernel(g), g.args(c, a, b, bias), g.grid, stream, shared=smem_bytes())


def gemm_tc(g: Gemm, c: int, a: int, b: int, bias: int = 0, stream=None) -> None:
    """As matmul_fast.gemm, on the tensor cores."""
    gemm(g, c, a, b, bias, stream, product=tc_product)


def sgemm_tc(c, a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias=None, stream=None):
    """As matmul_fast.sgemm, on the tensor cores: c = alpha * op(a) @ op(b) + bias + beta * c."""
    sgemm(c, a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, bias=bias, stream=stream,
          gemm=gemm_tc)


(matmul_fwd_tc, matmul_bwd_tc, causal_scores_fwd_tc, causal_scores_bwd_tc, attn_values_fwd_tc,
 attn_values_bwd_tc) = MatrixProducts(gemm_tc).launchers("tc", __name__)
