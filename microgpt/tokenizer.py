"""ByteTokenizer: every UTF-8 byte a token (0..255), plus end-of-text (256); BPETokenizer: a byte-level BPE
read from a tokenizer.json, with the same interface (train_bpe trains one).

    tok = ByteTokenizer()
    ids = tok.encode("naïve ☃")     # int32 array of the text's UTF-8 bytes
    tok.decode(ids) == "naïve ☃"    # exact, for every str that UTF-8 can encode

encode never produces end-of-text; a caller that separates documents appends `tok.eot` itself. decode
writes each end-of-text as the marker "<|endoftext|>" (as GPT-2's tokenizer shows it), so a sampled
sequence shows where the model ended a document. Sampled ids need not form valid UTF-8: decode turns
each broken sequence into U+FFFD instead of failing. Both loops run in Cython (microgpt._tokens).
"""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from . import _tokens


class ByteTokenizer:
    vocab_size = _tokens.VOCAB_SIZE
    eot = _tokens.EOT
    eot_text = "<|endoftext|>"
    _eot_bytes = eot_text.encode("ascii")  # ASCII, so it can never complete a broken UTF-8 sequence

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of text as an int32 array. A lone surrogate (which no UTF-8 text holds)
        raises UnicodeEncodeError."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return _tokens.encode_utf8(text)

    def decode(self, ids) -> str:
        """Text of a 1-D sequence of ids in [0, 257); an id outside raises ValueError naming it."""
        return _tokens.decode_ids(_as_ids(ids), self._eot_bytes)

    def record(self) -> None:
        """What a checkpoint keeps to find this tokenizer again: nothing, bytes are the default."""
        return None

    def stream(self) -> "TextStream":
        """A decoder fed ids as they are sampled: push(ids) gives the text they complete, flush() the rest;
        together they give decode() of the whole sequence."""
        return TextStream(self)


class TextStream:
    """Incremental decode: the bytes of a character split across pushes (or tokens) wait for the rest."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pending = []  # ids whose text is not yet complete

    def push(self, ids) -> str:
        text = []
        bytewise = isinstance(self.tokenizer, ByteTokenizer)
        for i in _as_ids(ids, self.tokenizer.vocab_size).tolist():
            self.pending.append(i)
            if bytewise:
                if i == self.tokenizer.eot or _complete(self.pending):
                    text.append(self.flush())
            else:  # a token's bytes may end inside a character: its decode then ends in U+FFFD
                piece = self.tokenizer.decode(self.pending)
                if not piece.endswith("\ufffd"):
                    text.append(piece)
                    self.pending = []
        return "".join(text)

    def flush(self) -> str:
        text = self.tokenizer.decode(self.pending)
        self.pending = []
        return text


class BPETokenizer:
    """A byte-level BPE tokenizer read from a tokenizer.json (the Hugging Face `tokenizers` package: pip install
    'microgpt[hf]'), with the ByteTokenizer's interface: vocab_size, eot, encode, decode, stream. Byte-level, so
    any UTF-8 text round-trips; `<|endoftext|>` must be one of its tokens. train_bpe makes one."""

    eot_text = ByteTokenizer.eot_text

    def __init__(self, path):
        tokenizers = _tokenizers()
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"tokenizer {os.fspath(path)!r} does not exist")
        try:
            self._tok = tokenizers.Tokenizer.from_file(self.path)
        except Exception as e:  # the package's own error type for a file that is not a tokenizer.json
            raise ValueError(f"tokenizer {os.fspath(path)!r} is not a tokenizer.json: {e}") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        eot = self._tok.token_to_id(self.eot_text)
        if eot is None:
            raise ValueError(f"tokenizer {os.fspath(path)!r} has no {self.eot_text} token")
        self.eot = eot
        with open(self.path, "rb") as fh:
            raw = fh.read()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        # GPT-2's byte-level pre-tokenizer (no prefix space, its regex): text may be encoded in pieces cut
        # before a newline (microgpt.data.text_pieces); any other is encoded whole
        pre = (json.loads(raw).get("pre_tokenizer") or {})
        self.piecewise = pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space", False) and \
            pre.get("use_regex", True)

    def encode(self, text: str) -> np.ndarray:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return np.array(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def encode_batch(self, texts: list) -> list:
        """encode of each text, in parallel threads where the package allows."""
        return [np.array(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        a = _as_ids(ids, self.vocab_size)
        return self._tok.decode(a.tolist(), skip_special_tokens=False)

    def stream(self) -> "TextStream":
        return TextStream(self)

    def record(self) -> dict:
        """What a checkpoint keeps to find this tokenizer again, and to know it unchanged."""
        return {"path": self.path, "sha256": self.sha256}


def recorded_tokenizer(record: dict | None, given=None, where: str = "the run", resume: bool = False):
    """The tokenizer a checkpoint records (BPETokenizer.record(): found again by path, known unchanged by
    sha256), or `given` (a path), which must be that one; bytes where none is recorded (and a given one is
    refused where a run on bytes resumes). ValueError or FileNotFoundError say which and why."""
    if record is not None and not isinstance(record, dict):
        raise ValueError(f"{where}: the recorded tokenizer must be an object, got {record!r}")
    if given is not None:
        tokenizer = BPETokenizer(given)
        if record is not None and record.get("sha256") != tokenizer.sha256:
            raise ValueError(f"--tokenizer {os.fspath(given)} is not the tokenizer {where} was trained with "
                             f"({record.get('path')}, sha256 {str(record.get('sha256'))[:12]}...)")
        if record is None and resume:
            raise ValueError(f"--tokenizer {os.fspath(given)}: {where} was trained on bytes (no tokenizer recorded)")
        return tokenizer
    if record is None:
        return ByteTokenizer()
    path = record.get("path")
    if not isinstance(path, str) or not os.path.isfile(path):
        raise FileNotFoundError(f"{where} was trained with the tokenizer {path}, which is not there any more: "
                                f"give it with --tokenizer")
    tokenizer = BPETokenizer(path)
    if tokenizer.sha256 != record.get("sha256"):
        raise ValueError(f"{where}'s tokenizer {path} has changed since it was trained (sha256 "
                         f"{tokenizer.sha256[:12]}..., recorded {str(record.get('sha256'))[:12]}...): give the one "
                         f"it was trained with via --tokenizer")
    return tokenizer


def train_bpe(text_files: list, vocab_size: int, out, show_progress: bool = True, texts=None) -> BPETokenizer:
    """A byte-level BPE tokenizer of vocab_size tokens (the 256 bytes, <|endoftext|> and the merges learned
    from the files, or from the strings of `texts`), saved as a tokenizer.json at out."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 257:
        raise ValueError(f"vocab_size must be an int >= 257 (the 256 bytes and <|endoftext|>), got {vocab_size!r}")
    tk = _tokenizers()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=[ByteTokenizer.eot_text],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=show_progress)
    if texts is None:  # read here, as training reads --data: bytes that are not UTF-8 as U+FFFD
        texts = [open(f, encoding="utf-8", errors="replace").read() for f in text_files]
    folder = os.path.dirname(os.path.abspath(os.fspath(out)))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{os.fspath(out)}: the folder {folder} does not exist")
    try:
        tok.train_from_iterator(texts, trainer)
        tok.save(os.fspath(out))
    except Exception as e:  # the package raises a bare Exception
        raise ValueError(f"training the tokenizer failed: {e}") from None
    return BPETokenizer(out)


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("a BPE tokenizer needs the tokenizers package: pip install 'microgpt[hf]'") from None
    return tokenizers


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


def _as_ids(ids, vocab_size: int = _tokens.VOCAB_SIZE) -> np.ndarray:
    """ids as a 1-D C-contiguous int32 or int64 array, checked before any narrowing cast so that no
    out-of-range id wraps into a valid one (and, for a vocabulary other than the bytes', checked here)."""
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
    if vocab_size == _tokens.VOCAB_SIZE and (a.dtype == np.int32 or a.dtype == np.int64):
        return np.ascontiguousarray(a)  # the Cython decoder checks each id itself
    bad = np.flatnonzero((a < 0) | (a >= vocab_size))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"ids holds token id {a[i]} at index {i}, outside [0, {vocab_size})")
    return np.ascontiguousarray(a, dtype=np.int32)
