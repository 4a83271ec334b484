"""Launchers of cuda/layernorm.cuh: LayerNorm over the last axis, forward and backward."""
from __future__ import annotations

from .checks import ptr, rows, shape_of
from .runtime import blocks, launch


def layernorm_fwd(out, mean, rstd, x, w, b, *, stream=None):
    """x (..., C) normalised over C; mean and rstd (...) saved for backward."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    args = [ptr("out", out, shape), ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1]),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]
    launch("k_layernorm_fwd", args, blocks(N), stream)


def layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, *, stream=None):
    """dx written; dw, db (C) added into."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    args = [ptr("dx", dx, shape), ptr("dw", dw, (C,)), ptr("db", db, (C,)), ptr("dout", dout, shape),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("mean", mean, shape[:-1]),
            ptr("rstd", rstd, shape[:-1]), N, C]
    launch("k_layernorm_bwd", args, (blocks(max(N, C)), 2), stream)
