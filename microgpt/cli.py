"""The microgpt command: train, sample, info.

    microgpt train --steps 200            # GPU when there is one, else a small model on the CPU
    microgpt train --steps 400 --resume   # continue runs/microgpt/model.ckpt to step 400
    microgpt sample runs/microgpt/model.ckpt --max-new-tokens 200 --prompt "The "
    microgpt info
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from . import checkpoint, kernels
from ._version import __version__
from .config import PRESETS, GPTConfig
from .data import BatchSampler, load_tokens, split
from .model import GPT
from .tokenizer import ByteTokenizer

# Without a GPU the command still runs, on a model small enough for numpy to train in seconds.
CPU_SIZES = dict(n_layer=2, n_head=4, d_model=64, block_size=64)


def cuda_available() -> tuple[bool, str]:
    """(True, device name) where PyCUDA and a CUDA device are there, else (False, the reason)."""
    try:
        return True, kernels.device_summary()
    except Exception as e:  # no pycuda, no driver, no device: all mean the numpy backend
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__


def pick_backend(requested: str, quiet: bool = False) -> str:
    if requested != "auto":
        return requested
    ok, why = cuda_available()
    if ok:
        return "cuda"
    if not quiet:
        print(f"no GPU ({why}): training on the numpy backend, a small model on the CPU", file=sys.stderr)
    return "numpy"


def config_from_args(args, backend: str, vocab_size: int) -> GPTConfig:
    sizes = {k: getattr(args, k) for k in ("n_layer", "n_head", "d_model", "block_size")}
    if args.preset is None and backend == "numpy" and all(v is None for v in sizes.values()):
        sizes = dict(CPU_SIZES)
    base = GPTConfig.preset(args.preset or "andrea-12m", vocab_size=vocab_size)
    merged = {k: (v if v is not None else getattr(base, k)) for k, v in sizes.items()}
    return GPTConfig(vocab_size=base.vocab_size, **merged)


def lr_at(step: int, lr: float, warmup: int, total: int, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def checkpoint_path(out_dir) -> Path:
    return Path(out_dir) / "model.ckpt"


def cmd_train(args) -> int:
    backend = pick_backend(args.backend)
    tokenizer = ByteTokenizer()
    train_tokens, val_tokens = split(load_tokens(args.data, tokenizer), args.val_fraction)
    ckpt = checkpoint_path(args.out)
    if args.resume:
        if not ckpt.is_file():
            raise SystemExit(f"--resume: no checkpoint at {ckpt}")
        model = GPT.load(ckpt, backend=backend, variant=args.variant)
        extra = checkpoint.read_meta(ckpt).get("extra") or {}
        config = model.config
        T = extra.get("T", config.block_size)
        print(f"resumed {ckpt} at step {model.step_count}")
    else:
        config = config_from_args(args, backend, tokenizer.vocab_size)
        model = GPT(config, backend=backend, seed=args.seed, variant=args.variant)
        extra = {}
        T = args.seq_len or config.block_size
    if T > config.block_size:
        raise SystemExit(f"--seq-len {T} is above the model's block_size {config.block_size}")
    print(f"training {model.num_params / 1e6:.2f}M parameters on {backend}: {config}, B={args.batch_size}, "
          f"T={T}, {len(train_tokens):,} train / {len(val_tokens):,} val tokens")
    train = BatchSampler(train_tokens, args.batch_size, T, seed=args.seed)
    val = BatchSampler(val_tokens, args.batch_size, T, seed=args.seed + 1)
    if "train_sampler" in extra:
        train.state = extra["train_sampler"]  # the resumed run draws the batches the first would have

    def save():
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        model.save(ckpt, extra={"train_sampler": train.state, "T": T})

    val_batches = [val.next() for _ in range(args.eval_batches)]  # the same held-out batches every time

    def evaluate() -> float:
        return float(np.mean([model.forward(b[:, :-1], b[:, 1:], return_logits=False)[1] for b in val_batches]))

    first = model.step_count
    if first >= args.steps:
        print(f"the checkpoint is at step {first}, --steps {args.steps}: nothing to train")
    else:
        print(f"step {first:5d} | val loss {evaluate():.4f}")
    tokens_per_step = args.batch_size * T
    bar = tqdm(range(first, args.steps), desc="train", unit="step", dynamic_ncols=True, file=sys.stderr,
               disable=args.no_progress, initial=first, total=args.steps)
    t0 = time.perf_counter()
    last = args.steps if args.stop_after is None else min(args.steps, first + args.stop_after)
    for step in bar:
        if step >= last:
            save()
            bar.close()
            print(f"stopped after step {step} (--stop-after {args.stop_after}); continue with --resume")
            return 0
        lr = lr_at(step, args.lr, args.warmup, args.steps, args.min_lr_ratio)
        batch = train.next()
        model.zero_grad()
        _, loss = model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
        if not math.isfinite(loss):
            bar.close()
            kept = f"the last good checkpoint is {ckpt} (step {checkpoint.read_meta(ckpt)['step']})" \
                if ckpt.is_file() else "no checkpoint was written"
            print(f"step {step + 1}: the loss is {loss}; stopping ({kept})", file=sys.stderr)
            return 1
        model.backward()
        model.step(lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip)
        done = step + 1
        tok_s = tokens_per_step * (done - first) / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
        if done % args.eval_every == 0 or done == args.steps:
            bar.write(f"step {done:5d} | train loss {loss:.4f} | val loss {evaluate():.4f} | "
                      f"lr {lr:.2e} | {tok_s:,.0f} tok/s")
        if done % args.ckpt_every == 0 or done == args.steps:
            save()
    bar.close()
    print(f"checkpoint: {ckpt}")
    prompt = tokenizer.encode("The ")
    sample = model.generate(prompt, args.sample_tokens, temperature=0.8, top_k=40, seed=args.seed)
    print("sample:", tokenizer.decode(sample[0]))
    return 0


def cmd_sample(args) -> int:
    backend = pick_backend(args.backend, quiet=True)
    model = GPT.load(args.checkpoint, backend=backend, variant=args.variant)
    tokenizer = ByteTokenizer()
    if model.config.vocab_size < tokenizer.vocab_size:
        raise SystemExit(f"{args.checkpoint}: vocab_size {model.config.vocab_size} is not the byte "
                         f"tokenizer's {tokenizer.vocab_size}")
    prompt = tokenizer.encode(args.prompt) if args.prompt else np.array([tokenizer.eot], np.int32)
    out = model.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         seed=args.seed)
    print(tokenizer.decode(out[0]))
    return 0


def cmd_info(args) -> int:
    print(f"microgpt {__version__}")
    ok, why = cuda_available()
    src = kernels.cuda_source_dir() / "microgpt_cuda.cu"
    if ok:
        print(f"device: {why}")
        print(f"compiled for: {kernels.engine().arch} ({src}, nvcc options {' '.join(kernels.NVCC_OPTIONS)})")
    else:
        print(f"device: none ({why}); the numpy backend runs on the CPU")
    try:
        names = kernels.kernel_names()
        print(f"kernels ({len(names)}, from {src}): {', '.join(names)}")
    except (OSError, RuntimeError) as e:  # no nvcc to read the translation unit with
        print(f"kernels: not listed ({str(e).splitlines()[0]})")
    for name, v in kernels.VARIANTS.items():
        print(f"variant {name}{' (default)' if name == kernels.DEFAULT_VARIANT else ''}: {v.summary}")
    if args.checkpoint:
        meta = checkpoint.read_meta(args.checkpoint)
        print(f"checkpoint {args.checkpoint}: step {meta['step']}, {meta['n_params']:,} parameters, "
              f"config {meta['config']}")
    else:
        for name in PRESETS:
            print(f"preset {name}: {GPTConfig.preset(name)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="microgpt", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model on a text file or the built-in corpus")
    t.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
    t.add_argument("--variant", choices=list(kernels.VARIANTS), default=None,
                   help=f"the cuda backend's kernels (default: {kernels.DEFAULT_VARIANT})")
    t.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="model sizes (default: andrea-12m on a GPU, a 2-layer d_model-64 model on the CPU)")
    for name in ("n_layer", "n_head", "d_model", "block_size"):
        t.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, default=None)
    t.add_argument("--data", default=None, help="a UTF-8 text file (default: Python's pydoc topics)")
    t.add_argument("--val-fraction", type=float, default=0.1)
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--seq-len", type=int, default=None, help="T of a batch (default: block_size)")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--min-lr-ratio", type=float, default=0.1)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--eval-every", type=int, default=50)
    t.add_argument("--eval-batches", type=int, default=4)
    t.add_argument("--ckpt-every", type=int, default=100, help="checkpoint every N steps (and at the end)")
    t.add_argument("--out", default="runs/microgpt", help="folder of the checkpoint (model.ckpt)")
    t.add_argument("--resume", action="store_true", help="continue from --out's checkpoint to --steps")
    t.add_argument("--stop-after", type=int, default=None,
                   help="stop after N steps of this run, checkpointing (the schedule still runs to --steps)")
    t.add_argument("--sample-tokens", type=int, default=120)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    sp = sub.add_parser("sample", help="sample text from a checkpoint")
    sp.add_argument("checkpoint")
    sp.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
    sp.add_argument("--variant", choices=list(kernels.VARIANTS), default=None,
                    help=f"the cuda backend's kernels (default: {kernels.DEFAULT_VARIANT})")
    sp.add_argument("--prompt", default="")
    sp.add_argument("--max-new-tokens", type=int, default=200)
    sp.add_argument("--temperature", type=float, default=0.8)
    sp.add_argument("--top-k", type=int, default=None)
    sp.add_argument("--seed", type=int, default=None)
    sp.set_defaults(func=cmd_sample)

    i = sub.add_parser("info", help="the device, the compiled architecture, the kernels, a config")
    i.add_argument("checkpoint", nargs="?", help="a checkpoint whose config to show")
    i.set_defaults(func=cmd_info)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
