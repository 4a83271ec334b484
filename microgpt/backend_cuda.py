"""The cuda backend: the whole GPT on the GPU through the kernels of cuda/microgpt_cuda.cu.

Weights, gradients, Adam m and v live on the device as four flat float32 vectors laid out by
microgpt.params; activations are allocated once per (B, T) and reused. A forward or backward pass is a
fixed sequence of launches, so it is planned once per (B, T): every launch's arguments are checked by the
launch layer when the plan is made, and the pass then runs as one CUDA graph of it (kernels.Pass; launch by
launch where no graph can be captured) on one stream. In a training step the
only transfers are the batch in (from page-locked memory) and the per-position losses out.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from . import kernels as K
from .attention import attention_dqkv, attention_fwd, attention_grad_buffers, fused
from .backend import FLAT_VECTORS, check_which
from .config import GPTConfig
from .params import decays, num_params, param_table


def device_views(table, flat):
    """Zero-copy named GPUArray views into a flat device vector."""
    return {s.name: flat[s.offset:s.offset + s.size].reshape(s.shape) for s in table}


def _sublayer(tensors, prefix):
    """{'attn.qkv.w': ...} -> {'qkv.w': ...}: the tensors (weights or gradients) under one prefix."""
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


class CudaBackend:
    dtype = np.dtype(np.float32)

    def __init__(self, config: GPTConfig, variant: str | None = None):
        self.ops = K.select(variant)  # refuses an unknown variant before anything is allocated
        engine = K.engine()
        self.cuda, self.ga = engine.cuda, engine.ga
        self.config = config
        self.table = param_table(config)
        self.stream = engine.cuda.Stream()
        self.pool = engine.memory_pool()  # activations come and go with (B, T): reuse their memory
        K.release_at_exit(self)
        n = num_params(config)
        self.flat = {which: self.ga.zeros(n, np.float32) for which in FLAT_VECTORS}
        self.P = device_views(self.table, self.flat["params"])
        self.G = device_views(self.table, self.flat["grads"])
        mask = np.zeros(n, np.uint8)
        for s in self.table:
            mask[s.offset:s.offset + s.size] = decays(s.name, s.shape)
        self.decay_mask = self.ga.to_gpu(mask)  # one AdamW launch covers every tensor
        self.sumsq = self.ga.zeros(1, np.float64)
        self._bufs = None   # activations of the current (B, T)
        self._passes = {}   # (B, T, with_targets) -> forward pass (K.Pass of its plan); "bwd" -> backward pass
        self._dec = None    # sampling's key-value caches, buffers and decode plan, for one batch size
        self._has_norm = False

    def release(self) -> None:
        """Drops every device buffer (the model is unusable after): called at exit, while the context lives."""
        self._bufs, self._dec, self._passes, self.flat, self.P, self.G = None, None, {}, {}, {}, {}
        self.decay_mask = self.sumsq = None
        self.pool.free_held()

    # -- state ------------------------------------------------------------------------------------
    def pull(self, which: str) -> np.ndarray:
        self.stream.synchronize()
        return self.flat[check_which(which)].get()

    def grad_buffer(self):
        """The device gradient vector (a GPUArray: torch.as_tensor wraps it through __cuda_array_interface__),
        the backward's kernels done, for a collective to sum in place (microgpt.distributed)."""
        self.stream.synchronize()
        return self.flat["grads"]

    def push(self, which: str, values: np.ndarray) -> None:
        self.stream.synchronize()
        self.flat[check_which(which)].set(np.ascontiguousarray(values, dtype=np.float32))

    def zero_grad(self) -> None:
        self.cuda.memset_d32_async(self.flat["grads"].gpudata, 0, self.flat["grads"].size, self.stream)

    # -- buffers ------------------------------------------------------------------------------------
    def _new(self, *shape, dtype=np.float32):
        return self.ga.empty(shape, dtype, allocator=self.pool.allocate)

    def _buffers(self, B, T):
        if self._bufs is not None and self._bufs.shape == (B, T):
            return self._bufs
        self._bufs = None
        self._passes = {}
        self.pool.free_held()
        cfg, new = self.config, self._new
        C, NH, V, L = cfg.d_model, cfg.n_head, cfg.vocab_size, cfg.n_layer
        b = SimpleNamespace(shape=(B, T))
        # the batch travels in one copy: token ids, targets, and the positions sorted by token that the
        # embedding backward reads
        b.batch_host = self.cuda.pagelocked_empty((3, B, T), np.int32)
        b.losses_host = self.cuda.pagelocked_empty((B, T), np.float32)
        b.batch = new(3, B, T, dtype=np.int32)
        b.idx, b.tgt, b.order = b.batch[0], b.batch[1], b.batch[2]
        b.resid = [new(B, T, C) for _ in range(L + 1)]  # the residual stream entering each layer, and out
        b.layers, b.fused = [], fused(self.ops, C // NH, T)
        b.scratch = SimpleNamespace(out=new(B, T, C), mlp=new(B, T, C))
        if not b.fused:  # the pipeline's stages its backward does not read, shared by all layers
            b.scratch.qkv, b.scratch.masked = new(B, T, 3 * C), new(B, NH, T, T)
            b.scratch.heads = new(B, NH, T, C // NH)
        for _ in range(L):
            # saved for backward, per layer
            a = SimpleNamespace(ln1=new(B, T, C), mean1=new(B, T), rstd1=new(B, T), x1=new(B, T, C),
                                ln2=new(B, T, C), mean2=new(B, T), rstd2=new(B, T), fc=new(B, T, 4 * C),
                                act=new(B, T, 4 * C))
            # and what the attention's backward reads: qkv, y and lse (fused), or q, k, v, probs and y
            a.att = SimpleNamespace(y=new(B, T, C), out=b.scratch.out, scores=None, lse=None, q=None, k=None,
                                    v=None, probs=None, masked=None, heads=None)
            if b.fused:
                a.att.qkv, a.att.lse = new(B, T, 3 * C), new(B, NH, T)
            else:
                a.att.qkv, a.att.masked, a.att.heads = b.scratch.qkv, b.scratch.masked, b.scratch.heads
                a.att.q, a.att.k, a.att.v = (new(B, NH, T, C // NH) for _ in range(3))
                a.att.probs = new(B, NH, T, T)
            b.layers.append(a)
        b.lnf, b.meanf, b.rstdf = new(B, T, C), new(B, T), new(B, T)
        b.logits, b.probs, b.losses = new(B, T, V), new(B, T, V), new(B, T)
        b.dlosses = self.ga.to_gpu(np.full((B, T), 1.0 / (B * T), np.float32))
        self._bufs = b
        return b

    def _grad_buffers(self, b):
        if not hasattr(b, "d"):
            B, T = b.shape
            C, NH = self.config.d_model, self.config.n_head
            new = self._new
            b.d = attention_grad_buffers(new, B, T, C, NH, fused=b.fused)
            b.d.resid, b.d.ln = new(B, T, C), new(B, T, C)
            b.d.act, b.d.fc = new(B, T, 4 * C), new(B, T, 4 * C)
            b.d.logits = new(B, T, self.config.vocab_size)
        return b.d

    # -- forward / backward ---------------------------------------------------------------------------
    def _weight_splits(self, b, transposed: bool):
        """The products' weights as the pass's products from split operands may read them split once (the tc variant
        on sm_90a): the forward's as out = inp @ W^T reads them, the backward's transposed, as dinp = dout @ W does;
        held with the activations of (B, T), both in one arena (each pass splits them at its start, and the passes
        run in turn)."""
        key = "bwd_splits" if transposed else "fwd_splits"
        if not hasattr(b, key):
            names = [f"h.{l}.{w}" for l in range(self.config.n_layer)
                     for w in ("attn.qkv.w", "attn.proj.w", "mlp.fc.w", "mlp.proj.w")] + ["wte"]
            weights = [self.P[n] for n in names]
            if not hasattr(b, "split_arena"):
                floats = max(K.split_floats(K.weight_splits(weights, t).candidates) for t in (False, True))
                b.split_arena = K.SplitArena(floats, self._new)
            setattr(b, key, K.weight_splits(weights, transposed, b.split_arena.allocator()))
        return getattr(b, key)

    def _plan_forward(self, b, with_targets):
        cfg, P, NH, ops = self.config, self.P, self.config.n_head, self.ops

        def reads_resid(l):
            """(out, mean, rstd, w, b) of the layernorm that reads resid[l]: layer l's ln1, or lnf after the last."""
            if l == cfg.n_layer:
                return b.lnf, b.meanf, b.rstdf, P["lnf.w"], P["lnf.b"]
            s, w = b.layers[l], _sublayer(P, f"h.{l}.")
            return s.ln1, s.mean1, s.rstd1, w["ln1.w"], w["ln1.b"]
        splits = self._weight_splits(b, transposed=False)  # each weight split once, first, not before each product
        with K.recording() as plan, splits.reading(plan):
            ops.embed_fwd(b.resid[0], b.idx, P["wte"], P["wpe"], check_token_ids=False)
            out, mean, rstd, ln_w, ln_b = reads_resid(0)
            ops.layernorm_fwd(out, mean, rstd, b.resid[0], ln_w, ln_b)
            for l, s in enumerate(b.layers):
                w = _sublayer(P, f"h.{l}.")
                attention_fwd(ops, s.ln1, _sublayer(w, "attn."), s.att, NH)
                # each residual add with the layernorm that reads its sum: x1 = resid[l] + attn, ln2(x1) ...
                ops.residual_layernorm_fwd(s.x1, s.ln2, s.mean2, s.rstd2, b.resid[l], b.scratch.out, w["ln2.w"],
                                           w["ln2.b"])
                ops.matmul_fwd(s.fc, s.ln2, w["mlp.fc.w"], w["mlp.fc.b"])
                ops.gelu_fwd(s.act, s.fc)
                ops.matmul_fwd(b.scratch.mlp, s.act, w["mlp.proj.w"], w["mlp.proj.b"])
                # ... and resid[l+1] = x1 + mlp, with the next layer's ln1 (or lnf)
                out, mean, rstd, ln_w, ln_b = reads_resid(l + 1)
                ops.residual_layernorm_fwd(b.resid[l + 1], out, mean, rstd, s.x1, b.scratch.mlp, ln_w, ln_b)
            ops.matmul_fwd(b.logits, b.lnf, P["wte"], None)  # tied output projection, no bias
            if with_targets:
                ops.crossentropy_fwd(b.losses, b.probs, b.logits, b.tgt, check_token_ids=False)
        return plan

    def _plan_backward(self, b):
        cfg, P, G, NH, ops = self.config, self.P, self.G, self.config.n_head, self.ops
        d, splits = self._grad_buffers(b), self._weight_splits(b, transposed=True)
        with K.recording() as plan, splits.reading(plan):
            ops.crossentropy_bwd(d.logits, b.probs, b.tgt, b.dlosses, check_token_ids=False)
            # each layernorm's backward with the product that makes its output's gradient (fused where the
            # variant can: that gradient, d.ln or d.dx, is then never written)
            ops.matmul_layernorm_bwd(d.resid, G["lnf.w"], G["lnf.b"], G["wte"], None, d.logits, b.lnf, P["wte"],
                                     b.resid[cfg.n_layer], P["lnf.w"], b.meanf, b.rstdf, dinp=d.ln)
            for l in reversed(range(cfg.n_layer)):
                s, w, g = b.layers[l], _sublayer(P, f"h.{l}."), _sublayer(G, f"h.{l}.")
                # resid[l+1] = x1 + mlp(ln2(x1)): d.resid is the gradient of resid[l+1]
                ops.matmul_bwd(d.act, g["mlp.proj.w"], g["mlp.proj.b"], d.resid, s.act, w["mlp.proj.w"])
                ops.gelu_bwd(d.fc, d.act, s.fc)
                ops.matmul_layernorm_bwd(d.resid, g["ln2.w"], g["ln2.b"], g["mlp.fc.w"], g["mlp.fc.b"], d.fc, s.ln2,
                                         w["mlp.fc.w"], s.x1, w["ln2.w"], s.mean2, s.rstd2, dinp=d.ln,
                                         accumulate=True)  # now the gradient of x1
                # x1 = resid[l] + attn(ln1(resid[l]))
                wa, ga = _sublayer(w, "attn."), _sublayer(g, "attn.")
                attention_dqkv(ops, d.resid, wa, ga, s.att, d, NH)
                ops.matmul_layernorm_bwd(d.resid, g["ln1.w"], g["ln1.b"], ga["qkv.w"], ga["qkv.b"], d.dqkv, s.ln1,
                                         wa["qkv.w"], b.resid[l], w["ln1.w"], s.mean1, s.rstd1, dinp=d.dx,
                                         accumulate=True)  # now the gradient of resid[l]
            ops.embed_bwd(G["wte"], G["wpe"], d.resid, b.idx, b.order, check_token_ids=False)
        return plan

    def forward(self, idx, targets=None, logits="all"):
        """idx, targets: checked int32 (B, T) host arrays. Returns (logits or None, losses or None)."""
        B, T = idx.shape
        b = self._buffers(B, T)
        key = (B, T, targets is not None)
        if key not in self._passes:
            self._passes[key] = K.Pass(self._plan_forward(b, targets is not None), "forward")
        self.stream.synchronize()  # the page-locked batch may still be in flight from the last call
        b.batch_host[0] = idx
        b.batch_host[1] = 0 if targets is None else targets
        b.batch_host[2] = K.token_order(idx)
        self.cuda.memcpy_htod_async(b.batch.gpudata, b.batch_host, self.stream)
        self._passes[key].launch(self.stream)
        losses = out = None
        if targets is not None:
            self.cuda.memcpy_dtoh_async(b.losses_host, b.losses.gpudata, self.stream)
        if logits == "all":
            out = b.logits.get_async(stream=self.stream)
        elif logits == "last":  # one row per sequence, for sampling
            V = self.config.vocab_size
            out = self.cuda.pagelocked_empty((B, 1, V), np.float32)
            for i in range(B):
                row = int(b.logits.gpudata) + ((i * T + T - 1) * V) * 4
                self.cuda.memcpy_dtoh_async(out[i], row, self.stream)
        K.synchronize(self.stream, "forward")
        if targets is not None:
            losses = b.losses_host.copy()
        return out, losses

    def backward(self) -> None:
        b = self._bufs
        if "bwd" not in self._passes:
            self._passes["bwd"] = K.Pass(self._plan_backward(b), "backward")
        self._passes["bwd"].launch(self.stream)

    # -- sampling: a cache of every layer's keys and values -----------------------------------------
    def _decode_state(self, B):
        """The caches (B, NH, block_size, d_k) of every layer, one position's activations and the decode plan,
        for B sequences; made once per B."""
        if self._dec is not None and self._dec.B == B:
            return self._dec
        self._dec = None
        cfg, new = self.config, self._new
        C, NH, L, V = cfg.d_model, cfg.n_head, cfg.n_layer, cfg.vocab_size
        d = SimpleNamespace(B=B)
        d.k = [new(B, NH, cfg.block_size, C // NH) for _ in range(L)]
        d.v = [new(B, NH, cfg.block_size, C // NH) for _ in range(L)]
        # the new tokens and their position travel in one copy: ids[:B] the tokens, ids[B] the position
        d.ids_host = self.cuda.pagelocked_empty(B + 1, np.int32)
        d.ids = new(B + 1, dtype=np.int32)
        d.tokens, d.pos = d.ids[:B].reshape(B, 1), d.ids[B:]
        d.x, d.x1, d.ln, d.y, d.out, d.mlp = (new(B, 1, C) for _ in range(6))
        d.mean, d.rstd = new(B, 1), new(B, 1)
        d.qkv, d.fc, d.act = new(B, 1, 3 * C), new(B, 1, 4 * C), new(B, 1, 4 * C)
        d.logits, d.logits_host = new(B, 1, V), self.cuda.pagelocked_empty((B, V), np.float32)
        # the next tokens as k_sample chooses them, and the draws it chooses them by
        d.chosen, d.chosen_host = new(B, dtype=np.int32), self.cuda.pagelocked_empty(B, np.int32)
        d.u, d.u_host = new(B, dtype=np.float64), self.cuda.pagelocked_empty(B, np.float64)
        d.step = K.Pass(self._plan_decode(d), "decode")  # one CUDA graph, captured at the first decode
        self._dec = d
        return d

    def _plan_decode(self, d):
        """One position through every layer, as _plan_forward runs T of them, its attention against the caches."""
        cfg, P, ops = self.config, self.P, self.ops
        with K.recording() as plan:
            ops.embed_decode(d.x, d.tokens, P["wte"], P["wpe"], d.pos, check_token_ids=False)
            ops.layernorm_fwd(d.ln, d.mean, d.rstd, d.x, P["h.0.ln1.w"], P["h.0.ln1.b"])
            for l in range(cfg.n_layer):
                w = _sublayer(P, f"h.{l}.")
                ops.matmul_fwd(d.qkv, d.ln, w["attn.qkv.w"], w["attn.qkv.b"])
                ops.attention_decode(d.y, d.k[l], d.v[l], d.qkv, d.pos)
                ops.matmul_fwd(d.out, d.y, w["attn.proj.w"], w["attn.proj.b"])
                ops.residual_layernorm_fwd(d.x1, d.ln, d.mean, d.rstd, d.x, d.out, w["ln2.w"], w["ln2.b"])
                ops.matmul_fwd(d.fc, d.ln, w["mlp.fc.w"], w["mlp.fc.b"])
                ops.gelu_fwd(d.act, d.fc)
                ops.matmul_fwd(d.mlp, d.act, w["mlp.proj.w"], w["mlp.proj.b"])
                ln = "lnf." if l == cfg.n_layer - 1 else f"h.{l + 1}.ln1."  # the layernorm that reads the sum
                ops.residual_layernorm_fwd(d.x, d.ln, d.mean, d.rstd, d.x1, d.mlp, P[ln + "w"], P[ln + "b"])
            ops.matmul_fwd(d.logits, d.ln, P["wte"], None)  # tied output projection, no bias
        return plan

    def prefill(self, idx, choose=None):
        """idx: checked int32 (B, T), T <= block_size. The forward over the prompt, its keys and values kept in
        the caches for decode(); returns the last position's logits (B, V), or with `choose` (a
        sampling.Choice) the next tokens (B,) chosen on the GPU, only they copied back."""
        B, T = idx.shape
        last, _ = self.forward(idx, None, logits="last" if choose is None else None)
        d, b, NH = self._decode_state(B), self._bufs, self.config.n_head
        if b.fused and not hasattr(b, "heads"):  # the keys and values are in each layer's qkv: split out here
            b.heads = [self._new(B, NH, T, self.config.d_model // NH) for _ in range(3)]  # held with the buffers
        for l, s in enumerate(b.layers):
            k, v = s.att.k, s.att.v
            if b.fused:
                q, k, v = b.heads
                self.ops.split_heads_fwd(q, k, v, s.att.qkv, NH, stream=self.stream)
            self.ops.kv_store(d.k[l], k, stream=self.stream)
            self.ops.kv_store(d.v[l], v, stream=self.stream)
        d.length = T  # positions in the caches: decode's next one
        if choose is None:
            K.synchronize(self.stream, "prefill")
            return last[:, -1]
        V, row_bytes = self.config.vocab_size, self.config.vocab_size * 4
        for i in range(B):  # each sequence's last row of logits, where the decode step leaves its own
            self.cuda.memcpy_dtod_async(int(d.logits.gpudata) + i * row_bytes,
                                        int(self._bufs.logits.gpudata) + ((i * T + T - 1) * V) * 4, row_bytes,
                                        self.stream)
        return self._choose(d, choose, "prefill")

    def decode(self, tokens, pos, choose=None):
        """tokens: int (B,) ids, at position pos (< block_size), the one after the prefilled or decoded ones
        (the B of the last prefill). One position through every layer, one CUDA graph of the plan recorded
        once; returns its logits (B, V), or with `choose` the next tokens (B,) chosen on the GPU."""
        d = self._dec
        if d is None:
            raise RuntimeError("decode() needs a prefill() first: the caches hold no prompt")
        if pos != d.length or pos >= self.config.block_size:
            raise ValueError(f"pos must be the position after the cached ones, {d.length}, and below block_size="
                             f"{self.config.block_size}, got {pos}")
        tokens = np.asarray(tokens)
        if tokens.shape != (d.B,):
            raise ValueError(f"tokens must have shape ({d.B},), the prefilled batch's, got {tokens.shape}")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:  # the plan reads wte unchecked
            raise ValueError(f"tokens must lie in [0, {self.config.vocab_size}), got {tokens.min()}..{tokens.max()}")
        d.ids_host[:d.B], d.ids_host[d.B] = tokens, pos  # the last decode's copy is done (synchronized)
        self.cuda.memcpy_htod_async(d.ids.gpudata, d.ids_host, self.stream)
        d.step.launch(self.stream)
        d.length += 1
        if choose is not None:
            return self._choose(d, choose, "decode")
        self.cuda.memcpy_dtoh_async(d.logits_host, d.logits.gpudata, self.stream)
        K.synchronize(self.stream, "decode")
        return d.logits_host.copy()

    def _choose(self, d, choose, phase):
        """k_sample on d.logits by `choose`'s rule and draws; the chosen ids copied back."""
        if choose.u is not None:
            d.u_host[:] = choose.u
            self.cuda.memcpy_htod_async(d.u.gpudata, d.u_host, self.stream)
        self.ops.sample(d.chosen, d.logits.reshape(d.B, self.config.vocab_size),
                        d.u if choose.u is not None else None, choose.temperature, choose.top_k, choose.top_p,
                        stream=self.stream)
        self.cuda.memcpy_dtoh_async(d.chosen_host, d.chosen.gpudata, self.stream)
        K.synchronize(self.stream, phase)
        return d.chosen_host.copy()

    # -- optimiser ----------------------------------------------------------------------------------
    def step(self, t, lr, beta1, beta2, eps, weight_decay, grad_clip):
        grads = self.flat["grads"]
        self.ops.global_norm(self.sumsq, grads, stream=self.stream)
        self._has_norm = True
        clip = dict(sumsq=self.sumsq, max_norm=grad_clip) if grad_clip is not None else {}
        self.ops.adamw(self.flat["params"], grads, self.flat["m"], self.flat["v"], lr=lr, beta1=beta1, beta2=beta2,
                eps=eps, weight_decay=weight_decay, step=t, decay_mask=self.decay_mask, stream=self.stream, **clip)

    @property
    def last_grad_norm(self):
        if not self._has_norm:
            return None
        K.synchronize(self.stream, "step")
        return float(np.sqrt(self.sumsq.get()[0]))
