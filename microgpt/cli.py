"""The microgpt command: train, sample, convert, plot, eval, info.

    microgpt train --steps 200            # GPU when there is one, else a small model on the CPU
    microgpt train --steps 400 --resume   # continue runs/microgpt/model.ckpt to step 400
    microgpt sample runs/microgpt/model.ckpt --max-new-tokens 200 --prompt "The " --top-p 0.9 --seed 1
    microgpt convert runs/microgpt/model.ckpt hf-out/      # to a Hugging Face GPT-2 directory, and back
    microgpt plot runs/a runs/b -o loss.png                # the runs' logs (log.jsonl) on one figure
    microgpt eval runs/microgpt/model.ckpt --data my.txt   # loss, perplexity and bits per byte on a text
    microgpt info

A user error is one line, `microgpt: error: ...`, naming the flag and the value typed, with exit status 2,
and it is found before the first step. Ctrl-C, SIGTERM or SIGHUP during training finishes the step in
flight, saves, says where, and exits with 128 + the signal's number (130, 143, 129).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from . import checkpoint, evaluate, info, ops, plot, runlog
from .argtypes import count, count0, fraction, open_fraction, positive, rate, seed, unit
from .config import PRESETS, GPTConfig
from .convert import convert
from .data import builtin_corpus
from .gpt import GPT
from .kernels import virtual
from .tokenizer import ByteTokenizer, train_bpe
from .train import DEFAULT_BATCH_SIZE, SIZE_FLAGS, cmd_train
from .usage import (EXIT_USAGE, PeerFailed, UsageError, check_memory, cuda_available, flag, pick_backend,
                    read_checkpoint, read_data, run_tokenizer)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage and exit; we want one line, from main()
        raise UsageError(message)


# ---------------------------------------------------------------------------------------------- commands


def cmd_sample(args) -> int:
    try:
        prompt_text = args.prompt.encode("utf-8").decode("utf-8")
    except UnicodeError:
        raise UsageError(f"--prompt {args.prompt.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8") from None
    saved = read_checkpoint(args.checkpoint)
    tokenizer = run_tokenizer(args.tokenizer, saved.extra, args.checkpoint, resume=False)
    if saved.config.vocab_size != tokenizer.vocab_size:  # ids the tokenizer has no text for, or never uses
        name = "byte tokenizer's" if isinstance(tokenizer, ByteTokenizer) else f"tokenizer {tokenizer.path}'s"
        raise UsageError(f"{args.checkpoint}: vocab_size {saved.config.vocab_size} is not the {name} "
                         f"{tokenizer.vocab_size}: give the tokenizer it was trained with (--tokenizer)")
    if args.top_k is not None and args.top_k > saved.config.vocab_size:
        raise UsageError(f"--top-k {args.top_k} is above the model's vocab_size {saved.config.vocab_size}")
    backend = pick_backend(args.backend, quiet=True)
    check_memory(saved.config, backend, f"--num-samples {args.num_samples}", args.num_samples,
                 saved.config.block_size, training=False)
    model = GPT.from_checkpoint(saved, backend=backend, variant=args.variant)
    prompt = tokenizer.encode(prompt_text) if prompt_text else np.array([tokenizer.eot], np.int32)
    prompts = np.repeat(prompt[None], args.num_samples, axis=0)  # sampled together, one row each
    shown = 0 if prompt_text else 1  # an empty prompt starts at <|endoftext|>, which is not shown
    stream = tokenizer.stream() if args.num_samples == 1 else None  # one sample streams as its tokens come
    if stream is not None:
        sys.stdout.write(tokenizer.decode(prompt[shown:]))
        sys.stdout.flush()

    def show(ids):
        sys.stdout.write(stream.push(ids[:1]))
        sys.stdout.flush()
    start = time.perf_counter()
    out = model.generate(prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, on_token=show if stream is not None else None)
    seconds = time.perf_counter() - start
    if stream is not None:
        print(stream.flush())
    else:
        for i, row in enumerate(out):
            print(f"--- sample {i + 1} of {args.num_samples}")
            print(tokenizer.decode(row[shown:]))
    n = args.max_new_tokens * args.num_samples
    print(f"microgpt: {n} tokens in {seconds:.2f} s ({n / max(seconds, 1e-9):,.0f} tokens/s)", file=sys.stderr)
    return 0


def cmd_convert(args) -> int:
    """ANDREA checkpoint <-> Hugging Face GPT-2 directory (microgpt.convert)."""
    try:
        to_hf, config, dropped = convert(args.src, args.dst)
    except checkpoint.CheckpointError as e:
        raise UsageError(f"SRC: {e}") from None
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(f"convert {args.src!r} -> {args.dst!r}: {e}") from None
    if dropped:
        print(f"microgpt: note: the Adam moments and the step ({dropped}) are not part of a Hugging Face "
              f"checkpoint: dropped", file=sys.stderr)
    print(f"{args.src} -> {args.dst} ({'Hugging Face GPT-2' if to_hf else 'ANDREA checkpoint'}, {config})")
    return 0


def cmd_tokenizer_train(args) -> int:
    if args.data is not None:
        read_data(args.data)
    if Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a folder; expected the path of a tokenizer.json to write")
    try:  # without --data, the built-in corpus, as train takes it
        tokenizer = train_bpe([args.data] if args.data else [], args.vocab_size, args.out,
                              show_progress=not args.no_progress, texts=None if args.data else [builtin_corpus()])
    except (OSError, ImportError, ValueError) as e:
        raise UsageError(f"tokenizer train: {e}") from None
    print(f"{args.out}: a byte-level BPE of {tokenizer.vocab_size:,} tokens (sha256 {tokenizer.sha256[:12]}...) "
          f"from {args.data or '(built-in corpus)'}")
    if tokenizer.vocab_size < args.vocab_size:
        print(f"microgpt: note: the text held merges for {tokenizer.vocab_size:,} tokens, not the "
              f"{args.vocab_size:,} asked for: a model trained with it has vocab_size {tokenizer.vocab_size:,}",
              file=sys.stderr)
    return 0


def cmd_eval(args) -> int:
    saved = read_checkpoint(args.checkpoint)
    tokenizer = run_tokenizer(args.tokenizer, saved.extra, args.checkpoint, resume=False)
    text, T = evaluate.prepare(args, saved, tokenizer)  # the text and the windows checked before any model is made
    backend = pick_backend(args.backend, quiet=True)
    check_memory(saved.config, backend, f"--batch-size {args.batch_size}", args.batch_size, T, training=False)
    model = GPT.from_checkpoint(saved, backend=backend, variant=args.variant)
    score = evaluate.score(model, tokenizer, text, T, args.batch_size, progress=not args.no_progress)
    print(evaluate.report(score, args, saved.step, backend))
    return 0


def cmd_plot(args) -> int:
    try:
        print(plot.plot_runs(args.runs, args.out, log_x=args.log_x, smooth=args.smooth))
    except plot.PlotError as e:
        raise UsageError(str(e)) from None
    return 0


def cmd_info(args) -> int:
    saved = read_checkpoint(args.checkpoint) if args.checkpoint else None  # the whole file, checked
    if not args.explain:
        print(info.describe(cuda_available(), saved, args.checkpoint))
        return 0
    config = saved.config if saved else GPTConfig.preset(args.preset or "andrea-120m")
    T = config.block_size if args.T is None else args.T
    if T > config.block_size:
        raise UsageError(f"-T {T} is above the model's block_size {config.block_size}")
    try:
        text = info.explain(config, args.variant, args.B, T, args.device, args.decode)
    except (OSError, RuntimeError) as e:  # no nvcc to read the kernels' formats with
        raise UsageError(f"--explain: {str(e).splitlines()[0]}") from None
    print(text)  # a reader that goes away (| head) ends it quietly, in main
    return 0


# ---------------------------------------------------------------------------------------------- the parser
def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="microgpt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    variant = dict(choices=list(ops.VARIANTS), default=None,
                   help=f"the cuda backend's kernels (default: {ops.DEFAULT_VARIANT})")

    def model_flags(parser, saved=True):
        """--backend and --variant; where a saved model runs (saved), --tokenizer too."""
        parser.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
        parser.add_argument("--variant", **variant)
        if saved:
            parser.add_argument("--tokenizer", default=None, help="the tokenizer.json the model was trained with "
                                "(default: the one its checkpoint records, or bytes)")

    t = sub.add_parser("train", help="train a model on a text file or the built-in corpus")
    model_flags(t, saved=False)
    t.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="model sizes (default: andrea-12m on a GPU, a 2-layer d_model-64 model on the CPU); "
                        "each size flag replaces one of them")
    for name in SIZE_FLAGS:
        t.add_argument(flag(name), dest=name, type=count, default=None)
    t.add_argument("--data", default=None, help="a UTF-8 text file (default: Python's pydoc topics)")
    t.add_argument("--tokenizer", default=None, help="a BPE tokenizer.json (microgpt tokenizer train); the "
                   "vocabulary size comes from it, and the checkpoint records it (default: bytes)")
    t.add_argument("--val-fraction", type=open_fraction, default=0.1)
    t.add_argument("--steps", type=count, default=200)
    t.add_argument("--batch-size", type=count, default=None,
                   help=f"B of a batch (default: {DEFAULT_BATCH_SIZE}; with --resume, the run's)")
    t.add_argument("--seq-len", type=count, default=None, help="T of a batch (default: block_size)")
    t.add_argument("--lr", type=rate, default=3e-3)
    t.add_argument("--warmup", type=count0, default=20)
    t.add_argument("--min-lr-ratio", type=fraction, default=0.1)
    t.add_argument("--weight-decay", type=rate, default=0.1)
    t.add_argument("--grad-clip", type=positive, default=1.0)
    t.add_argument("--eval-every", type=count, default=50)
    t.add_argument("--eval-batches", type=count, default=4)
    t.add_argument("--ckpt-every", type=count, default=100, help="checkpoint every N steps (and at the end)")
    t.add_argument("--out", default="runs/microgpt", help="folder of the checkpoint (model.ckpt)")
    t.add_argument("--resume", action="store_true", help="continue from --out's checkpoint to --steps")
    t.add_argument("--overwrite", action="store_true", help="start a new run in an --out that holds one, "
                   "replacing its checkpoint at the first save (without it, train refuses)")
    t.add_argument("--stop-after", type=count, default=None,
                   help="stop after N steps of this run, checkpointing (the schedule still runs to --steps)")
    t.add_argument("--sample-tokens", type=count0, default=120)
    t.add_argument("--seed", type=seed, default=0)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--log-every", type=count, default=1, metavar="N", help=runlog.LOG_EVERY_HELP)
    t.set_defaults(func=cmd_train)

    sp = sub.add_parser("sample", help="sample text from a checkpoint")
    sp.add_argument("checkpoint")
    model_flags(sp)
    sp.add_argument("--prompt", default="")
    sp.add_argument("--max-new-tokens", type=count0, default=200)
    sp.add_argument("--temperature", type=rate, default=0.8)
    sp.add_argument("--top-k", type=count, default=None)
    sp.add_argument("--top-p", type=unit, default=None, help="sample from the smallest set of tokens whose "
                    "probability reaches this (nucleus sampling)")
    sp.add_argument("--num-samples", type=count, default=1, help="samples of the prompt, drawn together")
    sp.add_argument("--seed", type=seed, default=None, help="the same seed gives the same text")
    sp.set_defaults(func=cmd_sample)

    tk = sub.add_parser("tokenizer", help="tokenizers: train a byte-level BPE")
    tks = tk.add_subparsers(dest="tokenizer_command", required=True, parser_class=Parser)
    tt = tks.add_parser("train", help="a byte-level BPE tokenizer.json from a text file")
    tt.add_argument("--vocab-size", type=count, default=8449, help="tokens in all: the 256 bytes, "
                    "<|endoftext|> and the merges (default: andrea-120m's 8449)")
    tt.add_argument("--data", default=None, help="a UTF-8 text file (default: the built-in corpus)")
    tt.add_argument("--out", default="tokenizer.json")
    tt.add_argument("--no-progress", action="store_true")
    tt.set_defaults(func=cmd_tokenizer_train)

    cv = sub.add_parser("convert", help="an ANDREA checkpoint to a Hugging Face GPT-2 directory and back")
    cv.add_argument("src", help="an ANDREA checkpoint, or a Hugging Face GPT-2 directory (save_pretrained)")
    cv.add_argument("dst", help="a directory (written as Hugging Face GPT-2), or a path ending in .ckpt (ANDREA)")
    cv.set_defaults(func=cmd_convert)

    plot.add_parser(sub).set_defaults(func=cmd_plot)
    evaluate.add_parser(sub, model_flags).set_defaults(func=cmd_eval)

    i = sub.add_parser("info", help="the device, the compiled architecture, the kernels, a checkpoint; --explain: "
                       "every launch of a step, with its kernel and why, planned without a GPU")
    i.add_argument("checkpoint", nargs="?", help="a checkpoint to check whole and describe (and --explain)")
    i.add_argument("--explain", action="store_true", help="print the launches of one training step")
    i.add_argument("--preset", choices=list(PRESETS), default=None, help="the model --explain plans (andrea-120m)")
    i.add_argument("--variant", **variant)
    i.add_argument("-B", type=count, default=8)
    i.add_argument("-T", type=count, default=None, help="default: the model's block_size")
    i.add_argument("--device", choices=list(virtual.DEVICES), default="h200", help="the GPU described")
    i.add_argument("--decode", action="store_true", help="--explain a decode step of B sequences instead")
    i.set_defaults(func=cmd_info)
    return p


def out_of_memory(e: BaseException) -> bool:
    """Whether e is the host's MemoryError or the device's (PyCUDA's pycuda._driver.MemoryError, which is not a
    subclass of it): what the memory estimate before the first step could not foresee."""
    return isinstance(e, MemoryError) or (type(e).__name__ == "MemoryError" and
                                          type(e).__module__.startswith("pycuda"))


def main(argv=None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a terminal that is not UTF-8 shows what it can, never a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):  # a NaN is reported where it matters
            warnings.simplefilter("ignore", RuntimeWarning)
            args = build_parser().parse_args(argv)
            return args.func(args)
    except UsageError as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print("\nmicrogpt: interrupted; the last checkpoint written stands", file=sys.stderr)
        return 128 + signum
    except PeerFailed as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (microgpt sample | head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + getattr(signal, "SIGPIPE", 13)
    except Exception as e:
        if not out_of_memory(e):
            raise
        print(f"microgpt: error: out of memory{' on the GPU' if not isinstance(e, MemoryError) else ''}: lower "
              f"--batch-size, --seq-len or the model's sizes; the last checkpoint written stands", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
