"""Launchers of cuda/layernorm_fast.cuh: the layernorms a warp per row (the row in registers where it fits);
the backward's dw and db summed in the same pass as dx, a partial row per block, then added in block order.
Each reduction in a fixed order."""
from __future__ import annotations

import math

from .checks import flag, ptr, rows, shape_of
from .layernorm import layernorm_fwd_args
from .rows_fast import WARP
from .runtime import BLOCK, blocks, engine, launch, scratch

# The blocks a backward's grid aims at: two an SM of the H200's 132 in one wave, where a block holds 128
# registers a thread and 8 * 2 * C floats of shared memory (C = 768: 48 KB). A constant, not the device's SM
# count: which rows a block adds, and so every bit of dw and db, must not depend on the GPU.
BWD_BLOCKS = 256


def layernorm_fwd_fast(out, mean, rstd, x, w, b, *, stream=None):
    args = layernorm_fwd_args(out, mean, rstd, x, w, b)
    launch("k_layernorm_fwd_fast", args, blocks(args[-2] * WARP), stream)


def residual_layernorm_fwd_fast(x, out, mean, rstd, resid, branch, w, b, *, stream=None):
    """x = resid + branch (written) and out = layernorm(x) in one pass, a warp per row."""
    shape = shape_of("resid", resid)
    N, C = rows(shape)
    args = [ptr("x", x, shape), ptr("out", out, shape), ptr("mean", mean, shape[:-1]),
            ptr("rstd", rstd, shape[:-1]), ptr("resid", resid, shape), ptr("branch", branch, shape),
            ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]
    launch("k_residual_layernorm_fwd_fast", args, blocks(N * WARP), stream)


def bwd_rows_per_block(N: int) -> int:
    """Rows each block of layernorm_bwd_fast takes: a multiple of its warps, the fewest that cover N rows with at
    most BWD_BLOCKS blocks (8192 rows: 32 a block, 4 a warp). A function of N alone."""
    warps = BLOCK // WARP
    return warps * max(1, math.ceil(N / (BWD_BLOCKS * warps)))


def layernorm_bwd_fast(dx, dw, db, dout, x, w, mean, rstd, *, accumulate=False, stream=None):
    """dx written (accumulate=True: added into), a warp per row; in the same pass each block sums its rows' dw and
    db into a partial row (a partial a warp in shared memory, added in warp order), and k_layernorm_bwd_fast_reduce
    adds the blocks' partials into dw and db in block order."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    args = [ptr("dx", dx, shape), ptr("dout", dout, shape), ptr("x", x, shape), ptr("w", w, (C,)),
            ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1])]
    p_dw, p_db, acc = ptr("dw", dw, (C,)), ptr("db", db, (C,)), flag("accumulate", accumulate)
    rows_per_block = bwd_rows_per_block(N)
    n_blocks, warps = math.ceil(N / rows_per_block), BLOCK // WARP
    partials = scratch(n_blocks * 2 * C)
    shared, warp_partials = warps * 2 * C * 4, None
    if shared > engine().max_shared:  # rows longer than 3,600 floats or so: the warps' partials go to global memory
        shared, warp_partials = 0, scratch(n_blocks * warps * 2 * C)  # held here until the launches are queued
    launch("k_layernorm_bwd_fast", [args[0], int(partials.gpudata), 0 if warp_partials is None else
                                    int(warp_partials.gpudata), *args[1:], N, C, rows_per_block, acc],
           n_blocks, stream, shared=shared)
    launch("k_layernorm_bwd_fast_reduce", [p_dw, p_db, int(partials.gpudata), n_blocks, C],
           math.ceil(2 * C / WARP), stream)
