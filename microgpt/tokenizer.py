"""ByteTokenizer: every UTF-8 byte a token (0..255), plus end-of-text (256).

    tok = ByteTokenizer()
    ids = tok.encode("naïve ☃")     # int32 array of the text's UTF-8 bytes
    tok.decode(ids) == "naïve ☃"    # exact, for every str that UTF-8 can encode

encode never produces end-of-text; a caller that separates documents appends `tok.eot` itself. decode
writes each end-of-text as the marker "<|endoftext|>" (as GPT-2's tokenizer shows it), so a sampled
sequence shows where the model ended a document. Sampled ids need not form valid UTF-8: decode turns
each broken sequence into U+FFFD instead of failing. Both loops run in Cython (microgpt._host).
"""
from __future__ import annotations

import numpy as np

from . import _host


class ByteTokenizer:
    vocab_size = _host.VOCAB_SIZE
    eot = _host.EOT
    eot_text = "<|endoftext|>"
    _eot_bytes = eot_text.encode("ascii")  # ASCII, so it can never complete a broken UTF-8 sequence

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of text as an int32 array. A lone surrogate (which no UTF-8 text holds)
        raises UnicodeEncodeError."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return _host.encode_utf8(text)

    def decode(self, ids) -> str:
        """Text of a 1-D sequence of ids in [0, 257); an id outside raises ValueError naming it."""
        return _host.decode_ids(_as_ids(ids), self._eot_bytes)

    def stream(self) -> "TextStream":
        """A decoder fed ids as they are sampled: push(ids) gives the text they complete, flush() the rest;
        together they give decode() of the whole sequence."""
        return TextStream(self)


class TextStream:
    """Incremental decode: the bytes of a character split across pushes wait for the rest."""

    def __init__(self, tokenizer: ByteTokenizer):
        self.tokenizer = tokenizer
        self.pending = []  # ids of a UTF-8 sequence not yet complete

    def push(self, ids) -> str:
        text = []
        for i in _as_ids(ids).tolist():
            if not 0 <= i < self.tokenizer.vocab_size:
                raise ValueError(f"ids holds token id {i}, outside [0, {self.tokenizer.vocab_size})")
            self.pending.append(i)
            if i == self.tokenizer.eot or _complete(self.pending):
                text.append(self.flush())
        return "".join(text)

    def flush(self) -> str:
        text = self.tokenizer.decode(self.pending)
        self.pending = []
        return text


def _complete(ids) -> bool:
    """Whether the bytes ids end on a character boundary: the last lead byte's sequence is whole (or broken,
    which no later byte can mend)."""
    for back in range(1, min(4, len(ids)) + 1):
        b = ids[-back]
        if b < 0x80:
            return True                        # ASCII
        if b >= 0xC0:                          # a lead byte: its sequence's length
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 1
            return back >= need
    return True                                # four continuation bytes: broken already


def _as_ids(ids) -> np.ndarray:
    """ids as a 1-D C-contiguous int32 or int64 array, checked before any narrowing cast so that no
    out-of-range id wraps into a valid one."""
    try:
        a = np.asarray(ids)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"ids must be a 1-D sequence of integer token ids: {e}") from None
    if a.size == 0:
        return np.empty(0, dtype=np.int32)
    if a.dtype.kind not in "iu":
        raise TypeError(f"ids must be integer token ids, got dtype {a.dtype}")
    if a.ndim > 1:
        raise ValueError(f"ids must be 1-D, got shape {a.shape}; decode one row at a time")
    a = a.reshape(-1)
    if a.dtype == np.int32 or a.dtype == np.int64:
        return np.ascontiguousarray(a)
    bad = np.flatnonzero((a < 0) | (a >= ByteTokenizer.vocab_size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"ids holds token id {a[i]} at index {i}, outside [0, {ByteTokenizer.vocab_size})")
    return a.astype(np.int32)
