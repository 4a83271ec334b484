"""Choosing the next token from the logits of the last position: greedy, temperature, top-k, top-p.

    nxt = sample_next(logits, temperature=0.8, top_k=40, top_p=0.95, rng=np.random.default_rng(0))

One rule for every backend, on the host in float64; the same seed gives the same tokens.
"""
from __future__ import annotations

import numpy as np


def check_sampling(temperature, top_k, top_p, vocab_size: int) -> tuple[float, int | None, float | None]:
    """The sampling options, checked (ValueError naming the argument) and normalised."""
    temperature = float(temperature)
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or not 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k must be None or an int in [1, vocab_size={vocab_size}], got {top_k!r}")
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.floating, np.integer)) \
                or not 0.0 < float(top_p) <= 1.0:
            raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
        top_p = float(top_p)
    return temperature, (None if top_k is None else int(top_k)), top_p


def sample_next(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                rng: np.random.Generator) -> np.ndarray:
    """logits (B, V) -> (B,) int32 token ids. temperature 0 takes the most likely token (no random draw);
    otherwise the logits are divided by the temperature, cut to the top_k largest, the probabilities cut to
    the smallest set whose mass reaches top_p (nucleus sampling), and one token drawn per row."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int32)
    logits = (logits - logits.max(axis=-1, keepdims=True)) / temperature  # max first: no overflow at tiny T
    V = logits.shape[-1]
    if top_k is not None and top_k < V:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # the mass of the more likely tokens
        keep = np.zeros_like(p, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)  # the first token is always kept
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    # the first token whose cumulative mass passes u: a token of probability 0 is never drawn
    cdf = p.cumsum(axis=-1)
    u = rng.random((p.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), V - 1).astype(np.int32)
