"""Choosing the next token from the logits of the last position: greedy, temperature, top-k, top-p.

    nxt = sample_next(logits, temperature=0.8, top_k=40, top_p=0.95, rng=np.random.default_rng(0))
    # the same, in its two parts: the random draw, then the rule that turns it into a token
    nxt = choose(logits, 0.8, 40, 0.95, draw(rng, len(logits), 0.8))

One rule for every backend, on the host in float64; the same seed gives the same tokens. The cuda backend's
kernel k_sample (cuda/sampling.cuh, launched by microgpt.kernels.sample) applies the same rule in float64 to
the same float32 logits and the same draws u, so the two choose the same token unless a draw lands within
rounding (about 1e-15 relative) of a boundary between two tokens' cumulative probabilities, or a token's
probability within rounding of the top-p boundary. Every step of the rule is order-free (ties at the top-k
and top-p boundaries are kept or dropped together), so a kernel that sums in another order can follow it.
"""
from __future__ import annotations

from dataclasses import dataclass

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


def draw(rng: np.random.Generator | None, batch: int, temperature: float) -> np.ndarray | None:
    """The random part of a step: one uniform u in [0, 1) a row, float64 (batch,), from one call of
    rng.random; None at temperature 0, which takes the most likely token and leaves rng untouched."""
    if temperature == 0:
        return None
    return rng.random(batch)


def choose(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
           u: np.ndarray | None) -> np.ndarray:
    """logits (B, V) -> (B,) int32 token ids, given u (B,) in [0, 1) from draw() (unused at temperature 0).

    temperature 0: the most likely token (the first index of the largest logit). Otherwise, in float64:
    z = (logits - max) / temperature; top_k < V keeps the tokens whose logit is >= the k-th largest (ties
    with it kept); p = exp(z - max z) over the kept tokens, normalised; top_p < 1 keeps token i iff the total
    probability of the tokens strictly more likely than it (of a larger logit) is below top_p: the smallest
    set whose mass reaches top_p, tied tokens kept or dropped together whatever their order; renormalised.
    The token is the first index whose cumulative p, in token-id order, exceeds u * the total (V - 1 if none
    does); a token of probability 0 is never chosen.
    "More likely" compares the logits, not their rounded probabilities: the same order but where rounding
    makes two logits' z or p equal (a temperature of 1e30; logits near 0 beside a max of 1), which would
    otherwise tie tokens that the kernel, comparing logits, does not."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int32)
    z = (logits - logits.max(axis=-1, keepdims=True)) / temperature  # max first: no overflow at tiny T
    V = z.shape[-1]
    if top_k is not None and top_k < V:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        z = np.where(logits < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        p = np.where(_mass_strictly_above(logits, p) < top_p, p, 0.0)  # the most likely token is always kept
        p /= p.sum(axis=-1, keepdims=True)
    cdf = p.cumsum(axis=-1)
    target = np.asarray(u, dtype=np.float64).reshape(-1, 1) * cdf[:, -1:]
    return np.minimum((cdf <= target).sum(axis=-1), V - 1).astype(np.int32)


def _mass_strictly_above(logits: np.ndarray, p: np.ndarray) -> np.ndarray:
    """(B, V): for each token, the sum of p over its row's tokens of a strictly larger logit (equal logits get
    equal masses, whatever their order): the exclusive cumulative sum of p with the row sorted from the
    largest logit down, read where the token's logit first appears."""
    out = np.empty_like(p)
    for b, (row, pr) in enumerate(zip(logits, p)):
        before = np.concatenate(([0.0], np.cumsum(pr[np.argsort(-row, kind="stable")])[:-1]))
        above = len(row) - np.searchsorted(np.sort(row), row, side="right")  # how many logits are larger
        out[b] = before[above]
    return out


@dataclass(frozen=True, eq=False)
class Choice:
    """One step's choice, to hand to whatever holds the logits: the rule's options (checked) and this step's
    draws u (draw(); None at temperature 0). Called on logits (B, V) it is choose() on them."""
    temperature: float
    top_k: int | None
    top_p: float | None
    u: np.ndarray | None

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        return choose(logits, self.temperature, self.top_k, self.top_p, self.u)


def sample_next(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                rng: np.random.Generator | None) -> np.ndarray:
    """logits (B, V) -> (B,) int32 token ids: choose() with a fresh draw() from rng (one call of rng.random a
    step when temperature > 0; none at temperature 0, where rng may be None)."""
    return choose(logits, temperature, top_k, top_p, draw(rng, np.shape(logits)[0], temperature))
