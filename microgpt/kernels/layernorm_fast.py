"""Launchers of cuda/layernorm_fast.cuh: the layernorms a warp per row (the row in registers where it fits),
dw and db through per-chunk partial sums; each reduction in a fixed order."""
from __future__ import annotations

import math

from .checks import flag, ptr, rows, shape_of
from .colsum import chunks, reduce_chunks
from .layernorm import layernorm_fwd_args
from .rows_fast import WARP
from .runtime import blocks, launch, scratch


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


def layernorm_bwd_fast(dx, dw, db, dout, x, w, mean, rstd, *, accumulate=False, stream=None):
    """dx written (accumulate=True: added into), a warp per row; dw and db added into through per-chunk
    partial sums."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    p_dout, p_x = ptr("dout", dout, shape), ptr("x", x, shape)
    p_mean, p_rstd = ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1])
    p_dw, p_db = ptr("dw", dw, (C,)), ptr("db", db, (C,))
    launch("k_layernorm_bwd_fast", [ptr("dx", dx, shape), p_dout, p_x, ptr("w", w, (C,)), p_mean, p_rstd, N, C,
                                    flag("accumulate", accumulate)], blocks(N * WARP), stream)
    rows_per_chunk, n_chunks = chunks(N)
    pw, pb = scratch(n_chunks * C), scratch(n_chunks * C)
    launch("k_layernorm_bwd_fast_wb", [int(pw.gpudata), int(pb.gpudata), p_dout, p_x, p_mean, p_rstd, N, C,
                                       rows_per_chunk], (math.ceil(C / WARP), n_chunks, 1), stream)
    reduce_chunks(p_dw, pw, n_chunks, C, stream)
    reduce_chunks(p_db, pb, n_chunks, C, stream)
