"""Launchers of cuda/heads_fast.cuh: the head split as copies of (T, d_k) matrices between row strides, a block
a matrix's tile of rows; the merge a block a (B, T, C) row; the reference kernels' bits (a copy)."""
from __future__ import annotations

import math

from .attention import merge_heads_bwd_args, merge_heads_fwd_args, split_heads_bwd_args, split_heads_fwd_args
from .rows_fast import GRID_Y, WARP, unroll
from .runtime import BLOCK, launch


def head_grid(matrices: int, T: int, d_k: int) -> tuple[int, int]:
    """(matrices, tiles of rows): a tile is MB_UNROLL passes of BLOCK // w rows (at least one), w = the chunks
    of a row (d_k / 4 16-byte ones where d_k % 4 == 0, else d_k floats); at most GRID_Y tiles, the kernels
    loop past them."""
    width = d_k // 4 if d_k % 4 == 0 else d_k
    rows_per_tile = unroll() * max(1, BLOCK // width)
    return matrices, min(math.ceil(T / rows_per_tile), GRID_Y)


def split_heads_fwd_fast(q, k, v, qkv, n_head, *, stream=None):
    """As split_heads_fwd: qkv (B, T, 3C) -> q, k, v (B, NH, T, d_k)."""
    args = split_heads_fwd_args(q, k, v, qkv, n_head)
    B, T, NH, d_k = args[-4:]
    launch("k_split_heads_fwd_fast", args, head_grid(3 * B * NH, T, d_k), stream)


def split_heads_bwd_fast(dqkv, dq, dk, dv, *, stream=None):
    args = split_heads_bwd_args(dqkv, dq, dk, dv)
    B, T, NH, d_k = args[-4:]
    launch("k_split_heads_bwd_fast", args, head_grid(3 * B * NH, T, d_k), stream)


def merge_launch(name: str, args: list, stream) -> None:
    """A block a (B, T, C) row, a thread a chunk of it (d_k / 4 16-byte ones a head where d_k % 4 == 0, else
    d_k floats), rounded up to a warp, at most 1024 (longer rows loop); at most 2^31 - 1 blocks (they loop)."""
    B, T, NH, d_k = args[-4:]
    chunks = NH * (d_k // 4 if d_k % 4 == 0 else d_k)
    threads = min(1024, WARP * math.ceil(chunks / WARP))
    launch(name, args, min(B * T, 2 ** 31 - 1), stream, block=threads)


def merge_heads_fwd_fast(y, heads, *, stream=None):
    """As merge_heads_fwd: heads (B, NH, T, d_k) -> y (B, T, NH * d_k)."""
    merge_launch("k_merge_heads_fwd_fast", merge_heads_fwd_args(y, heads), stream)


def merge_heads_bwd_fast(dheads, dy, n_head, *, stream=None):
    merge_launch("k_merge_heads_bwd_fast", merge_heads_bwd_args(dheads, dy, n_head), stream)
