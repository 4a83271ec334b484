#!/usr/bin/env python3
"""Tokens/s of a whole training step (forward, backward, clipping, AdamW) on the cuda backend, against a
PyTorch GPT of the same architecture, dtype (FP32, TF32 off), B and T, measured in the same run; and each one's
model FLOPs a step, the TFLOP/s they make, and the MFU: that rate over the 3xTF32 ceiling measured in the run.

    python tools/bench_train.py                      # andrea-120m and gpt2-124m, B=8, T=1024
    python tools/bench_train.py --quick --json       # a small model, a few steps, one JSON object
    python tools/bench_train.py --variant fast tc    # each variant against the same PyTorch measurement
    python tools/bench_train.py --preset gpt2-124m   # one preset (gpt2-124m: the tied lm_head of 50,257 rows)

PyTorch is the peer a user would run instead: tools/torch_gpt.py's TorchGPT with scaled_dot_product_attention
and fused AdamW. Without PyTorch (or its CUDA) its column says so. --quick without a GPU times a small model
on the numpy backend (no peer, no MFU: "-", as MFU is relative to a GPU's tensor cores).
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
from microgpt import kernels as K
from microgpt.ops import DEFAULT_VARIANT, VARIANTS
from microgpt.runlog import flops_per_token

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import CEILING_HELP, gpu_or_exit, gpu_or_none, product_ceiling  # noqa: E402

PRESETS_TIMED = ["andrea-120m", "gpt2-124m"]  # the default: ours, and GPT-2's, whose tied lm_head dominates
QUICK_GPU = dict(preset="andrea-12m", B=4, T=256, steps=3, warmup=1)
QUICK_CPU = dict(config=GPTConfig(n_layer=2, n_head=2, d_model=32, block_size=64, vocab_size=257), B=4, T=64,
                 steps=3, warmup=1)  # numpy trains it in a blink


def batches(cfg, B, T, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, size=(B, T + 1)).astype(np.int32) for _ in range(n)]


def time_microgpt(cfg, B, T, steps, warmup, variant, backend="cuda"):
    """Seconds a training step of microgpt and the losses of the steps; variant None on the numpy backend."""
    model = GPT(cfg, backend=backend, variant=variant)
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


def rates(step_s: float, flops: int, ceiling: float | None) -> dict:
    """A step of step_s seconds doing `flops` model FLOPs: its ms, TFLOP/s and MFU (None without a ceiling)."""
    tflops = flops / step_s / 1e12
    return {"step_ms": step_s * 1e3, "tflops": tflops, "mfu": tflops / ceiling if ceiling else None}


def ceiling_of(models) -> dict:
    """timing.product_ceiling at the shapes of models, (config, B, T) each, on a stream of its own."""
    return product_ceiling(models, K.engine().cuda.Stream())


def time_preset(preset, cfg, args, variants, backend, ceiling) -> list[dict]:
    """A row for each variant of microgpt at the preset, against one PyTorch measurement (its fields torch_*)."""
    T = args.T or cfg.block_size
    tokens, flops = args.B * T, flops_per_token(cfg, T) * args.B * T  # the training log's count (runlog)
    rows = []
    for variant in variants:
        ours, losses = time_microgpt(cfg, args.B, T, args.steps, args.warmup, variant, backend)
        gc.collect()  # the model's device memory back before the next one
        rows.append({"preset": preset, "T": T, "variant": variant or backend, "model_flops_per_step": flops,
                     **rates(ours, flops, ceiling), "tokens_per_s": tokens / ours,
                     "losses_finite": bool(np.all(np.isfinite(losses)))})
    if args.no_torch or backend != "cuda":
        theirs, note = None, "skipped (--no-torch)" if args.no_torch else "no peer on the numpy backend"
    else:
        theirs, note = time_torch(cfg, args.B, T, args.steps, args.warmup)
        gc.collect()
    peer = rates(theirs, flops, ceiling) if theirs else dict.fromkeys(("step_ms", "tflops", "mfu"))
    for r in rows:
        r.update({f"torch_{k}": v for k, v in peer.items()}, torch_tokens_per_s=tokens / theirs if theirs else None,
                 ratio_vs_torch=theirs / (r["step_ms"] / 1e3) if theirs else None, torch_note=note)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, epilog=CEILING_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), nargs="+", default=PRESETS_TIMED,
                    help=f"the models, each timed in turn (default: {' '.join(PRESETS_TIMED)})")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=None, help="sequence length (default: each preset's block_size)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variant", choices=list(VARIANTS), nargs="+", default=[DEFAULT_VARIANT],
                    help="microgpt's kernels; several are timed one after the other, each against the one PyTorch "
                         "measurement of the preset (the JSON's flat fields are the first row's)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    small = QUICK_CPU["config"]
    ap.add_argument("--quick", action="store_true",
                    help=f"andrea-12m at B=4, T=256, 3 steps; without a GPU, a {small.n_layer}-layer d_model "
                         f"{small.d_model} model at B=4, T=64 on the numpy backend")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    device = gpu_or_none()[0] if args.quick else gpu_or_exit("bench_train")
    if device is not None:
        if args.quick:
            args.preset, args.B, args.T, args.steps, args.warmup = ([QUICK_GPU["preset"]], QUICK_GPU["B"],
                                                                     QUICK_GPU["T"], QUICK_GPU["steps"],
                                                                     QUICK_GPU["warmup"])
        backend, configs = "cuda", {p: GPTConfig.preset(p) for p in dict.fromkeys(args.preset)}
        variants = list(dict.fromkeys(args.variant))
        ceiling = ceiling_of([(cfg, args.B, args.T or cfg.block_size) for cfg in configs.values()])
    else:  # --quick without a GPU
        device, backend, configs, variants = "CPU (no CUDA GPU here)", "numpy", {"quick": small}, [None]
        args.B, args.T, args.steps, args.warmup = (QUICK_CPU[k] for k in ("B", "T", "steps", "warmup"))
        ceiling = dict(tflops=None, source="none on the numpy backend: MFU is relative to a GPU's 3xTF32 ceiling",
                       measured=False, shapes=[])
    rows = [r for preset, cfg in configs.items() for r in time_preset(preset, cfg, args, variants, backend,
                                                                      ceiling["tflops"])]
    first = rows[0]
    result = {
        "device": device, "backend": backend, "preset": first["preset"], "B": args.B, "T": first["T"],
        "steps": args.steps, "variant": first["variant"], "microgpt_step_ms": first["step_ms"],
        "microgpt_tokens_per_s": first["tokens_per_s"], "torch_step_ms": first["torch_step_ms"],
        "torch_tokens_per_s": first["torch_tokens_per_s"], "ratio_vs_torch": first["ratio_vs_torch"],
        "torch_note": first["torch_note"], "losses_finite": first["losses_finite"],
        "model_flops_per_step": first["model_flops_per_step"], "microgpt_tflops": first["tflops"],
        "mfu": first["mfu"], "ceiling_tflops": ceiling["tflops"], "ceiling_source": ceiling["source"],
        "ceiling": ceiling, "variants": {r["variant"]: r for r in rows if r["preset"] == first["preset"]},
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _si(x: float) -> str:
    """x in 3 significant digits and an SI prefix: 5.06T, 64.3G."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}"
    return f"{x:.3g}"


def print_table(result) -> None:
    """A line a row, each preset's PyTorch row after its variants'; then what the columns mean."""
    ceiling = "-" if result["ceiling_tflops"] is None else f"{result['ceiling_tflops']:.1f} TFLOP/s"
    tf32 = ", TF32 off" if result["backend"] == "cuda" else ""
    print(f"{result['device']}: {result['backend']} backend, B={result['B']}, FP32{tf32}, "
          f"{result['steps']} timed steps")
    print(f"3xTF32 ceiling: {ceiling} ({result['ceiling_source']})")
    print(f"{'preset':<13}{'T':>6}  {'':<23}{'ms/step':>9}{'tokens/s':>11}{'FLOP/step':>10}{'FLOP/s':>8}"
          f"{'MFU':>7}{'vs PyTorch':>12}")

    def line(r, who, ms, tok_s, tflops, mfu, ratio):
        print(f"{r['preset']:<13}{r['T']:>6}  {who:<23}{ms:>9.1f}{tok_s:>11,.0f}"
              f"{_si(r['model_flops_per_step']):>10}{_si(tflops * 1e12):>8}{_pct(mfu):>7}{ratio:>12}")
    rows = result["rows"]
    for i, r in enumerate(rows):
        line(r, f"microgpt ({r['variant']})", r["step_ms"], r["tokens_per_s"], r["tflops"], r["mfu"],
             f"{r['ratio_vs_torch']:.2f}x" if r["ratio_vs_torch"] else "-")
        if i + 1 < len(rows) and rows[i + 1]["preset"] == r["preset"]:
            continue
        if r["torch_step_ms"]:
            line(r, "PyTorch (SDPA, fused)", r["torch_step_ms"], r["torch_tokens_per_s"], r["torch_tflops"],
                 r["torch_mfu"], "")
        else:
            print(f"{r['preset']:<13}{r['T']:>6}  {'PyTorch':<23}{r['torch_note']}")
    print("FLOP/step: the model's, nanoGPT's 6N + 12 * n_layer * T * d_model a token (the training log's count); "
          "MFU: FLOP/s over the 3xTF32 ceiling, measured as --help says")
    peers = sorted({r["torch_note"] for r in rows if r["torch_step_ms"]})
    if peers:
        print(f"vs PyTorch: PyTorch's time over ours, the ratio of the tokens/s (above 1: ours is faster); "
              f"{', '.join(peers)}")


if __name__ == "__main__":
    sys.exit(main())
