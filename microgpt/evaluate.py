"""microgpt eval: a checkpoint's loss on a text file, as perplexity and as bits per byte.

    microgpt eval runs/a/model.ckpt --data valid.txt --json

Every token of the text is predicted once (WINDOWS says from what). The loss is the mean next-token
cross-entropy over them, in nats; perplexity is its exponential; bits per byte is the summed loss over ln 2
times the text's UTF-8 bytes, which no tokenizer changes, so checkpoints with different tokenizers compare.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from .argtypes import count
from .data import encode_text
from .usage import UsageError, read_data

WINDOWS = ("the text follows an <|endoftext|>, as a new document, and is cut into non-overlapping windows of "
           "--seq-len tokens, the last one shorter, so that every token is predicted once, from the tokens before "
           "it in its window")


@dataclass(frozen=True)
class Score:
    loss_sum: float  # nats, summed over every token of the text
    tokens: int
    bytes: int       # the text's, in UTF-8
    windows: int
    T: int

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf

    @property
    def bits_per_byte(self) -> float:
        return self.loss_sum / (math.log(2) * self.bytes)


def add_parser(sub, model_flags):
    """The `eval` subcommand's parser, on the command's subparsers; model_flags(parser) adds the command's
    --backend, --variant and --tokenizer."""
    ev = sub.add_parser("eval", help="a checkpoint's loss, perplexity and bits per byte on a text file")
    ev.add_argument("checkpoint", help="a checkpoint, such as train's --out/model.ckpt")
    ev.add_argument("--data", required=True, metavar="FILE", help=f"a UTF-8 text file: {WINDOWS}")
    model_flags(ev)
    ev.add_argument("--seq-len", type=count, default=None, help="the windows' length (default: the T the run "
                    "trained with, block_size unless train's --seq-len said otherwise)")
    ev.add_argument("--batch-size", type=count, default=8, help="windows a forward pass (default: 8)")
    ev.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ev


def prepare(args, saved, tokenizer) -> tuple[str, int]:
    """(the text of --data, the windows' length T) for the checkpoint `saved`, checked (UsageError)."""
    config = saved.config
    if tokenizer.vocab_size > config.vocab_size:
        raise UsageError(f"{args.checkpoint}: vocab_size {config.vocab_size} is below the tokenizer's "
                        f"{tokenizer.vocab_size}: give the tokenizer it was trained with (--tokenizer)")
    run_T = saved.extra.get("T")
    T = args.seq_len or (run_T if isinstance(run_T, int) and 0 < run_T <= config.block_size else config.block_size)
    if T > config.block_size:
        raise UsageError(f"--seq-len {T} is above the model's block_size {config.block_size}")
    text = read_data(args.data)
    if not text:
        raise UsageError(f"--data {args.data} holds no text")
    return text, T


def score(model, tokenizer, text: str, T: int, batch_size: int = 8, progress: bool = False) -> Score:
    """The loss of model on every token of text, in the windows WINDOWS describes, batch_size windows a forward
    pass, summed in float64."""
    tokens = encode_text(text, tokenizer, progress)
    stream = np.concatenate([[tokenizer.eot], tokens]).astype(np.int32)  # token i is stream[i + 1]
    n, full = len(tokens), len(tokens) // T
    inputs, targets = stream[:full * T].reshape(full, T), stream[1:full * T + 1].reshape(full, T)
    passes = [(inputs[i:i + batch_size], targets[i:i + batch_size]) for i in range(0, full, batch_size)]
    if n > full * T:
        passes.append((stream[None, full * T:n], stream[None, full * T + 1:]))
    total = 0.0
    with tqdm(total=n, unit="tok", unit_scale=True, desc="eval", disable=not progress, file=sys.stderr,
              dynamic_ncols=True, leave=False) as bar:
        for x, y in passes:
            _, loss = model.forward(x, y, return_logits=False)  # the mean over the pass's tokens
            total += loss * x.size
            bar.update(x.size)
    return Score(total, n, len(text.encode("utf-8")), full + (n > full * T), T)


def report(s: Score, args, step: int, backend: str) -> str:
    """The figures as a line of text, or as one JSON object with --json."""
    figures = dict(checkpoint=args.checkpoint, step=step, data=args.data, backend=backend, T=s.T, windows=s.windows,
                   tokens=s.tokens, bytes=s.bytes, loss=s.loss, perplexity=s.perplexity, bits_per_byte=s.bits_per_byte)
    if args.json:
        return json.dumps(figures)
    return (f"{args.data}: loss {s.loss:.4f}, perplexity {s.perplexity:.3f}, {s.bits_per_byte:.4f} bits per byte "
            f"({s.tokens:,} tokens, {s.bytes:,} bytes, {s.windows:,} windows of {s.T}; {args.checkpoint} at step "
            f"{step}, on {backend})")
