"""Launchers of cuda/rows_fast.cuh: a warp per row (softmax, the embedding's positions) or a block per row
(the cross-entropy over the vocabulary); each reduction in a fixed order. The header's MB_UNROLL, the chunks a
thread of the memory-bound fast kernels has in flight, is read here (unroll()) for their grids."""
from __future__ import annotations

import functools

from .checks import causal_flag, check_ids, ptr, rows, shape_of
from .crossentropy import crossentropy_bwd_args
from .embed import embed_fwd_args
from .runtime import BLOCK, blocks, launch
from .source import int_constants

WARP = 32
GRID_Y = 65535  # the most blocks a launch may have along y


@functools.cache
def unroll() -> int:
    """MB_UNROLL of cuda/rows_fast.cuh (enum MemoryBoundLaunch)."""
    return int_constants()["MB_UNROLL"]


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


def crossentropy_fwd_fast(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """As crossentropy_fwd, a block of BLOCK threads per position."""
    shape = shape_of("logits", logits)
    N, V = rows(shape)
    args = [ptr("losses", losses, shape[:-1]), ptr("probs", probs, shape), ptr("logits", logits, shape),
            check_ids("targets", targets, shape[:-1], V, check_token_ids), N, V]
    launch("k_crossentropy_fwd_fast", args, blocks(N * BLOCK), stream)


def crossentropy_bwd_fast(dlogits, probs, targets, dlosses, *, check_token_ids=True, stream=None):
    """As crossentropy_bwd (the same bits), a block per position (up to GRID_Y of them, looping past it)."""
    args = crossentropy_bwd_args(dlogits, probs, targets, dlosses, check_token_ids)
    N = args[-2]
    launch("k_crossentropy_bwd_fast", args, (1, min(N, GRID_Y)), stream)


def embed_fwd_fast(x, idx, wte, wpe, *, check_token_ids=True, stream=None):
    """As embed_fwd (the same bits), a warp per position."""
    args = embed_fwd_args(x, idx, wte, wpe, check_token_ids)
    B, T = args[-3:-1]
    launch("k_embed_fwd_fast", args, blocks(B * T * WARP), stream)
