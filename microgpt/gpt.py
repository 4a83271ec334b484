"""GPT: the ANDREA model behind one API, on the numpy backend (CPU) or the cuda backend (the kernels).

    model = GPT(GPTConfig.preset("andrea-12m"), backend="cuda")
    logits, loss = model.forward(idx, targets)   # idx, targets: int (B, T)
    model.zero_grad(); model.backward(); model.step(lr=3e-4, grad_clip=1.0)

Every argument is checked here, before a backend (and so before any kernel) sees it.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from . import checkpoint, hf
from .backend import Backend
from .backend_cuda import CudaBackend
from .backend_numpy import NumpyBackend
from .config import GPTConfig
from .ops import resolve
from .params import init_params, num_params, param_table, views
from .sampling import Choice, check_sampling, draw


def _as_array(name, a, shape="(B, T)"):
    """a as a NumPy array; TypeError naming it where NumPy cannot make one (ragged lists and the like)."""
    if isinstance(a, np.ndarray):
        return a
    try:
        return np.asarray(a)
    except Exception as e:
        raise TypeError(f"{name} must be an integer array of shape {shape}: {e}") from None


def _check_tokens(name, a, config, max_T=None):
    """An integer (B, T) array of ids in [0, vocab), T <= max_T (block_size by default); returned as
    C-contiguous int32."""
    a = _as_array(name, a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array of token ids, got dtype {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{name} must have shape (B, T), got shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} must have B >= 1 and T >= 1, got shape {a.shape}")
    if a.shape[1] > (config.block_size if max_T is None else max_T):
        raise ValueError(f"{name} has T={a.shape[1]} positions, above block_size={config.block_size}")
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= config.vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name} holds token id {bad}, outside [0, vocab_size={config.vocab_size})")
    return np.ascontiguousarray(a, dtype=np.int32)


def _numpy_backend(config, dtype, variant):
    resolve(variant)  # the numpy backend has one set of operations; a bad name is still refused
    return NumpyBackend(config, dtype=dtype)


def _cuda_backend(config, dtype, variant):
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"dtype: the cuda backend is float32 only, got {np.dtype(dtype)}")
    return CudaBackend(config, variant=variant)


BACKENDS = {"numpy": _numpy_backend, "cuda": _cuda_backend}


class GPT:
    def __init__(self, config: GPTConfig, backend: str = "numpy", seed: int = 0, dtype=np.float32,
                 variant: str | None = None):
        """backend: "numpy" (the reference engine on the CPU; float32, or float64 for gradient checks) or
        "cuda" (the kernels). variant: the cuda backend's kernels, a name of microgpt.ops.VARIANTS (None:
        ops.DEFAULT_VARIANT, "tc"; "fast"; "reference", the readable kernels only); the numpy backend has one set."""
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {backend!r}")
        self.config = config
        self.table = param_table(config)
        self.backend: Backend = BACKENDS[backend](config, dtype, variant)
        self.step_count = 0  # AdamW steps taken, the t of its bias correction
        self._can_backward = False
        init = np.empty(num_params(config), dtype=self.backend.dtype)
        init_params(config, init, seed)
        self.backend.push("params", init)

    @property
    def num_params(self) -> int:
        return num_params(self.config)

    # -- forward / backward -----------------------------------------------------------------------
    def forward(self, idx, targets=None, *, return_logits=True):
        """logits (B, T, V) float32 as NumPy, and the mean cross-entropy against targets (None without).
        return_logits=False skips bringing the logits back (a training step needs only the loss)."""
        idx = _check_tokens("idx", idx, self.config)
        if targets is not None:
            targets = _check_tokens("targets", targets, self.config)
            if targets.shape != idx.shape:
                raise ValueError(f"targets must have the shape of idx {idx.shape}, got {targets.shape}")
        logits, losses = self.backend.forward(idx, targets, logits="all" if return_logits else None)
        self._can_backward = targets is not None
        loss = None if losses is None else float(np.mean(losses, dtype=np.float64))
        return logits, loss

    def backward(self) -> None:
        """Adds the gradients of the last forward's mean loss to the gradients (zero_grad clears them)."""
        if not self._can_backward:
            raise RuntimeError("backward() needs a forward(idx, targets) with targets first")
        self.backend.backward()
        self._can_backward = False  # the saved activations belong to one backward

    def zero_grad(self) -> None:
        self.backend.zero_grad()

    def step(self, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, grad_clip=None) -> None:
        """Optional global-norm clipping (as torch.nn.utils.clip_grad_norm_), then AdamW (as
        torch.optim.AdamW, weight decay on 2-D tensors only)."""
        lr, eps, weight_decay = float(lr), float(eps), float(weight_decay)
        try:
            beta1, beta2 = (float(b) for b in betas)
        except (TypeError, ValueError):
            raise TypeError(f"betas must be a pair of floats, got {betas!r}") from None
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")  # one inf turns every weight into NaN
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        for name, b in (("betas[0]", beta1), ("betas[1]", beta2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {b}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if grad_clip is not None:
            grad_clip = float(grad_clip)
            if not (grad_clip > 0 and math.isfinite(grad_clip)):
                raise ValueError(f"grad_clip must be a finite number > 0 or None, got {grad_clip}")
        self.step_count += 1
        self.backend.step(self.step_count, lr, beta1, beta2, eps, weight_decay, grad_clip)

    @property
    def last_grad_norm(self):
        """The global gradient norm before clipping, of the last step()."""
        return self.backend.last_grad_norm

    # -- sampling ---------------------------------------------------------------------------------
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, on_token=None):
        """Extends idx (B, T) by max_new_tokens sampled tokens (microgpt.sampling: temperature 0 takes the
        most likely one; top_k, top_p cut the candidates). The model sees the last block_size tokens. A
        backend with a key-value cache (prefill, decode) runs the prompt once and then one position a token,
        re-running the window only when it moves past block_size, and chooses each token itself (the cuda
        backend on the GPU, by the same rule and draws); others run the whole window each token.
        on_token(ids (B,)) is called with each new column as it is chosen."""
        cfg = self.config
        idx = _as_array("idx", idx, "(T,) or (B, T)")
        if idx.ndim == 1:  # one prompt
            idx = idx[None]
        # a prompt longer than block_size is fine: the model sees its last block_size tokens
        idx = _check_tokens("idx", idx, cfg, max_T=np.inf)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        temperature, top_k, top_p = check_sampling(temperature, top_k, top_p, cfg.vocab_size)
        if on_token is not None and not callable(on_token):
            raise TypeError(f"on_token must be callable or None, got {type(on_token).__name__}")
        rng = np.random.default_rng(seed)
        self._can_backward = False
        cached = callable(getattr(self.backend, "decode_steps", None))
        # the choice of each new token, its draws made in order as the tokens are (lazily, one a token)
        choices = (Choice(temperature, top_k, top_p, draw(rng, idx.shape[0], temperature))
                   for _ in range(max_new_tokens))
        out = [idx]

        def emit(nxt):
            out.append(np.asarray(nxt, np.int32)[:, None])
            if on_token is not None:
                on_token(out[-1][:, 0])

        for choose in choices:
            window = np.ascontiguousarray(np.concatenate(out, axis=1)[:, -cfg.block_size:])
            if not cached:
                last, _ = self.backend.forward(window, None, logits="last")
                emit(choose(last[:, -1]))
                continue
            # the prompt (or a window that moved past block_size), then one position a token until the cache is full
            emit(self.backend.prefill(window, choose))
            steps = min(max_new_tokens - (len(out) - 1), cfg.block_size - window.shape[1])
            if steps > 0:
                for nxt in self.backend.decode_steps(out[-1][:, 0], window.shape[1], itertools.islice(choices, steps)):
                    emit(nxt)
        return np.concatenate(out, axis=1)

    # -- state ------------------------------------------------------------------------------------
    def _named(self, which):
        return {k: v.astype(np.float32, copy=True) for k, v in views(self.table, self.backend.pull(which)).items()}

    def state_dict(self) -> dict:
        """name -> float32 NumPy copy of every weight (names of microgpt.params)."""
        return self._named("params")

    def grad_dict(self) -> dict:
        """name -> float32 NumPy copy of the gradient accumulated by backward()."""
        return self._named("grads")

    def load_state_dict(self, state: dict) -> None:
        """Loads every weight; refuses, loading nothing, a dict with a missing, extra, misshaped or non-finite
        tensor."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict of name -> array, got {type(state).__name__}")
        expected = {s.name: s.shape for s in self.table}
        wrong = {"missing": [n for n in expected if n not in state],
                 "unexpected": [n for n in state if n not in expected]}
        parts = [f"{what} {', '.join(map(str, names[:8]))}{' ...' if len(names) > 8 else ''}"
                 for what, names in wrong.items() if names]
        if parts:
            raise ValueError(f"state_dict does not match the config: {'; '.join(parts)}")
        flat = np.array(self.backend.pull("params"), copy=True)
        named = views(self.table, flat)
        for name, shape in expected.items():
            value = np.asarray(state[name])
            if value.dtype.kind not in "fiu":
                raise TypeError(f"state_dict[{name!r}] must be a float array, got dtype {value.dtype}")
            if value.shape != shape:
                raise ValueError(f"state_dict[{name!r}] has shape {value.shape}, expected {shape}")
            if not np.isfinite(value).all():
                raise ValueError(f"state_dict[{name!r}] holds non-finite values (NaN or inf)")
            named[name][...] = value
        self.backend.push("params", flat)

    # -- checkpoints ------------------------------------------------------------------------------
    # Only backend.pull/push, step_count and config: every backend checkpoints the same way.
    def save(self, path, extra: dict | None = None) -> None:
        """Writes the ANDREA checkpoint (step, weights, Adam m and v) at path and its sidecar at path + '.json',
        atomically (microgpt.checkpoint). extra: JSON values kept with it (a BatchSampler's state, say)."""
        checkpoint.save(path, self.config, self.step_count, self.backend.pull("params"),
                        self.backend.pull("m"), self.backend.pull("v"), extra=extra)

    @classmethod
    def load(cls, path, backend: str = "numpy", variant: str | None = None) -> "GPT":
        """The model of the checkpoint at path, on backend, ready to continue training: weights, Adam m and
        v and the step are those saved, bit for bit; gradients are zero."""
        return cls.from_checkpoint(checkpoint.read(path), backend=backend, variant=variant)

    @classmethod
    def from_checkpoint(cls, ckpt: "checkpoint.Checkpoint", backend: str = "numpy",
                        variant: str | None = None) -> "GPT":
        """The model of a checkpoint already read (checkpoint.read), as load() makes it; ckpt.extra is what
        was saved with it."""
        model = cls(ckpt.config, backend=backend, variant=variant)
        model._restore(ckpt)
        return model

    @classmethod
    def from_hf(cls, path, backend: str = "numpy", variant: str | None = None) -> "GPT":
        """The GPT-2 of a Hugging Face save_pretrained directory (config.json + model.safetensors), on backend:
        its weights as microgpt.hf reads them; step 0, Adam moments zero. A config microgpt cannot compute is
        refused by name (microgpt.hf)."""
        config, state = hf.read_hf(path)
        model = cls(config, backend=backend, variant=variant)
        model.load_state_dict(state)
        return model

    def save_hf(self, path) -> None:
        """Writes the weights as a Hugging Face GPT-2 directory that transformers.GPT2LMHeadModel
        .from_pretrained loads (microgpt.hf); the Adam moments and the step are not part of that format."""
        hf.write_hf(path, self.config, self.state_dict())

    def load_checkpoint(self, path) -> dict:
        """Restores weights, Adam m and v and the step from a checkpoint of this model's config, and returns
        its extra. The file is read and checked whole first: one that is refused leaves the model as it was."""
        ckpt = checkpoint.read(path, expect_config=self.config)
        self._restore(ckpt)
        return ckpt.extra

    def _restore(self, ckpt) -> None:
        self.backend.push("params", ckpt.weights)
        self.backend.push("m", ckpt.m)
        self.backend.push("v", ckpt.v)
        self.backend.push("grads", np.zeros_like(ckpt.weights))
        self.step_count = ckpt.step
        self._can_backward = False  # the last forward's activations belong to the old weights
