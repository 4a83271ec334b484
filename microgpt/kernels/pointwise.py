"""Launchers of cuda/pointwise.cuh: GELU (tanh form) and the residual add, one thread per element."""
from __future__ import annotations

import math

from .checks import ptr, shape_of
from .runtime import blocks, launch


def gelu_fwd_args(out, x) -> list:
    """The checked arguments of k_gelu_fwd and k_gelu_fwd_fast: out, x, n."""
    shape = shape_of("x", x)
    return [ptr("out", out, shape), ptr("x", x, shape), math.prod(shape)]


def gelu_bwd_args(dx, dout, x) -> list:
    """The checked arguments of k_gelu_bwd and k_gelu_bwd_fast: dx, dout, x, n."""
    shape = shape_of("x", x)
    return [ptr("dx", dx, shape), ptr("dout", dout, shape), ptr("x", x, shape), math.prod(shape)]


def gelu_fwd(out, x, *, stream=None):
    args = gelu_fwd_args(out, x)
    launch("k_gelu_fwd", args, blocks(args[-1]), stream)


def gelu_bwd(dx, dout, x, *, stream=None):
    args = gelu_bwd_args(dx, dout, x)
    launch("k_gelu_bwd", args, blocks(args[-1]), stream)


def residual_fwd(out, a, b, *, stream=None):
    """out = a + b (out may be a or b)."""
    shape = shape_of("a", a)
    n = math.prod(shape)
    launch("k_residual_fwd", [ptr("out", out, shape), ptr("a", a, shape), ptr("b", b, shape), n], blocks(n), stream)


def residual_bwd(da, db, dout, *, stream=None):
    shape = shape_of("dout", dout)
    n = math.prod(shape)
    launch("k_residual_bwd", [ptr("da", da, shape), ptr("db", db, shape), ptr("dout", dout, shape), n], blocks(n),
           stream)
