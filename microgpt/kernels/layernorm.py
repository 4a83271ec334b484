"""Launchers of cuda/layernorm.cuh: LayerNorm over the last axis, forward and backward."""
from __future__ import annotations

from .checks import flag, opt_ptr, ptr, rows, rows_ptr, shape_of
from .matmul import matmul_bwd
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


def matmul_layernorm_bwd_args(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd, dinp, accumulate):
    """Checks every argument of matmul_layernorm_bwd by its name, before anything runs: (N, C, OUT, the accumulate
    flag, the arrays' device pointers by name, dbias's 0 where None)."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    p = {name: ptr(name, a, a_shape) for name, a, a_shape in (
        ("x", x, shape), ("dx", dx, shape), ("dw", dw, (C,)), ("db", db, (C,)), ("dweight", dweight, (OUT, C)),
        ("inp", inp, shape), ("weight", weight, (OUT, C)), ("w", w, (C,)), ("mean", mean, shape[:-1]),
        ("rstd", rstd, shape[:-1]), ("dinp", dinp, shape))}
    p["dout"] = rows_ptr("dout", dout, shape[:-1] + (OUT,))[0]  # its rows may be padded, as matmul_bwd takes them
    p["dbias"] = opt_ptr("dbias", dbias, (OUT,))
    return N, C, OUT, flag("accumulate", accumulate), p


def matmul_then_layernorm_bwd(matmul_bwd, layernorm_bwd, name="matmul_layernorm_bwd"):
    """matmul_layernorm_bwd as a variant's matmul_bwd into dinp, then its layernorm_bwd of dinp (the launcher
    called `name`)."""
    def matmul_layernorm_bwd(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd, *, dinp,
                             accumulate=False, stream=None):
        """The backward of a linear layer (dout, inp, weight: matmul_bwd's) whose input inp = layernorm(x) (x, w,
        mean, rstd: layernorm_bwd's): dweight, dbias, dw, db added into, dx written (accumulate=True: added
        into); dinp (inp's shape) takes inp's gradient on the way, where the variant does not fuse the two."""
        matmul_layernorm_bwd_args(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd, dinp, accumulate)
        matmul_bwd(dinp, dweight, dbias, dout, inp, weight, stream=stream)
        layernorm_bwd(dx, dw, db, dinp, x, w, mean, rstd, accumulate=accumulate, stream=stream)
    matmul_layernorm_bwd.__name__ = matmul_layernorm_bwd.__qualname__ = name
    return matmul_layernorm_bwd


matmul_layernorm_bwd = matmul_then_layernorm_bwd(matmul_bwd, layernorm_bwd)
