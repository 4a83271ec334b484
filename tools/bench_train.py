#!/usr/bin/env python3
"""Tokens/s of a whole training step (forward, backward, clipping, AdamW) on the cuda backend, against a
PyTorch GPT of the same architecture, dtype (FP32, TF32 off), B and T, measured in the same run.

    python tools/bench_train.py                      # andrea-120m, B=8, T=1024
    python tools/bench_train.py --quick --json       # a small model, a few steps, one JSON object
    python tools/bench_train.py --variant fast tc    # each variant against the same PyTorch measurement
    python tools/bench_train.py --variant reference  # the readable kernels instead of the fast ones

PyTorch is the peer a user would run instead: tools/torch_gpt.py's TorchGPT with scaled_dot_product_attention
and fused AdamW. Without PyTorch (or its CUDA) its column says so.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig
from microgpt.ops import DEFAULT_VARIANT, VARIANTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import gpu_or_exit  # noqa: E402


def batches(cfg, B, T, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, size=(B, T + 1)).astype(np.int32) for _ in range(n)]


def time_microgpt(cfg, B, T, steps, warmup, variant):
    model = GPT(cfg, backend="cuda", variant=variant)
    data = batches(cfg, B, T, 4)
    losses = []

    def step(i):
        b = data[i % len(data)]
        model.zero_grad()
        _, loss = model.forward(b[:, :-1], b[:, 1:], return_logits=False)
        model.backward()
        model.step(3e-4, weight_decay=0.1, grad_clip=1.0)
        losses.append(loss)
    for i in range(warmup):
        step(i)
    model.last_grad_norm  # waits for the device
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    model.last_grad_norm
    return (time.perf_counter() - t0) / steps, losses


def torch_step(model, opt, data):
    """The PyTorch peer's training step on batch i of data, as a user writes it (also under DDP, where model
    is the wrapper): forward, backward, clipping, AdamW; returns the loss."""
    import torch

    def step(i):
        b = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        _, loss = model(b[:, :-1], b[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss
    return step


def time_torch(cfg, B, T, steps, warmup):
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, "PyTorch has no CUDA here"
    from torch_gpt import TorchGPT  # needs torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = TorchGPT(cfg, attention="sdpa").load_numpy(GPT(cfg).state_dict()).cuda()
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-4, betas=(0.9, 0.95), fused=True)
    step = torch_step(model, opt, [torch.from_numpy(b).long().cuda() for b in batches(cfg, B, T)])
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    loss.item()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, f"PyTorch {torch.__version__}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="andrea-120m")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=None, help="sequence length (default: the preset's block_size)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variant", choices=list(VARIANTS), nargs="+", default=[DEFAULT_VARIANT],
                    help="microgpt's kernels; several are timed one after the other, each against the one PyTorch "
                         "measurement (the JSON's flat fields are the first's)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    ap.add_argument("--quick", action="store_true", help="andrea-12m at B=4, T=256, 3 steps")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    device = gpu_or_exit("bench_train")
    if args.quick:
        args.preset, args.B, args.T, args.steps, args.warmup = "andrea-12m", 4, 256, 3, 1
    cfg = GPTConfig.preset(args.preset)
    T = args.T or cfg.block_size
    tokens = args.B * T
    variants = list(dict.fromkeys(args.variant))
    runs = {}
    for variant in variants:
        ours, losses = time_microgpt(cfg, args.B, T, args.steps, args.warmup, variant)
        gc.collect()  # the model's device memory back before the next one
        runs[variant] = {"step_ms": ours * 1e3, "tokens_per_s": tokens / ours,
                         "losses_finite": bool(np.all(np.isfinite(losses)))}
    theirs, why = (None, "skipped (--no-torch)") if args.no_torch else time_torch(cfg, args.B, T, args.steps,
                                                                                   args.warmup)
    for r in runs.values():
        r["ratio_vs_torch"] = theirs * 1e3 / r["step_ms"] if theirs else None
    first = runs[variants[0]]
    result = {
        "device": device, "preset": args.preset, "B": args.B, "T": T, "steps": args.steps,
        "variant": variants[0], "microgpt_step_ms": first["step_ms"], "microgpt_tokens_per_s": first["tokens_per_s"],
        "torch_step_ms": theirs * 1e3 if theirs else None,
        "torch_tokens_per_s": tokens / theirs if theirs else None,
        "ratio_vs_torch": first["ratio_vs_torch"], "torch_note": why, "losses_finite": first["losses_finite"],
        "variants": runs,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{device}: {args.preset}, B={args.B}, T={T}, FP32, TF32 off, {args.steps} timed steps")
    print(f"{'':<22}{'ms/step':>10}{'tokens/s':>12}{'vs PyTorch':>12}")
    for variant, r in runs.items():
        ratio = f"{r['ratio_vs_torch']:>11.2f}x" if theirs else f"{'-':>12}"
        print(f"{'microgpt (' + variant + ')':<22}{r['step_ms']:>10.1f}{r['tokens_per_s']:>12,.0f}{ratio}")
    if theirs:
        print(f"{'PyTorch (SDPA, fused)':<22}{theirs * 1e3:>10.1f}{tokens / theirs:>12,.0f}{'':>12}   ({why})")
        print("vs PyTorch: PyTorch's time over ours, the ratio of the tokens/s (above 1: ours is faster)")
    else:
        print(f"{'PyTorch':<22}{why:>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
