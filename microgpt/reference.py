"""microgpt.reference: every operation of the engine, forward and backward, in NumPy.

This is the oracle the CUDA kernels are tested against, and the CPU backend of the model. Each function
computes exactly what the kernel of the same name (`k_<op>_fwd` / `k_<op>_bwd` in cuda/microgpt_cuda.cu)
defines, in the dtype of its inputs: float32 as the kernels, or float64 for gradient checks. Its own truth
comes from outside: finite differences and PyTorch autograd (tests/test_reference.py).

Shapes: B batch, T time, C = d_model, NH heads, d_k = C / NH, V vocabulary. Linear weights are (out, in).
"""
from __future__ import annotations

import math

import numpy as np

LN_EPS = 1e-5  # LN_EPS of cuda/common.cuh
MASK_VALUE = -1e9  # what the causal mask writes where j > i; MASK_VALUE of cuda/common.cuh
GELU_K = math.sqrt(2.0 / math.pi)
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6)


# ---------------------------------------------------------------------------------------------- embedding
def embed_fwd(idx, wte, wpe):
    """x[b, t] = wte[idx[b, t]] + wpe[t]."""
    T = idx.shape[1]
    return wte[idx] + wpe[:T]


def embed_bwd(dout, idx, vocab_size, block_size):
    """Gradients of wte (V, C) and wpe (block_size, C); repeated tokens add up."""
    B, T, C = dout.shape
    dwte = np.zeros((vocab_size, C), dtype=dout.dtype)
    np.add.at(dwte, idx.reshape(-1), dout.reshape(-1, C))
    dwpe = np.zeros((block_size, C), dtype=dout.dtype)
    dwpe[:T] = dout.sum(axis=0)
    return dwte, dwpe


# ---------------------------------------------------------------------------------------------- layernorm
def layernorm_fwd(x, w, b, eps=LN_EPS):
    """Normalise over the last axis (biased variance); returns out and the saved mean and 1/std."""
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    out = xc * rstd * w + b
    return out, mean[..., 0], rstd[..., 0]


def layernorm_bwd(dout, x, w, mean, rstd):
    C = x.shape[-1]
    xhat = (x - mean[..., None]) * rstd[..., None]
    flat = (-1, C)
    dw = (dout * xhat).reshape(flat).sum(axis=0)
    db = dout.reshape(flat).sum(axis=0)
    dxhat = dout * w
    dx = rstd[..., None] * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                            - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dw, db


# ---------------------------------------------------------------------------------------------- linear
def linear_fwd(x, w, b=None):
    """y = x @ W^T + b, W (out, in); the matmul kernel."""
    y = x @ w.T
    return y if b is None else y + b


def linear_bwd(dout, x, w):
    """dx, dW, db of y = x @ W^T + b."""
    d2 = dout.reshape(-1, dout.shape[-1])
    x2 = x.reshape(-1, x.shape[-1])
    return dout @ w, d2.T @ x2, d2.sum(axis=0)


# ---------------------------------------------------------------------------------------------- attention stages
def split_heads_fwd(qkv, n_head):
    """(B, T, 3C) -> q, k, v each (B, NH, T, d_k); head h of Q is columns h*d_k:(h+1)*d_k of 0:C."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    x = qkv.reshape(B, T, 3, n_head, C // n_head).transpose(2, 0, 3, 1, 4)
    return np.ascontiguousarray(x[0]), np.ascontiguousarray(x[1]), np.ascontiguousarray(x[2])


def split_heads_bwd(dq, dk, dv):
    B, NH, T, d_k = dq.shape
    return np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * NH * d_k)


def attn_scale(d_k, dtype):
    """1.0f / sqrtf(d_k), rounded as the kernel rounds it in its dtype."""
    one = np.dtype(dtype).type(1.0)
    return one / np.sqrt(np.dtype(dtype).type(d_k))


def attn_scores_fwd(q, k):
    """scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k)), per batch and head: (B, NH, T, T)."""
    return (q @ k.swapaxes(-1, -2)) * attn_scale(q.shape[-1], q.dtype)


def attn_scores_bwd(dscores, q, k):
    s = attn_scale(q.shape[-1], q.dtype)
    return (dscores @ k) * s, (dscores.swapaxes(-1, -2) @ q) * s


def causal_mask(T):
    """True where j > i: the future positions row i may not see."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def causal_mask_fwd(scores):
    out = scores.copy()
    out[..., causal_mask(scores.shape[-1])] = MASK_VALUE
    return out


def causal_mask_bwd(dout):
    dscores = dout.copy()
    dscores[..., causal_mask(dout.shape[-1])] = 0
    return dscores


def softmax_fwd(x):
    """Row-wise softmax over the last axis, max subtracted first."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def logsumexp(x):
    """Each row's log of its sum of exponentials over the last axis (what the fused attention keeps of its
    probabilities: probs = exp(masked - lse))."""
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[..., 0]


def softmax_bwd(dprobs, probs):
    return probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))


def attn_values_fwd(probs, v):
    """out[i] = sum_j A[i][j] * V[j], per batch and head."""
    return probs @ v


def attn_values_bwd(dout, probs, v):
    """dprobs (B, NH, T, T), dv (B, NH, T, d_k)."""
    return dout @ v.swapaxes(-1, -2), probs.swapaxes(-1, -2) @ dout


def merge_heads_fwd(y):
    """(B, NH, T, d_k) -> (B, T, C): heads concatenated along the feature axis."""
    B, NH, T, d_k = y.shape
    return np.ascontiguousarray(y.transpose(0, 2, 1, 3)).reshape(B, T, NH * d_k)


def merge_heads_bwd(dout, n_head):
    B, T, C = dout.shape
    return np.ascontiguousarray(dout.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3))


# ---------------------------------------------------------------------------------------------- GELU, residual
def gelu_fwd(x):
    """GPT-2's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))


def gelu_bwd(dout, x):
    u = GELU_K * (x + 0.044715 * x ** 3)
    th = np.tanh(u)
    du = GELU_K * (1.0 + 3.0 * 0.044715 * x * x)
    return dout * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du)


def residual_fwd(a, b):
    return a + b


def residual_bwd(dout):
    return dout, dout


# ---------------------------------------------------------------------------------------------- softmax cross-entropy
def crossentropy_fwd(logits, targets):
    """Fused softmax cross-entropy: per-position losses (B, T) and the probabilities (B, T, V)."""
    m = logits.max(axis=-1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=-1, keepdims=True)
    probs = e / s
    picked = np.take_along_axis(logits, targets[..., None], axis=-1)
    losses = (np.log(s) + m - picked)[..., 0]
    return losses, probs


def crossentropy_bwd(dlosses, probs, targets):
    """dlogits = (probs - onehot(target)) * dloss, per position."""
    dlogits = probs.copy()
    np.put_along_axis(dlogits, targets[..., None],
                      np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1, axis=-1)
    return dlogits * dlosses[..., None]


# ---------------------------------------------------------------------------------------------- optimiser
def global_norm(grads):
    """sqrt of the sum of squares of every gradient, accumulated in float64."""
    return math.sqrt(sum(float(np.dot(g.reshape(-1).astype(np.float64), g.reshape(-1).astype(np.float64)))
                         for g in grads))


def clip_coef(norm, max_norm):
    """The factor torch.nn.utils.clip_grad_norm_ multiplies every gradient by."""
    return min(1.0, max_norm / (norm + CLIP_EPS))


def adamw(param, grad, m, v, t, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0):
    """One AdamW step at step number t (1-based), as torch.optim.AdamW: decoupled decay, bias correction.
    Returns the new (param, m, v)."""
    param = param * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * grad
    v = beta2 * v + (1.0 - beta2) * grad * grad
    m_hat = m / (1.0 - beta1 ** t)
    v_hat = v / (1.0 - beta2 ** t)
    param = param - lr * m_hat / (np.sqrt(v_hat) + eps)
    return param, m, v

