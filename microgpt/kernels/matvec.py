"""Launcher of cuda/matvec.cuh: products of at most MATVEC_ROWS rows (sampling's decode step, one position a
sequence), which the fast and tc variants send here instead of to a 128-row SGEMM tile, with the decode step's
layernorm, GELU and residual add fused in where it asks for them (microgpt.kernels.decode).

    matvec(out, inp, weight, bias, M, K, N, stream)   # checked pointers: out (M, N) = inp (M, K) @ weight^T + bias
    matvec(x, inp, weight, bias, M, K, N, stream, resid=x)                 # x += inp @ weight^T + bias
    matvec(out, x, weight, bias, M, K, N, stream, ln=(w, b), gelu=True)    # out = gelu(layernorm(x) @ weight^T + bias)

The header's enum MatvecLaunch is read here for the row limit, the block, and how a product is cut into blocks.
"""
from __future__ import annotations

import functools
import math

from .runtime import launch, shared_limit
from .source import int_constants


@functools.cache  # (read from the preprocessed source once)
def matvec_launch() -> dict:
    """cuda/matvec.cuh's enum MatvecLaunch: ROWS (the most rows a product may have to come here), THREADS (a block),
    CHUNK (the bytes of W a block stages), BLOCKS (the fewest blocks a product of enough columns is cut into),
    GROUP_FEW and GROUP (the columns a warp takes at once in k_matvec_1, _2 and in k_matvec_4, _8)."""
    c = int_constants()
    return {k: c[f"MATVEC_{k}"] for k in ("ROWS", "THREADS", "CHUNK", "BLOCKS", "GROUP_FEW", "GROUP")}


def plan(M: int, K: int, N: int, layernorm: bool) -> tuple[int, int, int, int]:
    """(R, cols, parts, shared) of a product of M rows of K by N columns: k_matvec_<R>, cols columns a block,
    parts of K a group of columns is split into (so that the block's units are a multiple of its 4 warps: one a
    warp, or whole groups in one part), and the block's dynamic shared memory in bytes. From M, K and N alone, so
    that no bit depends on the GPU."""
    c = matvec_launch()
    R = 1 << (M - 1).bit_length()  # k_matvec_1, _2, _4 or _8
    group = c["GROUP_FEW"] if R <= 2 else c["GROUP"]
    fit = max(1, c["CHUNK"] // (4 * K))
    cols = min(fit, N, group * math.ceil(math.ceil(N / c["BLOCKS"]) / group))
    if cols >= 4 * group:  # whole groups for each of the 4 warps: K in one part
        cols -= cols % (4 * group)
    elif cols > 2 * group:  # not 3 groups (12 units, 3 a warp, one after the other): 2, in 2 parts of K
        cols = 2 * group
    groups = math.ceil(cols / group)
    parts = 4 // math.gcd(groups, 4)
    return R, cols, parts, 4 * (cols * K + (M * K if layernorm else 0) + groups * parts * group * R)


def fits(M: int, K: int, N: int, layernorm: bool, stream=None) -> bool:
    """Whether a product of M rows of K by N columns takes k_matvec: M <= MATVEC_ROWS, and a block's shared memory
    holds its staged columns of W and its partial sums (with the layernorm, its M rows too)."""
    if not 0 < M <= matvec_launch()["ROWS"]:
        return False
    R, _, _, shared = plan(M, K, N, layernorm)
    return shared <= shared_limit(f"k_matvec_{R}", stream)


def matvec(out: int, inp: int, weight: int, bias: int, M: int, K: int, N: int, stream=None, *, ln=(0, 0),
           gelu: bool = False, resid: int = 0) -> None:
    """out (M, N) = inp (M, K) @ weight (N, K)^T + bias (N; 0 for none), 1 <= M <= MATVEC_ROWS, on pointers already
    checked; ln = (w, b): inp layernormed first; gelu: GELU of that; resid (M, N; may be out): added last. float4
    loads where K % 4 == 0 and inp, weight lie on 16-byte boundaries."""
    if not fits(M, K, N, bool(ln[0]), stream):
        raise ValueError(f"k_matvec takes M in [1, {matvec_launch()['ROWS']}] rows whose block fits in shared memory, "
                         f"got M={M}, K={K}, N={N}")
    R, cols, parts, shared = plan(M, K, N, bool(ln[0]))
    vec4 = int(K % 4 == 0 and inp % 16 == 0 and weight % 16 == 0)
    fused = [what for what, on in (("the layernorm", ln[0]), ("GELU", gelu), ("the residual add", resid)) if on]
    why = [f"{M} rows <= MATVEC_ROWS = {matvec_launch()['ROWS']}: one pass over the weights, not a 128-row tile",
           f"{cols} columns a block staged in shared memory" + (f", K in {parts} parts" if parts > 1 else ""),
           f"{' and '.join(fused)} fused in" if fused else ""]
    launch(f"k_matvec_{R}", [out, inp, weight, bias, ln[0], ln[1], resid, M, K, N, int(gelu), cols, parts, vec4],
           math.ceil(N / cols), stream, shared=shared, block=matvec_launch()["THREADS"], dependent=True,
           why="; ".join(filter(None, why)))
