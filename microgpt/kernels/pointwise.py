"""Launchers of cuda/pointwise.cuh: GELU (tanh form) and the residual add, one thread per element; and mlp.proj's
backward into GELU's (matmul_gelu_bwd) as a variant's matmul_bwd, then its GELU backward."""
from __future__ import annotations

import math

from .checks import opt_ptr, ptr, rows, shape_of
from .matmul import matmul_bwd
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


def matmul_gelu_bwd_args(dpre, dweight, dbias, dout, act, pre, weight) -> tuple[int, int, int, dict]:
    """Checks every argument of matmul_gelu_bwd by its name, before anything runs: (N, IN, OUT, the arrays' device
    pointers by name, dbias's 0 where None)."""
    shape = shape_of("act", act)
    N, IN = rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    p = {"dpre": ptr("dpre", dpre, shape), "dweight": ptr("dweight", dweight, (OUT, IN)),
         "dbias": opt_ptr("dbias", dbias, (OUT,)), "dout": ptr("dout", dout, shape[:-1] + (OUT,)),
         "act": ptr("act", act, shape), "pre": ptr("pre", pre, shape), "weight": ptr("weight", weight, (OUT, IN))}
    if p["dpre"] == p["pre"]:
        raise ValueError("dpre and pre must be two arrays: dpre is written before pre is read")
    return N, IN, OUT, p


def matmul_then_gelu_bwd(matmul_bwd, gelu_bwd, name="matmul_gelu_bwd"):
    """matmul_gelu_bwd as a variant's matmul_bwd with dpre as its dinp, then its gelu_bwd of dpre in place (element
    by element: each reads its own before writing it; the launcher called `name`)."""
    def matmul_gelu_bwd(dpre, dweight, dbias, dout, act, pre, weight, *, stream=None):
        """The backward of a linear layer whose input is act = gelu(pre) (dout, act, weight: matmul_bwd's): dpre =
        (dout @ weight) * gelu'(pre) written; dweight, dbias (None: none) added into."""
        matmul_gelu_bwd_args(dpre, dweight, dbias, dout, act, pre, weight)
        matmul_bwd(dpre, dweight, dbias, dout, act, weight, stream=stream)
        gelu_bwd(dpre, dpre, pre, stream=stream)
    matmul_gelu_bwd.__name__ = matmul_gelu_bwd.__qualname__ = name
    return matmul_gelu_bwd


matmul_gelu_bwd = matmul_then_gelu_bwd(matmul_bwd, gelu_bwd)
