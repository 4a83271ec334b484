"""The cuda backend: microgpt.model on the GPU, through one variant's launchers of cuda/microgpt_cuda.cu.

Weights, gradients, Adam m and v live on the device as four flat float32 vectors laid out by
microgpt.params; activations are allocated once per (B, T) and reused. A forward, backward or decode pass is a
fixed sequence of launches, so it is recorded once (per (B, T), or per B for decode): every launch's arguments are
checked by the launch layer when the plan is made, and the pass then runs as one CUDA graph of it (kernels.Pass;
launch by launch where no graph can be captured) on one stream. In a training step the
only transfers are the batch in (from page-locked memory) and the per-position losses out.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from . import kernels as K
from . import attention, model
from .backend import FLAT_VECTORS, check_which
from .config import GPTConfig
from .ops import select
from .params import decays, num_params, param_table


def _last_rows(logits) -> list[int]:
    """The device address of each sequence's last row of logits (B, T, V), whose rows lie strides[1] bytes apart
    (model.padded_rows)."""
    B, T, _ = logits.shape
    pitch = logits.strides[1]
    return [int(logits.gpudata) + (i * T + T - 1) * pitch for i in range(B)]


def device_views(table, flat):
    """Zero-copy named GPUArray views into a flat device vector."""
    return {s.name: flat[s.offset:s.offset + s.size].reshape(s.shape) for s in table}


class CudaBackend:
    dtype = np.dtype(np.float32)

    def __init__(self, config: GPTConfig, variant: str | None = None, device=None):
        """device: the engine it runs on and plans for: this process's GPU (kernels.engine(), the default), or one
        that microgpt.kernels.virtual describes, whose plans record what that GPU would run."""
        self.ops = select(variant)  # refuses an unknown variant before anything is allocated
        self.device = K.engine() if device is None else device
        self.cuda, self.ga = self.device.cuda, self.device.ga
        self.config = config
        self.table = param_table(config)
        self.stream = self.cuda.Stream()
        self.pool = self.device.memory_pool()  # activations come and go with (B, T): reuse their memory
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
        self._passes = {}   # ("forward", with targets) and "backward" -> K.Pass of its plan, at the buffers' (B, T)
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
        """microgpt.model's activations at (B, T), made once and kept until another (B, T) comes, with the batch
        they read: token ids, targets and the positions sorted by token (the embedding backward's), one copy."""
        if self._bufs is not None and self._bufs.shape == (B, T):
            return self._bufs
        self._bufs = None
        self._passes = {}
        self.pool.free_held()
        cfg, new = self.config, self._new
        fused = attention.fused(self.ops, cfg.d_k, T, self.device)
        b = model.activations(cfg, B, T, new, attention.states(new, B, T, cfg.d_model, cfg.n_head, fused=fused))
        b.fused = fused
        b.batch_host = self.cuda.pagelocked_empty((3, B, T), np.int32)
        b.batch_sent = self.cuda.Event()  # recorded after each copy of batch_host to the device
        b.losses_host = self.cuda.pagelocked_empty((B, T), np.float32)
        b.batch = new(3, B, T, dtype=np.int32)
        b.idx, b.tgt, b.order = b.batch[0], b.batch[1], b.batch[2]
        b.dlosses = self.ga.to_gpu(np.full((B, T), 1.0 / (B * T), np.float32))
        self._bufs = b
        return b

    def _grad_buffers(self, b):
        if not hasattr(b, "d"):
            B, T = b.shape
            cfg = self.config
            b.d = model.gradients(cfg, B, T, self._new, lambda: attention.grad_buffers(
                self._new, B, T, cfg.d_model, cfg.n_head, fused=b.fused))
        return b.d

    # -- forward / backward ---------------------------------------------------------------------------
    def _weight_splits(self, b, transposed: bool):
        """The products' weights as the pass's products from split operands may read them split once (the tc variant
        on sm_90a): the forward's as out = inp @ W^T reads them, the backward's transposed, as dinp = dout @ W does;
        held with the activations of (B, T), both in one arena (each pass splits them at its start, and the passes
        run in turn)."""
        key = "bwd_splits" if transposed else "fwd_splits"
        if not hasattr(b, key):
            weights = model.product_weights(self.P, self.config)
            if not hasattr(b, "split_arena"):
                floats = max(K.split_floats(K.weight_splits(weights, t).candidates) for t in (False, True))
                b.split_arena = K.SplitArena(floats, self._new)
            setattr(b, key, K.weight_splits(weights, transposed, b.split_arena.allocator()))
        return getattr(b, key)

    def _plan(self, b, pass_, transposed) -> K.Plan:
        """One pass of microgpt.model over b, pass_(ops), recorded, its products reading the weights split once."""
        plan = K.Plan(self.device)
        with self._weight_splits(b, transposed).reading(plan):
            pass_(self.ops.on(plan))
        return plan

    def plan(self, which: str, B: int, T: int, targets: bool = True) -> K.Plan:
        """The recorded launches of one pass at (B, T), made once and kept with the buffers: "forward" (with or
        without targets), "backward" (of the forward with targets), "decode" (one position, B sequences)."""
        if which == "decode":
            return self._decode_state(B).step.plan  # the logits: sampling adds k_sample
        b = self._buffers(B, T)
        key = "backward" if which == "backward" else (which, targets)
        if key not in self._passes:
            if which == "forward":
                plan = self._plan(b, lambda ops: model.forward(ops, self.P, self.config, b, targets), False)
            elif which == "backward":
                d = self._grad_buffers(b)
                plan = self._plan(b, lambda ops: model.backward(ops, self.P, self.G, self.config, b, d), True)
            else:
                raise ValueError(f"which must be 'forward', 'backward' or 'decode', got {which!r}")
            self._passes[key] = K.Pass(plan, which)
        return self._passes[key].plan

    def forward(self, idx, targets=None, logits="all"):
        """idx, targets: checked int32 (B, T) host arrays. Returns (logits or None, losses or None)."""
        B, T = idx.shape
        self.plan("forward", B, T, targets is not None)
        b, key = self._bufs, ("forward", targets is not None)
        order = K.token_order(idx)  # on the host while the device may still run the last step
        b.batch_sent.synchronize()  # the last copy from the page-locked batch, not the step after it
        b.batch_host[0] = idx
        b.batch_host[1] = 0 if targets is None else targets
        b.batch_host[2] = order
        self.cuda.memcpy_htod_async(b.batch.gpudata, b.batch_host, self.stream)
        b.batch_sent.record(self.stream)
        self._passes[key].launch(self.stream)
        losses = out = None
        if targets is not None:
            self.cuda.memcpy_dtoh_async(b.losses_host, b.losses.gpudata, self.stream)
        if logits == "all":
            out = b.logits.get_async(stream=self.stream)  # its padded rows copied out as (B, T, V)
        elif logits == "last":  # one row per sequence, for sampling
            out = self.cuda.pagelocked_empty((B, 1, self.config.vocab_size), np.float32)
            for i, row in enumerate(_last_rows(b.logits)):
                self.cuda.memcpy_dtoh_async(out[i], row, self.stream)
        K.synchronize(self.stream, "forward (or the step queued before it)")
        if targets is not None:
            losses = b.losses_host.copy()
        return out, losses

    def backward(self) -> None:
        self.plan("backward", *self._bufs.shape)
        self._passes["backward"].launch(self.stream)

    # -- sampling: a cache of every layer's keys and values -----------------------------------------
    def _decode_state(self, B):
        """The caches (B, NH, block_size, d_k) of every layer, one position's activations and the decode plan,
        for B sequences; made once per B."""
        if self._dec is not None and self._dec.B == B:
            return self._dec
        self._dec = None
        cfg, new, pinned = self.config, self._new, self.cuda.pagelocked_empty
        # ids[:B]: the tokens a step reads, where k_sample writes the next ones; ids[B]: the position
        d = SimpleNamespace(B=B, cache=model.kv_cache(cfg, B, new), ids=new(B + 1, dtype=np.int32),
                            ids_host=pinned(B + 1, np.int32), logits_host=pinned((B, cfg.vocab_size), np.float32),
                            u=new(B, dtype=np.float64), sampled={})
        d.a = model.decode_activations(cfg, d.cache, d.ids[:B].reshape(B, 1), d.ids[B:], new)
        d.logits = d.a.logits.reshape(B, cfg.vocab_size)
        # per step in flight (two: decode_steps queues one ahead): its position and draws in, and its tokens, which
        # k_sample writes into mapped host memory as well as into ids (no copy back after the step)
        d.ring = [SimpleNamespace(pos=pinned(1, np.int32), u=pinned(B, np.float64),
                                  ids=self.device.mapped_empty(B, np.int32), done=self.cuda.Event()) for _ in range(2)]
        d.step = self._decode_pass(d, None)
        self._dec = d
        return d

    def _decode_pass(self, d, rule, slot=None):
        """One decode step recorded (one CUDA graph, captured at its first launch): its logits, and with rule
        (temperature, top_k, top_p) k_sample's choice by it, written into ids[:B] for the next step to read and
        into the ring slot's mapped ids for the host."""
        plan = K.Plan(self.device)
        ops = self.ops.on(plan)
        model.decode(ops, self.P, self.config, d.a)
        if rule is not None:
            temperature, top_k, top_p = rule
            ops.sample(d.ids[:d.B], d.logits, d.u if temperature > 0 else None, temperature, top_k, top_p,
                       mirror=slot.ids)
        return K.Pass(plan, "decode")

    def _sampled(self, d, choose, i=0):
        """The decode pass that chooses by `choose`'s rule, its tokens for ring slot i (made at its first use)."""
        key = (choose.temperature, choose.top_k, choose.top_p, i)
        if key not in d.sampled:
            d.sampled[key] = self._decode_pass(d, key[:3], d.ring[i])
        return d.sampled[key]

    def prefill(self, idx, choose=None):
        """idx: checked int32 (B, T), T <= block_size. The forward over the prompt, its keys and values kept in
        the caches for decode(); returns the last position's logits (B, V), or with `choose` (a
        sampling.Choice) the next tokens (B,) chosen on the GPU, only they copied back."""
        B, T = idx.shape
        last, _ = self.forward(idx, None, logits="last" if choose is None else None)
        d, b, cfg = self._decode_state(B), self._bufs, self.config
        if b.fused and not hasattr(b, "heads"):  # the keys and values are in each layer's qkv: split out here
            b.heads = [self._new(B, cfg.n_head, T, cfg.d_k) for _ in range(3)]  # held with the buffers
        model.fill_cache(self.ops.on(self.stream), cfg, b, d.cache, getattr(b, "heads", None))
        d.length = T  # positions in the caches: decode's next one
        if choose is None:
            K.synchronize(self.stream, "prefill")
            return last[:, -1]
        row_bytes = cfg.vocab_size * 4
        for i, row in enumerate(_last_rows(self._bufs.logits)):  # where the decode step leaves its own logits
            self.cuda.memcpy_dtod_async(int(d.logits.gpudata) + i * row_bytes, row, row_bytes, self.stream)
        slot = d.ring[0]
        self._put_draws(d, slot, choose)
        self.ops.sample(d.ids[:B], d.logits, d.u if choose.u is not None else None, choose.temperature, choose.top_k,
                        choose.top_p, mirror=slot.ids, stream=self.stream)
        return self._tokens(slot, "prefill")

    def _check_step(self, d, tokens, pos):
        """The tokens (B,) and position of a decode step, checked; they are copied to ids (in ids_host)."""
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
        d.ids_host[:d.B], d.ids_host[d.B] = tokens, pos  # the last step's copy is done (synchronized)
        self.cuda.memcpy_htod_async(d.ids.gpudata, d.ids_host, self.stream)

    def decode(self, tokens, pos, choose=None):
        """tokens: int (B,) ids, at position pos (< block_size), the one after the prefilled or decoded ones
        (the B of the last prefill). One position through every layer, one CUDA graph of the plan recorded
        once; returns its logits (B, V), or with `choose` the next tokens (B,) chosen on the GPU."""
        d = self._dec
        self._check_step(d, tokens, pos)
        if choose is None:
            d.step.launch(self.stream)
            d.length += 1
            self.cuda.memcpy_dtoh_async(d.logits_host, d.logits.gpudata, self.stream)
            K.synchronize(self.stream, "decode")
            return d.logits_host.copy()
        slot = d.ring[0]
        self._put_draws(d, slot, choose)
        self._sampled(d, choose).launch(self.stream)
        d.length += 1
        return self._tokens(slot, "decode")

    def decode_steps(self, tokens, pos, choices):
        """Runs a decode step for each sampling.Choice of `choices` (an iterable, taken one at a time as the steps
        are queued), from tokens (B,) at position pos; yields each step's chosen tokens (B,). Each step reads the
        tokens the step before chose where k_sample wrote them, so the host queues step i + 1 before it waits for
        step i's tokens: the GPU never waits for Python."""
        d = self._dec
        self._check_step(d, tokens, pos)
        waiting = None  # the slot of the step queued before, whose tokens are still to come
        for i, choose in enumerate(choices):
            slot = d.ring[i % 2]  # the step two before, which used it, has been waited for
            if i > 0:  # the position is ids[B]: copied in with the tokens for the first step
                slot.pos[0] = pos + i
                self.cuda.memcpy_htod_async(int(d.ids.gpudata) + 4 * d.B, slot.pos, self.stream)
            self._put_draws(d, slot, choose)
            self._sampled(d, choose, i % 2).launch(self.stream)
            d.length += 1
            slot.done.record(self.stream)
            if waiting is not None:
                yield self._wait(waiting)
            waiting = slot
        if waiting is not None:
            yield self._wait(waiting)

    def _put_draws(self, d, slot, choose) -> None:
        """Queues the copy of choose's draws u (none at temperature 0) to the device, from the slot's pinned copy."""
        if choose.u is not None:
            slot.u[:] = choose.u
            self.cuda.memcpy_htod_async(d.u.gpudata, slot.u, self.stream)

    def _tokens(self, slot, phase):
        """The chosen tokens, which k_sample wrote into the slot's mapped ids, once the stream is done."""
        K.synchronize(self.stream, phase)
        return slot.ids.host.copy()

    def _wait(self, slot):
        """The tokens of the step that recorded slot.done, once they are back."""
        try:
            slot.done.synchronize()
        except self.cuda.Error as err:
            raise K.KernelError(f"a kernel launched in the decode failed: {err} (MICROGPT_SYNC=1 names it)") from None
        return slot.ids.host.copy()

    # -- optimiser ----------------------------------------------------------------------------------
    def step(self, t, lr, beta1, beta2, eps, weight_decay, grad_clip):
        self.optimizer(self.ops.on(self.stream), t, lr, beta1, beta2, eps, weight_decay, grad_clip)
        self._has_norm = True

    def optimizer(self, ops, t, lr, beta1, beta2, eps, weight_decay, grad_clip) -> None:
        """The step's launches through `ops` (bound to the stream, or to a plan that records them): the global
        norm of the gradients, then AdamW over the flat vectors, clipping first where grad_clip is given."""
        grads = self.flat["grads"]
        ops.global_norm(self.sumsq, grads)
        clip = dict(sumsq=self.sumsq, max_norm=grad_clip) if grad_clip is not None else {}
        ops.adamw(self.flat["params"], grads, self.flat["m"], self.flat["v"], lr=lr, beta1=beta1, beta2=beta2,
                  eps=eps, weight_decay=weight_decay, step=t, decay_mask=self.decay_mask, **clip)

    @property
    def last_grad_norm(self):
        if not self._has_norm:
            return None
        K.synchronize(self.stream, "step")
        return float(np.sqrt(self.sumsq.get()[0]))
