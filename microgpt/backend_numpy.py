"""The numpy backend (microgpt.backend.Backend): microgpt.model on the CPU, each op run at once by
microgpt.reference_ops. Its four flat vectors are microgpt._host.FlatBuffer's (aligned, zeroed), in float32 or,
for gradient checks, float64.
"""
from __future__ import annotations

import numpy as np

from . import attention, model
from . import reference as R
from . import reference_ops
from ._host import FlatBuffer
from .backend import FLAT_VECTORS, check_which
from .config import GPTConfig
from .params import decays, num_params, param_table


class NumpyBackend:
    ops = reference_ops

    def __init__(self, config: GPTConfig, dtype=np.float32):
        self.config = config
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        self.table = param_table(config)
        n = num_params(config)
        self.buffers = {which: FlatBuffer(n, dtype=self.dtype) for which in FLAT_VECTORS}
        self.flat = {which: buf.array for which, buf in self.buffers.items()}
        self.P = self.buffers["params"].views(self.table)
        self.G = self.buffers["grads"].views(self.table)
        self._a = None      # the activations of the last forward
        self._cache = None  # sampling's keys and values
        self.positions = 0  # token positions run through the model by forward, prefill and decode
        self.last_grad_norm = None

    def _new(self, *shape, dtype=None):
        return np.zeros(shape, self.dtype if dtype is None else dtype)

    # -- state ------------------------------------------------------------------------------------
    def pull(self, which: str) -> np.ndarray:
        """The live flat vector (no copy): weights, gradients, Adam m or v."""
        return self.flat[check_which(which)]

    def push(self, which: str, values: np.ndarray) -> None:
        self.buffers[check_which(which)].copy_from(values)

    def zero_grad(self) -> None:
        self.buffers["grads"].fill(0)

    def grad_buffer(self) -> np.ndarray:
        """The live gradient vector, for a collective to sum in place (microgpt.distributed)."""
        return self.flat["grads"]

    # -- forward / backward ---------------------------------------------------------------------------
    def forward(self, idx, targets=None, logits="all"):
        cfg, (B, T) = self.config, idx.shape
        states = attention.states(self._new, B, T, cfg.d_model, cfg.n_head)
        a = model.activations(cfg, B, T, self._new, states)
        a.idx, a.tgt, a.order = idx, targets, None
        model.forward(self.ops, self.P, cfg, a, targets is not None)
        self._a = a
        self.positions += idx.size
        out = {"all": a.logits, "last": a.logits[:, -1:], None: None}[logits]
        return out, (None if targets is None else a.losses)

    def backward(self) -> None:
        cfg, a = self.config, self._a
        B, T = a.shape
        a.dlosses = np.full((B, T), 1.0 / (B * T), dtype=self.dtype)
        d = model.gradients(cfg, B, T, self._new,
                            lambda: attention.grad_buffers(self._new, B, T, cfg.d_model, cfg.n_head))
        model.backward(self.ops, self.P, self.G, cfg, a, d)

    # -- sampling: a cache of every layer's keys and values -----------------------------------------
    def prefill(self, idx, choose=None):
        """The forward over the prompt, each layer's keys and values kept for decode() (microgpt.backend)."""
        last, _ = self.forward(idx, None, logits="last")
        B = idx.shape[0]
        if self._cache is None or self._cache.k[0].shape[0] != B:  # the cache and a decode step's buffers, per B
            self._cache = model.kv_cache(self.config, B, self._new)
            self._cache.step = model.decode_activations(self.config, self._cache, np.zeros((B, 1), np.int32),
                                                        np.zeros(1, np.int32), self._new)
        model.fill_cache(self.ops, self.config, self._a, self._cache, None)
        self._a = None  # what backward would need is not kept: sampling trains nothing
        return last[:, -1] if choose is None else choose(last[:, -1])

    def decode(self, tokens, pos, choose=None):
        """One position through every layer, its query against the cached keys and values 0..pos."""
        a = self._cache.step
        a.idx[:, 0], a.pos[0] = tokens, pos
        model.decode(self.ops, self.P, self.config, a)
        self.positions += len(tokens)
        logits = a.logits[:, 0].copy()
        return logits if choose is None else choose(logits)

    def decode_steps(self, tokens, pos, choices):
        """decode() with each sampling.Choice of `choices` in turn, from tokens (B,) at position pos, each step's
        chosen tokens the next one's input; yields them."""
        for i, choose in enumerate(choices):
            tokens = self.decode(tokens, pos + i, choose)
            yield tokens

    # -- optimiser ----------------------------------------------------------------------------------
    def step(self, t, lr, beta1, beta2, eps, weight_decay, grad_clip):
        grads = self.flat["grads"]
        self.last_grad_norm = R.global_norm([grads])
        if grad_clip is not None:
            grads *= self.dtype.type(R.clip_coef(self.last_grad_norm, grad_clip))
        params, m, v = self.flat["params"], self.flat["m"], self.flat["v"]
        for spec in self.table:
            sl = slice(spec.offset, spec.offset + spec.size)
            wd = weight_decay if decays(spec.name, spec.shape) else 0.0
            params[sl], m[sl], v[sl] = R.adamw(params[sl], grads[sl], m[sl], v[sl], t, lr,
                                               beta1, beta2, eps, wd)
