"""Launchers of cuda/embed.cuh: the token and position embedding, forward and backward."""
from __future__ import annotations

import numpy as np

from .checks import check_ids, ptr, read_ids, shape_of
from .runtime import blocks, device_of, launch


def embed_fwd_args(x, idx, wte, wpe, check_token_ids=True, stream=None) -> list:
    """The checked arguments of k_embed_fwd and k_embed_fwd_fast: x, idx, wte, wpe, B, T, C (with
    check_token_ids, idx read back and refused unless every id lies in the vocabulary)."""
    B, T = shape_of("idx", idx, 2)
    V, C = shape_of("wte", wte, 2)
    T_max = shape_of("wpe", wpe, 2)[0]
    if T > T_max:
        raise ValueError(f"idx has T={T} positions, above wpe's {T_max}")
    return [ptr("x", x, (B, T, C)), check_ids("idx", idx, (B, T), V, check_token_ids, stream),
            ptr("wte", wte, (V, C)), ptr("wpe", wpe, (T_max, C)), B, T, C]


def embed_fwd(x, idx, wte, wpe, *, check_token_ids=True, stream=None):
    """x (B, T, C) = wte[idx] + wpe[:T]."""
    args = embed_fwd_args(x, idx, wte, wpe, check_token_ids, stream)
    B, T, C = args[-3:]
    launch("k_embed_fwd", args, blocks(B * T * C), stream)


def token_order(idx: np.ndarray) -> np.ndarray:
    """The positions of idx (B, T) sorted by token id, stably: what embed_bwd reads as `order`."""
    return np.argsort(np.asarray(idx).reshape(-1), kind="stable").astype(np.int32).reshape(np.shape(idx))


def embed_bwd_args(dwte, dwpe, dx, idx, order, check_token_ids=True, stream=None) -> tuple[list, object]:
    """The checked arguments of k_embed_bwd and k_embed_bwd_fast (dwte, dwpe, dx, idx, order, B, T, C), and the
    order array they point into, which the caller keeps until the launch: where order is None it is computed
    here from idx (a read-back); with check_token_ids, a given order is read back and refused unless it is
    token_order(idx)."""
    B, T, C = shape_of("dx", dx, 3)
    V = shape_of("dwte", dwte, 2)[0]
    T_max = shape_of("dwpe", dwpe, 2)[0]
    if T > T_max:
        raise ValueError(f"dx has T={T} positions, above dwpe's {T_max}")
    idx_ptr = check_ids("idx", idx, (B, T), V, check_token_ids, stream)
    if order is None:
        order = device_of(stream).ga.to_gpu(token_order(read_ids(idx_ptr, (B, T), stream)))
    elif check_token_ids:
        host_order = read_ids(ptr("order", order, (B, T), np.int32), (B, T), stream)
        if not np.array_equal(host_order, token_order(read_ids(idx_ptr, (B, T), stream))):
            raise ValueError("order must be token_order(idx): the positions sorted stably by token id")
    return [ptr("dwte", dwte, (V, C)), ptr("dwpe", dwpe, (T_max, C)), ptr("dx", dx, (B, T, C)), idx_ptr,
            ptr("order", order, (B, T), np.int32), B, T, C], order


def embed_bwd(dwte, dwpe, dx, idx, order=None, *, check_token_ids=True, stream=None):
    """dwte (V, C) += dx gathered by token; dwpe (T_max, C)[:T] += dx summed over the batch.
    order (B, T) int32 is token_order(idx); without it, it is computed here from idx (a read-back)."""
    args, order = embed_bwd_args(dwte, dwpe, dx, idx, order, check_token_ids, stream)
    B, T, C = args[-3:]
    launch("k_embed_bwd", args, (blocks(B * T * C), 2), stream)
