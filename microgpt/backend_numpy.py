"""The numpy backend: the whole GPT composed of the reference operations, on the CPU.

Every backend holds four flat vectors laid out by microgpt.params (weights, gradients, Adam m and v) and
answers the calls of microgpt.backend.Backend; microgpt.model.GPT validates arguments before any of them runs. Here the four are
microgpt._host.FlatBuffer's (aligned, zeroed), in float32 or, for gradient checks, float64.
"""
from __future__ import annotations

import numpy as np

from . import reference as R
from ._host import FlatBuffer
from .backend import FLAT_VECTORS, check_which
from .config import GPTConfig
from .params import decays, num_params, param_table


class NumpyBackend:
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
        self._saved = None
        self._kv = None
        self.positions = 0  # token positions run through the model by forward, prefill and decode
        self.last_grad_norm = None

    # -- state ------------------------------------------------------------------------------------
    def pull(self, which: str) -> np.ndarray:
        """The live flat vector (no copy): weights, gradients, Adam m or v."""
        return self.flat[check_which(which)]

    def push(self, which: str, values: np.ndarray) -> None:
        """Copies n_params numbers into one flat vector."""
        self.buffers[check_which(which)].copy_from(values)

    def zero_grad(self) -> None:
        self.buffers["grads"].fill(0)

    def grad_buffer(self) -> np.ndarray:
        """The live gradient vector, for a collective to sum in place (microgpt.distributed)."""
        return self.flat["grads"]

    # -- forward / backward ---------------------------------------------------------------------------
    def forward(self, idx, targets=None, logits="all"):
        """Returns (logits, per-position losses or None); keeps what backward needs."""
        cfg, P = self.config, self.P
        x = R.embed_fwd(idx, P["wte"], P["wpe"])
        layers = []
        for l in range(cfg.n_layer):
            p = lambda name: P[f"h.{l}.{name}"]  # noqa: E731
            ln1, mean1, rstd1 = R.layernorm_fwd(x, p("ln1.w"), p("ln1.b"))
            att, att_cache = R.attention_fwd(ln1, p("attn.qkv.w"), p("attn.qkv.b"),
                                             p("attn.proj.w"), p("attn.proj.b"), cfg.n_head)
            x1 = R.residual_fwd(x, att)
            ln2, mean2, rstd2 = R.layernorm_fwd(x1, p("ln2.w"), p("ln2.b"))
            fc = R.linear_fwd(ln2, p("mlp.fc.w"), p("mlp.fc.b"))
            act = R.gelu_fwd(fc)
            mlp = R.linear_fwd(act, p("mlp.proj.w"), p("mlp.proj.b"))
            layers.append(dict(x=x, mean1=mean1, rstd1=rstd1, att=att_cache, x1=x1, ln2=ln2,
                               mean2=mean2, rstd2=rstd2, fc=fc, act=act))
            x = R.residual_fwd(x1, mlp)
        lnf, meanf, rstdf = R.layernorm_fwd(x, P["lnf.w"], P["lnf.b"])
        full = R.linear_fwd(lnf, P["wte"])  # tied output projection
        losses = probs = None
        if targets is not None:
            losses, probs = R.crossentropy_fwd(full, targets)
        self._saved = dict(idx=idx, targets=targets, layers=layers, x=x, lnf=lnf, meanf=meanf,
                           rstdf=rstdf, probs=probs)
        out = {"all": full, "last": full[:, -1:], None: None}[logits]
        self.positions += idx.size
        return out, losses

    def backward(self) -> None:
        """Adds the gradients of the mean loss of the last forward into the gradient vector."""
        cfg, P, G, s = self.config, self.P, self.G, self._saved
        idx, targets = s["idx"], s["targets"]
        B, T = idx.shape
        dlosses = np.full((B, T), 1.0 / (B * T), dtype=self.dtype)
        dlogits = R.crossentropy_bwd(dlosses, s["probs"], targets)
        dlnf, dwte, _ = R.linear_bwd(dlogits, s["lnf"], P["wte"])
        G["wte"] += dwte
        dx, dw, db = R.layernorm_bwd(dlnf, s["x"], P["lnf.w"], s["meanf"], s["rstdf"])
        G["lnf.w"] += dw
        G["lnf.b"] += db
        for l in reversed(range(cfg.n_layer)):
            c = s["layers"][l]
            p = lambda name: P[f"h.{l}.{name}"]  # noqa: E731
            g = lambda name: G[f"h.{l}.{name}"]  # noqa: E731
            # x2 = x1 + mlp(ln2(x1))
            dx1, dmlp = R.residual_bwd(dx)
            dact, dw, db = R.linear_bwd(dmlp, c["act"], p("mlp.proj.w"))
            g("mlp.proj.w")[...] += dw
            g("mlp.proj.b")[...] += db
            dfc = R.gelu_bwd(dact, c["fc"])
            dln2, dw, db = R.linear_bwd(dfc, c["ln2"], p("mlp.fc.w"))
            g("mlp.fc.w")[...] += dw
            g("mlp.fc.b")[...] += db
            dbranch, dw, db = R.layernorm_bwd(dln2, c["x1"], p("ln2.w"), c["mean2"], c["rstd2"])
            g("ln2.w")[...] += dw
            g("ln2.b")[...] += db
            dx1 = dx1 + dbranch
            # x1 = x + attn(ln1(x))
            dx0, datt = R.residual_bwd(dx1)
            dln1, dw_att = R.attention_bwd(datt, c["att"], p("attn.qkv.w"), p("attn.proj.w"), cfg.n_head)
            g("attn.qkv.w")[...] += dw_att["w_qkv"]
            g("attn.qkv.b")[...] += dw_att["b_qkv"]
            g("attn.proj.w")[...] += dw_att["w_o"]
            g("attn.proj.b")[...] += dw_att["b_o"]
            dbranch, dw, db = R.layernorm_bwd(dln1, c["x"], p("ln1.w"), c["mean1"], c["rstd1"])
            g("ln1.w")[...] += dw
            g("ln1.b")[...] += db
            dx = dx0 + dbranch
        dwte, dwpe = R.embed_bwd(dx, idx, cfg.vocab_size, cfg.block_size)
        G["wte"] += dwte
        G["wpe"] += dwpe

    # -- sampling: a cache of every layer's keys and values -----------------------------------------
    def prefill(self, idx, choose=None):
        """idx: checked int32 (B, T), T <= block_size. The forward over the prompt, keeping each layer's
        keys and values for decode(); returns the last position's logits (B, V), or with `choose` (a
        sampling.Choice) the next tokens (B,) it chooses from them."""
        cfg = self.config
        B, T = idx.shape
        last, _ = self.forward(idx, None, logits="last")
        d_k = cfg.d_model // cfg.n_head
        self._kv = []
        for layer in self._saved["layers"]:
            k = np.zeros((B, cfg.n_head, cfg.block_size, d_k), self.dtype)
            v = np.zeros_like(k)
            k[:, :, :T], v[:, :, :T] = layer["att"]["k"], layer["att"]["v"]
            self._kv.append((k, v))
        self._saved = None  # what backward would need is not kept: sampling trains nothing
        return last[:, -1] if choose is None else choose(last[:, -1])

    def decode(self, tokens, pos, choose=None):
        """tokens: checked int32 (B,), at position pos (< block_size) after the prefilled or decoded ones.
        One position through every layer, its query against the cached keys and values 0..pos; returns its
        logits (B, V), or with `choose` the next tokens (B,)."""
        cfg, P = self.config, self.P
        x = R.embed_fwd(tokens[:, None], P["wte"], P["wpe"][pos:pos + 1])  # (B, 1, C)
        for l, (k_cache, v_cache) in enumerate(self._kv):
            p = lambda name: P[f"h.{l}.{name}"]  # noqa: E731
            ln1, _, _ = R.layernorm_fwd(x, p("ln1.w"), p("ln1.b"))
            q, k, v = R.split_heads_fwd(R.linear_fwd(ln1, p("attn.qkv.w"), p("attn.qkv.b")), cfg.n_head)
            k_cache[:, :, pos], v_cache[:, :, pos] = k[:, :, 0], v[:, :, 0]
            # no mask: every cached position is at or before this one
            probs = R.softmax_fwd(R.attn_scores_fwd(q, k_cache[:, :, :pos + 1]))
            y = R.merge_heads_fwd(R.attn_values_fwd(probs, v_cache[:, :, :pos + 1]))
            x1 = R.residual_fwd(x, R.linear_fwd(y, p("attn.proj.w"), p("attn.proj.b")))
            ln2, _, _ = R.layernorm_fwd(x1, p("ln2.w"), p("ln2.b"))
            act = R.gelu_fwd(R.linear_fwd(ln2, p("mlp.fc.w"), p("mlp.fc.b")))
            x = R.residual_fwd(x1, R.linear_fwd(act, p("mlp.proj.w"), p("mlp.proj.b")))
        lnf, _, _ = R.layernorm_fwd(x, P["lnf.w"], P["lnf.b"])
        self.positions += len(tokens)
        logits = R.linear_fwd(lnf, P["wte"])[:, 0]  # tied output projection
        return logits if choose is None else choose(logits)

    # -- optimiser ----------------------------------------------------------------------------------
    def step(self, t, lr, beta1, beta2, eps, weight_decay, grad_clip):
        """Optional global-norm clipping, then AdamW on every tensor (decay on 2-D ones only)."""
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
