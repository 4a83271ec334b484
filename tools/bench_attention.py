#!/usr/bin/env python3
"""The 12-head attention pipeline (the literal kernels, and the fast variant) against PyTorch's
scaled_dot_product_attention in FP32 with TF32 off, at the same shapes, forward and forward+backward.

    python tools/bench_attention.py                 # B=8, 12 heads, T=1024, d_k=64
    python tools/bench_attention.py --quick --json
    python tools/bench_attention.py --variant fast  # one variant (default: all)

Both sides start from q, k, v (B, NH, T, d_k) and end at the per-head outputs (and, backward, at dq, dk,
dv): ours is scores -> causal mask -> softmax -> weighted sum of V, one kernel a stage (the fast variant
fuses the mask into the scores and skips the masked half). Times are medians of CUDA-event timings.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from microgpt import kernels as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_median_ms, gpu_or_exit, torch_median_ms  # noqa: E402


def ours(B, NH, T, d_k, variant, iters, warmup):
    """(forward ms, forward+backward ms) of the pipeline between q, k, v and the heads' outputs."""
    ops = K.select(variant)
    e = K.engine()
    ga = e.ga
    rng = np.random.default_rng(0)
    stream = e.cuda.Stream()
    hs, att = (B, NH, T, d_k), (B, NH, T, T)
    q, k, v, dout = (ga.to_gpu(rng.standard_normal(hs).astype(np.float32)) for _ in range(4))
    masked, probs, heads = ga.empty(att, np.float32), ga.empty(att, np.float32), ga.empty(hs, np.float32)
    dprobs, dscores = ga.empty(att, np.float32), ga.empty(att, np.float32)
    dq, dk, dv = (ga.empty(hs, np.float32) for _ in range(3))

    # the launches are recorded once (arguments checked once), as the model runs them
    with K.recording() as fwd_plan:
        ops.causal_scores_fwd(masked, q, k)
        ops.softmax_fwd(probs, masked, causal=True)
        ops.attn_values_fwd(heads, probs, v)
    with K.recording() as bwd_plan:
        ops.attn_values_bwd(dprobs, dv, dout, probs, v)
        ops.softmax_bwd(dscores, dprobs, probs, causal=True)
        ops.causal_scores_bwd(dq, dk, dscores, q, k)

    def run_fwd(s):
        K.replay(fwd_plan, s, "forward")

    def run_both(s):
        K.replay(fwd_plan, s, "forward")
        K.replay(bwd_plan, s, "backward")
    return cuda_median_ms(run_fwd, iters, warmup, stream), cuda_median_ms(run_both, iters, warmup, stream)


def torch_sdpa(B, NH, T, d_k, iters, warmup):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None, None, "PyTorch is not installed"
    if not torch.cuda.is_available():
        return None, None, "PyTorch has no CUDA here"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    q, k, v = (torch.randn(B, NH, T, d_k, device="cuda", requires_grad=True) for _ in range(3))
    dout = torch.randn(B, NH, T, d_k, device="cuda")

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        torch.autograd.grad(fwd(), (q, k, v), dout)

    with torch.no_grad():
        f = torch_median_ms(fwd, iters, warmup)
    return f, torch_median_ms(both, iters, warmup), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("-T", type=int, default=1024)
    ap.add_argument("--d-k", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variant", choices=["all", *K.VARIANTS], default="all", help="whose kernels to time")
    ap.add_argument("--quick", action="store_true", help="B=2, T=256, 3 iterations")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    device = gpu_or_exit("bench_attention")
    if args.quick:
        args.B, args.T, args.iters, args.warmup = 2, 256, 3, 1
    shape = (args.B, args.heads, args.T, args.d_k)
    rows = {}
    for variant in (K.VARIANTS if args.variant == "all" else [args.variant]):
        rows[variant] = ours(*shape, variant, args.iters, args.warmup)
    t_fwd, t_both, why = torch_sdpa(*shape, args.iters, args.warmup)
    result = dict(device=device, B=args.B, n_head=args.heads, T=args.T, d_k=args.d_k,
                  torch_sdpa_fwd_ms=t_fwd, torch_sdpa_fwd_bwd_ms=t_both, torch_note=why,
                  **{f"{k}_fwd_ms": v[0] for k, v in rows.items()},
                  **{f"{k}_fwd_bwd_ms": v[1] for k, v in rows.items()},
                  **({f"{k}_fwd_vs_torch": t_fwd / v[0] for k, v in rows.items()} if t_fwd else {}),
                  **({f"{k}_fwd_bwd_vs_torch": t_both / v[1] for k, v in rows.items()} if t_both else {}))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{device}: causal attention, B={args.B}, {args.heads} heads, T={args.T}, d_k={args.d_k}, FP32, TF32 off")
    print(f"{'':<26}{'fwd ms':>9}{'fwd+bwd ms':>12}{'fwd x torch':>13}{'fwd+bwd x torch':>17}")
    for k, (f, b) in rows.items():
        ratio = f"{t_fwd / f:>13.2f}{t_both / b:>17.2f}" if t_fwd else f"{'-':>13}{'-':>17}"
        print(f"{'microgpt ' + k:<26}{f:>9.3f}{b:>12.3f}{ratio}")
    if t_fwd:
        print(f"{'PyTorch SDPA':<26}{t_fwd:>9.3f}{t_both:>12.3f}")
        print("x torch: PyTorch's time over ours (above 1: ours is faster)")
    else:
        print(f"PyTorch SDPA: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
