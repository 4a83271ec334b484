"""Every op of microgpt.ops in NumPy, called as its CUDA launchers are: outputs first, written (or added into where
the launcher adds), on NumPy arrays. The numpy backend runs the model through these, and the GPU tests compare
each launcher to them. The arithmetic is microgpt.reference's, in the dtype of the arrays (float32 as the kernels,
or float64 for gradient checks).

Token ids, the embedding's `order` and the position of a decode step are read as the kernels read them;
`check_token_ids`, `stream` and the like are accepted and ignored, so one call serves either backend.
"""
from __future__ import annotations

import numpy as np

from . import reference as R
from .sampling import choose


def embed_fwd(x, idx, wte, wpe, **_):
    x[...] = R.embed_fwd(idx, wte, wpe)


def embed_bwd(dwte, dwpe, dx, idx, order=None, **_):
    """dwte and dwpe added into; order (the kernels' sorted positions) is not needed here."""
    gwte, gwpe = R.embed_bwd(dx, idx, dwte.shape[0], dwpe.shape[0])
    dwte += gwte
    dwpe += gwpe


def layernorm_fwd(out, mean, rstd, x, w, b, **_):
    out[...], mean[...], rstd[...] = R.layernorm_fwd(x, w, b)


def layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, *, accumulate=False, **_):
    """dx written (accumulate: added into); dw, db added into."""
    gx, gw, gb = R.layernorm_bwd(dout, x, w, mean, rstd)
    dx[...] = dx + gx if accumulate else gx
    dw += gw
    db += gb


def residual_layernorm_fwd(x, out, mean, rstd, resid, branch, w, b, **_):
    x[...] = R.residual_fwd(resid, branch)
    layernorm_fwd(out, mean, rstd, x, w, b)


def matmul_fwd(out, inp, weight, bias=None, **_):
    out[...] = R.linear_fwd(inp, weight, bias)


def matmul_bwd(dinp, dweight, dbias, dout, inp, weight, **_):
    """dinp written; dweight and dbias (None: none) added into."""
    gx, gw, gb = R.linear_bwd(dout, inp, weight)
    dinp[...] = gx
    dweight += gw
    if dbias is not None:
        dbias += gb


def matmul_layernorm_bwd(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd, *, dinp,
                         accumulate=False, **_):
    matmul_bwd(dinp, dweight, dbias, dout, inp, weight)
    layernorm_bwd(dx, dw, db, dinp, x, w, mean, rstd, accumulate=accumulate)


def split_heads_fwd(q, k, v, qkv, n_head, **_):
    q[...], k[...], v[...] = R.split_heads_fwd(qkv, n_head)


def split_heads_bwd(dqkv, dq, dk, dv, **_):
    dqkv[...] = R.split_heads_bwd(dq, dk, dv)


def attn_scores_fwd(scores, q, k, **_):
    scores[...] = R.attn_scores_fwd(q, k)


def attn_scores_bwd(dq, dk, dscores, q, k, **_):
    dq[...], dk[...] = R.attn_scores_bwd(dscores, q, k)


def causal_mask_fwd(out, scores, **_):
    out[...] = R.causal_mask_fwd(scores)


def causal_mask_bwd(dscores, dout, **_):
    dscores[...] = R.causal_mask_bwd(dout)


def causal_scores_fwd(masked, q, k, *, scores=None, **_):
    """The scores, then the mask; the scores before it kept in `scores` where given."""
    s = R.attn_scores_fwd(q, k)
    if scores is not None:
        scores[...] = s
    masked[...] = R.causal_mask_fwd(s)


def causal_scores_bwd(dq, dk, dscores, q, k, **_):
    """dscores is masked in place, as the reference launcher leaves it."""
    causal_mask_bwd(dscores, dscores)
    attn_scores_bwd(dq, dk, dscores, q, k)


def softmax_fwd(probs, x, *, causal=False, **_):
    probs[...] = R.softmax_fwd(x)


def softmax_bwd(dx, dprobs, probs, *, causal=False, **_):
    dx[...] = R.softmax_bwd(dprobs, probs)


def attn_values_fwd(out, probs, v, **_):
    out[...] = R.attn_values_fwd(probs, v)


def attn_values_bwd(dprobs, dv, dout, probs, v, **_):
    dprobs[...], dv[...] = R.attn_values_bwd(dout, probs, v)


def merge_heads_fwd(y, heads, **_):
    y[...] = R.merge_heads_fwd(heads)


def merge_heads_bwd(dheads, dy, n_head, **_):
    dheads[...] = R.merge_heads_bwd(dy, n_head)


def _probs(qkv, lse, n_head):
    """q, k, v of qkv and the causal probabilities rebuilt from the scores and each row's log-sum-exp."""
    q, k, v = R.split_heads_fwd(qkv, n_head)
    masked = R.causal_mask_fwd(R.attn_scores_fwd(q, k))
    return q, k, v, masked, None if lse is None else np.exp(masked - lse[..., None])


def fused_attention_fwd(y, lse, qkv, n_head, **_):
    q, k, v, masked, _ = _probs(qkv, None, n_head)
    y[...] = R.merge_heads_fwd(R.attn_values_fwd(R.softmax_fwd(masked), v))
    lse[...] = R.logsumexp(masked)


def fused_attention_bwd(dqkv, dy, qkv, y, lse, n_head, **_):
    q, k, v, _, probs = _probs(qkv, lse, n_head)
    dprobs, dv = R.attn_values_bwd(R.merge_heads_bwd(dy, n_head), probs, v)
    dq, dk = R.attn_scores_bwd(R.causal_mask_bwd(R.softmax_bwd(dprobs, probs)), q, k)
    dqkv[...] = R.split_heads_bwd(dq, dk, dv)


def matmul_attention_bwd(dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head, *, dy, **_):
    matmul_bwd(dy, dweight, dbias, dout, y, weight)
    fused_attention_bwd(dqkv, dy, qkv, y, lse, n_head)


def gelu_fwd(out, x, **_):
    out[...] = R.gelu_fwd(x)


def gelu_bwd(dx, dout, x, **_):
    dx[...] = R.gelu_bwd(dout, x)


def matmul_gelu_bwd(dpre, dweight, dbias, dout, act, pre, weight, **_):
    """dpre written; dweight and dbias (None: none) added into."""
    matmul_bwd(dpre, dweight, dbias, dout, act, weight)
    gelu_bwd(dpre, dpre, pre)


def residual_fwd(out, a, b, **_):
    out[...] = R.residual_fwd(a, b)


def residual_bwd(da, db, dout, **_):
    da[...], db[...] = R.residual_bwd(dout)


def crossentropy_fwd(losses, probs, logits, targets, **_):
    losses[...], probs[...] = R.crossentropy_fwd(logits, targets)


def crossentropy_bwd(dlogits, probs, targets, dlosses, **_):
    dlogits[...] = R.crossentropy_bwd(dlosses, probs, targets)


def embed_decode(x, tokens, wte, wpe, pos, **_):
    """x (B, 1, C) = wte[tokens] + wpe[p], p = pos[0]."""
    p = int(pos[0])
    x[...] = R.embed_fwd(tokens, wte, wpe[p:p + 1])


def layernorm_matmul_fwd(out, x, w, b, weight, bias, *, gelu=False, **_):
    y = R.linear_fwd(R.layernorm_fwd(x, w, b)[0], weight, bias)
    out[...] = R.gelu_fwd(y) if gelu else y


def matmul_residual_fwd(x, inp, weight, bias, **_):
    x[...] = R.residual_fwd(x, R.linear_fwd(inp, weight, bias))


def kv_store(cache, src, **_):
    cache[:, :, :src.shape[2]] = src


def attention_decode(y, k_cache, v_cache, qkv, pos, **_):
    """The new position p's key and value stored at row p of the caches; y its attention over rows 0 .. p (none of
    them masked: they are all at or before it)."""
    p = int(pos[0])
    q, k, v = R.split_heads_fwd(qkv, k_cache.shape[1])
    k_cache[:, :, p], v_cache[:, :, p] = k[:, :, 0], v[:, :, 0]
    probs = R.softmax_fwd(R.attn_scores_fwd(q, k_cache[:, :, :p + 1]))
    y[...] = R.merge_heads_fwd(R.attn_values_fwd(probs, v_cache[:, :, :p + 1]))


def sample(tokens, logits, u, temperature, top_k=None, top_p=None, *, mirror=None, **_):
    tokens[...] = choose(logits, temperature, top_k, top_p, u)
    if mirror is not None:
        mirror[...] = tokens


def global_norm(sumsq, g, *, accumulate=False, **_):
    sumsq[0] = (sumsq[0] if accumulate else 0.0) + R.global_norm([g]) ** 2


def adamw(params, grads, m, v, *, lr, beta1, beta2, eps, weight_decay, step, decay_mask=None, sumsq=None,
          max_norm=None, **_):
    """One AdamW step; decay where decay_mask is nonzero (everywhere without one); clipped first where sumsq and
    max_norm are given, the clipped gradient written back."""
    if sumsq is not None:
        grads *= grads.dtype.type(R.clip_coef(float(np.sqrt(sumsq[0])), max_norm))
    decay = np.ones(params.shape, bool) if decay_mask is None else decay_mask.astype(bool)
    for on in (True, False):
        sel = decay == on
        params[sel], m[sel], v[sel] = R.adamw(params[sel], grads[sel], m[sel], v[sel], step, lr, beta1, beta2, eps,
                                              weight_decay if on else 0.0)
