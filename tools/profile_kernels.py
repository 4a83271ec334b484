#!/usr/bin/env python3
"""Every kernel at a model's shapes: its median time, the bytes and FLOPs it must move and do, the GB/s
and TFLOP/s it reached, their share of this GPU's copy bandwidth and FP32 matmul rate (both measured in
the same run), and PyTorch's time for the same work: FP32, and for the matrix products also with TF32 on
(cuBLAS on the tensor cores at TF32's 10-bit precision, the rate the tc variant's 3xTF32 products trade
for FP32 accuracy).

    python tools/profile_kernels.py                          # andrea-120m, B=8, T=1024
    python tools/profile_kernels.py --quick --json out.json --plot roofline.png

Each case's launches are recorded once per copy of its inputs (`--sets`), as the model records its passes
(arguments checked, scratch allocated once), then replayed `--iters` times after `--warmup`, timed with CUDA
events, rotating among the copies so that repeated launches do not measure the cache. A kernel that takes less
than SHORT_MS is timed over `--batch` launches (their mean) captured as one CUDA graph, as the model's passes
run it: timed alone, the gap between the start event and the kernel would count in its time (`--stream`: the
launches queued one by one on a stream instead, about a microsecond more each on the H200).
"floor" is the least time the kernel could take at those ceilings (max of bytes / bandwidth and
FLOPs / matmul rate; for the tc variant's products the matmul rate is a third of cuBLAS TF32's, three
TF32 products standing for one FP32 one); "of floor" is floor / time, 100% being as fast as this GPU allows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from microgpt import PRESETS, GPTConfig
from microgpt import kernels as K
from microgpt.ops import VARIANTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_cases import Shape, build_cases, model_params  # noqa: E402
from product_cases import PADDED  # noqa: E402
from timing import cuda_copy_gbs, cuda_median_ms, gpu_or_exit, torch_median_ms  # noqa: E402


SHORT_MS = 0.25  # kernels faster than this are timed over a batch of launches (--batch)


def planned(case):
    """(launch, rotate, plans) replaying the case's launches as recorded once per set of its inputs (plans, one a
    set); the launcher itself and no plans where it records nothing (a launch that is not a kernel's)."""
    plans = []
    for _ in range(case.sets):
        plan = K.Plan()
        case.launch(plan)
        plans.append(plan)
        if case.rotate:
            case.rotate()
    if not all(plans):
        return case.launch, case.rotate, None
    at = {"i": 0}

    def rotate():
        at["i"] = (at["i"] + 1) % len(plans)
    return (lambda stream: K.replay(plans[at["i"]], stream, case.kernel)), rotate, plans


def graph_ms(plans, batch, iters, stream):
    """Mean milliseconds of a launch of the case, over `batch` of them (rotating its sets) in one CUDA graph; None
    where this process cannot capture one."""
    launches = K.Plan()
    for i in range(batch):
        launches.extend(plans[i % len(plans)])
    try:
        graph = K.Graph(launches, stream, "profile")
    except K.GraphUnavailable:
        return None
    try:
        return cuda_median_ms(graph.launch, iters, 1, stream) / batch
    finally:
        graph.release()


def matmul_rate(n=8192, tf32=False):
    """TFLOP/s of cuBLAS through PyTorch on random n x n x n, FP32 (TF32 off) or TF32; None without torch."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None, "PyTorch has no CUDA"
    except ImportError:
        return None, "PyTorch is not installed"
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ms = torch_median_ms(with_tf32(lambda: a @ b) if tf32 else (lambda: a @ b), 5, 2)
    return 2 * n ** 3 / ms / 1e9, f"cuBLAS {'TF32' if tf32 else 'SGEMM'} via PyTorch"


def with_tf32(fn):
    """fn with PyTorch's matrix products on TF32 for the call (off again after: FP32 is the peer)."""
    import torch

    def run():
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return fn()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    return run


PRODUCTS = ("matmul_fwd", "matmul_bwd", "attn_scores_fwd", "attn_scores_bwd", "causal_scores_fwd",
            "causal_scores_bwd", "attn_values_fwd", "attn_values_bwd")  # PyTorch does these on cuBLAS


def torch_peers(shape):
    """name -> zero-argument callable doing the kernel's work in PyTorch (TF32 off), or {} without it."""
    try:
        import torch
        import torch.nn.functional as F
        if not torch.cuda.is_available():
            return {}
    except ImportError:
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    B, T, C, NH, V = shape.B, shape.T, shape.C, shape.NH, shape.V
    d_k = C // NH
    dev = "cuda"

    def rnd(*s, grad=False):
        return torch.randn(*s, device=dev, requires_grad=grad)

    peers = {}
    idx = torch.randint(0, V, (B, T), device=dev)
    wte, wpe = rnd(V, C, grad=True), rnd(T, C, grad=True)
    emb = F.embedding(idx, wte) + wpe
    g_emb = rnd(B, T, C)
    peers["embed_fwd"] = lambda: F.embedding(idx, wte) + wpe
    peers["embed_bwd"] = lambda: torch.autograd.grad(emb, (wte, wpe), g_emb, retain_graph=True)
    x, w, b = rnd(B, T, C, grad=True), rnd(C, grad=True), rnd(C, grad=True)
    ln = F.layer_norm(x, (C,), w, b)
    peers["layernorm_fwd"] = lambda: F.layer_norm(x, (C,), w, b)
    peers["layernorm_bwd"] = lambda: torch.autograd.grad(ln, (x, w, b), g_emb, retain_graph=True)
    for layer, (IN, OUT) in {"qkv": (C, 3 * C), "attn.proj": (C, C), "mlp.fc": (C, 4 * C),
                             "mlp.proj": (4 * C, C), "lm_head": (C, V)}.items():
        xi, wi = rnd(B, T, IN, grad=True), rnd(OUT, IN, grad=True)
        bi = None if layer == "lm_head" else rnd(OUT, grad=True)
        yi, gi = F.linear(xi, wi, bi), rnd(B, T, OUT)
        params = (xi, wi) if bi is None else (xi, wi, bi)
        peers[f"matmul_fwd ({layer})"] = lambda xi=xi, wi=wi, bi=bi: F.linear(xi, wi, bi)
        peers[f"matmul_bwd ({layer})"] = lambda yi=yi, params=params, gi=gi: torch.autograd.grad(
            yi, params, gi, retain_graph=True)
    for kind in ("fwd", "bwd"):  # PyTorch's logits are contiguous: the same peer for the model's padded rows
        peers[f"matmul_{kind} ({PADDED})"] = peers[f"matmul_{kind} (lm_head)"]
    q, k, v = rnd(B, NH, T, d_k, grad=True), rnd(B, NH, T, d_k, grad=True), rnd(B, NH, T, d_k, grad=True)
    qkv = rnd(B, T, 3 * C)
    peers["split_heads_fwd"] = lambda: [t.view(B, T, NH, d_k).transpose(1, 2).contiguous()
                                        for t in qkv.split(C, dim=2)]
    heads = rnd(B, NH, T, d_k)
    peers["merge_heads_fwd"] = lambda: heads.transpose(1, 2).reshape(B, T, C).contiguous()
    s = q @ k.transpose(-1, -2) * (1.0 / d_k ** 0.5)
    g_att = rnd(B, NH, T, T)
    peers["attn_scores_fwd"] = lambda: q @ k.transpose(-1, -2) * (1.0 / d_k ** 0.5)
    peers["attn_scores_bwd"] = lambda: torch.autograd.grad(s, (q, k), g_att, retain_graph=True)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=dev), 1)
    scores = rnd(B, NH, T, T, grad=True)
    peers["causal_mask_fwd"] = lambda: scores.masked_fill(mask, K.MASK_VALUE)
    sm = (q @ k.transpose(-1, -2) * (1.0 / d_k ** 0.5)).masked_fill(mask, K.MASK_VALUE)
    peers["causal_scores_fwd"] = lambda: (q @ k.transpose(-1, -2) * (1.0 / d_k ** 0.5)).masked_fill(mask, K.MASK_VALUE)
    peers["causal_scores_bwd"] = lambda: torch.autograd.grad(sm, (q, k), g_att, retain_graph=True)
    p = torch.softmax(scores, -1)
    peers["softmax_fwd"] = lambda: torch.softmax(scores, -1)
    peers["softmax_bwd"] = lambda: torch.autograd.grad(p, scores, g_att, retain_graph=True)
    pv_in = torch.softmax(rnd(B, NH, T, T), -1).requires_grad_()
    o = pv_in @ v
    g_o = rnd(B, NH, T, d_k)
    peers["attn_values_fwd"] = lambda: pv_in @ v
    peers["attn_values_bwd"] = lambda: torch.autograd.grad(o, (pv_in, v), g_o, retain_graph=True)
    h = rnd(B, T, 4 * C, grad=True)
    gh = F.gelu(h, approximate="tanh")
    g_h = rnd(B, T, 4 * C)
    peers["gelu_fwd"] = lambda: F.gelu(h, approximate="tanh")
    peers["gelu_bwd"] = lambda: torch.autograd.grad(gh, h, g_h, retain_graph=True)
    a2 = rnd(B, T, C)
    peers["residual_fwd"] = lambda: x + a2
    logits, tg = rnd(B * T, V, grad=True), torch.randint(0, V, (B * T,), device=dev)
    ce = F.cross_entropy(logits, tg, reduction="none")
    g_ce = torch.full((B * T,), 1.0 / (B * T), device=dev)
    peers["crossentropy_fwd"] = lambda: F.cross_entropy(logits, tg, reduction="none")
    peers["crossentropy_bwd"] = lambda: torch.autograd.grad(ce, logits, g_ce, retain_graph=True)
    return peers


def name_filter(terms: str):
    """--filter as build_cases' predicate: a case whose name contains one of the terms a|b|c (None: every case).
    Only the wanted cases' inputs are made: making them all takes most of a minute at andrea-120m's shapes."""
    if not terms:
        return None
    return lambda name: any(term in name for term in terms.split("|"))


def op_of(case_name):
    """'k_matmul_fwd (qkv)' / 'matmul_fwd_fast (qkv)' / 'matmul_fwd_tc (qkv)' -> 'matmul_fwd (qkv)', the
    PyTorch peer's key."""
    base, _, layer = case_name.partition(" ")
    base = base[2:] if base.startswith("k_") else base
    for variant in VARIANTS:
        base = base.removesuffix(f"_{variant}")
    return f"{base} {layer}".strip()


def on_tensor_cores(case_name) -> bool:
    """Whether the case is one of the tc variant's products ('matmul_fwd_tc (qkv)', 'sgemm_tc (nn)')."""
    return case_name.partition(" ")[0].endswith("_tc")


def roofline(rows, bw, rate, path, title, rate_tf32=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'microgpt[plot]')"
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [r["flops"] / r["bytes"] for r in rows if r["flops"] and r["bytes"]]
    lo, hi = min(xs + [0.1]) / 2, max(xs + [100.0]) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(rate, g * bw / 1e3) for g in grid], "k-", lw=1.5,
            label=f"ceiling: {bw / 1e3:.2f} TB/s copy, {rate:.1f} TFLOP/s FP32 matmul")
    if rate_tf32:  # the tensor cores: cuBLAS TF32, and a third of it for three TF32 products (3xTF32)
        ax.plot(grid, [min(rate_tf32, g * bw / 1e3) for g in grid], "k:", lw=1,
                label=f"tensor cores: {rate_tf32:.0f} TFLOP/s cuBLAS TF32")
        ax.plot(grid, [min(rate_tf32 / 3, g * bw / 1e3) for g in grid], "k--", lw=1,
                label=f"3xTF32 ceiling: {rate_tf32 / 3:.0f} TFLOP/s")
    style = {"fast": ("o", "tab:blue"), "tc": ("^", "tab:green"), "reference": ("s", "tab:orange")}
    for r in rows:
        if not (r["flops"] and r["bytes"]):
            continue
        kind = "tc" if on_tensor_cores(r["kernel"]) else "reference" if r["kernel"].startswith("k_") else "fast"
        marker, color = style[kind]
        ax.scatter(r["flops"] / r["bytes"], r["tflops"], marker=marker, color=color, s=25)
        ax.annotate(r["kernel"].replace("k_", ""), (r["flops"] / r["bytes"], r["tflops"]), fontsize=6,
                    xytext=(3, 2), textcoords="offset points")
    for kind, label in (("fast", "fast variant"), ("tc", "tc variant (tensor cores)"),
                        ("reference", "reference kernel")):
        ax.scatter([], [], marker=style[kind][0], color=style[kind][1], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="andrea-120m")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=None, help="default: the preset's block_size")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sets", type=int, default=3, help="copies of the inputs to rotate among")
    ap.add_argument("--batch", type=int, default=10, help=f"launches a timing of a kernel under {SHORT_MS} ms spans")
    ap.add_argument("--stream", action="store_true", help="time those launches queued one by one, not as a graph")
    ap.add_argument("--variant", choices=["all", *VARIANTS], default="all", help="whose kernels to time")
    ap.add_argument("--filter", default="", help="only cases whose name contains this (or one of a|b|c)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch column and the cuBLAS ceiling")
    ap.add_argument("--quick", action="store_true", help="andrea-12m, B=2, T=256, 3 iterations")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON here ('-': stdout, no table)")
    ap.add_argument("--plot", metavar="PNG", help="write a roofline plot here")
    args = ap.parse_args()
    device = gpu_or_exit("profile_kernels")
    if args.quick:
        args.preset, args.B, args.T, args.iters, args.warmup, args.sets = "andrea-12m", 2, 256, 3, 1, 2
    cfg = GPTConfig.preset(args.preset)
    shape = Shape(args.B, args.T or cfg.block_size, cfg.d_model, cfg.n_head, cfg.vocab_size)
    variants = tuple(VARIANTS) if args.variant == "all" else (args.variant,)
    stream = K.engine().cuda.Stream()
    bw = cuda_copy_gbs(stream)
    rate, rate_source = (None, "skipped (--no-torch)") if args.no_torch else matmul_rate()
    rate_tf32 = None if args.no_torch or rate is None else matmul_rate(tf32=True)[0]
    peers = {} if args.no_torch else torch_peers(shape)
    if rate is None:  # no cuBLAS here: our own SGEMM at the same size stands in, and says so
        ga = K.engine().ga
        a = ga.to_gpu(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
        c = ga.empty_like(a)
        ms = cuda_median_ms(lambda s: K.sgemm(c, a, a, stream=s), 5, 2, stream)
        rate, rate_source = 2 * 4096 ** 3 / ms / 1e9, f"microgpt k_sgemm_nn ({rate_source})"
    cases = build_cases(shape, n_params=model_params(shape, cfg.n_layer), sets=args.sets, variants=variants,
                        wanted=name_filter(args.filter))
    rows = []
    for case in cases:
        run, rotate, plans = planned(case)
        ms = cuda_median_ms(run, args.iters, args.warmup, stream, rotate)
        batch = args.batch if ms < SHORT_MS else 1
        graphed = batch > 1 and plans is not None and not args.stream
        if graphed:
            ms = graph_ms(plans, batch, args.iters, stream)
            graphed = ms is not None
        if batch > 1 and not graphed:
            ms = cuda_median_ms(run, args.iters, 1, stream, rotate, batch)
        op = op_of(case.kernel)
        peer = peers.get(op)
        torch_ms = torch_median_ms(peer, args.iters, args.warmup, batch) if peer else None
        tf32_ms = (torch_median_ms(with_tf32(peer), args.iters, args.warmup, batch)
                   if peer and op.partition(" ")[0] in PRODUCTS else None)
        ceiling = rate_tf32 / 3 if rate_tf32 and on_tensor_cores(case.kernel) else rate
        floor = max(case.bytes / (bw * 1e9), case.flops / (ceiling * 1e12)) * 1e3
        rows.append(dict(kernel=case.kernel, ms=ms, batch=batch, graph=graphed, bytes=case.bytes, flops=case.flops,
                         gbs=case.bytes / ms / 1e6, tflops=case.flops / ms / 1e9,
                         pct_bw=100 * case.bytes / ms / 1e6 / bw, pct_matmul=100 * case.flops / ms / 1e9 / rate,
                         floor_ms=floor, pct_of_floor=100 * floor / ms, torch_ms=torch_ms,
                         vs_torch=(torch_ms / ms) if torch_ms else None, torch_tf32_ms=tf32_ms,
                         vs_torch_tf32=(tf32_ms / ms) if tf32_ms else None))
    result = dict(device=device, preset=args.preset, B=shape.B, T=shape.T, copy_gbs=bw, matmul_tflops=rate,
                  matmul_source=rate_source, matmul_tf32_tflops=rate_tf32, iters=args.iters, rows=rows,
                  torch_note=None if peers else "no PyTorch peer (missing, no CUDA, or --no-torch)")
    title = (f"{device}: {args.preset} B={shape.B} T={shape.T}; copy {bw / 1e3:.2f} TB/s, "
             f"FP32 matmul {rate:.1f} TFLOP/s ({rate_source})"
             + (f", TF32 {rate_tf32:.0f}" if rate_tf32 else ""))
    if args.plot:
        why = roofline(rows, bw, rate, args.plot, title, rate_tf32)
        result["plot"] = args.plot if why is None else None
        result["plot_note"] = why
    if args.json:
        text = json.dumps(result, indent=1)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text)
    print(title)
    w = max([34] + [len(r["kernel"]) + 1 for r in rows])  # the name column, as wide as the longest name
    hdr = f"{'kernel':<{w}}{'ms':>9}{'GB/s':>9}{'TFLOP/s':>9}{'%copy':>7}{'%mm':>6}{'floor':>8}{'of floor':>9}" \
          f"{'torch ms':>10}{'x torch':>8}{'tf32 ms':>9}{'x tf32':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        t = f"{r['torch_ms']:>10.3f}{r['vs_torch']:>8.2f}" if r["torch_ms"] else f"{'-':>10}{'-':>8}"
        t += f"{r['torch_tf32_ms']:>9.3f}{r['vs_torch_tf32']:>7.2f}" if r["torch_tf32_ms"] else f"{'-':>9}{'-':>7}"
        print(f"{r['kernel']:<{w}}{r['ms']:>9.3f}{r['gbs']:>9.0f}{r['tflops']:>9.2f}{r['pct_bw']:>7.1f}"
              f"{r['pct_matmul']:>6.1f}{r['floor_ms']:>8.3f}{r['pct_of_floor']:>8.1f}%{t}")
    short = [r for r in rows if r["batch"] > 1]
    if short:
        graphed = sum(r["graph"] for r in short)
        how = ("each in one CUDA graph, as the model's passes run them" if graphed == len(short) else
               f"{graphed} of {len(short)} in one CUDA graph, as the model's passes run them, the rest one by one")
        print(f"kernels under {SHORT_MS} ms: the mean of {args.batch} launches, {how}; PyTorch's queued one by one")
    if not peers:
        print(f"torch column: {result['torch_note']}")
    if args.plot:
        print(f"roofline: {args.plot}" if result["plot"] else f"roofline: not written ({result['plot_note']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
