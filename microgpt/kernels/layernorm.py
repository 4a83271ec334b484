"""Launchers of cuda/layernorm.cuh: LayerNorm over the last axis, forward and backward."""
from __future__ import annotations

from .checks import flag, ptr, rows, shape_of
from .pointwise import residual_fwd
from .runtime import blocks, launch


def layernorm_fwd_args(out, mean, rstd, x, w, b) -> list:
    """The checked arguments of k_layernorm_fwd and k_layernorm_fwd_fast: out, mean, rstd, x, w, b, N, C."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    return [ptr("out", out, shape), ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1]),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]


def layernorm_fwd(out, mean, rstd, x, w, b, *, stream=None):
    """x (..., C) normalised over C; mean and rstd (...) saved for backward."""
    args = layernorm_fwd_args(out, mean, rstd, x, w, b)
    launch("k_layernorm_fwd", args, blocks(args[-2]), stream)


def layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, *, accumulate=False, stream=None):
    """dx written (accumulate=True: added into, as the residual stream's gradient is); dw, db (C) added
    into."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    args = [ptr("dx", dx, shape), ptr("dw", dw, (C,)), ptr("db", db, (C,)), ptr("dout", dout, shape),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("mean", mean, shape[:-1]),
            ptr("rstd", rstd, shape[:-1]), N, C, flag("accumulate", accumulate)]
    launch("k_layernorm_bwd", args, (blocks(max(N, C)), 2), stream)


def residual_layernorm_fwd(x, out, mean, rstd, resid, branch, w, b, *, stream=None):
    """x = resid + branch (written), then out = layernorm(x): the residual add and the layernorm after it,
    here as the two readable kernels (every argument checked first, by this op's names)."""
    shape = shape_of("resid", resid)
    N, C = rows(shape)
    for name, a, a_shape in (("x", x, shape), ("out", out, shape), ("mean", mean, shape[:-1]),
                             ("rstd", rstd, shape[:-1]), ("branch", branch, shape), ("w", w, (C,)), ("b", b, (C,))):
        ptr(name, a, a_shape)
    residual_fwd(x, resid, branch, stream=stream)
    layernorm_fwd(out, mean, rstd, x, w, b, stream=stream)
