"""Launchers of cuda/matmul.cuh: the linear layer out = inp @ weight^T + bias, forward and backward."""
from __future__ import annotations

from .checks import opt_ptr, ptr, rows, rows_ptr, shape_of
from .runtime import blocks, launch


def matmul_fwd(out, inp, weight, bias=None, *, stream=None):
    """out (..., OUT) = inp (..., IN) @ weight (OUT, IN)^T + bias (OUT) (bias None: none); out's rows may be padded
    (checks.rows_ptr)."""
    shape = shape_of("inp", inp)
    N, IN = rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    p_out, ldo = rows_ptr("out", out, shape[:-1] + (OUT,))
    args = [p_out, ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN)), opt_ptr("bias", bias, (OUT,)), N, IN,
            OUT, ldo]
    launch("k_matmul_fwd", args, blocks(N * OUT), stream)


def matmul_bwd(dinp, dweight, dbias, dout, inp, weight, *, stream=None):
    """dinp written; dweight (OUT, IN) and dbias (OUT, or None) added into; dout's rows may be padded."""
    shape = shape_of("inp", inp)
    N, IN = rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    p_dout, ldo = rows_ptr("dout", dout, shape[:-1] + (OUT,))
    args = [ptr("dinp", dinp, shape), ptr("dweight", dweight, (OUT, IN)), opt_ptr("dbias", dbias, (OUT,)), p_dout,
            ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN)), N, IN, OUT, ldo]
    launch("k_matmul_bwd", args, (blocks(max(N * IN, OUT * IN)), 3), stream)
