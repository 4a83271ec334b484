"""Launcher of cuda/matvec.cuh: products of at most MATVEC_ROWS rows (sampling's decode step, one position a
sequence), which the fast and tc variants' matmul_fwd send here instead of to a 128-row SGEMM tile.

    matvec(out, inp, weight, bias, M, K, N, stream)   # checked pointers: out (M, N) = inp (M, K) @ weight^T + bias

The header's enum MatvecLaunch is read here for the row limit, the grid and the block.
"""
from __future__ import annotations

import functools
import math

from .runtime import launch
from .source import int_constants


@functools.cache  # (read from the preprocessed source once)
def matvec_launch() -> tuple[int, int, int]:
    """(MATVEC_ROWS, MATVEC_COLS, MATVEC_THREADS) of cuda/matvec.cuh (enum MatvecLaunch): the most rows a
    product may have to come here, the output columns a block and the threads of that block."""
    c = int_constants()
    return c["MATVEC_ROWS"], c["MATVEC_COLS"], c["MATVEC_THREADS"]


def matvec(out: int, inp: int, weight: int, bias: int, M: int, K: int, N: int, stream=None) -> None:
    """out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N; 0 for none), 1 <= M <= MATVEC_ROWS, on pointers
    already checked; float4 loads where K % 4 == 0 and inp, weight lie on 16-byte boundaries."""
    max_rows, cols, threads = matvec_launch()
    if not 1 <= M <= max_rows:
        raise ValueError(f"M must be in [1, {max_rows}] for k_matvec, got {M}")
    vec4 = int(K % 4 == 0 and inp % 16 == 0 and weight % 16 == 0)
    launch("k_matvec", [out, inp, weight, bias, M, K, N, vec4], max(1, math.ceil(N / cols)), stream, block=threads,
           why=f"{M} rows <= MATVEC_ROWS = {max_rows}: one pass over the weights, not a 128-row tile")
