"""The microgpt command: train, sample, convert, plot, eval, info.

    microgpt train --steps 200            # GPU when there is one, else a small model on the CPU
    microgpt train --steps 400 --resume   # continue runs/microgpt/model.ckpt to step 400
    microgpt sample runs/microgpt/model.ckpt --max-new-tokens 200 --prompt "The " --top-p 0.9 --seed 1
    microgpt convert runs/microgpt/model.ckpt hf-out/      # to a Hugging Face GPT-2 directory, and back
    microgpt plot runs/a runs/b -o loss.png                # the runs' logs (log.jsonl) on one figure
    microgpt eval runs/microgpt/model.ckpt --data my.txt   # loss, perplexity and bits per byte on a text
    microgpt info

A user error is one line, `microgpt: error: ...`, naming the flag and the value typed, with exit status 2,
and it is found before the first step. Ctrl-C during training finishes the step in flight, saves, says
where, and exits with status 130.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from . import checkpoint, evaluate, info, kernels, ops, plot, runlog
from .argtypes import count, count0, fraction, open_fraction, positive, rate, seed, unit
from .kernels import virtual
from .config import PRESETS, GPTConfig
from .convert import convert
from .data import BatchSampler, builtin_corpus, cached_tokens, load_tokens, split
from .gpt import GPT
from .runs import RunFolder, RunFolderError
from .tokenizer import BPETokenizer, ByteTokenizer, recorded_tokenizer, train_bpe
from .train import EXIT_INTERRUPTED, PeerFailed, train_loop

# Without a GPU the command still runs, on a model small enough for numpy to train in seconds.
CPU_SIZES = dict(n_layer=2, n_head=4, d_model=64, block_size=64)
SIZE_FLAGS = ("n_layer", "n_head", "d_model", "block_size")
EXIT_USAGE = 2
DEFAULT_BATCH_SIZE = 8


def flag(field: str) -> str:
    """'n_head' -> '--n-head': a field as its flag, in messages and in the parser."""
    return "--" + field.replace("_", "-")


class UsageError(Exception):
    """What the user typed cannot run; printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage and exit; we want one line, from main()
        raise UsageError(message)


# ---------------------------------------------------------------------------------------------- checks
def cuda_available() -> tuple[bool, str]:
    """(True, device name) where PyCUDA and a CUDA device are there, else (False, the reason)."""
    try:
        return True, kernels.device_summary()
    except Exception as e:  # no pycuda, no driver, no device: all mean the numpy backend
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__


def pick_backend(requested: str, quiet: bool = False) -> str:
    ok, why = (True, "") if requested == "numpy" else cuda_available()
    if requested == "cuda" and not ok:
        raise UsageError(f"--backend cuda: no usable CUDA GPU here ({why}); install PyCUDA with "
                         f"pip install 'microgpt[cuda]' on a machine with a GPU, or use --backend numpy")
    if requested != "auto":
        return requested
    if not ok and not quiet:
        print(f"no GPU ({why}): training on the numpy backend, a small model on the CPU", file=sys.stderr)
    return "cuda" if ok else "numpy"


def config_from_args(args, backend: str, vocab_size: int) -> GPTConfig:
    """The preset (andrea-12m; CPU_SIZES on the numpy backend without --preset), each size flag given
    replacing one field of it."""
    try:
        base = GPTConfig.preset(args.preset or "andrea-12m", vocab_size=vocab_size)
    except ValueError as e:
        raise UsageError(f"--preset {args.preset}: {e} (the tokenizer's vocabulary is {vocab_size})") from None
    fields = base.to_dict() | (CPU_SIZES if args.preset is None and backend == "numpy" else {})
    fields |= {k: getattr(args, k) for k in SIZE_FLAGS if getattr(args, k) is not None}
    try:
        return GPTConfig.from_dict(fields)
    except ValueError as e:
        typed = " ".join(f"{flag(k)} {getattr(args, k)}" for k in SIZE_FLAGS if getattr(args, k))
        raise UsageError(f"{typed or 'the model sizes'}: {e}") from None


def run_batch_size(extra: dict):
    sampler = extra.get("train_sampler")
    return sampler.get("B") if isinstance(sampler, dict) else None


def check_resume_flags(args, config: GPTConfig, T: int, extra: dict) -> None:
    """--resume continues the checkpoint's model: a size flag or a --seq-len that differs is refused."""
    changed = [f"{flag(k)} {getattr(args, k)} (the checkpoint's is {getattr(config, k)})"
               for k in SIZE_FLAGS if getattr(args, k) is not None and getattr(args, k) != getattr(config, k)]
    if args.preset is not None:
        try:
            same = GPTConfig.preset(args.preset, vocab_size=config.vocab_size) == config
        except ValueError:  # a preset that fixes another vocabulary
            same = False
        if not same:
            changed.append(f"--preset {args.preset} (the checkpoint's model is {config})")
    if args.seq_len is not None and args.seq_len != T:
        changed.append(f"--seq-len {args.seq_len} (the checkpoint's run uses {T})")
    B, world = run_batch_size(extra), int(os.environ.get("WORLD_SIZE", 1))
    if args.batch_size is not None and B is not None and world * args.batch_size != B:
        changed.append(f"--batch-size {args.batch_size} (the checkpoint's run uses {B})")
    if changed:
        raise UsageError(f"--resume continues the checkpoint's run, which these would change: {'; '.join(changed)}")


def training_tokens(args, tokenizer, T):
    """(train, validation) tokens of --data, each long enough for a window of T+1."""
    if args.data is not None:
        p = Path(args.data)
        if not p.exists():
            raise UsageError(f"--data {args.data}: no such file")
        if p.is_dir():
            raise UsageError(f"--data {args.data} is a folder; expected a UTF-8 text file")
    try:  # a file is tokenized once, into a token file beside it that later runs map
        tokens = load_tokens(None, tokenizer) if args.data is None else \
            cached_tokens(args.data, tokenizer, progress=not args.no_progress)
    except OSError as e:
        raise UsageError(f"--data {args.data}: {e.strerror or e}") from None
    if len(tokens) == 0:
        raise UsageError(f"--data {args.data} holds no text")
    train_tokens, val_tokens = split(tokens, args.val_fraction)
    if min(len(train_tokens), len(val_tokens)) < T + 1:
        raise UsageError(f"--data {args.data or '(built-in corpus)'}: {len(tokens):,} tokens are too few: with "
                         f"--val-fraction {args.val_fraction} the training part has {len(train_tokens):,} and the "
                         f"validation part {len(val_tokens):,}, and each needs at least T+1 = {T + 1} for "
                         f"sequences of T = {T}")
    return train_tokens, val_tokens


def read_checkpoint(path, flag=None):
    """The whole checkpoint at path, checked; a file that is missing or not whole is a usage error."""
    try:
        return checkpoint.read(path)
    except (OSError, checkpoint.CheckpointError) as e:
        raise UsageError(f"{flag}: {e}" if flag else str(e)) from None


# ---------------------------------------------------------------------------------------------- commands
def open_tokenizer(path, flag="--tokenizer"):
    try:
        return BPETokenizer(path)
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(f"{flag} {path}: {e}") from None


def run_tokenizer(given, extra: dict, where: str, resume: bool):
    """The tokenizer of a saved run (tokenizer.recorded_tokenizer), --tokenizer where given."""
    try:
        return recorded_tokenizer(extra.get("tokenizer"), given, where, resume)
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(str(e)) from None


def data_parallel(requested: str):
    """Under torchrun (WORLD_SIZE set): (the backend, microgpt.distributed.DataParallel); else (backend, None)."""
    if "WORLD_SIZE" not in os.environ:
        return pick_backend(requested), None
    try:
        from .distributed import DataParallel, select_gpu  # torch: the [dist] extra, imported only here
    except ImportError as e:
        raise UsageError(f"WORLD_SIZE is set (torchrun) but torch.distributed is missing ({e}): pip install "
                         f"'microgpt[dist]'") from None
    select_gpu()
    backend = pick_backend(requested, quiet=os.environ.get("RANK", "0") != "0")
    return backend, DataParallel(backend)


def cmd_train(args) -> int:
    backend, dp = data_parallel(args.backend)
    world = dp.world if dp else 1
    run = RunFolder(args.out)
    ckpt = run.checkpoint
    if args.resume:
        if not ckpt.is_file():
            raise UsageError(f"--resume: no checkpoint at {ckpt}")
        saved = read_checkpoint(ckpt, "--resume")
        config, extra = saved.config, saved.extra
        tokenizer = run_tokenizer(args.tokenizer, extra, f"--resume: {ckpt}", resume=True)
        T = extra.get("T", config.block_size)
        check_resume_flags(args, config, T, extra)
    else:
        tokenizer = open_tokenizer(args.tokenizer) if args.tokenizer is not None else ByteTokenizer()
        config = config_from_args(args, backend, tokenizer.vocab_size)
        saved, extra, T = None, {}, args.seq_len or config.block_size
    if config.vocab_size < tokenizer.vocab_size:
        raise UsageError(f"the model's vocab_size {config.vocab_size} is below the tokenizer's {tokenizer.vocab_size}")
    if T > config.block_size:
        raise UsageError(f"--seq-len {T} is above the model's block_size {config.block_size}")
    B = args.batch_size or (run_batch_size(extra) or world * DEFAULT_BATCH_SIZE) // world  # per process
    train_tokens, val_tokens = training_tokens(args, tokenizer, T)
    train = BatchSampler(train_tokens, world * B, T, seed=args.seed)  # the global batch, dealt to the ranks
    val = BatchSampler(val_tokens, world * B, T, seed=args.seed + 1)
    if "train_sampler" in extra:
        try:  # the resumed run draws the batches the first would have
            train.state = extra["train_sampler"]
        except (TypeError, ValueError) as e:
            raise UsageError(f"--resume: the run's batches cannot continue on this data ({e}): resume with "
                             f"the --data and --val-fraction the run started with") from None
    lead = dp is None or dp.lead  # rank 0 alone writes the run and speaks
    try:  # a file, a place that cannot be written, a folder in use: refused before any step
        if lead:
            run.open(saved.step if saved else None)  # a resumed run's log goes on from its checkpoint
    except RunFolderError as e:
        raise UsageError(str(e)) from None
    try:
        model = GPT(config, backend=backend, seed=args.seed, variant=args.variant) if saved is None else \
            GPT.from_checkpoint(saved, backend=backend, variant=args.variant)
        if lead:
            print((f"resumed {run.checkpoint} at step {model.step_count}\n" if saved else "") +
                  f"training {model.num_params / 1e6:.2f}M parameters on {backend}: {config}, B={train.B}"
                  f"{f' ({world} x {B})' if dp else ''}, T={T}, {len(train.tokens):,} train / {len(val.tokens):,} "
                  f"val tokens")
        return train_loop(model, run.checkpoint, train, val, args, tokenizer, resumed=saved is not None, dp=dp,
                          log=run.log)
    finally:
        run.close()
        if dp is not None:
            dp.close()


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
    model = GPT.from_checkpoint(saved, backend=pick_backend(args.backend, quiet=True), variant=args.variant)
    prompt = tokenizer.encode(prompt_text) if prompt_text else np.array([tokenizer.eot], np.int32)
    prompts = np.repeat(prompt[None], args.num_samples, axis=0)  # sampled together, one row each
    stream = tokenizer.stream() if args.num_samples == 1 else None  # one sample streams as its tokens come
    if stream is not None:
        sys.stdout.write(tokenizer.decode(prompt))
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
            print(tokenizer.decode(row))
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
    if args.data is not None and not Path(args.data).is_file():
        raise UsageError(f"--data {args.data}: no such file")
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
    try:  # the text and the windows checked before any model is made
        text, T = evaluate.prepare(args, saved, tokenizer)
    except evaluate.EvalError as e:
        raise UsageError(str(e)) from None
    backend = pick_backend(args.backend, quiet=True)
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
        print(info.explain(config, args.variant, args.B, T, args.device, args.decode))
    except (OSError, RuntimeError) as e:  # no nvcc to read the kernels' formats with
        raise UsageError(f"--explain: {str(e).splitlines()[0]}") from None
    return 0


# ---------------------------------------------------------------------------------------------- the parser
def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="microgpt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    variant = dict(choices=list(ops.VARIANTS), default=None,
                   help=f"the cuda backend's kernels (default: {ops.DEFAULT_VARIANT})")

    t = sub.add_parser("train", help="train a model on a text file or the built-in corpus")
    t.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
    t.add_argument("--variant", **variant)
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
    t.add_argument("--stop-after", type=count, default=None,
                   help="stop after N steps of this run, checkpointing (the schedule still runs to --steps)")
    t.add_argument("--sample-tokens", type=count0, default=120)
    t.add_argument("--seed", type=seed, default=0)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--log-every", type=count, default=1, metavar="N", help=runlog.LOG_EVERY_HELP)
    t.set_defaults(func=cmd_train)

    sp = sub.add_parser("sample", help="sample text from a checkpoint")
    sp.add_argument("checkpoint")
    sp.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
    sp.add_argument("--variant", **variant)
    sp.add_argument("--tokenizer", default=None, help="the tokenizer.json the model was trained with (default: "
                    "the one its checkpoint records, or bytes)")
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
    evaluate.add_parser(sub, variant).set_defaults(func=cmd_eval)

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


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UsageError as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nmicrogpt: interrupted; the last checkpoint written stands", file=sys.stderr)
        return EXIT_INTERRUPTED
    except PeerFailed as e:
        print(f"microgpt: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
