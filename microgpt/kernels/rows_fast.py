"""Launchers of cuda/rows_fast.cuh: a warp per row (softmax, the embedding's positions) or a block per row
(the cross-entropy over the vocabulary); each reduction in a fixed order. The header's MB_UNROLL, the chunks a
thread of the memory-bound fast kernels has in flight, is read here (unroll()) for their grids, and its
CE_SMEM_MAX_FLOATS (kept_row_floats()) for the cross-entropy forward's shared memory."""
from __future__ import annotations

import functools

from .checks import causal_flag, ptr, rows, shape_of
from .crossentropy import crossentropy_bwd_args, crossentropy_fwd_args
from .embed import embed_fwd_args
from .runtime import BLOCK, blocks, device_of, launch
from .source import int_constants

WARP = 32
GRID_Y = 65535  # the most blocks a launch may have along y
# k_crossentropy_fwd_fast's static shared memory, which the device's limit on a block's shared memory also counts:
# its warps' (max, sum) pairs, 256 bytes, padded to the 1024-byte alignment that matmul_tc's tiles give the dynamic
# shared memory of every kernel of the translation unit (ptxas: 1024 bytes smem)
CE_STATIC_SHARED = 1024


@functools.cache
def unroll() -> int:
    """MB_UNROLL of cuda/rows_fast.cuh (enum MemoryBoundLaunch)."""
    return int_constants()["MB_UNROLL"]


@functools.cache
def kept_row_floats() -> int:
    """CE_SMEM_MAX_FLOATS of cuda/rows_fast.cuh (enum CrossEntropyFwdLaunch): the most floats of shared memory a
    row of the cross-entropy forward is given, V + 3 (its 16-byte chunks aligned as the logits' are)."""
    return int_constants()["CE_SMEM_MAX_FLOATS"]


def softmax_fwd_fast(probs, x, *, causal=False, stream=None):
    """As softmax_fwd, a warp per row held in registers; causal=True reads row i's first i + 1 columns
    only and writes the rest 0."""
    shape = shape_of("x", x)
    n_rows, cols = rows(shape)
    args = [ptr("probs", probs, shape), ptr("x", x, shape), n_rows, cols, causal_flag("x", shape, causal)]
    launch("k_softmax_fwd_fast", args, blocks(n_rows * WARP), stream)


def softmax_bwd_fast(dx, dprobs, probs, *, causal=False, stream=None):
    """As softmax_bwd; causal=True reads row i's first i + 1 columns only and writes the rest 0."""
    shape = shape_of("probs", probs)
    n_rows, cols = rows(shape)
    args = [ptr("dx", dx, shape), ptr("dprobs", dprobs, shape), ptr("probs", probs, shape), n_rows, cols,
            causal_flag("probs", shape, causal)]
    launch("k_softmax_bwd_fast", args, blocks(n_rows * WARP), stream)


def crossentropy_fwd_fast(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """As crossentropy_fwd, a block of BLOCK threads per position. A row that fits in kept_row_floats() and in what
    the device allows a block is kept in shared memory by the kernel's first pass for its second, instead of read
    again from global memory; the kernel takes the path the launch gives it memory for, with the same bits."""
    args = crossentropy_fwd_args(losses, probs, logits, targets, check_token_ids, stream)
    N, V = args[4:6]
    kept = 4 * (V + 3)
    fits = V + 3 <= kept_row_floats() and kept + CE_STATIC_SHARED <= device_of(stream).max_shared
    launch("k_crossentropy_fwd_fast", args, blocks(N * BLOCK), stream, shared=kept if fits else 0,
           why="a block a row, kept in shared memory between its passes" if fits else "a block a row, read twice")


def crossentropy_bwd_fast(dlogits, probs, targets, dlosses, *, check_token_ids=True, stream=None):
    """As crossentropy_bwd (the same bits), a block per position (up to GRID_Y of them, looping past it)."""
    args = crossentropy_bwd_args(dlogits, probs, targets, dlosses, check_token_ids, stream)
    N = args[4]
    launch("k_crossentropy_bwd_fast", args, (1, min(N, GRID_Y)), stream)


def embed_fwd_fast(x, idx, wte, wpe, *, check_token_ids=True, stream=None):
    """As embed_fwd (the same bits), a warp per position."""
    args = embed_fwd_args(x, idx, wte, wpe, check_token_ids, stream)
    B, T = args[-3:-1]
    launch("k_embed_fwd_fast", args, blocks(B * T * WARP), stream)
