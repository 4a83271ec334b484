#!/usr/bin/env python3
"""Sampling speed: tokens/s of GPT.generate (the prompt, then the new tokens) against Hugging Face
transformers' GPT2LMHeadModel.generate with its key-value cache, at the same widths, in FP32 with TF32 off,
measured in the same run. Greedy decoding, so both do the same work whatever they choose.

    python tools/bench_generate.py                      # andrea-12m and andrea-120m, B 1 and 8, prompt 16 and 512
    python tools/bench_generate.py --quick --json       # a small model on the numpy backend
    python tools/bench_generate.py --backend numpy --preset andrea-12m -B 1 --prompt 16 --new 32

Weights are random (seeded): the speed does not depend on them. Without transformers (or its CUDA) its column
says so. A row whose prompt and new tokens pass block_size re-runs the window once the cache is full.

Each row is also held to the memory-bandwidth limit of its decode steps (the tokens after the first); the
JSON's names in brackets:
  MB/step      (bytes_per_step) what a decode step must read, FP32: every weight once (wte once, though the
               tied lm_head reads it too; of wpe the one row) and each layer's cached keys and values 0..pos of
               B sequences, averaged over the row's decode steps; activations not counted (timing.decode_reads)
  limit tok/s  (limit_tok_s) the copy bandwidth measured in the same run (copy_gbs: device to device on the
               cuda backend, np.copyto on the CPU; bytes read and written) over bytes/step, times B
  decode tok/s (decode_tok_s) B tokens a decode step: decode_steps steps in decode_s, from the first token's
               arrival (the prompt's prefill and its choice) to the last decode step's, in the same generate
               calls; steps that re-run the window past block_size are no decode steps and are not counted
  % limit      (pct_of_limit) decode tok/s over limit tok/s
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig, kernels

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_copy_gbs, decode_reads, gpu_or_exit, host_copy_gbs  # noqa: E402

QUICK = dict(config=GPTConfig(n_layer=2, n_head=2, d_model=32, block_size=64, vocab_size=257), B=[1, 2],
             prompt=[4], new=16)


def decode_positions(cfg, prompt_len, new) -> list[int]:
    """The positions of GPT.generate's decode steps for `new` tokens: the first token comes from the prefill of
    the prompt's last block_size tokens, then one position a token until the cache is full (past that each
    token re-runs the window)."""
    start = min(prompt_len, cfg.block_size)
    return list(range(start, min(start + new - 1, cfg.block_size)))


def step_bytes(cfg, B, positions) -> float:
    """The mean over `positions` of the bytes a decode step there must read (timing.decode_reads)."""
    return sum(sum(decode_reads(cfg, B, pos).values()) for pos in positions) / len(positions)


def time_microgpt(cfg, backend, B, prompt_len, new, variant=None, repeats=2):
    """Seconds of one generate call and of its decode steps (each the best of `repeats`, after a short
    warm-up): the decode steps from the first token's arrival (on_token) to the last decode step's."""
    model = GPT(cfg, backend=backend, variant=variant)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(B, prompt_len))
    model.generate(prompt, 2, temperature=0)  # compiles, plans, allocates
    steps = len(decode_positions(cfg, prompt_len, new))
    best, best_decode = np.inf, np.inf
    for _ in range(repeats):
        stamps = []
        t0 = time.perf_counter()
        out = model.generate(prompt, new, temperature=0, on_token=lambda ids: stamps.append(time.perf_counter()))
        best = min(best, time.perf_counter() - t0)
        if steps:  # stamps[k]: token k chosen; tokens 1..steps come from the decode steps
            best_decode = min(best_decode, stamps[steps] - stamps[0])
    assert out.shape == (B, prompt_len + new)
    return best, (best_decode if steps else None), decode_note(model.backend)


def decode_note(backend) -> str:
    """How the cuda backend ran its decode steps: as one CUDA graph a token, or launch by launch (and why)."""
    d = getattr(backend, "_dec", None)
    if d is None or not getattr(d, "sampled", None):
        return ""
    step = next(iter(d.sampled.values()))  # the pass of the step that chose greedily
    return "decode: one CUDA graph a token" if step.graph is not None else f"decode replayed: {step.unavailable}"


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


def print_row(row, args, peer_note, copy_gbs, copy_how, first) -> None:
    """A line of the table; with the first row, the heading before it."""
    if first:
        print(f"sampling, greedy, {args.new} new tokens a row, backend {args.backend}"
              f"{'; ' + row['note'] if row['note'] else ''}; peer: {peer_note}; copy bandwidth "
              f"{copy_gbs:,.1f} GB/s ({copy_how})")
        print(f"{'model':<14}{'B':>3}{'prompt':>8}{'microgpt tok/s':>16}{'peer tok/s':>12}{'ratio':>9}"
              f"{'decode tok/s':>14}{'MB/step':>10}{'limit tok/s':>13}{'% limit':>9}")
    peer = f"{row['peer_tok_s']:>12,.0f}{row['ratio']:>8.2f}x" if "ratio" in row else f"{'-':>12}{'-':>9}"
    limit = (f"{row['decode_tok_s']:>14,.0f}{row['bytes_per_step'] / 1e6:>10,.2f}{row['limit_tok_s']:>13,.0f}"
             f"{row['pct_of_limit']:>8.1f}%" if row["decode_steps"] else f"{'-':>14}{'-':>10}{'-':>13}{'-':>9}")
    print(f"{row['preset']:<14}{row['B']:>3}{row['prompt']:>8}{row['microgpt_tok_s']:>16,.0f}{peer}{limit}"
          + ("   (window re-run past block_size)" if row["windowed"] else ""), flush=True)


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
    if args.backend == "cuda":
        copy_gbs, copy_how = cuda_copy_gbs(kernels.engine().cuda.Stream()), "device-to-device copy"
    else:
        copy_gbs, copy_how = host_copy_gbs(), "np.copyto on the CPU"
    rows = []
    for name, cfg in configs.items():
        peer, peer_note = (None, "skipped (--no-peer)") if args.no_peer else transformers_peer(cfg)
        for B in args.B:
            for prompt_len in args.prompt:
                t, t_decode, note = time_microgpt(cfg, args.backend, B, prompt_len, args.new, args.variant)
                positions = decode_positions(cfg, prompt_len, args.new)
                row = dict(preset=name, B=B, prompt=prompt_len, new=args.new, microgpt_s=t, note=note,
                           microgpt_tok_s=B * args.new / t, windowed=len(positions) < args.new - 1,
                           decode_steps=len(positions), decode_s=t_decode, decode_tok_s=None, bytes_per_step=None,
                           limit_tok_s=None, pct_of_limit=None)
                if positions:
                    nbytes = step_bytes(cfg, B, positions)
                    row.update(decode_tok_s=B * len(positions) / t_decode, bytes_per_step=nbytes,
                               limit_tok_s=copy_gbs * 1e9 / nbytes * B)
                    row["pct_of_limit"] = 100 * row["decode_tok_s"] / row["limit_tok_s"]
                if peer is not None:
                    tp = time_transformers(peer, cfg, B, prompt_len, args.new)
                    row.update(peer_s=tp, peer_tok_s=B * args.new / tp, ratio=tp / t)
                rows.append(row)
                if not args.json:
                    print_row(row, args, peer_note, copy_gbs, copy_how, len(rows) == 1)
    if args.json:
        print(json.dumps(dict(backend=args.backend, new=args.new, copy_gbs=copy_gbs, copy=copy_how, rows=rows)))
    elif rows and "ratio" in rows[0]:
        print("ratio: the peer's time over ours (above 1: ours is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
