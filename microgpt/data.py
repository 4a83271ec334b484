"""Training data: text -> tokens -> train/validation split -> seeded (B, T+1) batches.

    train, val = split(load_tokens())                # Python's pydoc topics, or load_tokens("file.txt")
    tokens = cached_tokens("big.txt", tokenizer)     # tokenized once into big.txt.<tokenizer>.tokens, mapped
    sampler = BatchSampler(train, B=8, T=1024, seed=0)
    batch = sampler.fill(pinned)                     # any C-contiguous int32 (B, T+1) buffer, e.g. page-locked
    inputs, targets = batch[:, :-1], batch[:, 1:]

The sampling loop is Cython (microgpt._tokens.WindowSampler) with the GIL released and its own generator
(xoshiro256**, seeded by splitmix64), so the batches depend on the seed alone: not on NumPy's version,
not on other draws. `state` is a JSON-able dict; a resumed run that assigns it continues the sequence.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydoc_data.topics import topics
from tqdm import tqdm

from . import _tokens
from .checkpoint import replace_file
from .tokenizer import ByteTokenizer


def builtin_corpus() -> str:
    """A corpus every Python install has: the standard library's pydoc topics (about 0.5 MB of English)."""
    return "\n\n".join(topics[k] for k in sorted(topics))


class NotText(ValueError):
    """A data file that is not UTF-8 text; the message names the file and the offset of the first bad byte."""


def read_text(path) -> str:
    """The text of a UTF-8 file. Refuses (NotText) bytes that are not UTF-8 and NUL bytes, which no text
    holds but UTF-16 is full of, naming the offset of the first."""
    data = Path(path).read_bytes()
    nul = data.find(b"\0")
    try:
        text = data[:nul if nul >= 0 else len(data)].decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotText(f"{path} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                      f"({e.reason})") from None
    if nul >= 0:
        raise NotText(f"{path} is not UTF-8 text: a NUL byte at offset {nul} (UTF-16? convert it with "
                      f"iconv -f UTF-16 -t UTF-8)")
    return text


def load_tokens(path: str | None = None, tokenizer=None) -> np.ndarray:
    """The tokens of a UTF-8 text file (read_text: anything else is refused), or of builtin_corpus(), by
    the byte tokenizer or another with its interface; a BPETokenizer with GPT-2's pre-tokenizer (piecewise)
    encodes the text in pieces in parallel, cut where its pre-tokenizer cuts anyway, so the tokens are those
    of the whole."""
    tokenizer = tokenizer or ByteTokenizer()
    if path is None:
        return tokenizer.encode(builtin_corpus())
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    return encode_file(path, tokenizer)


PIECE = 1 << 20  # characters a piece of text holds, about
TOKEN_FILE = "microgpt-tokens"


def cached_tokens(path, tokenizer, progress: bool = False) -> np.ndarray:
    """The tokens of the text file at path, memory-mapped from a token file beside it (nanoGPT's train.bin
    habit): `path.<tokenizer>.tokens`, uint16 for a vocabulary up to 65536 and uint32 above, with a JSON
    sidecar naming the text's size and modification time and the tokenizer (its sha256, or bytes). Written
    once (checkpoint.replace_file: one rename) and read by every run after, until the text or the
    tokenizer changes. Where nothing can be written beside the text, the tokens are kept in memory."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    record = tokenizer.record()
    tag = "bytes" if record is None else record["sha256"][:16]
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    st = p.stat()
    meta = {"format": TOKEN_FILE, "version": 3, "text_size": st.st_size, "text_mtime_ns": st.st_mtime_ns,
            "tokenizer": tag, "dtype": np.dtype(dtype).name}
    tokens_path, sidecar = p.with_name(f"{p.name}.{tag}.tokens"), p.with_name(f"{p.name}.{tag}.tokens.json")
    try:
        saved = json.loads(sidecar.read_text())
        count = saved["count"]
        if {k: saved.get(k) for k in meta} == meta and type(count) is int and \
                tokens_path.stat().st_size == count * np.dtype(dtype).itemsize:
            tokens = _mapped(tokens_path, dtype, count)
            if not count or int(tokens.max()) < tokenizer.vocab_size:
                return tokens
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, another text or tokenizer's, or damaged: made again
    tokens = encode_file(p, tokenizer, progress)
    try:
        replace_file(tokens_path, tokens.astype(dtype).tobytes())
        replace_file(sidecar, json.dumps(meta | {"count": int(tokens.size)}).encode())
    except OSError:
        return tokens  # a folder we may not write: the tokens stay in memory this time
    return _mapped(tokens_path, dtype, tokens.size)


def _mapped(path, dtype, count) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,)) if count else np.empty(0, dtype)


def encode_file(path, tokenizer, progress: bool = False) -> np.ndarray:
    """The tokens of a UTF-8 text file (read_text: anything else is refused), as encode_text makes them."""
    return encode_text(read_text(path), tokenizer, progress)


def encode_text(text: str, tokenizer, progress: bool = False) -> np.ndarray:
    """The tokens of text, by pieces (text_pieces) in batches where the tokenizer encodes in parallel, with a
    progress bar over the text's characters if asked."""
    if not getattr(tokenizer, "piecewise", False):  # only GPT-2's pre-tokenizer is known to cut there
        return tokenizer.encode(text)
    pieces, out = text_pieces(text), []
    with tqdm(total=len(text), unit="char", unit_scale=True, desc="tokenizing", disable=not progress,
              leave=False) as bar:
        for i in range(0, len(pieces), 16):
            batch = pieces[i:i + 16]
            out += tokenizer.encode_batch(batch)
            bar.update(sum(len(b) for b in batch))
    return np.concatenate(out) if out else np.empty(0, np.int32)


def text_pieces(text: str, size: int = PIECE) -> list:
    """text cut into pieces of about `size` characters, each cut just before a newline that a non-space
    character follows: GPT-2's byte-level pre-tokenizer makes that newline a token of its own and ends the
    whitespace before it there too, whatever comes next, so encoding the pieces gives the tokens of the whole
    (a cut after the newline would leave a run such as two newlines whole at a piece's end, which a merge
    can join)."""
    pieces, start = [], 0
    while len(text) - start > size:
        cut = start + size
        while cut < len(text) and not (text[cut] == "\n" and cut + 1 < len(text) and not text[cut + 1].isspace()):
            cut += 1
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return [p for p in pieces if p]


def split(tokens: np.ndarray, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation): the last val_fraction of the stream is validation, so no window of one
    overlaps the other."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = int(len(tokens) * val_fraction)
    return tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


class BatchSampler:
    """Random windows of T+1 tokens; row b of a batch is inputs batch[b, :T] and targets batch[b, 1:].

    Window starts are uniform over [0, len(tokens) - T). One sampler belongs to one thread.
    """

    def __init__(self, tokens: np.ndarray, B: int, T: int, seed: int = 0):
        self.B = _positive_int("B", B)
        self.T = _positive_int("T", T)
        tokens = np.asarray(tokens)  # a memory-mapped token file stays mapped: a view, not a copy
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise TypeError(f"tokens must be a 1-D integer array, got dtype {tokens.dtype}, shape {tokens.shape}")
        if tokens.dtype == np.uint16 and tokens.flags.c_contiguous:
            self.tokens = tokens  # a token file (cached_tokens), read as it lies: never copied into memory
        elif tokens.dtype == np.uint32 and tokens.flags.c_contiguous:
            self.tokens = tokens.view(np.int32)  # ids below 2**31 read the same
        else:
            self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self._windows = _tokens.WindowSampler(self.tokens, self.T, seed)
        self.batches_drawn = 0

    def fill(self, out: np.ndarray) -> np.ndarray:
        """Writes the next batch into out, a C-contiguous writeable int32 array of shape (B, T+1)."""
        want = (self.B, self.T + 1)
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a NumPy int32 array of shape {want}, got {type(out).__name__}")
        if out.dtype != np.int32:
            raise TypeError(f"out must have dtype int32, got {out.dtype}")
        if out.shape != want:
            raise ValueError(f"out must have shape (B, T+1) = {want}, got {out.shape}")
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        if not out.flags.writeable:
            raise ValueError("out must be writeable")
        self._windows.fill(out)
        self.batches_drawn += 1
        return out

    def next(self) -> np.ndarray:
        return self.fill(np.empty((self.B, self.T + 1), dtype=np.int32))

    @property
    def state(self) -> dict:
        """Where the sequence stands, as plain ints (JSON and pickle both keep it)."""
        return {"rng": _tokens.RNG_NAME, "words": self._windows.rng_state, "batches_drawn": self.batches_drawn,
                "B": self.B, "T": self.T, "n_tokens": len(self.tokens)}

    @state.setter
    def state(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from BatchSampler.state, got {type(state).__name__}")
        missing = [k for k in self.state if k not in state]
        if missing:
            raise ValueError(f"state is missing {', '.join(missing)}")
        if state["rng"] != _tokens.RNG_NAME:
            raise ValueError(f"state['rng'] is {state['rng']!r}, this sampler uses {_tokens.RNG_NAME!r}")
        # the same generator state over other tokens or another shape would give other windows, silently
        for key, mine in (("B", self.B), ("T", self.T), ("n_tokens", len(self.tokens))):
            if state[key] != mine:
                raise ValueError(f"state['{key}'] is {state[key]!r}, this sampler has {key}={mine}")
        drawn = state["batches_drawn"]
        if isinstance(drawn, bool) or not isinstance(drawn, int) or drawn < 0:
            raise ValueError(f"state['batches_drawn'] must be an int >= 0, got {drawn!r}")
        try:
            self._windows.rng_state = state["words"]
        except (TypeError, ValueError) as e:
            raise ValueError(f"state['words']: {e}") from None
        self.batches_drawn = drawn
