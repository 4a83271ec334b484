"""Launchers of cuda/pointwise.cuh: GELU (tanh form) and the residual add, one thread per element."""
from __future__ import annotations

import math

from .checks import ptr, shape_of
from .runtime import blocks, launch


def gelu_fwd(out, x, *, stream=None):
    shape = shape_of("x", x)
    n = math.prod(shape)
    launch("k_gelu_fwd", [ptr("out", out, shape), ptr("x", x, shape), n], blocks(n), stream)


def gelu_bwd(dx, dout, x, *, stream=None):
    shape = shape_of("x", x)
    n = math.prod(shape)
    launch("k_gelu_bwd", [ptr("dx", dx, shape), ptr("dout", dout, shape), ptr("x", x, shape), n], blocks(n), stream)


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
