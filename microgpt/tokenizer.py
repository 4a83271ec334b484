"""ByteTokenizer: every UTF-8 byte a token (0..255), plus end-of-text (256)."""
from __future__ import annotations

import numpy as np

from . import _host


class ByteTokenizer:
    vocab_size = 257
    eot = _host.EOT

    def encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return _host.encode_bytes(text.encode("utf-8"))

    def decode(self, ids) -> str:
        ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        # sampled ids need not form valid UTF-8: show the broken bytes rather than fail
        return _host.decode_bytes(ids).decode("utf-8", errors="replace")
