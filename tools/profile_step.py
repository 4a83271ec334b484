"""Where a training step's time goes, op by op: the cuda backend's recorded forward and backward plans replayed
with a CUDA event between every two launches, summed by the op that launched them (microgpt.ops; Launch.op) and
by kernel, beside the step's wall time, with each op's FLOPs and bytes and its share of the GPU's ceiling.

    python tools/profile_step.py                   # andrea-120m, B=8, T=1024, the default variant
    python tools/profile_step.py --variant fast    # another variant's kernels
    python tools/profile_step.py --quick --json    # a small model; one JSON object

Each launch's time is the gap between the events around it, from one replay of the plan queued behind a spin
kernel (the GPU stays busy while the host queues the launches, so a gap is the GPU's work, not the host's);
the median over --reps replays. The optimizer's launches (global norm, AdamW) are outside the plans: the
step's wall time less the two plans is theirs and the host's.

An op's FLOPs are the multiply-adds (2 each) the step needs of it: its products' (the attention's over the causal
triangle alone, a fused backward's recomputed scores not counted), or what microgpt.ops declares (Op.flops); its
bytes the fewest its arguments need (each array read or written once, one added into both; the T x T arrays of
the unfused attention whole). "of ceiling" is the op's floor, the larger of FLOPs / the 3xTF32 ceiling and bytes /
the copy bandwidth, over its time ("bound": which is larger). Both ceilings are measured in the same run: the
copy bandwidth by a 2 GiB device-to-device copy, the 3xTF32 ceiling as the end of --help says. MFU: the model's
FLOPs a step (nanoGPT's count, as the training log's) over the step's wall time, over the same 3xTF32 ceiling.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import statistics
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig
from microgpt import kernels as K
from microgpt import ops as O
from microgpt.ops import DEFAULT_VARIANT, VARIANTS
from microgpt.runlog import flops_per_token

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import CEILING_HELP, cuda_copy_gbs, gpu_or_exit, product_ceiling, spin  # noqa: E402


# ---------------------------------------------------------------------------------------------- an op's work
def _rows_in_out(a) -> int:
    """N * IN * OUT of a linear layer's product: inp (..., IN) against weight (OUT, IN)."""
    return _size(a["inp"]) * a["weight"].shape[0]


def _triangle(heads) -> int:
    """The causal attention's (query, key) pairs times d_k, of heads (B, NH, T, d_k)."""
    B, NH, T, D = heads.shape
    return B * NH * T * (T + 1) // 2 * D


def _triangle_qkv(a) -> int:
    """_triangle of the heads of qkv (B, T, 3C) at n_head."""
    B, T, C3 = a["qkv"].shape
    return B * a["n_head"] * T * (T + 1) // 2 * (C3 // 3 // a["n_head"])


# the products' FLOPs from an op's arguments by name; a layernorm or the like fused beside one is memory-bound
PRODUCT_FLOPS = {
    "matmul_fwd": lambda a: 2 * _rows_in_out(a),
    "matmul_bwd": lambda a: 4 * _rows_in_out(a),
    "matmul_layernorm_bwd": lambda a: 4 * _rows_in_out(a),
    "matmul_gelu_bwd": lambda a: 4 * _size(a["act"]) * a["weight"].shape[0],
    "matmul_attention_bwd": lambda a: 4 * _size(a["y"]) * a["weight"].shape[0] + 8 * _triangle_qkv(a),
    "attn_scores_fwd": lambda a: 2 * _triangle(a["q"]), "attn_scores_bwd": lambda a: 4 * _triangle(a["q"]),
    "causal_scores_fwd": lambda a: 2 * _triangle(a["q"]), "causal_scores_bwd": lambda a: 4 * _triangle(a["q"]),
    "attn_values_fwd": lambda a: 2 * _triangle(a["v"]), "attn_values_bwd": lambda a: 4 * _triangle(a["v"]),
    "fused_attention_fwd": lambda a: 4 * _triangle_qkv(a), "fused_attention_bwd": lambda a: 8 * _triangle_qkv(a),
}


def _size(x) -> int:
    return int(np.prod(x.shape))


def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _sizes(spec, a) -> dict:
    """The sizes (B, T, C, ...) an op's declared argument shapes take at these arguments: a dimension declared as a
    size, or as k*size, binds it (the first binding wins)."""
    sizes = {}
    for arg in spec.args:
        x = a.get(arg.name)
        if not _is_array(x) or len(x.shape) != len(arg.shape):
            continue
        for expr, dim in zip(arg.shape, x.shape):
            m = re.fullmatch(r"(?:(\d+)\*)?([A-Za-z_]\w*)", expr)
            if m and m[2] not in sizes:
                sizes[m[2]] = dim // int(m[1] or 1)
    return sizes


def op_work(op: str, args: tuple, kw: dict) -> tuple[int, int]:
    """(FLOPs, bytes) of one call of `op` (a name of microgpt.ops.OPS) on these arguments, as the module's
    docstring counts them."""
    spec = O.OPS[op]
    a = dict(zip((arg.name for arg in spec.args if not arg.keyword), args)) | kw
    roles = {arg.name: arg.role for arg in spec.args}
    nbytes = sum(_size(x) * x.dtype.itemsize * (2 if roles.get(name) == "inout" else 1)
                 for name, x in a.items() if _is_array(x) and roles.get(name) != "scratch")
    if op in PRODUCT_FLOPS:
        return PRODUCT_FLOPS[op](a), nbytes
    try:
        return O.OPS[op].work(_sizes(spec, a)), nbytes
    except NameError:  # a size the arguments do not bind: no FLOPs to count
        return 0, nbytes


@contextlib.contextmanager
def counting_work():
    """Inside, each op call recorded into a runtime.Plan adds its op_work to the dict yielded, under id(plan) and
    the Launch.op of its launches: {id(plan): {op: [FLOPs, bytes]}}; the weight splits' too (reading each weight
    once, writing its TF32 hi and lo)."""
    work = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
    bound, split = O._bound, K.SplitOperands.split

    def add(plan, flops, nbytes):
        entry = work[id(plan)][plan.op]
        entry[0] += flops
        entry[1] += nbytes

    def counted_bound(op, fn, target):
        call = bound(op, fn, target)
        if not isinstance(target, K.Plan):
            return call

        def counted(*args, **kw):
            call(*args, **kw)  # sets target.op to the launches' Launch.op
            add(target, *op_work(op, args, kw))
        return counted

    def counted_split(self, stream=None):
        split(self, stream)
        if isinstance(stream, K.Plan):
            add(stream, 0, 12 * sum(rows * k for _, rows, k, _, _ in self.found))

    O._bound, K.SplitOperands.split = counted_bound, counted_split
    try:
        yield work
    finally:
        O._bound, K.SplitOperands.split = bound, split


# ---------------------------------------------------------------------------------------------- timing
def launch_times(plan, stream, reps) -> list[float]:
    """Milliseconds of each launch of `plan`, the median over reps replays."""
    cuda = K.engine().cuda
    times = [[] for _ in plan]
    events = [cuda.Event() for _ in range(len(plan) + 1)]
    for _ in range(reps):
        spin(stream)
        events[0].record(stream)
        for i, (_, fn, grid, args, shared, block) in enumerate(plan):
            fn.prepared_async_call(grid, (block, 1, 1), stream, *args, shared_size=shared)
            events[i + 1].record(stream)
        events[-1].synchronize()
        for i in range(len(plan)):
            times[i].append(events[i + 1].time_since(events[i]))
    return [statistics.median(t) for t in times]


def op_rows(ops, step_ms, tflops, gbs) -> list[dict]:
    """The op table's rows from {(phase, op): [launches, ms, FLOPs, bytes]}, slowest first: each op's rates, and
    its floor at the ceilings (tflops None: bytes alone) over its time."""
    rows = []
    for (phase, op), (n, ms, flops, nbytes) in ops.items():
        t_flops = flops / (tflops * 1e9) if tflops else 0.0
        t_bytes = nbytes / (gbs * 1e6)
        floor = max(t_flops, t_bytes)
        rows.append(dict(phase=phase, op=op or "(no op)", launches=n, ms=ms, share=ms / step_ms, flops=flops,
                         bytes=nbytes, tflops=flops / ms / 1e9 if ms else None, gbs=nbytes / ms / 1e6 if ms else None,
                         floor_ms=floor, of_ceiling=floor / ms if ms and floor else None,
                         bound=("flops" if t_flops > t_bytes else "bytes") if floor else None))
    return sorted(rows, key=lambda r: -r["ms"])


def profile(cfg, B, T, variant, steps, reps, ceiling, gbs) -> dict:
    model = GPT(cfg, backend="cuda", variant=variant)
    batch = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(B, T + 1)).astype(np.int32)

    def step():
        model.zero_grad()
        model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
        model.backward()
        model.step(3e-4, weight_decay=0.1, grad_clip=1.0)
    with counting_work() as work:  # the first step records the plans, each op's work noted
        step()
    for _ in range(2):  # the module built, the clocks up
        step()
    model.last_grad_norm
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    model.last_grad_norm
    step_ms = (time.perf_counter() - t0) / steps * 1e3

    backend = model.backend
    kernels, phases = collections.defaultdict(lambda: [0, 0.0]), {}
    ops = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    for key, p in backend._passes.items():
        plan = p.plan
        phase = "backward" if key == "backward" else "forward"
        ms = launch_times(plan, backend.stream, reps)
        phases[phase] = sum(ms)
        for launch, t in zip(plan, ms):
            kernels[phase, launch[0]][0] += 1
            kernels[phase, launch[0]][1] += t
            ops[phase, launch.op][0] += 1
            ops[phase, launch.op][1] += t
        for op, (flops, nbytes) in work[id(plan)].items():
            ops[phase, op][2:] = [flops, nbytes]
    rows = [dict(phase=phase, kernel=name, launches=n, ms=t, share=t / step_ms)
            for (phase, name), (n, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])]
    model_flops = flops_per_token(cfg, T) * B * T
    tflops = ceiling["tflops"]
    return dict(variant=model.backend.ops.variant.name, B=B, T=T, step_ms=step_ms, phases_ms=phases,
                rest_ms=step_ms - sum(phases.values()), model_flops_per_step=model_flops,
                achieved_tflops=model_flops / step_ms / 1e9,
                mfu=model_flops / step_ms / 1e9 / tflops if tflops else None, ceiling_tflops=tflops,
                ceiling_source=ceiling["source"], ceiling_shapes=ceiling["shapes"], copy_gbs=gbs,
                ops=op_rows(ops, step_ms, tflops, gbs), kernels=rows)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_table(result, device, preset) -> None:
    ceiling = "-" if result["ceiling_tflops"] is None else f"{result['ceiling_tflops']:.1f} TFLOP/s"
    print(f"{device}: {preset}, B={result['B']}, T={result['T']}, variant {result['variant']}; "
          f"a step {result['step_ms']:.1f} ms (wall)")
    print(f"ceilings: 3xTF32 {ceiling} ({result['ceiling_source']}); copy {result['copy_gbs']:,.0f} GB/s")
    print(f"model: {result['model_flops_per_step'] / 1e12:.3f} TFLOP a step, {result['achieved_tflops']:.1f} "
          f"TFLOP/s, MFU {_pct(result['mfu'])}")
    print()
    print(f"{'phase':<10}{'op':<34}{'launches':>9}{'ms':>9}{'of step':>9}{'GFLOP':>9}{'MB':>9}{'TFLOP/s':>9}"
          f"{'GB/s':>8}{'of ceiling':>11}  bound")
    for r in result["ops"]:
        tf = "-" if r["tflops"] is None else f"{r['tflops']:.1f}"
        gb = "-" if r["gbs"] is None else f"{r['gbs']:,.0f}"
        print(f"{r['phase']:<10}{r['op']:<34}{r['launches']:>9}{r['ms']:>9.3f}{100 * r['share']:>8.1f}%"
              f"{r['flops'] / 1e9:>9.2f}{r['bytes'] / 1e6:>9.1f}{tf:>9}{gb:>8}{_pct(r['of_ceiling']):>11}  "
              f"{r['bound'] or '-'}")
    print()
    print(f"{'phase':<10}{'kernel':<36}{'launches':>9}{'ms':>10}{'of step':>9}")
    for r in result["kernels"]:
        print(f"{r['phase']:<10}{r['kernel']:<36}{r['launches']:>9}{r['ms']:>10.3f}{100 * r['share']:>8.1f}%")
    phases = ", ".join(f"{p} {ms:.1f} ms" for p, ms in result["phases_ms"].items())
    print(f"plans: {phases}; the rest of the step (optimizer, host): {result['rest_ms']:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, epilog=CEILING_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="andrea-120m")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=None, help="sequence length (default: the preset's block_size)")
    ap.add_argument("--variant", choices=list(VARIANTS), default=DEFAULT_VARIANT)
    ap.add_argument("--steps", type=int, default=5, help="steps timed for the wall time")
    ap.add_argument("--reps", type=int, default=5, help="replays of each plan timed launch by launch")
    ap.add_argument("--quick", action="store_true", help="andrea-12m, B=2, T=128, 2 steps, 2 replays")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()
    if args.quick:
        args.preset, args.B, args.T, args.steps, args.reps = "andrea-12m", 2, 128, 2, 2
    device = gpu_or_exit("profile_step")
    cfg = GPTConfig.preset(args.preset)
    T = args.T or cfg.block_size
    stream = K.engine().cuda.Stream()
    gbs = cuda_copy_gbs(stream)
    ceiling = product_ceiling([(cfg, args.B, T)], stream)
    result = profile(cfg, args.B, T, args.variant, args.steps, args.reps, ceiling, gbs)
    if args.json:
        print(json.dumps(dict(device=device, preset=args.preset, **result)))
    else:
        print_table(result, device, args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
