"""Training data: text -> tokens -> train/validation split -> seeded (B, T+1) batches."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .tokenizer import ByteTokenizer


def builtin_corpus() -> str:
    """A corpus every Python install has: the standard library's pydoc topics (about 0.5 MB of English)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def load_tokens(path: str | None = None, tokenizer: ByteTokenizer | None = None) -> np.ndarray:
    tokenizer = tokenizer or ByteTokenizer()
    if path is None:
        text = builtin_corpus()
    else:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"data file {path!r} does not exist")
        text = p.read_text(encoding="utf-8", errors="replace")
    return tokenizer.encode(text)


def split(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = int(len(tokens) * val_fraction)
    return tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]


class BatchSampler:
    """Random windows of T+1 tokens; row b of a batch is inputs batch[b, :T] and targets batch[b, 1:]."""

    def __init__(self, tokens: np.ndarray, B: int, T: int, seed: int = 0):
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if len(tokens) < T + 1:
            raise ValueError(f"tokens: {len(tokens)} tokens are too few for windows of T+1={T + 1}")
        self.tokens, self.B, self.T = tokens, B, T
        self.rng = np.random.default_rng(seed)

    def fill(self, out: np.ndarray) -> np.ndarray:
        starts = self.rng.integers(0, len(self.tokens) - self.T, size=self.B)
        out[...] = self.tokens[starts[:, None] + np.arange(self.T + 1)]
        return out

    def next(self) -> np.ndarray:
        return self.fill(np.empty((self.B, self.T + 1), dtype=np.int32))
