"""Launcher of cuda/matvec.cuh: products of at most MATVEC_ROWS rows (sampling's decode step, one position a
sequence), which the fast and tc variants send here instead of to a 128-row SGEMM tile, with the decode step's
layernorm, GELU and residual add fused in where it asks for them (microgpt.kernels.decode).

    matvec(out, inp, weight, bias, M, K, N, stream)   # checked pointers: out (M, N) = inp (M, K) @ weight^T + bias
    matvec(x, inp, weight, bias, M, K, N, stream, resid=x)                 # x += inp @ weight^T + bias
    matvec(out, x, weight, bias, M, K, N, stream, ln=(w, b), gelu=True)    # out = gelu(layernorm(x) @ weight^T + bias)

The header's enum MatvecLaunch is read here for the row limit, the block, and the columns below which a block's
warps split K.
"""
from __future__ import annotations

import functools
import math

from .runtime import device_of, launch
from .source import int_constants


@functools.cache  # (read from the preprocessed source once)
def matvec_launch() -> tuple[int, int, int]:
    """(MATVEC_ROWS, MATVEC_WARPS, MATVEC_SPLIT_BELOW) of cuda/matvec.cuh (enum MatvecLaunch): the most rows a
    product may have to come here, the warps of a block (a column each), and the columns below which a block's
    warps share one column, each a part of K."""
    c = int_constants()
    return c["MATVEC_ROWS"], c["MATVEC_WARPS"], c["MATVEC_SPLIT_BELOW"]


def fits(M: int, K: int, layernorm: bool, stream=None) -> bool:
    """Whether a product of M rows of K takes k_matvec: M <= MATVEC_ROWS, and with the layernorm its M rows fit
    in a block's shared memory."""
    return 0 < M <= matvec_launch()[0] and (not layernorm or 4 * M * K <= device_of(stream).max_shared)


def matvec(out: int, inp: int, weight: int, bias: int, M: int, K: int, N: int, stream=None, *, ln=(0, 0),
           gelu: bool = False, resid: int = 0) -> None:
    """out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N; 0 for none), 1 <= M <= MATVEC_ROWS, on pointers already
    checked; ln = (w, b): inp layernormed first; gelu: GELU of that; resid (M, N; may be out): added last. float4
    loads where K % 4 == 0 and inp, weight lie on 16-byte boundaries."""
    max_rows, warps, split_below = matvec_launch()
    if not fits(M, K, False, stream):
        raise ValueError(f"M must be in [1, {max_rows}] for k_matvec, got {M}")
    rows_kernel = 1 << (M - 1).bit_length()  # k_matvec_1, _2, _4 or _8
    vec4 = int(K % 4 == 0 and inp % 16 == 0 and weight % 16 == 0)
    split = warps if N < split_below else 1
    fused = [what for what, on in (("the layernorm", ln[0]), ("GELU", gelu), ("the residual add", resid)) if on]
    why = [f"{M} rows <= MATVEC_ROWS = {max_rows}: one pass over the weights, not a 128-row tile",
           f"N = {N} < MATVEC_SPLIT_BELOW = {split_below}: K split over a block's warps" if split > 1 else "",
           f"{' and '.join(fused)} fused in" if fused else ""]
    launch(f"k_matvec_{rows_kernel}", [out, inp, weight, bias, ln[0], ln[1], resid, M, K, N, int(gelu), split, vec4],
           max(1, math.ceil(N * split / warps)), stream, shared=4 * M * K if ln[0] else 0, block=32 * warps,
           dependent=True, why="; ".join(filter(None, why)))
