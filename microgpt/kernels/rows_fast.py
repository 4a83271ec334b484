"""Launchers of cuda/rows_fast.cuh: a warp per row (softmax) or a block per row (the cross-entropy over the
vocabulary); each reduction in a fixed order."""
from __future__ import annotations

from .checks import causal_flag, check_ids, ptr, rows, shape_of
from .runtime import BLOCK, blocks, launch

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


def crossentropy_fwd_fast(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """As crossentropy_fwd, a block of BLOCK threads per position."""
    shape = shape_of("logits", logits)
    N, V = rows(shape)
    args = [ptr("losses", losses, shape[:-1]), ptr("probs", probs, shape), ptr("logits", logits, shape),
            check_ids("targets", targets, shape[:-1], V, check_token_ids), N, V]
    launch("k_crossentropy_fwd_fast", args, blocks(N * BLOCK), stream)
