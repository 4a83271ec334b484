"""Launchers of cuda/attention.cuh: the attention pipeline, one stage a kernel; and the same attention fused
(fused_attention_fwd/bwd: the reference of the tc variant's flash attention), and the output projection's
backward into it (matmul_attention_bwd, which the tc variant fuses).

    qkv (B, T, 3C) -> split_heads -> q, k, v (B, NH, T, d_k)
    attn_scores: scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k))         (B, NH, T, T)
    causal_mask: MASK_VALUE where j > i; softmax over j; attn_values: out[i] = sum_j A[i][j] * V[j]
    merge_heads -> y (B, T, C)

causal_scores_fwd/bwd are the scores and the mask together, the stage the fast variant fuses into one
kernel; here they are the two literal kernels one after the other.
"""
from __future__ import annotations

import numbers

from .checks import causal_flag, head_dims, opt_ptr, ptr, rows, shape_of
from .matmul import matmul_bwd
from .runtime import blocks, launch, scratch


def qkv_dims(qkv, n_head) -> tuple[int, int, int, int]:
    """(B, T, C, d_k) of the QKV projection's output qkv (B, T, 3C) split into n_head heads (n_head dividing C)."""
    B, T, C3 = shape_of("qkv", qkv, 3)
    if isinstance(n_head, bool) or not isinstance(n_head, numbers.Integral) or n_head <= 0:
        raise ValueError(f"n_head must be a positive int, got {n_head!r}")
    if C3 % 3 or (C3 // 3) % n_head:
        raise ValueError(f"qkv's last dimension {C3} must be 3 * C with n_head={n_head} dividing C")
    return B, T, C3 // 3, C3 // 3 // n_head


def split_heads_fwd_args(q, k, v, qkv, n_head) -> list:
    """The checked arguments of k_split_heads_fwd and k_split_heads_fwd_fast: q, k, v, qkv, B, T, NH, d_k."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    hs = (B, n_head, T, d_k)
    return [ptr("q", q, hs), ptr("k", k, hs), ptr("v", v, hs), ptr("qkv", qkv, (B, T, 3 * C)), B, T, n_head, d_k]


def split_heads_bwd_args(dqkv, dq, dk, dv) -> list:
    """The checked arguments of k_split_heads_bwd and k_split_heads_bwd_fast: dqkv, dq, dk, dv, B, T, NH, d_k."""
    B, NH, T, d_k = head_dims("dq", dq)
    hs = (B, NH, T, d_k)
    return [ptr("dqkv", dqkv, (B, T, 3 * NH * d_k)), ptr("dq", dq, hs), ptr("dk", dk, hs), ptr("dv", dv, hs),
            B, T, NH, d_k]


def split_heads_fwd(q, k, v, qkv, n_head, *, stream=None):
    """qkv (B, T, 3C) -> q, k, v (B, NH, T, d_k)."""
    args = split_heads_fwd_args(q, k, v, qkv, n_head)
    B, T, NH, d_k = args[-4:]
    launch("k_split_heads_fwd", args, blocks(B * T * NH * d_k), stream)


def split_heads_bwd(dqkv, dq, dk, dv, *, stream=None):
    args = split_heads_bwd_args(dqkv, dq, dk, dv)
    B, T, NH, d_k = args[-4:]
    launch("k_split_heads_bwd", args, blocks(B * T * 3 * NH * d_k), stream)


def attn_scores_fwd(scores, q, k, *, stream=None):
    """scores (B, NH, T, T): scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k))."""
    B, NH, T, d_k = head_dims("q", q)
    args = [ptr("scores", scores, (B, NH, T, T)), ptr("q", q, (B, NH, T, d_k)), ptr("k", k, (B, NH, T, d_k)),
            B * NH, T, d_k]
    launch("k_attn_scores_fwd", args, blocks(B * NH * T * T), stream)


def attn_scores_bwd(dq, dk, dscores, q, k, *, stream=None):
    B, NH, T, d_k = head_dims("q", q)
    hs = (B, NH, T, d_k)
    args = [ptr("dq", dq, hs), ptr("dk", dk, hs), ptr("dscores", dscores, (B, NH, T, T)), ptr("q", q, hs),
            ptr("k", k, hs), B * NH, T, d_k]
    launch("k_attn_scores_bwd", args, (blocks(B * NH * T * d_k), 2), stream)


def _square(name, a):
    B, NH, T, T2 = head_dims(name, a)
    if T != T2:
        raise ValueError(f"{name} must be (B, NH, T, T), got {(B, NH, T, T2)}")
    return B, NH, T


def causal_mask_fwd(out, scores, *, stream=None):
    """out = scores with MASK_VALUE where j > i; out may be scores itself."""
    B, NH, T = _square("scores", scores)
    args = [ptr("out", out, (B, NH, T, T)), ptr("scores", scores, (B, NH, T, T)), B * NH, T]
    launch("k_causal_mask_fwd", args, blocks(B * NH * T * T), stream)


def causal_mask_bwd(dscores, dout, *, stream=None):
    B, NH, T = _square("dout", dout)
    args = [ptr("dscores", dscores, (B, NH, T, T)), ptr("dout", dout, (B, NH, T, T)), B * NH, T]
    launch("k_causal_mask_bwd", args, blocks(B * NH * T * T), stream)


def causal_scores_fwd(masked, q, k, *, scores=None, stream=None):
    """masked = causal_mask(attn_scores(q, k)): the literal scores kernel, then the mask. With `scores`,
    the scores before the mask are kept there; without, they are masked in place in `masked`."""
    attn_scores_fwd(masked if scores is None else scores, q, k, stream=stream)
    causal_mask_fwd(masked, masked if scores is None else scores, stream=stream)


def causal_scores_bwd(dq, dk, dscores, q, k, *, stream=None):
    """dq, dk of causal_scores_fwd; dscores is masked in place (no gradient reaches a masked score)."""
    causal_mask_bwd(dscores, dscores, stream=stream)
    attn_scores_bwd(dq, dk, dscores, q, k, stream=stream)


def softmax_fwd(probs, x, *, causal=False, stream=None):
    """Row-wise softmax over the last axis of x (..., cols). causal=True says x holds square matrices
    masked above the diagonal (as causal_mask_fwd writes them), which the fast kernel need not read; this
    one reads the whole row, and the masked entries come out 0 either way."""
    shape = shape_of("x", x)
    causal_flag("x", shape, causal)
    n_rows, cols = rows(shape)
    launch("k_softmax_fwd", [ptr("probs", probs, shape), ptr("x", x, shape), n_rows, cols], blocks(n_rows), stream)


def softmax_bwd(dx, dprobs, probs, *, causal=False, stream=None):
    """dx = probs * (dprobs - rowsum(dprobs * probs)); causal=True as softmax_fwd (probs 0 above the
    diagonal, so dx is 0 there too)."""
    shape = shape_of("probs", probs)
    causal_flag("probs", shape, causal)
    n_rows, cols = rows(shape)
    args = [ptr("dx", dx, shape), ptr("dprobs", dprobs, shape), ptr("probs", probs, shape), n_rows, cols]
    launch("k_softmax_bwd", args, blocks(n_rows), stream)


def attn_values_fwd(out, probs, v, *, stream=None):
    """out (B, NH, T, d_k): out[i] = sum_j A[i][j] * V[j]."""
    B, NH, T, d_k = head_dims("v", v)
    args = [ptr("out", out, (B, NH, T, d_k)), ptr("probs", probs, (B, NH, T, T)), ptr("v", v, (B, NH, T, d_k)),
            B * NH, T, d_k]
    launch("k_attn_values_fwd", args, blocks(B * NH * T * d_k), stream)


def attn_values_bwd(dprobs, dv, dout, probs, v, *, stream=None):
    B, NH, T, d_k = head_dims("v", v)
    hs = (B, NH, T, d_k)
    args = [ptr("dprobs", dprobs, (B, NH, T, T)), ptr("dv", dv, hs), ptr("dout", dout, hs),
            ptr("probs", probs, (B, NH, T, T)), ptr("v", v, hs), B * NH, T, d_k]
    launch("k_attn_values_bwd", args, (blocks(B * NH * T * max(T, d_k)), 2), stream)


def merge_heads_fwd_args(y, heads) -> list:
    """The checked arguments of k_merge_heads_fwd and k_merge_heads_fwd_fast: y, heads, B, T, NH, d_k."""
    B, NH, T, d_k = head_dims("heads", heads)
    return [ptr("y", y, (B, T, NH * d_k)), ptr("heads", heads, (B, NH, T, d_k)), B, T, NH, d_k]


def merge_heads_bwd_args(dheads, dy, n_head) -> list:
    """The checked arguments of k_merge_heads_bwd and k_merge_heads_bwd_fast: dheads, dy, B, T, NH, d_k."""
    B, T, C = shape_of("dy", dy, 3)
    if C % n_head:
        raise ValueError(f"n_head={n_head} must divide dy's last dimension {C}")
    d_k = C // n_head
    return [ptr("dheads", dheads, (B, n_head, T, d_k)), ptr("dy", dy, (B, T, C)), B, T, n_head, d_k]


def merge_heads_fwd(y, heads, *, stream=None):
    """heads (B, NH, T, d_k) -> y (B, T, NH * d_k)."""
    args = merge_heads_fwd_args(y, heads)
    B, T, NH, d_k = args[-4:]
    launch("k_merge_heads_fwd", args, blocks(B * NH * T * d_k), stream)


def merge_heads_bwd(dheads, dy, n_head, *, stream=None):
    args = merge_heads_bwd_args(dheads, dy, n_head)
    B, T, NH, d_k = args[-4:]
    launch("k_merge_heads_bwd", args, blocks(B * T * NH * d_k), stream)


def fused_attention_fwd(y, lse, qkv, n_head, *, stream=None):
    """y (B, T, C): causal attention of the heads of qkv (B, T, 3C) in one kernel, written where W_O reads them;
    lse (B, NH, T): each row's log-sum-exp of its scores, which the backward rebuilds the probabilities from."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    args = [ptr("y", y, (B, T, C)), ptr("lse", lse, (B, n_head, T)), ptr("qkv", qkv, (B, T, 3 * C)), B, T, n_head,
            d_k]
    launch("k_fused_attention_fwd", args, blocks(B * n_head * T), stream)


def fused_attention_bwd(dqkv, dy, qkv, y, lse, n_head, *, stream=None):
    """dqkv (B, T, 3C) written: the gradients of the heads' Q, K and V from dy (B, T, C), the forward's qkv, y
    (read by the tc variant's kernels, for delta) and lse."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    p_dqkv, p_dy = ptr("dqkv", dqkv, (B, T, 3 * C)), ptr("dy", dy, (B, T, C))
    p_qkv, p_lse = ptr("qkv", qkv, (B, T, 3 * C)), ptr("lse", lse, (B, n_head, T))
    ptr("y", y, (B, T, C))
    delta = scratch(B * n_head * T, stream)  # held here until both launches are queued
    launch("k_fused_attention_bwd_dq", [p_dqkv, int(delta.gpudata), p_dy, p_qkv, p_lse, B, T, n_head, d_k],
           blocks(B * n_head * T), stream)
    launch("k_fused_attention_bwd_dkdv", [p_dqkv, p_dy, p_qkv, p_lse, int(delta.gpudata), B, T, n_head, d_k],
           blocks(B * n_head * T), stream)


def matmul_attention_bwd_args(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, dy):
    """Checks every argument of matmul_attention_bwd by its name, before anything runs: (B, T, C, d_k, the arrays'
    device pointers by name, dbias's 0 where None)."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    shape, qkv_shape = (B, T, C), (B, T, 3 * C)
    p = {name: ptr(name, a, a_shape) for name, a, a_shape in (
        ("dqkv", dqkv, qkv_shape), ("dweight", dweight, (C, C)), ("dout", dout, shape), ("y", y, shape),
        ("weight", weight, (C, C)), ("qkv", qkv, qkv_shape), ("lse", lse, (B, n_head, T)), ("dy", dy, shape))}
    p["dbias"] = opt_ptr("dbias", dbias, (C,))
    return B, T, C, d_k, p


def matmul_then_attention_bwd(matmul_bwd, fused_attention_bwd, name="matmul_attention_bwd"):
    """matmul_attention_bwd as a variant's matmul_bwd into dy, then its fused_attention_bwd of dy (the launcher
    called `name`)."""
    def matmul_attention_bwd(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, *, dy, stream=None):
        """The backward of the attention's output projection (dout, weight: matmul_bwd's; its input y, the fused
        attention's output) and of the fused attention (qkv, lse, n_head: fused_attention_bwd's): dqkv written,
        dweight and dbias added into; dy (y's shape) takes y's gradient on the way."""
        matmul_attention_bwd_args(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, dy)
        matmul_bwd(dy, dweight, dbias, dout, y, weight, stream=stream)
        fused_attention_bwd(dqkv, dy, qkv, y, lse, n_head, stream=stream)
    matmul_attention_bwd.__name__ = matmul_attention_bwd.__qualname__ = name
    return matmul_attention_bwd


matmul_attention_bwd = matmul_then_attention_bwd(matmul_bwd, fused_attention_bwd)
