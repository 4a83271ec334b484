#!/usr/bin/env python3
"""Sampling speed: tokens/s of GPT.generate (the prompt, then the new tokens) against Hugging Face
transformers' GPT2LMHeadModel.generate with its key-value cache, at the same widths, in FP32 with TF32 off,
measured in the same run. Greedy decoding, so both do the same work whatever they choose.

    python tools/bench_generate.py                      # andrea-12m and andrea-120m, B 1 and 8, prompt 16 and 512
    python tools/bench_generate.py --quick --json       # a small model on the numpy backend
    python tools/bench_generate.py --backend numpy --preset andrea-12m -B 1 --prompt 16 --new 32

Weights are random (seeded): the speed does not depend on them. Without transformers (or its CUDA) its column
says so. A row whose prompt and new tokens pass block_size re-runs the window once the cache is full.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import gpu_or_exit  # noqa: E402

QUICK = dict(config=GPTConfig(n_layer=2, n_head=2, d_model=32, block_size=64, vocab_size=257), B=[1, 2],
             prompt=[4], new=16)


def time_microgpt(cfg, backend, B, prompt_len, new, variant=None, repeats=2):
    """Seconds of one generate call (the best of `repeats`, after a short warm-up)."""
    model = GPT(cfg, backend=backend, variant=variant)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(B, prompt_len))
    model.generate(prompt, 2, temperature=0)  # compiles, plans, allocates
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = model.generate(prompt, new, temperature=0)
        best = min(best, time.perf_counter() - t0)
    assert out.shape == (B, prompt_len + new)
    return best, decode_note(model.backend)


def decode_note(backend) -> str:
    """How the cuda backend ran its decode steps: as one CUDA graph a token, or launch by launch (and why)."""
    d = getattr(backend, "_dec", None)
    if d is None or not hasattr(d, "step"):
        return ""
    return "decode: one CUDA graph a token" if d.step.graph is not None else f"decode replayed: {d.step.unavailable}"


def transformers_peer(cfg):
    """A GPT2LMHeadModel of the same widths on the GPU, or the reason there is none."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return None, f"transformers not installed ({e.name})"
    if not torch.cuda.is_available():
        return None, "no CUDA for PyTorch"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf_cfg = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_model,
                                     n_layer=cfg.n_layer, n_head=cfg.n_head, activation_function="gelu_new",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(hf_cfg).to("cuda").eval()
    return model, f"transformers {transformers.__version__}"


def time_transformers(model, cfg, B, prompt_len, new, repeats=2):
    import torch
    prompt = torch.from_numpy(np.random.default_rng(0).integers(0, cfg.vocab_size, size=(B, prompt_len))).cuda()
    kw = dict(do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, min_new_tokens=2, **kw)
        best = np.inf
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, **kw)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    assert out.shape == (B, prompt_len + new)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", nargs="+", choices=sorted(PRESETS), default=["andrea-12m", "andrea-120m"])
    ap.add_argument("--backend", choices=["cuda", "numpy"], default="cuda")
    ap.add_argument("--variant", default=None, help="the cuda backend's kernels (default: the default variant)")
    ap.add_argument("-B", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, nargs="+", default=[16, 512], help="prompt lengths")
    ap.add_argument("--new", type=int, default=256, help="new tokens a row")
    ap.add_argument("--no-peer", action="store_true", help="skip transformers")
    ap.add_argument("--quick", action="store_true", help="a small model on the numpy backend, no peer")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    for name, values in (("-B", args.B), ("--prompt", args.prompt), ("--new", [args.new])):
        if min(values) < 1:
            ap.error(f"{name} must be >= 1, got {min(values)}")
    if args.backend == "cuda" and not args.quick:
        gpu_or_exit("bench_generate")

    if args.quick:
        configs = {"quick": QUICK["config"]}
        args.backend, args.B, args.prompt, args.new, args.no_peer = "numpy", QUICK["B"], QUICK["prompt"], \
            QUICK["new"], True
    else:
        configs = {p: GPTConfig.preset(p) for p in args.preset}
    rows = []
    for name, cfg in configs.items():
        peer, peer_note = (None, "skipped (--no-peer)") if args.no_peer else transformers_peer(cfg)
        for B in args.B:
            for prompt_len in args.prompt:
                t, note = time_microgpt(cfg, args.backend, B, prompt_len, args.new, args.variant)
                row = dict(preset=name, B=B, prompt=prompt_len, new=args.new, microgpt_s=t, note=note,
                           microgpt_tok_s=B * args.new / t, windowed=prompt_len + args.new > cfg.block_size)
                if peer is not None:
                    tp = time_transformers(peer, cfg, B, prompt_len, args.new)
                    row.update(peer_s=tp, peer_tok_s=B * args.new / tp, ratio=tp / t)
                rows.append(row)
                if not args.json:
                    peer_cols = (f"{row['peer_tok_s']:>12,.0f}{row['ratio']:>8.2f}x" if peer is not None
                                 else f"{'-':>12}{'-':>9}")
                    if len(rows) == 1:
                        print(f"sampling, greedy, {args.new} new tokens a row, backend {args.backend}"
                              f"{'; ' + note if note else ''}; peer: {peer_note}")
                        print(f"{'model':<14}{'B':>3}{'prompt':>8}{'microgpt tok/s':>16}{'peer tok/s':>12}"
                              f"{'ratio':>9}")
                    print(f"{name:<14}{B:>3}{prompt_len:>8}{row['microgpt_tok_s']:>16,.0f}{peer_cols}"
                          + ("   (window re-run past block_size)" if row["windowed"] else ""), flush=True)
    if args.json:
        print(json.dumps(dict(backend=args.backend, new=args.new, rows=rows)))
    elif rows and "ratio" in rows[0]:
        print("ratio: the peer's time over ours (above 1: ours is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
