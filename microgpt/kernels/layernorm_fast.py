"""Launchers of cuda/layernorm_fast.cuh: the layernorms a warp per row (the row in registers where it fits);
the backward a block per row, each thread owning the same 4 columns of every row its block takes, so that dw
and db add up in registers in the same pass as dx into a partial row per block, which the launch's last blocks
add up. Each reduction in a fixed order. The header's enum LayernormBwdLaunch is read here for the backward's
rows a block takes at once, its widest rows and the reduction's strip of columns."""
from __future__ import annotations

import functools
import math

from .checks import flag, ptr, rows, shape_of
from .layernorm import layernorm_fwd_args, matmul_then_layernorm_bwd
from .products import matmul_bwd_fast, matmul_bwd_tc
from .rows_fast import WARP
from .runtime import blocks, counters, device_of, launch, scratch, sm_version
from .source import int_constants

# The blocks a backward's grid aims at (one wave where four fit an SM of 132), each writing a partial row of 2 * C
# floats. A constant, not the device's SM count: which rows a block adds, and so every bit of dw and db, must not
# depend on the GPU (docs/kernels/layernorm.md).
BWD_BLOCKS = 512


@functools.cache  # (read from the preprocessed source once)
def bwd_launch() -> tuple[int, int, int]:
    """(LN_BWD_ROWS, LN_BWD_THREADS, LN_BWD_REDUCE_COLS) of cuda/layernorm_fast.cuh: the rows a block of the
    backward takes at once, its most threads (rows of up to 4 times as many columns take k_layernorm_bwd_fast,
    longer ones k_layernorm_bwd_fast_wide), and the columns of dw and db a finishing block adds at a time."""
    c = int_constants()
    return c["LN_BWD_ROWS"], c["LN_BWD_THREADS"], c["LN_BWD_REDUCE_COLS"]


@functools.cache  # (read from the preprocessed source once)
def staged_launch() -> tuple[int, int]:
    """(LN_STAGED_WARPS, LN_STAGED_MAX_C) of cuda/layernorm_fast.cuh: the rows (a warp each) of a block of
    k_layernorm_fwd_staged, and its longest rows."""
    c = int_constants()
    return c["LN_STAGED_WARPS"], c["LN_STAGED_MAX_C"]


def staged(C: int, pointers, device) -> bool:
    """Whether rows of C columns at these pointers take k_layernorm_fwd_staged on `device` (an engine): rows of 16-byte
    chunks (C % 4 == 0, every row array on a 16-byte boundary) of at most LN_STAGED_MAX_C columns, on a GPU with
    cp.async (sm_80 on). The rest take k_layernorm_fwd_fast, whose bits it gives."""
    return (C % 4 == 0 and C <= staged_launch()[1] and all(p % 16 == 0 for p in pointers)
            and sm_version(device) >= 80)


def layernorm_fwd_fast(out, mean, rstd, x, w, b, *, stream=None):
    """A warp a row: staged through shared memory where the rows allow it (k_layernorm_fwd_staged), else held in
    registers or looped over (k_layernorm_fwd_fast); the same bits either way."""
    args = layernorm_fwd_args(out, mean, rstd, x, w, b)
    N, C = args[-2:]
    p_out, _, _, p_x, p_w, p_b = args[:6]
    if staged(C, (p_out, p_x, p_w, p_b), device_of(stream)):
        warps = staged_launch()[0]
        launch("k_layernorm_fwd_staged", args, math.ceil(N / warps), stream, shared=warps * C * 4, block=warps * WARP,
               why=f"a warp a row, staged through shared memory by cp.async (16-byte rows of C = {C} <= "
                   f"{staged_launch()[1]})")
    else:
        launch("k_layernorm_fwd_fast", args, blocks(N * WARP), stream, why="a warp a row, in registers (rows not "
               "staged: C % 4, alignment, C > LN_STAGED_MAX_C or no cp.async)")


@functools.cache  # (read from the preprocessed source once)
def residual_threads() -> int:
    """RESID_LN_THREADS of cuda/layernorm_fast.cuh: the fused residual add and layernorm's threads a block."""
    return int_constants()["RESID_LN_THREADS"]


def residual_layernorm_fwd_fast(x, out, mean, rstd, resid, branch, w, b, *, stream=None):
    """x = resid + branch (written) and out = layernorm(x) in one pass, a warp per row."""
    shape = shape_of("resid", resid)
    N, C = rows(shape)
    args = [ptr("x", x, shape), ptr("out", out, shape), ptr("mean", mean, shape[:-1]),
            ptr("rstd", rstd, shape[:-1]), ptr("resid", resid, shape), ptr("branch", branch, shape),
            ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]
    threads = residual_threads()  # a warp a row
    launch("k_residual_layernorm_fwd_fast", args, math.ceil(N * WARP / threads), stream, block=threads)


def bwd_rows_per_block(N: int) -> int:
    """Rows each block of layernorm_bwd_fast takes: a multiple of the rows it takes at once, the fewest that cover
    N rows with at most BWD_BLOCKS blocks (8192 rows: 16 a block, 512 blocks). A function of N alone."""
    at_once = bwd_launch()[0]
    return at_once * max(1, math.ceil(N / (BWD_BLOCKS * at_once)))


def bwd_reducers(n_blocks: int, C: int, resident: int) -> int:
    """Blocks of a backward launch that add the partial rows into dw and db once every block is done: a strip
    of columns each, no more than the launch has, and at most a quarter of the blocks the GPU holds at once
    (`resident`), since they wait for the others in place: the blocks still to run find room, even beside three
    more such launches. Which block adds a column never changes its bits."""
    strips = math.ceil(2 * C / bwd_launch()[2])
    return max(1, min(strips, n_blocks, resident // 4))


def layernorm_bwd_fast(dx, dw, db, dout, x, w, mean, rstd, *, accumulate=False, stream=None):
    """dx written (accumulate=True: added into) and, in the same pass, each block's partial row of dw and db: a
    block of ceil(C / 4) threads (rounded up to a warp) spans a row, each thread adding its own 4 columns of dw
    and db (in registers over 4 rows, in shared memory between); rows wider than a block's most threads span take
    k_layernorm_bwd_fast_wide, each thread's columns added in the partial row itself. The launch's last blocks to
    finish then add the blocks' partials into dw and db in a fixed order."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    args = [ptr("dout", dout, shape), ptr("x", x, shape), ptr("w", w, (C,)), ptr("mean", mean, shape[:-1]),
            ptr("rstd", rstd, shape[:-1])]
    p_dx, p_dw, p_db = ptr("dx", dx, shape), ptr("dw", dw, (C,)), ptr("db", db, (C,))
    acc = flag("accumulate", accumulate)
    _, max_threads, _ = bwd_launch()
    rows_per_block = bwd_rows_per_block(N)
    n_blocks = math.ceil(N / rows_per_block)
    threads = WARP * math.ceil(C / (4 * WARP))
    if threads <= max_threads:  # each thread's 16 bytes of dw and of db in shared memory between rows
        kernel, shared = "k_layernorm_bwd_fast", 2 * 16 * threads
    else:  # the reduction's group sums: 4 floats a thread
        kernel, threads, shared = "k_layernorm_bwd_fast_wide", max_threads, 16 * max_threads
    e = device_of(stream)
    reducers = bwd_reducers(n_blocks, C, e.sm_count * e.resident_blocks(kernel, threads, shared))
    partials, done = scratch(n_blocks * 2 * C, stream), counters(2, stream)  # held here until the launch is queued
    bwd_args = [p_dx, p_dw, p_db, int(partials.gpudata), int(done.gpudata), *args, N, C, rows_per_block, acc,
                reducers]
    launch(kernel, bwd_args, n_blocks, stream, shared=shared, block=threads)


matmul_layernorm_bwd_fast = matmul_then_layernorm_bwd(matmul_bwd_fast, layernorm_bwd_fast, "matmul_layernorm_bwd_fast")
matmul_layernorm_bwd_tc = matmul_then_layernorm_bwd(matmul_bwd_tc, layernorm_bwd_fast, "matmul_layernorm_bwd_tc")
