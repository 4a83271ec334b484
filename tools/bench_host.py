#!/usr/bin/env python3
"""Host-side throughput: the Cython tokenizer and batch sampler against plain NumPy, in the same run.

    python tools/bench_host.py            # full run (a few seconds)
    python tools/bench_host.py --quick    # a smaller text and fewer repeats, for CI
    python tools/bench_host.py --json     # one JSON object on stdout instead of the table

Tokenizer figures are MB/s of UTF-8 text (encode: str -> int32 ids, decode: ids -> str) on two texts:
Python's pydoc topics (mostly ASCII) and a multilingual text (2-, 3- and 4-byte characters). Sampler
figures are batches/s of (B, T+1) int32 windows written into one preallocated buffer. "ratio" is
Cython / NumPy: above 1 the Cython code is faster. Each figure is the best of several timed repeats.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from microgpt.data import BatchSampler, builtin_corpus  # noqa: E402
from microgpt.tokenizer import ByteTokenizer  # noqa: E402

EOT = ByteTokenizer.eot


# -- the plain NumPy peers: the same jobs, written as one would without Cython -----------------------

def numpy_encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def numpy_decode(ids: np.ndarray) -> str:
    if ((ids < 0) | (ids > EOT)).any():
        raise ValueError("ids out of range")
    pieces = np.split(ids, np.flatnonzero(ids == EOT))
    first, rest = pieces[0], [p[1:] for p in pieces[1:]]  # every piece after the first starts with EOT
    text = [first.astype(np.uint8).tobytes().decode("utf-8", errors="replace")]
    for p in rest:
        text.append(ByteTokenizer.eot_text + p.astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
    return "".join(text)


class NumpySampler:
    def __init__(self, tokens, B, T, seed):
        self.tokens, self.B, self.T = tokens, B, T
        self.rng = np.random.default_rng(seed)
        self.offsets = np.arange(T + 1)

    def fill(self, out):
        starts = self.rng.integers(0, len(self.tokens) - self.T, size=self.B)
        out[...] = self.tokens[starts[:, None] + self.offsets]
        return out


# -- timing -------------------------------------------------------------------------------------------

def best_rate(fn, work, repeats, min_seconds):
    """work / seconds of one call: the best of `repeats` timings, each of as many calls as take about
    min_seconds / repeats (counted by a first, untimed round that also warms caches)."""
    target = min_seconds / repeats
    calls, t0 = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - t0 < target:
        fn()
        calls += 1
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return work / best


def multilingual_text(n_chars: int, seed: int = 0) -> str:
    """Words of 2-8 letters from Latin, Latin-1, Greek, Cyrillic, CJK and emoji ranges, spaces between."""
    rng = np.random.default_rng(seed)
    ranges = np.array([(0x61, 0x7A), (0xE0, 0xFF), (0x3B1, 0x3C9), (0x430, 0x44F), (0x4E00, 0x9FFF),
                       (0x1F600, 0x1F64F)])
    n_words = n_chars // 3 + 1
    lengths = rng.integers(2, 9, size=n_words)
    script = np.repeat(rng.integers(len(ranges), size=n_words), lengths)  # one script per word
    lo, hi = ranges[script, 0], ranges[script, 1]
    letters = lo + (rng.random(len(script)) * (hi - lo + 1)).astype(np.int64)
    spaces = np.cumsum(lengths)  # a space after each word
    cps = np.insert(letters, spaces, 0x20)[:n_chars]
    return cps.astype(np.uint32).tobytes().decode("utf-32-le")


def bench_tokenizer(name, text, repeats, min_seconds):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    # same output, or the comparison means nothing
    if not np.array_equal(ids, numpy_encode(text)) or tok.decode(ids) != text or numpy_decode(ids) != text:
        raise SystemExit(f"bench_host: the Cython and NumPy tokenizers disagree on the {name} text")
    mb = len(ids) / 1e6
    row = {"text": name, "bytes": int(len(ids))}
    jobs = (("encode", tok.encode, numpy_encode, text), ("decode", tok.decode, numpy_decode, ids))
    for op, cy, npy, arg in jobs:
        c = best_rate(lambda: cy(arg), mb, repeats, min_seconds)
        n = best_rate(lambda: npy(arg), mb, repeats, min_seconds)
        row[op] = {"cython_MBps": c, "numpy_MBps": n, "ratio": c / n}
    return row


def bench_sampler(tokens, B, T, repeats, min_seconds):
    out = np.empty((B, T + 1), dtype=np.int32)
    cy, npy = BatchSampler(tokens, B, T, seed=0), NumpySampler(tokens, B, T, seed=0)
    c = best_rate(lambda: cy.fill(out), 1.0, repeats, min_seconds)
    n = best_rate(lambda: npy.fill(out), 1.0, repeats, min_seconds)
    return {"B": B, "T": T, "tokens": int(len(tokens)), "cython_batches_per_s": c, "numpy_batches_per_s": n,
            "ratio": c / n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller inputs, fewer repeats (about a second)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--batch-size", "-B", type=int, default=8)
    p.add_argument("--seq-len", "-T", type=int, default=1024)
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.seq_len < 1:
        p.error("--batch-size and --seq-len must be >= 1")

    repeats, min_seconds, copies = (3, 0.06, 1) if args.quick else (7, 1.0, 8)
    corpus = builtin_corpus() * copies
    tokens = ByteTokenizer().encode(corpus)
    if len(tokens) < args.seq_len + 1:
        p.error(f"--seq-len {args.seq_len} is longer than the corpus ({len(tokens)} tokens)")
    texts = [("pydoc-topics", corpus), ("multilingual", multilingual_text(len(corpus) // 3))]
    result = {
        "quick": args.quick,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "tokenizer": [bench_tokenizer(name, text, repeats, min_seconds) for name, text in texts],
        "sampler": bench_sampler(tokens, args.batch_size, args.seq_len, repeats, min_seconds),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"host side, Cython vs NumPy (Python {result['python']}, NumPy {result['numpy']}, "
          f"{result['machine']}{', quick' if args.quick else ''})")
    print(f"{'tokenizer':<26}{'Cython MB/s':>14}{'NumPy MB/s':>14}{'ratio':>9}")
    for row in result["tokenizer"]:
        for op in ("encode", "decode"):
            r = row[op]
            label = f"{op} {row['text']} ({row['bytes'] / 1e6:.1f} MB)"
            print(f"{label:<26}{r['cython_MBps']:>14,.0f}{r['numpy_MBps']:>14,.0f}{r['ratio']:>8.2f}x")
    s = result["sampler"]
    print(f"{'sampler':<26}{'Cython batch/s':>14}{'NumPy batch/s':>14}{'ratio':>9}")
    label = f"B={s['B']} T={s['T']}"
    print(f"{label:<26}{s['cython_batches_per_s']:>14,.0f}{s['numpy_batches_per_s']:>14,.0f}{s['ratio']:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
