"""Launchers of cuda/matmul_fast.cuh: the tiled SIMT SGEMM, one launch of a product (microgpt.kernels.products
plans it), and split-K's reduction.

A 128 x 128 tile (128 x 64 where N fits in it: attention's d_k), causal tile skipping for attention; split-K,
deterministic, where a single product has too few tiles to fill the GPU (the weight gradients), its slices added
in order by k_splitk_reduce.
"""
from __future__ import annotations

import enum

from .runtime import blocks, launch

GEMM_TILE = 128  # the M of one SGEMM block; its N is 128, or 64 for narrow products


class Causal(enum.IntEnum):
    """What the product may skip; mirrors `enum Causal` of cuda/matmul_fast.cuh."""
    NONE = 0
    OUT_LOWER = 1  # C is lower triangular: C[m][n] = fill for n > m
    A_LOWER = 2    # A is lower triangular: A[m][k] = 0 for k > m
    A_UPPER = 3    # A is upper triangular: A[m][k] = 0 for k < m


def sgemm_launch(g, c: int, a: int, b: int, bias: int, stream) -> None:
    """One unsplit launch of g (a products.Gemm) on the SIMT SGEMM."""
    launch(g.kernel, g.args(c, a, b, bias), g.grid, stream, why=f"SIMT SGEMM, 128 x {g.tile_n} tiles" + (
        f", {g.causal.name} tiles skipped" if g.causal else ""))


def splitk_reduce(c: int, partials: int, splits: int, MN: int, beta: float, sums: int, M: int, stream) -> None:
    """c (MN floats) = beta * c + the slices' partial products ([splits][MN] at partials) added in slice order, and
    sums (M,) += their row sums ([splits][M], after the partial products) where M > 0 (k_splitk_reduce)."""
    launch("k_splitk_reduce", [c, partials, splits, MN, float(beta), sums, M], blocks(MN + M), stream,
           why="adds the slices in order")
