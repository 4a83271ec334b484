"""Launchers of cuda/pointwise_fast.cuh: GELU forward and backward, each thread 4 * MB_UNROLL elements (in
16-byte chunks where aligned); the reference kernels' bits, since each element is their expression. And the fast
variant's mlp.proj backward into GELU's: its product, then this GELU backward."""
from __future__ import annotations

import math

from .pointwise import gelu_bwd_args, gelu_fwd_args, matmul_then_gelu_bwd
from .products import matmul_bwd_fast
from .rows_fast import unroll
from .runtime import blocks, launch


def elementwise_blocks(n: int) -> int:
    """Blocks of the fast elementwise kernels over n elements: a thread's share is MB_UNROLL chunks of 4."""
    return blocks(math.ceil(n / (4 * unroll())))


def gelu_fwd_fast(out, x, *, stream=None):
    args = gelu_fwd_args(out, x)
    launch("k_gelu_fwd_fast", args, elementwise_blocks(args[-1]), stream)


def gelu_bwd_fast(dx, dout, x, *, stream=None):
    args = gelu_bwd_args(dx, dout, x)
    launch("k_gelu_bwd_fast", args, elementwise_blocks(args[-1]), stream)


matmul_gelu_bwd_fast = matmul_then_gelu_bwd(matmul_bwd_fast, gelu_bwd_fast, "matmul_gelu_bwd_fast")
