"""Launchers of cuda/matmul_attention_tc.cuh: the attention's output projection's backward into flash attention's
backward, on the tensor cores, with the dX product that makes dy also summing flash attention's delta (the rows
past its first query tiles) from its tiles (sm_90a): no pass reads dy back beside y for it, the one memory-bound
kernel of the tc backward that stayed under 80% of the copy bandwidth (k_flash_bwd_delta_rows). Where the kernel
does not apply, the tc variant's matmul_bwd, then its fused_attention_bwd."""
from __future__ import annotations

import dataclasses
import math

from . import flash_attention
from .attention import matmul_attention_bwd_args, matmul_then_attention_bwd
from .flash_attention import fused_attention_bwd_tc
from .products import Gemm, gemm, matmul_bwd_tc
from .matmul_tc import a_tensor_map, split_operands, tc_kernel
from .runtime import device_of, launch, noting
from .source import int_constant

D_K = (32, 64, 128)  # the head widths whose heads a 128-column tile holds whole

# the same ops unfused: where the kernel does not apply, and beside it in the profile
unfused = matmul_then_attention_bwd(matmul_bwd_tc, fused_attention_bwd_tc, "matmul_attention_bwd_tc_unfused")


def fuses(g: Gemm, B: int, T: int, n_head: int, device) -> bool:
    """Whether the dX product g (B T rows of C = g.N, K = C) sums delta on `device` (an engine): where it would run
    with B split beforehand (split_operands: sm_90a, a product the wgmma kernel takes), flash attention runs the
    backward (flash_attention.runs) and its heads are whole in the product's tiles (d_k in D_K), on a grid within
    CUDA's limits."""
    d_k = g.N // n_head
    return (d_k in D_K and flash_attention.runs(B, n_head, d_k, T, device) and split_operands(g, tc_kernel(g, device))
            and math.ceil(g.M / 128) <= 65535)


def matmul_attention_bwd_tc(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, *, dy, stream=None):
    """As matmul_attention_bwd: where fuses(), the dX product dout @ weight (dout split in registers, the weight
    beforehand) with k_gemm_wg_split_delta as its epilogue, which writes dy and the delta of the rows past the pass
    kernel's query tiles; then the rest of flash attention's backward (flash_attention.backward) and the dW product (its bias
    gradient summed by the wgmma kernel) as in matmul_bwd. Otherwise the two ops one after the other."""
    B, T, C, d_k, p = matmul_attention_bwd_args(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, dy)
    g = Gemm.dense(B * T, C, C, units="tc")
    if not fuses(g, B, T, n_head, device_of(stream)):
        with noting(stream, "unfused: flash attention does not run, d_k is not 32, 64 or 128, or the product is not "
                            "one the wgmma kernel takes with B split beforehand"):
            unfused(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, dy=dy, stream=stream)
        return

    def product_and_delta(p_delta, p_sync):
        def delta_epilogue(a, b_split, K_pad, grid):
            launch("k_gemm_wg_split_delta", [p["dy"], p_delta, p_sync, a, g.lda, a_tensor_map(g, a, stream), b_split,
                                             p["y"], B * T, C, g.K, K_pad, T, d_k], grid, stream,
                   shared=int_constant("TC_AREG_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"),
                   why="fused: the dX product making dy sums flash attention's delta in its epilogue")
        gemm(dataclasses.replace(g, epilogue=delta_epilogue), 0, p["dout"], p["weight"], stream=stream)

    flash_attention.backward(dqkv, dy, qkv, y, lse, n_head, stream, delta_rows=product_and_delta)
    gemm(Gemm.dense(C, C, B * T, trans_a=True, beta=1.0, units="tc"), p["dweight"], p["dout"], p["y"], stream=stream,
         sums=p["dbias"])
