"""Where a training step's time goes: the cuda backend's recorded forward and backward plans replayed with a
CUDA event between every two launches, summed by kernel, beside the step's wall time.

    python tools/profile_step.py                   # andrea-120m, B=8, T=1024, the default variant
    python tools/profile_step.py --variant fast    # another variant's kernels
    python tools/profile_step.py --quick --json    # a small model; one JSON object

Each launch's time is the gap between the events around it, from one replay of the plan queued behind a spin
kernel (the GPU stays busy while the host queues the launches, so a gap is the GPU's work, not the host's);
the median over --reps replays. The optimizer's launches (global norm, AdamW) are outside the plans: the
step's wall time less the two plans is theirs and the host's.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig
from microgpt import kernels as K
from microgpt.ops import DEFAULT_VARIANT, VARIANTS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import gpu_or_exit, spin  # noqa: E402


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


def profile(cfg, B, T, variant, steps, reps) -> dict:
    model = GPT(cfg, backend="cuda", variant=variant)
    batch = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(B, T + 1)).astype(np.int32)

    def step():
        model.zero_grad()
        model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
        model.backward()
        model.step(3e-4, weight_decay=0.1, grad_clip=1.0)
    for _ in range(3):  # the plans are recorded, the module built, the clocks up
        step()
    model.last_grad_norm
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    model.last_grad_norm
    step_ms = (time.perf_counter() - t0) / steps * 1e3

    backend = model.backend
    kernels, phases = collections.defaultdict(lambda: [0, 0.0]), {}
    for key, p in backend._passes.items():
        plan = p.plan
        phase = "backward" if key == "backward" else "forward"
        ms = launch_times(plan, backend.stream, reps)
        phases[phase] = sum(ms)
        for (name, *_), t in zip(plan, ms):
            kernels[phase, name][0] += 1
            kernels[phase, name][1] += t
    rows = [dict(phase=phase, kernel=name, launches=n, ms=t, share=t / step_ms)
            for (phase, name), (n, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])]
    return dict(variant=model.backend.ops.variant.name, B=B, T=T, step_ms=step_ms, phases_ms=phases,
                rest_ms=step_ms - sum(phases.values()), kernels=rows)


def print_table(result, device, preset) -> None:
    print(f"{device}: {preset}, B={result['B']}, T={result['T']}, variant {result['variant']}; "
          f"a step {result['step_ms']:.1f} ms (wall)")
    print(f"{'phase':<10}{'kernel':<36}{'launches':>9}{'ms':>10}{'of step':>9}")
    for r in result["kernels"]:
        print(f"{r['phase']:<10}{r['kernel']:<36}{r['launches']:>9}{r['ms']:>10.3f}{100 * r['share']:>8.1f}%")
    phases = ", ".join(f"{p} {ms:.1f} ms" for p, ms in result["phases_ms"].items())
    print(f"plans: {phases}; the rest of the step (optimizer, host): {result['rest_ms']:.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    result = profile(cfg, args.B, args.T or cfg.block_size, args.variant, args.steps, args.reps)
    if args.json:
        print(json.dumps(dict(device=device, preset=args.preset, **result)))
    else:
        print_table(result, device, args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
