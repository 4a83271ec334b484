"""What a backend is: the calls GPT and MultiHeadAttention make, declared once.

Two backends implement each: microgpt.backend_numpy.NumpyBackend and microgpt.backend_cuda.CudaBackend for
the whole model, NumpyAttention and CudaAttention (microgpt.attention) for one attention sublayer.
tests/test_backends.py holds every implementation to its protocol, signatures included. GPT checks every
argument before a backend sees it, so a backend may trust what it is given.
"""
from __future__ import annotations

from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from .config import GPTConfig

# The four flat float vectors of a model, laid out by microgpt.params: weights, gradients, Adam m and v.
FLAT_VECTORS = ("params", "grads", "m", "v")


def check_which(which: str) -> str:
    if which not in FLAT_VECTORS:
        raise ValueError(f"which must be one of {FLAT_VECTORS}, got {which!r}")
    return which


@runtime_checkable
class Backend(Protocol):
    """The whole GPT on one device: four flat vectors, a forward and backward pass, an optimiser step."""

    config: GPTConfig
    dtype: np.dtype  # of the flat vectors and the activations

    def pull(self, which: str) -> np.ndarray:
        """One flat vector (FLAT_VECTORS) as a host array of n_params numbers."""

    def push(self, which: str, values: np.ndarray) -> None:
        """Copies n_params numbers into one flat vector."""

    def zero_grad(self) -> None:
        """Sets the gradient vector to zero."""

    def forward(self, idx: np.ndarray, targets: np.ndarray | None = None,
                logits: str | None = "all") -> tuple[np.ndarray | None, np.ndarray | None]:
        """idx, targets: checked int32 (B, T). Returns (logits: all (B, T, V), the last position's
        (B, 1, V), or None; per-position losses (B, T) or None without targets), and keeps what backward
        needs."""

    def backward(self) -> None:
        """Adds the gradients of the mean loss of the last forward (with targets) into the gradients."""

    def step(self, t: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
             grad_clip: float | None) -> None:
        """Optional global-norm clipping, then AdamW step t (1-based), weight decay on 2-D tensors only."""

    @property
    def last_grad_norm(self) -> float | None:
        """The global gradient norm before clipping, of the last step (None before the first)."""

    # Optional, for data-parallel training (microgpt.distributed): grad_buffer() -> the live flat gradient
    # vector (a NumPy array, or a device array with __cuda_array_interface__) for a collective to sum in place.
    # Optional, for sampling: a key-value cache (both backends have one; GPT.generate runs the whole window
    # for each token on a backend without it).
    #   prefill(idx (B, T), T <= block_size, choose=None) -> the last position's logits (B, V), every layer's
    #       keys and values kept for positions 0 .. T-1;
    #   decode(tokens (B,), pos, choose=None) -> logits (B, V) of one more position, its keys and values kept;
    #   with choose (a sampling.Choice: the rule and this step's draws) both return the next tokens (B,)
    #       instead, chosen where the logits are (the cuda backend copies back only the ids);
    #   decode_steps(tokens (B,), pos, choices) -> yields the tokens (B,) of a decode step for each Choice, each
    #       step reading the last one's (the cuda backend queues a step ahead of the one it waits for).


@runtime_checkable
class AttentionBackend(Protocol):
    """One attention sublayer on one device: what MultiHeadAttention runs."""

    def load(self, weights: Mapping[str, np.ndarray]) -> None:
        """Takes the sublayer's weights (qkv.w, qkv.b, proj.w, proj.b) for the calls that follow."""

    def forward(self, x: np.ndarray, keep_intermediates: bool) -> tuple[np.ndarray, dict | None]:
        """x (B, T, C) float32 -> (out (B, T, C), the per-stage intermediates or None), keeping what
        backward needs."""

    def backward(self, dout: np.ndarray) -> tuple[np.ndarray, dict]:
        """dout (B, T, C) of the last forward -> (dx, the weights' gradients by name)."""
