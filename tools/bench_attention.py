#!/usr/bin/env python3
"""Causal multi-head attention as the model runs it, against PyTorch's scaled_dot_product_attention in FP32 with
TF32 off, at the same shapes, forward and forward+backward, for several lengths T.

    python tools/bench_attention.py                     # B=8, 12 heads, d_k=64, T = 1024, 2048, 4096
    python tools/bench_attention.py --quick --json
    python tools/bench_attention.py --variant tc -T 1024

Both sides start from the QKV projection's output qkv (B, T, 3C) and end at y (B, T, C), the heads side by side
for W_O (and, backward, from dy back to dqkv). Ours is the variant's attention: the reference and fast variants'
pipeline (split into heads, scores, causal mask, softmax, weighted sum of V, merge: one kernel a stage, the fast
variant fusing the mask into the scores and skipping the masked half), the tc variant's flash attention (one
kernel forward, two backward, the heads read from qkv). PyTorch's is nanoGPT's: views of qkv transposed into
heads, SDPA, the heads transposed back into y. Times are medians of CUDA-event timings. "MiB": the attention's
own memory beyond qkv, y and their gradients (ours: the buffers it allocates and its launchers' scratch;
PyTorch's: the peak of its allocator over a forward and backward, less qkv, dy, y and dqkv). The reference variant runs at T <= 1024 only (its T x T stages take
seconds beyond).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from microgpt import kernels as K
from microgpt import ops as O
from microgpt.attention import fused, grad_buffers, heads_bwd, heads_fwd, states

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_median_ms, gpu_or_exit, torch_median_ms  # noqa: E402

REFERENCE_MAX_T = 1024


def ours(B, NH, T, d_k, variant, iters, warmup):
    """(forward ms, forward+backward ms, MiB of the attention's own buffers) between qkv and y: the model's own
    stages (microgpt.attention.heads_fwd, heads_bwd) on its own buffers."""
    ops = O.select(variant)
    e = K.engine()
    ga = e.ga
    rng = np.random.default_rng(0)
    stream = e.cuda.Stream()
    C = NH * d_k

    def new(*shape):
        return ga.empty(shape, np.float32)
    is_fused = fused(ops, d_k, T, e)
    a = states(new, B, T, C, NH, fused=is_fused)(new(B, T, C))
    d = grad_buffers(new, B, T, C, NH, fused=is_fused)
    a.qkv.set(rng.standard_normal((B, T, 3 * C)).astype(np.float32))
    d.dy.set(rng.standard_normal((B, T, C)).astype(np.float32))
    # the launches are recorded once (arguments checked once), as the model runs them
    fwd_plan, bwd_plan = K.Plan(), K.Plan()
    heads_fwd(ops.on(fwd_plan), a, NH)
    heads_bwd(ops.on(bwd_plan), a, d, NH)

    def run_fwd(s):
        K.replay(fwd_plan, s, "forward")

    def run_both(s):
        K.replay(fwd_plan, s, "forward")
        K.replay(bwd_plan, s, "backward")
    # the attention's own: what its stages keep or pass between them, and the launchers' scratch
    own = [getattr(a, n) for n in ("lse", "q", "k", "v", "scores", "masked", "probs", "heads")]
    own += [getattr(d, n, None) for n in ("dheads", "dq", "dk", "dv", "dprobs", "dscores")]
    mb = sum(x.nbytes for x in own + fwd_plan.keep + bwd_plan.keep if x is not None) / 2 ** 20
    return cuda_median_ms(run_fwd, iters, warmup, stream), cuda_median_ms(run_both, iters, warmup, stream), mb


def torch_sdpa(B, NH, T, d_k, iters, warmup):
    """(forward ms, forward+backward ms, MiB, why not): nanoGPT's attention between qkv and y."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None, None, None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, None, None, "PyTorch has no CUDA here"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    C = NH * d_k
    qkv = torch.randn(B, T, 3 * C, device="cuda", requires_grad=True)
    dy = torch.randn(B, T, C, device="cuda")

    def fwd():
        q, k, v = (t.view(B, T, NH, d_k).transpose(1, 2) for t in qkv.split(C, dim=2))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)

    def both():
        torch.autograd.grad(fwd(), (qkv,), dy)

    with torch.no_grad():
        f = torch_median_ms(fwd, iters, warmup)
    b = torch_median_ms(both, iters, warmup)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    both()
    torch.cuda.synchronize()
    # beyond qkv and dy (allocated before) and what we also hold: y and dqkv
    mb = (torch.cuda.max_memory_allocated() - base - 4 * B * T * 4 * C) / 2 ** 20
    return f, b, mb, None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("-T", default="1024,2048,4096", help="lengths, comma-separated")
    ap.add_argument("--d-k", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variant", choices=["all", *O.VARIANTS], default="all", help="whose kernels to time")
    ap.add_argument("--quick", action="store_true", help="B=2, T=256, 3 iterations")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    try:
        lengths = [int(t) for t in str(args.T).split(",")]
    except ValueError:
        ap.error(f"-T: comma-separated positive lengths, got {args.T!r}")
    if any(t <= 0 for t in lengths):
        ap.error(f"-T: comma-separated positive lengths, got {args.T!r}")
    device = gpu_or_exit("bench_attention")
    if args.quick:
        args.B, lengths, args.iters, args.warmup = 2, [256], 3, 1
    rows = []
    for T in lengths:
        shape = (args.B, args.heads, T, args.d_k)
        for variant in (O.VARIANTS if args.variant == "all" else [args.variant]):
            if variant == "reference" and T > REFERENCE_MAX_T and args.variant == "all":
                continue
            f, b, mb = ours(*shape, variant, args.iters, args.warmup)
            rows.append(dict(T=T, who=f"microgpt {variant}", fwd_ms=f, fwd_bwd_ms=b, mb=mb))
        f, b, mb, why = torch_sdpa(*shape, args.iters, args.warmup)
        for r in rows:
            if r["T"] == T and f:
                r["fwd_vs_torch"], r["fwd_bwd_vs_torch"] = f / r["fwd_ms"], b / r["fwd_bwd_ms"]
        rows.append(dict(T=T, who="PyTorch SDPA", fwd_ms=f, fwd_bwd_ms=b, mb=mb, note=why))
    result = dict(device=device, B=args.B, n_head=args.heads, d_k=args.d_k, rows=rows)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{device}: causal attention, B={args.B}, {args.heads} heads, d_k={args.d_k}, FP32, TF32 off")
    print(f"{'T':>6}  {'':<22}{'fwd ms':>9}{'fwd+bwd ms':>12}{'fwd x torch':>13}{'fwd+bwd x torch':>17}{'MiB':>9}")
    for r in rows:
        if r["fwd_ms"] is None:
            print(f"{r['T']:>6}  {r['who']:<22}{r['note']}")
            continue
        ratio = (f"{r['fwd_vs_torch']:>13.2f}{r['fwd_bwd_vs_torch']:>17.2f}" if "fwd_vs_torch" in r
                 else f"{'':>13}{'':>17}")
        print(f"{r['T']:>6}  {r['who']:<22}{r['fwd_ms']:>9.3f}{r['fwd_bwd_ms']:>12.3f}{ratio}{r['mb']:>9.0f}")
    print("x torch: PyTorch's time over ours (above 1: ours is faster); MiB: the attention's own memory beyond "
          "qkv, y and their gradients")
    return 0


if __name__ == "__main__":
    sys.exit(main())
