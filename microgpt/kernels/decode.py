"""Launchers of cuda/decode.cuh: one new position a sequence, with every layer's keys and values cached; and the
decode step's products with the work around them fused in (layernorm_matmul_fwd, matmul_residual_fwd: k_matvec of
cuda/matvec.cuh in the fast and tc variants, the readable kernels one after the other in the reference one).

`pos` is a device int32 array of shape (1,) holding the new position p: the kernels read it when they run,
so a plan of these launches recorded once replays for every token. Its value is not read back here (that
would cost a transfer a launch): the caller keeps 0 <= p < T_max, and a kernel given a p outside it writes
nothing.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .checks import check_ids, head_dims, opt_ptr, ptr, rows, shape_of
from .layernorm import layernorm_fwd
from .layernorm_fast import layernorm_fwd_fast
from .matmul import matmul_fwd
from .matvec import fits, matvec
from .pointwise import gelu_fwd, residual_fwd
from .pointwise_fast import gelu_fwd_fast
from .runtime import BLOCK, blocks, counters, launch, scratch, shared_limit
from .source import int_constants


@functools.cache  # (read from the preprocessed source once)
def decode_chunk() -> int:
    """DECODE_CHUNK of cuda/decode.cuh (enum DecodeLaunch): the cached positions a block of k_attention_decode."""
    return int_constants()["DECODE_CHUNK"]


def decode_shared_bytes(d_k: int, threads: int = BLOCK) -> int:
    """k_attention_decode's dynamic shared memory in bytes, for blocks of `threads`: cuda/decode.cuh's
    decode_shared_floats(d_k, threads) floats (the chunk's keys and values in rows of decode_row(d_k): d_k rounded
    up to 4, then up to 16 past a multiple of 32; the query; each warp's weighted values, max and sum). Python
    cannot evaluate the header's constexpr functions, so this is their copy; tests/test_cuda_source.py compiles
    the header's and holds the two equal."""
    d_pad, warps = -(-d_k // 4) * 4, threads // 32
    row = (d_pad + 15) // 32 * 32 + 16
    return 4 * (2 * decode_chunk() * row + (warps + 1) * d_pad + 2 * warps)


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
    A block a chunk of DECODE_CHUNK cached positions of a head (its partial softmax and weighted values, into
    scratch); the head's last block to finish adds its chunks in order."""
    B, NH, T_max, d_k = head_dims("k_cache", k_cache)
    C = NH * d_k
    chunk, shared = decode_chunk(), decode_shared_bytes(d_k)
    limit = shared_limit("k_attention_decode", stream)
    if shared > limit:
        raise ValueError(f"k_cache has d_k={d_k}: a block's chunk of keys and values, query and partial sums take "
                         f"{shared} bytes of shared memory, above this GPU's {limit}")
    chunks = math.ceil(T_max / chunk)
    partial, done = scratch(B * NH * chunks * (d_k + 2), stream), counters(B * NH, stream)
    p_k, p_v = ptr("k_cache", k_cache, (B, NH, T_max, d_k)), ptr("v_cache", v_cache, (B, NH, T_max, d_k))
    vec4 = int(d_k % 4 == 0 and p_k % 16 == 0 and p_v % 16 == 0)
    args = [ptr("y", y, (B, 1, C)), int(partial.gpudata), int(done.gpudata), p_k, p_v,
            ptr("qkv", qkv, (B, 1, 3 * C)), ptr("pos", pos, (1,), np.int32), NH, d_k, T_max, vec4]
    launch("k_attention_decode", args, (chunks, B * NH), stream, shared=shared, dependent=True)


def _layernorm_matmul_args(out, x, w, b, weight, bias) -> tuple:
    """Checks layernorm_matmul_fwd's arguments by name: (x's shape, M rows, C, N columns, the pointers)."""
    shape = shape_of("x", x)
    M, C = rows(shape)
    N = shape_of("weight", weight, 2)[0]
    return shape, M, C, N, (ptr("out", out, shape[:-1] + (N,)), ptr("x", x, shape), ptr("w", w, (C,)),
                            ptr("b", b, (C,)), ptr("weight", weight, (N, C)), opt_ptr("bias", bias, (N,)))


def _matmul_residual_args(x, inp, weight, bias) -> tuple:
    """Checks matmul_residual_fwd's arguments by name: (inp's shape, M rows, K, C columns, the pointers)."""
    shape = shape_of("inp", inp)
    M, K = rows(shape)
    C = shape_of("weight", weight, 2)[0]
    return shape, M, K, C, (ptr("x", x, shape[:-1] + (C,)), ptr("inp", inp, shape), ptr("weight", weight, (C, K)),
                            opt_ptr("bias", bias, (C,)))


def one_after_the_other(layernorm_fwd, matmul_fwd, gelu_fwd) -> tuple:
    """layernorm_matmul_fwd and matmul_residual_fwd as these launchers of the unfused steps one after the other
    (every argument checked first, by the fused op's names); the residual add the reference kernel's."""

    def layernorm_matmul_fwd(out, x, w, b, weight, bias, *, gelu=False, stream=None):
        """out (..., N) = layernorm(x) @ weight (N, C)^T + bias (gelu: GELU of it), x (..., C): the decode step's
        layernorm and the product that reads it."""
        shape, M, C, _, _ = _layernorm_matmul_args(out, x, w, b, weight, bias)
        ln, mean, rstd = (scratch(n, stream) for n in (M * C, M, M))
        layernorm_fwd(ln.reshape(shape), mean.reshape(shape[:-1]), rstd.reshape(shape[:-1]), x, w, b, stream=stream)
        matmul_fwd(out, ln.reshape(shape), weight, bias, stream=stream)
        if gelu:
            gelu_fwd(out, out, stream=stream)  # element by element: in place

    def matmul_residual_fwd(x, inp, weight, bias, *, stream=None):
        """x (..., C) += inp (..., K) @ weight (C, K)^T + bias: the decode step's product and the residual add after
        it."""
        shape, M, _, C, _ = _matmul_residual_args(x, inp, weight, bias)
        branch = scratch(M * C, stream).reshape(shape[:-1] + (C,))
        matmul_fwd(branch, inp, weight, bias, stream=stream)
        residual_fwd(x, x, branch, stream=stream)  # element by element: in place

    return layernorm_matmul_fwd, matmul_residual_fwd


# the reference variant's: the readable kernels one after the other
layernorm_matmul_fwd, matmul_residual_fwd = one_after_the_other(layernorm_fwd, matmul_fwd, gelu_fwd)


def fused(matmul_fwd, variant: str) -> tuple:
    """The decode step's fused products, layernorm_matmul_fwd_<variant> and matmul_residual_fwd_<variant>: one
    k_matvec each where it takes them; elsewhere (more rows than MATVEC_ROWS, layernormed rows past shared memory)
    the fast layernorm, the variant's matmul_fwd, the fast GELU and the residual add one after the other."""
    unfused_ln, unfused_resid = one_after_the_other(layernorm_fwd_fast, matmul_fwd, gelu_fwd_fast)

    def layernorm_matmul_fwd(out, x, w, b, weight, bias, *, gelu=False, stream=None):
        """out = layernorm(x) @ weight^T + bias (gelu: GELU of it), x (..., C), weight (N, C)."""
        _, M, C, N, (p_out, p_x, p_w, p_b, p_weight, p_bias) = _layernorm_matmul_args(out, x, w, b, weight, bias)
        if fits(M, C, N, True, stream):
            matvec(p_out, p_x, p_weight, p_bias, M, C, N, stream, ln=(p_w, p_b), gelu=gelu)
        else:
            unfused_ln(out, x, w, b, weight, bias, gelu=gelu, stream=stream)

    def matmul_residual_fwd(x, inp, weight, bias, *, stream=None):
        """x += inp @ weight^T + bias, inp (..., K), weight (C, K), x (..., C)."""
        _, M, K, C, (p_x, p_inp, p_weight, p_bias) = _matmul_residual_args(x, inp, weight, bias)
        if fits(M, K, C, False, stream):
            matvec(p_x, p_inp, p_weight, p_bias, M, K, C, stream, resid=p_x)
        else:
            unfused_resid(x, inp, weight, bias, stream=stream)

    for fn in (layernorm_matmul_fwd, matmul_residual_fwd):
        fn.__name__ = fn.__qualname__ = f"{fn.__name__}_{variant}"
    return layernorm_matmul_fwd, matmul_residual_fwd
