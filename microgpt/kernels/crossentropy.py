"""Launchers of cuda/crossentropy.cuh: softmax cross-entropy over the vocabulary, fused."""
from __future__ import annotations

from .checks import check_ids, ptr, rows, rows_ptr, shape_of
from .runtime import blocks, launch


def crossentropy_fwd_args(losses, probs, logits, targets, check_token_ids=True, stream=None) -> list:
    """The checked arguments of k_crossentropy_fwd and k_crossentropy_fwd_fast: losses, probs, logits, targets, N, V
    and the pitches of probs' and logits' rows (each may be padded: checks.rows_ptr)."""
    shape = shape_of("logits", logits)
    N, V = rows(shape)
    (p_probs, ldp), (p_logits, ldl) = rows_ptr("probs", probs, shape), rows_ptr("logits", logits, shape)
    return [ptr("losses", losses, shape[:-1]), p_probs, p_logits,
            check_ids("targets", targets, shape[:-1], V, check_token_ids, stream), N, V, ldp, ldl]


def crossentropy_fwd(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """losses (...) and probs (..., V) of logits (..., V) against targets (...)."""
    args = crossentropy_fwd_args(losses, probs, logits, targets, check_token_ids, stream)
    launch("k_crossentropy_fwd", args, blocks(args[4]), stream)


def crossentropy_bwd_args(dlogits, probs, targets, dlosses, check_token_ids=True, stream=None) -> list:
    """The checked arguments of k_crossentropy_bwd and k_crossentropy_bwd_fast: dlogits, probs, targets,
    dlosses, N, V and the pitches of dlogits' and probs' rows (each may be padded)."""
    shape = shape_of("probs", probs)
    N, V = rows(shape)
    (p_dlogits, ldd), (p_probs, ldp) = rows_ptr("dlogits", dlogits, shape), rows_ptr("probs", probs, shape)
    return [p_dlogits, p_probs, check_ids("targets", targets, shape[:-1], V, check_token_ids, stream),
            ptr("dlosses", dlosses, shape[:-1]), N, V, ldd, ldp]


def crossentropy_bwd(dlogits, probs, targets, dlosses, *, check_token_ids=True, stream=None):
    """dlogits = (probs - onehot(targets)) * dlosses, per position."""
    args = crossentropy_bwd_args(dlogits, probs, targets, dlosses, check_token_ids, stream)
    N, V = args[4:6]
    launch("k_crossentropy_bwd", args, blocks(N * V), stream)
