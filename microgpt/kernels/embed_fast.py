"""Launchers of cuda/embed_fast.cuh: the embedding backward with k_embed_bwd's order of additions (its bits), a
warp per window of sorted positions (the token rows) and a warp per position (the position rows), 16-byte
chunks where the arrays allow. The header's enum EmbedBwdLaunch is read here for the grid."""
from __future__ import annotations

import functools
import math

from .embed import embed_bwd_args
from .runtime import BLOCK, launch
from .source import int_constants

WARP = 32


@functools.cache
def _sizes() -> tuple[int, int]:
    """EB_WINDOW and EB_COLS of cuda/embed_fast.cuh: sorted positions and columns a warp covers."""
    c = int_constants()
    return c["EB_WINDOW"], c["EB_COLS"]


def embed_bwd_fast_grid(B: int, T: int, C: int) -> int:
    """Blocks of k_embed_bwd_fast: the token part's (a warp per window and column span), then the position
    part's (a warp per position and span), as the kernel splits them."""
    window, cols = _sizes()
    spans, warps = math.ceil(C / cols), BLOCK // WARP
    return math.ceil(math.ceil(B * T / window) * spans / warps) + math.ceil(T * spans / warps)


def embed_bwd_fast(dwte, dwpe, dx, idx, order=None, *, check_token_ids=True, stream=None):
    """As embed_bwd (the same bits): dwte (V, C) += dx gathered by token, each token's positions added in order;
    dwpe (T_max, C)[:T] += dx summed over the batch in order."""
    args, order = embed_bwd_args(dwte, dwpe, dx, idx, order, check_token_ids, stream)
    B, T, C = args[-3:]
    launch("k_embed_bwd_fast", args, embed_bwd_fast_grid(B, T, C), stream)
