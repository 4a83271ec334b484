"""Launchers of cuda/matmul.cuh: the linear layer out = inp @ weight^T + bias, forward and backward."""
from __future__ import annotations

from .checks import opt_ptr, ptr, rows, shape_of
from .runtime import blocks, launch


def matmul_fwd(out, inp, weight, bias=None, *, stream=None):
    """out (..., OUT) = inp (..., IN) @ weight (OUT, IN)^T + bias (OUT) (bias None: none)."""
    shape = shape_of("inp", inp)
    N, IN = rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    args = [ptr("out", out, shape[:-1] + (OUT,)), ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN)),
            opt_ptr("bias", bias, (OUT,)), N, IN, OUT]
    launch("k_matmul_fwd", args, blocks(N * OUT), stream)


def matmul_bwd(dinp, dweight, dbias, dout, inp, weight, *, stream=None):
    """dinp written; dweight (OUT, IN) and dbias (OUT, or None) added into."""
    shape = shape_of("inp", inp)
    N, IN = rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    args = [ptr("dinp", dinp, shape), ptr("dweight", dweight, (OUT, IN)), opt_ptr("dbias", dbias, (OUT,)),
            ptr("dout", dout, shape[:-1] + (OUT,)), ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN)),
            N, IN, OUT]
    launch("k_matmul_bwd", args, (blocks(max(N * IN, OUT * IN)), 3), stream)
