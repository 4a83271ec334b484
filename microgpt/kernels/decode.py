"""Launchers of cuda/decode.cuh: one new position a sequence, with every layer's keys and values cached.

`pos` is a device int32 array of shape (1,) holding the new position p: the kernels read it when they run,
so a plan of these launches recorded once replays for every token. Its value is not read back here (that
would cost a transfer a launch): the caller keeps 0 <= p < T_max, and a kernel given a p outside it writes
nothing.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .checks import check_ids, head_dims, ptr, shape_of
from .runtime import BLOCK, blocks, device_of, launch, scratch
from .source import int_constants


@functools.cache  # (read from the preprocessed source once)
def decode_chunk() -> int:
    """DECODE_CHUNK of cuda/decode.cuh (enum DecodeLaunch): the cached positions a block of k_attention_decode."""
    return int_constants()["DECODE_CHUNK"]


def embed_decode(x, tokens, wte, wpe, pos, *, check_token_ids=True, stream=None):
    """x (B, 1, C) = wte[tokens] + wpe[p]: tokens (B, 1) int32, the ids of the new position."""
    B = shape_of("tokens", tokens, 2)[0]
    V, C = shape_of("wte", wte, 2)
    T_max = shape_of("wpe", wpe, 2)[0]
    args = [ptr("x", x, (B, 1, C)), check_ids("tokens", tokens, (B, 1), V, check_token_ids, stream),
            ptr("wte", wte, (V, C)), ptr("wpe", wpe, (T_max, C)), ptr("pos", pos, (1,), np.int32), B, C]
    launch("k_embed_decode", args, blocks(B * C), stream)


def kv_store(cache, src, *, stream=None):
    """cache (B, NH, T_max, d_k)[:, :, :T] = src (B, NH, T, d_k), T <= T_max: a prefilled prompt's keys or
    values."""
    B, NH, T, d_k = head_dims("src", src)
    T_max = head_dims("cache", cache)[2]
    if T > T_max:
        raise ValueError(f"src has T={T} positions, above the cache's {T_max}")
    args = [ptr("cache", cache, (B, NH, T_max, d_k)), ptr("src", src, (B, NH, T, d_k)), B * NH, T, T_max, d_k]
    launch("k_kv_store", args, blocks(B * NH * T * d_k), stream)


def attention_decode(y, k_cache, v_cache, qkv, pos, *, stream=None):
    """The attention of the new position p of each sequence: its key and value (from qkv (B, 1, 3C), as
    split_heads reads it) written into the caches (B, NH, T_max, d_k) at row p, then y (B, 1, C) =
    softmax(q K[:p+1]^T * (1/sqrt(d_k))) V[:p+1] per head, heads side by side as merge_heads writes them.
    Two launches: a block a chunk of DECODE_CHUNK cached positions of a head (its partial softmax and weighted
    values, into scratch), then one a head adding its chunks in order."""
    B, NH, T_max, d_k = head_dims("k_cache", k_cache)
    C = NH * d_k
    chunk = decode_chunk()
    shared = 4 * (chunk + d_k + BLOCK)  # a chunk's scores, the query, the partial sums
    if shared > device_of(stream).max_shared:
        raise ValueError(f"k_cache has d_k={d_k}: its query and partial sums take {shared} bytes of shared memory, "
                         f"above this GPU's {device_of(stream).max_shared}")
    chunks = math.ceil(T_max / chunk)
    partial = scratch(B * NH * chunks * (d_k + 2), stream)
    p_pos = ptr("pos", pos, (1,), np.int32)
    args = [int(partial.gpudata), ptr("k_cache", k_cache, (B, NH, T_max, d_k)),
            ptr("v_cache", v_cache, (B, NH, T_max, d_k)), ptr("qkv", qkv, (B, 1, 3 * C)), p_pos, NH, d_k, T_max]
    launch("k_attention_decode", args, (chunks, B * NH), stream, shared=shared)
    launch("k_attention_decode_merge", [ptr("y", y, (B, 1, C)), int(partial.gpudata), p_pos, NH, d_k, T_max, chunks],
           B * NH, stream)
