"""The microgpt command: train, sample, info.

    microgpt train --steps 200            # GPU when there is one, else a small model on the CPU
    microgpt sample runs/latest.ckpt --max-new-tokens 200 --prompt "The "
    microgpt info
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from .config import PRESETS, GPTConfig
from .data import BatchSampler, load_tokens, split
from .model import GPT
from .tokenizer import ByteTokenizer

# Without a GPU the command still runs, on a model small enough for numpy to train in seconds.
CPU_SIZES = dict(n_layer=2, n_head=4, d_model=64, block_size=64)


def cuda_available() -> tuple[bool, str]:
    """(True, device name) where PyCUDA and a CUDA device are there, else (False, the reason)."""
    try:
        from .kernels import device_summary
        return True, device_summary()
    except Exception as e:  # no pycuda, no driver, no device: all mean the numpy backend
        return False, str(e).splitlines()[0] if str(e) else type(e).__name__


def pick_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    ok, why = cuda_available()
    if ok:
        return "cuda"
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


def evaluate(model: GPT, sampler: BatchSampler, batches: int) -> float:
    losses = []
    for _ in range(batches):
        batch = sampler.next()
        _, loss = model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
        losses.append(loss)
    return float(np.mean(losses))


def cmd_train(args) -> int:
    from tqdm import tqdm

    backend = pick_backend(args.backend)
    tokenizer = ByteTokenizer()
    train_tokens, val_tokens = split(load_tokens(args.data, tokenizer), args.val_fraction)
    config = config_from_args(args, backend, tokenizer.vocab_size)
    T = args.seq_len or config.block_size
    if T > config.block_size:
        raise SystemExit(f"--seq-len {T} is above the model's block_size {config.block_size}")
    model = GPT(config, backend=backend, seed=args.seed)
    print(f"training {model.num_params / 1e6:.2f}M parameters on {backend}: {config}, B={args.batch_size}, "
          f"T={T}, {len(train_tokens):,} train / {len(val_tokens):,} val tokens")
    train = BatchSampler(train_tokens, args.batch_size, T, seed=args.seed)
    val = BatchSampler(val_tokens, args.batch_size, T, seed=args.seed + 1)

    val_loss = evaluate(model, val, args.eval_batches)
    print(f"step {0:5d} | val loss {val_loss:.4f}")
    tokens_per_step = args.batch_size * T
    bar = tqdm(range(args.steps), desc="train", unit="step", dynamic_ncols=True, file=sys.stderr,
               disable=args.no_progress)
    t0 = time.perf_counter()
    for step in bar:
        lr = lr_at(step, args.lr, args.warmup, args.steps, args.min_lr_ratio)
        batch = train.next()
        model.zero_grad()
        _, loss = model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
        if not math.isfinite(loss):
            print(f"step {step + 1}: the loss is {loss}; stopping", file=sys.stderr)
            return 1
        model.backward()
        model.step(lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip)
        dt = time.perf_counter() - t0
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_step * (step + 1) / dt:,.0f}")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            val_loss = evaluate(model, val, args.eval_batches)
            bar.write(f"step {step + 1:5d} | train loss {loss:.4f} | val loss {val_loss:.4f} | "
                      f"lr {lr:.2e} | {tokens_per_step * (step + 1) / dt:,.0f} tok/s")
    prompt = tokenizer.encode("The ")
    sample = model.generate(prompt, args.sample_tokens, temperature=0.8, top_k=40, seed=args.seed)
    print("sample:", tokenizer.decode(sample[0]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="microgpt", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model on a text file or the built-in corpus")
    t.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
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
    t.add_argument("--sample-tokens", type=int, default=120)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
