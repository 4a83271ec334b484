"""MultiHeadAttention: one attention sublayer, the 12-head pipeline, on either backend.

    mha = MultiHeadAttention(d_model=768, n_head=12, backend="cuda")
    out, inter = mha.forward(x, return_intermediates=True)   # x (B, T, C) float32
    inter["scores"][b, h]                                    # head h's (T, T) scores, before the mask
    dx = mha.backward(dout); mha.grads["qkv.w"]

The stages are those of the seed engine: fused QKV projection, split into heads, scores
`scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k))`, causal mask (-1e9 where j > i), row softmax,
weighted sum of V, concat, W_O. Weights follow torch.nn.Linear: `qkv.w` (3C, C), `qkv.b` (3C,),
`proj.w` (C, C), `proj.b` (C,); Q, K, V are rows 0:C, C:2C, 2C:3C of `qkv.w`.
"""
from __future__ import annotations

import numpy as np

from . import reference as R

WEIGHTS = ("qkv.w", "qkv.b", "proj.w", "proj.b")
INTERMEDIATES = ("q", "k", "v", "scores", "masked", "probs", "heads", "y")


class MultiHeadAttention:
    def __init__(self, d_model: int, n_head: int, backend: str = "numpy", seed: int = 0,
                 kernels: str = "reference"):
        """kernels (cuda backend): "reference", the literal stage kernels, or "fast", the variants (whose
        scores kernel writes the masked scores directly, so that "scores" is not among the
        intermediates)."""
        for name, value in (("d_model", d_model), ("n_head", n_head)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if d_model % n_head:
            raise ValueError(f"n_head={n_head} must divide d_model={d_model}")
        if backend not in ("numpy", "cuda"):
            raise ValueError(f"backend must be 'numpy' or 'cuda', got {backend!r}")
        if kernels not in ("reference", "fast"):
            raise ValueError(f"kernels must be 'reference' or 'fast', got {kernels!r}")
        self.kernels = kernels
        self.d_model, self.n_head, self.d_k, self.backend = int(d_model), int(n_head), d_model // n_head, backend
        C = self.d_model
        rng = np.random.default_rng(seed)
        self.weights = {
            "qkv.w": rng.normal(0, 0.02, (3 * C, C)).astype(np.float32), "qkv.b": np.zeros(3 * C, np.float32),
            "proj.w": rng.normal(0, 0.02, (C, C)).astype(np.float32), "proj.b": np.zeros(C, np.float32)}
        self.grads = None
        self._saved = None
        self._dev = None  # the cuda backend's device copies (weights, buffers)

    def shapes(self) -> dict:
        C = self.d_model
        return {"qkv.w": (3 * C, C), "qkv.b": (3 * C,), "proj.w": (C, C), "proj.b": (C,)}

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
        self._dev = None

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

    # -- forward / backward ---------------------------------------------------------------------------
    def forward(self, x, return_intermediates=False):
        """out (B, T, C); with return_intermediates also a dict of every stage per head: q, k, v and
        heads (B, NH, T, d_k), scores (before the mask), masked and probs (B, NH, T, T), y (B, T, C)."""
        x = self._check_x("x", x)
        if self.backend == "numpy":
            out, cache = R.attention_fwd(x, self.weights["qkv.w"], self.weights["qkv.b"],
                                         self.weights["proj.w"], self.weights["proj.b"], self.n_head)
            self._saved = cache
            inter = {k: cache[k] for k in INTERMEDIATES} if return_intermediates else None
        else:
            out, inter = self._cuda_forward(x, return_intermediates)
        return (out, inter) if return_intermediates else out

    def backward(self, dout):
        """dx (B, T, C); the weights' gradients of this backward in self.grads."""
        if self._saved is None:
            raise RuntimeError("backward() needs a forward() first")
        dout = self._check_x("dout", dout, self._saved_shape())
        if self.backend == "numpy":
            dx, g = R.attention_bwd(dout, self._saved, self.weights["qkv.w"], self.weights["proj.w"], self.n_head)
            self.grads = {"qkv.w": g["w_qkv"], "qkv.b": g["b_qkv"], "proj.w": g["w_o"], "proj.b": g["b_o"]}
            return dx
        return self._cuda_backward(dout)

    def _saved_shape(self):
        return self._saved["x"].shape if self.backend == "numpy" else self._saved.shape

    # -- the cuda backend -------------------------------------------------------------------------------
    def _cuda_forward(self, x, return_intermediates):
        import pycuda.gpuarray as ga

        from . import backend_cuda as BC
        from . import kernels
        kernels.engine()  # the primary context, before the first allocation
        if self._dev is None:
            self._dev = {k: ga.to_gpu(v) for k, v in self.weights.items()}
        B, T, C = x.shape
        new = lambda *s: ga.empty(s, np.float32)  # noqa: E731
        fast = self.kernels == "fast"
        a = BC.attention_buffers(new, B, T, C, self.n_head, keep_scores=not fast)
        a.x, a.shape = ga.to_gpu(x), x.shape
        BC.attention_fwd(a.x, self._dev, a, self.n_head, self.kernels)
        self._saved = a
        inter = None
        if return_intermediates:
            inter = {k: getattr(a, k).get() for k in INTERMEDIATES if not (fast and k == "scores")}
        return a.out.get(), inter

    def _cuda_backward(self, dout):
        import pycuda.gpuarray as ga

        from . import backend_cuda as BC
        a = self._saved
        B, T, C = a.shape
        new = lambda *s: ga.empty(s, np.float32)  # noqa: E731
        d = BC.attention_grad_buffers(new, B, T, C, self.n_head)
        g = {k: ga.zeros_like(v) for k, v in self._dev.items()}  # kernels add into weight gradients
        BC.attention_bwd(ga.to_gpu(dout), a.x, self._dev, g, a, d, self.n_head, self.kernels)
        self.grads = {k: v.get() for k, v in g.items()}
        return d.dx.get()
