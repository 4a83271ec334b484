"""Launchers of cuda/matmul_layernorm_tc.cuh: a linear layer's backward into the layernorm that made its input, on
the tensor cores, with the dX product's tiles going straight into the layernorm's backward (sm_90a): the layernorm
output's gradient is never stored or read back, and the layernorm backward has no pass of its own. Where the
kernel does not apply, the tc variant's matmul_bwd, then the fast layernorm_bwd (through dinp)."""
from __future__ import annotations

import dataclasses
import math

from .products import Gemm, gemm, matmul_bwd_tc
from .layernorm import matmul_layernorm_bwd_args, matmul_then_layernorm_bwd
from .layernorm_fast import layernorm_bwd_fast
from .matmul_tc import a_tensor_map, split_operands, tc_kernel
from .runtime import counters, device_of, launch, noting, scratch
from .source import int_constant


def max_row_tiles() -> int:
    """The most column tiles (of 128) a row may span (LN_MAX_ROW_TILES: C <= 1024): its tiles wait for each other,
    one block an SM, so they must all be on the GPU at once."""
    return int_constant("LN_MAX_ROW_TILES")


# the same ops unfused: where the kernel does not apply, and beside it in the profile
unfused = matmul_then_layernorm_bwd(matmul_bwd_tc, layernorm_bwd_fast, "matmul_layernorm_bwd_tc_unfused")


def fuses(g: Gemm, device) -> bool:
    """Whether the dX product g (N x C, K = OUT) runs fused with the layernorm backward on `device` (an engine):
    where it would run with B split beforehand (split_operands: sm_90a, a product the wgmma kernel takes), on rows of at
    most max_row_tiles() tiles (and no more tiles than the GPU has SMs), and a grid within CUDA's limits."""
    tiles = math.ceil(g.N / 128)
    return (split_operands(g, tc_kernel(g, device)) and tiles <= min(max_row_tiles(), device.sm_count)
            and math.ceil(g.M / 128) <= 65535)


def matmul_layernorm_bwd_tc(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd, *, dinp,
                            accumulate=False, stream=None):
    """As matmul_layernorm_bwd: the dW product (its bias gradient summed by the wgmma kernel) as in matmul_bwd; then,
    where fuses(), the dX product dout @ weight (dout split in registers, the weight beforehand) with
    k_gemm_wg_split_ln_bwd as its epilogue, whose blocks' column sums of dw and db the last block of each column tile
    adds in row-tile order; dinp is not written. Otherwise the two ops one after the other."""
    N, C, OUT, acc, p = matmul_layernorm_bwd_args(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd,
                                                  dinp, accumulate)
    g = Gemm.dense(N, C, OUT, units="tc")
    if not fuses(g, device_of(stream)):
        with noting(stream, "unfused: the dX product is not one the wgmma kernel takes with B split beforehand, or "
                            f"rows of C = {C} span more than {max_row_tiles()} tiles"):
            unfused(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd, dinp=dinp,
                    accumulate=accumulate, stream=stream)
        return
    gemm(Gemm.dense(OUT, C, N, trans_a=True, beta=1.0, units="tc"), p["dweight"], p["dout"], p["inp"], stream=stream,
         sums=p["dbias"])

    def layernorm_epilogue(a, b_split, K_pad, grid):
        tiles, row_tiles = grid
        partials, row_sums = scratch(2 * row_tiles * C, stream), scratch(2 * N * tiles, stream)
        done = counters(2 * row_tiles + tiles + 1, stream)  # rows arrived and done, column tiles done, the ticket
        launch("k_gemm_wg_split_ln_bwd",
               [p["dx"], p["dw"], p["db"], int(partials.gpudata), int(row_sums.gpudata), int(done.gpudata), a, g.lda,
                a_tensor_map(g, a, stream), b_split, p["x"], p["w"], p["mean"], p["rstd"], N, C, g.K, K_pad, acc],
               grid, stream, shared=int_constant("TC_AREG_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"),
               why="fused: the dX product's tiles go straight into the layernorm backward (dinp never written)")
    gemm(dataclasses.replace(g, epilogue=layernorm_epilogue), 0, p["dout"], p["weight"], stream=stream)
