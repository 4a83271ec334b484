"""Launcher of cuda/matvec.cuh: products of at most MATVEC_ROWS rows (sampling's decode step, one position a
sequence), which the fast and tc variants' matmul_fwd send here instead of to a 128-row SGEMM tile.

    matvec(out, inp, weight, bias, M, K, N, stream)   # checked pointers: out (M, N) = inp (M, K) @ weight^T + bias
"""
from __future__ import annotations

import math

from .runtime import BLOCK, launch

MATVEC_ROWS = 8  # as cuda/matvec.cuh
MATVEC_COLS = 4  # output columns a block of BLOCK threads (cuda/matvec.cuh's MATVEC_THREADS)


def matvec(out: int, inp: int, weight: int, bias: int, M: int, K: int, N: int, stream=None) -> None:
    """out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N; 0 for none), 1 <= M <= MATVEC_ROWS, on pointers
    already checked; float4 loads where K % 4 == 0 and inp, weight lie on 16-byte boundaries."""
    if not 1 <= M <= MATVEC_ROWS:
        raise ValueError(f"M must be in [1, {MATVEC_ROWS}] for k_matvec, got {M}")
    vec4 = int(K % 4 == 0 and inp % 16 == 0 and weight % 16 == 0)
    launch("k_matvec", [out, inp, weight, bias, M, K, N, vec4], max(1, math.ceil(N / MATVEC_COLS)), stream,
           block=BLOCK)
