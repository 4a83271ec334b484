"""One attention sublayer, the 12-head pipeline: on buffers, through the op table, as microgpt.model runs it in
every layer, and as MultiHeadAttention, the sublayer on its own with its intermediates, on any backend.

    mha = MultiHeadAttention(d_model=768, n_head=12, backend="cuda", variant="reference")
    out, inter = mha.forward(x, return_intermediates=True)   # x (B, T, C) float32
    inter["scores"][b, h]                                    # head h's (T, T) scores, before the mask
    dx = mha.backward(dout); mha.grads["qkv.w"]

The stages (the tc variant fuses those between the two projections into flash attention, one kernel forward
and a delta kernel and one more backward, keeping a log-sum-exp a row instead of the probabilities): fused QKV
projection, split into heads, scores `scores[i][j] = dot(Q[i], K[j]) * (1.0f /
sqrtf(d_k))`, causal mask (MASK_VALUE where j > i), row softmax, weighted sum of V, concat, W_O. Weights
follow torch.nn.Linear: `qkv.w` (3C, C), `qkv.b` (3C,), `proj.w` (C, C), `proj.b` (C,); Q, K, V are rows
0:C, C:2C, 2C:3C of `qkv.w`.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from . import reference as R
from . import reference_ops
from .backend import AttentionBackend
from .kernels import engine, flash_attention_supported, release_at_exit
from .ops import resolve, select
from .params import layer_shapes

WEIGHTS = ("qkv.w", "qkv.b", "proj.w", "proj.b")
INTERMEDIATES = ("q", "k", "v", "scores", "masked", "probs", "heads", "lse", "y")
STATE = INTERMEDIATES + ("qkv", "out")


# ---------------------------------------------------------------------------------------------- the stages
# The sublayer on buffers the caller owns (a state `a` forward, `d` backward), through one implementation of the op
# table (`ops`: the numpy one or a variant's launchers). Fused (a.lse set: the tc variant's flash attention) the
# heads run in one op forward and one backward, read from qkv; otherwise stage by stage, keeping q, k, v and the
# probabilities (and the scores before the mask in a.scores unless it is None: the fast variants write the masked
# scores directly). A decode step's attention is one op of microgpt.model.decode.
def fused(ops, d_k: int, T: int, device) -> bool:
    """Whether the variant's attention runs fused at this head width and length on `device` (a kernels engine)."""
    return ops.variant.fused_attention and flash_attention_supported(d_k, T, device)


def heads_fwd(ops, a, n_head):
    """The stages between the two projections: a.qkv -> a.y."""
    if a.lse is not None:
        ops.fused_attention_fwd(a.y, a.lse, a.qkv, n_head)
    else:
        ops.split_heads_fwd(a.q, a.k, a.v, a.qkv, n_head)
        ops.causal_scores_fwd(a.masked, a.q, a.k, scores=a.scores)
        ops.softmax_fwd(a.probs, a.masked, causal=True)
        ops.attn_values_fwd(a.heads, a.probs, a.v)
        ops.merge_heads_fwd(a.y, a.heads)


def heads_bwd(ops, a, d, n_head):
    """Their backward: d.dy -> d.dqkv written."""
    if a.lse is not None:
        ops.fused_attention_bwd(d.dqkv, d.dy, a.qkv, a.y, a.lse, n_head)
        return
    ops.merge_heads_bwd(d.dheads, d.dy, n_head)
    ops.attn_values_bwd(d.dprobs, d.dv, d.dheads, a.probs, a.v)
    ops.softmax_bwd(d.dscores, d.dprobs, a.probs, causal=True)
    ops.causal_scores_bwd(d.dq, d.dk, d.dscores, a.q, a.k)
    ops.split_heads_bwd(d.dqkv, d.dq, d.dk, d.dv)


def forward(ops, x, w, a, n_head):
    """x (B, T, C) -> a.out = proj(attention(qkv(x))); keeps a.qkv, a.y and what heads_fwd keeps for backward."""
    ops.matmul_fwd(a.qkv, x, w["qkv.w"], w["qkv.b"])
    heads_fwd(ops, a, n_head)
    ops.matmul_fwd(a.out, a.y, w["proj.w"], w["proj.b"])


def backward_to_qkv(ops, dout, w, g, a, d, n_head):
    """The backward as far as the qkv projection: dout (B, T, C) -> d.dqkv written; g["proj.*"] added into. With
    the attention fused, one op for both (the tc variant sums flash attention's delta in the product that makes
    d.dy)."""
    if a.lse is not None:
        ops.matmul_attention_bwd(d.dqkv, g["proj.w"], g["proj.b"], dout, a.y, w["proj.w"], a.qkv, a.lse, n_head,
                                 dy=d.dy)
        return
    ops.matmul_bwd(d.dy, g["proj.w"], g["proj.b"], dout, a.y, w["proj.w"])
    heads_bwd(ops, a, d, n_head)


def backward(ops, dout, x, w, g, a, d, n_head):
    """dout (B, T, C) -> d.dx written; g (the weights' gradients) added into. d holds the scratch."""
    backward_to_qkv(ops, dout, w, g, a, d, n_head)
    ops.matmul_bwd(d.dx, g["qkv.w"], g["qkv.b"], d.dqkv, x, w["qkv.w"])


def _state(**buffers) -> SimpleNamespace:
    return SimpleNamespace(**{k: buffers.get(k) for k in STATE})


def states(new, B, T, C, n_head, keep_scores=False, fused=False):
    """make(out) -> one layer's forward state writing `out`, from new(*shape): fused, qkv and lse (and y) of its own;
    otherwise q, k, v, probs (and y) of its own, and qkv, masked, heads (and scores with keep_scores) shared by every
    state made here, as the backward does not read them."""
    d_k = C // n_head
    if fused:
        return lambda out: _state(qkv=new(B, T, 3 * C), y=new(B, T, C), out=out, lse=new(B, n_head, T))
    shared = dict(qkv=new(B, T, 3 * C), masked=new(B, n_head, T, T), heads=new(B, n_head, T, d_k),
                  scores=new(B, n_head, T, T) if keep_scores else None)
    return lambda out: _state(y=new(B, T, C), out=out, q=new(B, n_head, T, d_k), k=new(B, n_head, T, d_k),
                              v=new(B, n_head, T, d_k), probs=new(B, n_head, T, T), **shared)


def grad_buffers(new, B, T, C, n_head, fused=False):
    d_k = C // n_head
    d = SimpleNamespace(dy=new(B, T, C), dqkv=new(B, T, 3 * C), dx=new(B, T, C))
    if not fused:
        d.dheads, d.dq, d.dk, d.dv = (new(B, n_head, T, d_k) for _ in range(4))
        d.dprobs, d.dscores = new(B, n_head, T, T), new(B, n_head, T, T)
    return d


# ---------------------------------------------------------------------------------------------- backends
class NumpyAttention:
    """The sublayer through microgpt.reference_ops, on the CPU (one set of operations: any variant is accepted):
    every stage kept, with the scores before the mask and each row's log-sum-exp of the masked ones."""

    def __init__(self, n_head: int, variant: str | None = None):
        resolve(variant)
        self.n_head = n_head
        self.weights = None
        self._a = None

    def _new(self, *shape):
        return np.zeros(shape, np.float32)

    def load(self, weights):
        self.weights = dict(weights)

    def forward(self, x, keep_intermediates):
        B, T, C = x.shape
        self._a = a = states(self._new, B, T, C, self.n_head, keep_scores=True)(self._new(B, T, C))
        a.x = x
        forward(reference_ops, x, self.weights, a, self.n_head)
        if not keep_intermediates:
            return a.out, None
        return a.out, {k: getattr(a, k) for k in INTERMEDIATES if k != "lse"} | {"lse": R.logsumexp(a.masked)}

    def backward(self, dout):
        a = self._a
        d = grad_buffers(self._new, *a.x.shape, self.n_head)
        g = {k: np.zeros_like(v) for k, v in self.weights.items()}  # the ops add into weight gradients
        backward(reference_ops, dout, a.x, self.weights, g, a, d, self.n_head)
        return d.dx, g


class CudaAttention:
    """The sublayer in one variant's kernels, on the GPU; the intermediates are those the variant has (the
    fast one has no scores before the mask; the tc one, fused, has y and lse and no per-head stage)."""

    def __init__(self, n_head: int, variant: str | None = None):
        self.n_head = n_head
        self.ops = select(variant)
        self.ga = engine().ga  # the primary context, before the first allocation
        self.weights = None
        self._a = None
        release_at_exit(self)

    def release(self):
        """Drops the device copies of the weights and the saved activations (called at exit)."""
        self.weights, self._a = None, None

    def _new(self, *shape):
        return self.ga.empty(shape, np.float32)

    def load(self, weights):
        self.weights = {k: self.ga.to_gpu(np.ascontiguousarray(v, dtype=np.float32)) for k, v in weights.items()}

    def forward(self, x, keep_intermediates):
        B, T, C = x.shape
        make = states(self._new, B, T, C, self.n_head, keep_scores=self.ops.variant.keeps_scores,
                      fused=fused(self.ops, C // self.n_head, T, engine()))
        a = make(self._new(B, T, C))
        a.x = self.ga.to_gpu(x)
        forward(self.ops, a.x, self.weights, a, self.n_head)
        self._a = a
        inter = None
        if keep_intermediates:
            inter = {k: getattr(a, k).get() for k in INTERMEDIATES if getattr(a, k) is not None}
        return a.out.get(), inter

    def backward(self, dout):
        a = self._a
        B, T, C = a.x.shape
        d = grad_buffers(self._new, B, T, C, self.n_head, fused=a.lse is not None)
        g = {k: self.ga.zeros_like(v) for k, v in self.weights.items()}  # kernels add into weight gradients
        backward(self.ops, self.ga.to_gpu(dout), a.x, self.weights, g, a, d, self.n_head)
        return d.dx.get(), {k: v.get() for k, v in g.items()}


ATTENTION_BACKENDS = {"numpy": NumpyAttention, "cuda": CudaAttention}


# ---------------------------------------------------------------------------------------------- the API
class MultiHeadAttention:
    def __init__(self, d_model: int, n_head: int, backend="numpy", seed: int = 0, variant: str | None = None):
        """backend: "numpy", "cuda", or an AttentionBackend object. variant (a name of
        microgpt.ops.VARIANTS, None for the default) picks the cuda backend's kernels; the numpy
        backend has one set."""
        for name, value in (("d_model", d_model), ("n_head", n_head)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if d_model % n_head:
            raise ValueError(f"n_head={n_head} must divide d_model={d_model}")
        self.d_model, self.n_head, self.d_k = int(d_model), int(n_head), d_model // n_head
        if isinstance(backend, str):
            if backend not in ATTENTION_BACKENDS:
                raise ValueError(f"backend must be one of {tuple(ATTENTION_BACKENDS)} or an AttentionBackend, "
                                 f"got {backend!r}")
            backend = ATTENTION_BACKENDS[backend](self.n_head, variant)
        elif not isinstance(backend, AttentionBackend):
            raise TypeError(f"backend must be a name or an AttentionBackend, got {type(backend).__name__}")
        elif variant is not None:
            raise ValueError("variant: a backend object was given, whose kernels are its own; pass variant "
                             "to it, not here")
        self.backend = backend
        rng = np.random.default_rng(seed)
        self.weights = {k: (rng.normal(0, 0.02, shape) if k.endswith(".w") else np.zeros(shape)).astype(np.float32)
                        for k, shape in self.shapes().items()}
        self.backend.load(self.weights)
        self.grads = None
        self._x_shape = None  # of the last forward, which backward answers

    def shapes(self) -> dict:
        """The weights' shapes by name (qkv.w, qkv.b, proj.w, proj.b): a layer's attn.* of microgpt.params."""
        return {name.split(".attn.")[1]: shape for name, shape in layer_shapes(0, self.d_model) if ".attn." in name}

    def state_dict(self) -> dict:
        return {k: v.copy() for k, v in self.weights.items()}

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in WEIGHTS if k not in state]
        extra = [k for k in state if k not in WEIGHTS]
        if missing or extra:
            raise ValueError(f"state_dict: missing {missing}, unexpected {extra}")
        new = {}
        for k, shape in self.shapes().items():
            v = np.asarray(state[k])
            if v.shape != shape:
                raise ValueError(f"state_dict[{k!r}] has shape {v.shape}, expected {shape}")
            new[k] = np.ascontiguousarray(v, dtype=np.float32)
        self.weights = new
        self.backend.load(new)
        self._x_shape = None  # the last forward's activations belong to the old weights

    def _check_x(self, name, x, shape=None):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
        if x.dtype.kind != "f":
            raise TypeError(f"{name} must be a float array, got dtype {x.dtype}")
        if shape is not None and x.shape != shape:
            raise ValueError(f"{name} must have shape {shape}, got {x.shape}")
        if x.ndim != 3 or x.shape[-1] != self.d_model or 0 in x.shape:
            raise ValueError(f"{name} must have shape (B, T, {self.d_model}), got {x.shape}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def forward(self, x, return_intermediates=False):
        """out (B, T, C); with return_intermediates also a dict of every stage per head: q, k, v and
        heads (B, NH, T, d_k), scores (before the mask), masked and probs (B, NH, T, T), lse (B, NH, T: each
        row's log-sum-exp of its masked scores, probs = exp(masked - lse)), y (B, T, C); those the variant has."""
        x = self._check_x("x", x)
        out, inter = self.backend.forward(x, return_intermediates)
        self._x_shape = x.shape
        return (out, inter) if return_intermediates else out

    def backward(self, dout):
        """dx (B, T, C); the weights' gradients of this backward in self.grads."""
        if self._x_shape is None:
            raise RuntimeError("backward() needs a forward() first")
        dout = self._check_x("dout", dout, self._x_shape)
        dx, self.grads = self.backend.backward(dout)
        return dx
