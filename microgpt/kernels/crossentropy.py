"""Launchers of cuda/crossentropy.cuh: softmax cross-entropy over the vocabulary, fused."""
from __future__ import annotations

from .checks import check_ids, ptr, rows, shape_of
from .runtime import blocks, launch


def crossentropy_fwd(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """losses (...) and probs (..., V) of logits (..., V) against targets (...)."""
    shape = shape_of("logits", logits)
    N, V = rows(shape)
    args = [ptr("losses", losses, shape[:-1]), ptr("probs", probs, shape), ptr("logits", logits, shape),
            check_ids("targets", targets, shape[:-1], V, check_token_ids, stream), N, V]
    launch("k_crossentropy_fwd", args, blocks(N), stream)


def crossentropy_bwd_args(dlogits, probs, targets, dlosses, check_token_ids=True, stream=None) -> list:
    """The checked arguments of k_crossentropy_bwd and k_crossentropy_bwd_fast: dlogits, probs, targets,
    dlosses, N, V."""
    shape = shape_of("probs", probs)
    N, V = rows(shape)
    return [ptr("dlogits", dlogits, shape), ptr("probs", probs, shape), check_ids("targets", targets, shape[:-1], V,
            check_token_ids, stream), ptr("dlosses", dlosses, shape[:-1]), N, V]


def crossentropy_bwd(dlogits, probs, targets, dlosses, *, check_token_ids=True, stream=None):
    """dlogits = (probs - onehot(targets)) * dlosses, per position."""
    args = crossentropy_bwd_args(dlogits, probs, targets, dlosses, check_token_ids, stream)
    N, V = args[-2:]
    launch("k_crossentropy_bwd", args, blocks(N * V), stream)
