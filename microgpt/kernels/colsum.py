"""Launchers of cuda/colsum.cuh: deterministic column sums (bias and layernorm weight gradients)."""
from __future__ import annotations

import math

from .checks import ptr, rows, rows_ptr, shape_of
from .runtime import launch, scratch

REDUCE_BLOCK = 64  # threads a block of k_colsum_reduce: a column each, spread over more SMs than 256 would be


def chunks(N: int) -> tuple[int, int]:
    """(rows per chunk, number of chunks) of a column sum over N rows: 32 chunks (docs/kernels/colsum.md).
    A function of N alone, so the order of every sum is too."""
    rows_per_chunk = max(8, math.ceil(N / 32))
    return rows_per_chunk, math.ceil(N / rows_per_chunk)


def reduce_chunks(out_ptr: int, partials_ptr: int, n_chunks: int, C: int, stream) -> None:
    """out (C,) += the chunks' partial sums (n_chunks, C, at partials_ptr), added in chunk order."""
    launch("k_colsum_reduce", [out_ptr, partials_ptr, n_chunks, C], math.ceil(C / REDUCE_BLOCK), stream,
           block=REDUCE_BLOCK, why=f"adds the {n_chunks} chunks' sums in order")


def add_column_sums(out_ptr: int, x_ptr: int, N: int, C: int, stream, ldx: int | None = None) -> None:
    """out (C,) += the column sums of x (N, C; its rows ldx floats apart, C where None), on checked pointers."""
    ldx = C if ldx is None else ldx
    rows_per_chunk, n_chunks = chunks(N)
    partials = scratch(n_chunks * C, stream)
    vec = 4 if C % 4 == 0 and ldx % 4 == 0 and x_ptr % 16 == 0 else 1  # a lane's columns: a 16-byte load a row
    launch("k_colsum_partial", [int(partials.gpudata), x_ptr, N, C, ldx, rows_per_chunk, int(vec == 4)],
           (math.ceil(C / (32 * vec)), n_chunks, 1), stream,
           why=f"column sums of {n_chunks} chunks of {rows_per_chunk} rows")
    reduce_chunks(out_ptr, int(partials.gpudata), n_chunks, C, stream)


def colsum(out, x, *, stream=None):
    """out (C,) += the sums over every row of x (..., C; its rows may be padded: checks.rows_ptr), deterministically."""
    shape = shape_of("x", x)
    N, C = rows(shape)
    p_out, (p_x, ldx) = ptr("out", out, (C,)), rows_ptr("x", x, shape)
    add_column_sums(p_out, p_x, N, C, stream, ldx)
