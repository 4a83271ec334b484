"""Launchers of cuda/rows_fast.cuh: a warp per row (softmax, layernorm) or a block per row (the
cross-entropy over the vocabulary); each reduction in a fixed order."""
from __future__ import annotations

import math

from .checks import causal_flag, check_ids, flag, ptr, rows, shape_of
from .colsum import chunks, reduce_chunks
from .runtime import BLOCK, blocks, launch, scratch

WARP = 32


def softmax_fwd_fast(probs, x, *, causal=False, stream=None):
    """As softmax_fwd, a warp per row held in registers; causal=True reads row i's first i + 1 columns
    only and writes the rest 0."""
    shape = shape_of("x", x)
    n_rows, cols = rows(shape)
    args = [ptr("probs", probs, shape), ptr("x", x, shape), n_rows, cols, causal_flag("x", shape, causal)]
    launch("k_softmax_fwd_fast", args, blocks(n_rows * WARP), stream)


def softmax_bwd_fast(dx, dprobs, probs, *, causal=False, stream=None):
    """As softmax_bwd; causal=True reads row i's first i + 1 columns only and writes the rest 0."""
    shape = shape_of("probs", probs)
    n_rows, cols = rows(shape)
    args = [ptr("dx", dx, shape), ptr("dprobs", dprobs, shape), ptr("probs", probs, shape), n_rows, cols,
            causal_flag("probs", shape, causal)]
    launch("k_softmax_bwd_fast", args, blocks(n_rows * WARP), stream)


def layernorm_fwd_fast(out, mean, rstd, x, w, b, *, stream=None):
    shape = shape_of("x", x)
    N, C = rows(shape)
    args = [ptr("out", out, shape), ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1]),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]
    launch("k_layernorm_fwd_fast", args, blocks(N * WARP), stream)


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


def crossentropy_fwd_fast(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """As crossentropy_fwd, a block of BLOCK threads per position."""
    shape = shape_of("logits", logits)
    N, V = rows(shape)
    args = [ptr("losses", losses, shape[:-1]), ptr("probs", probs, shape), ptr("logits", logits, shape),
            check_ids("targets", targets, shape[:-1], V, check_token_ids), N, V]
    launch("k_crossentropy_fwd_fast", args, blocks(N * BLOCK), stream)
