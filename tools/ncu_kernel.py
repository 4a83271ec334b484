#!/usr/bin/env python3
"""One named kernel under Nsight Compute (ncu --clock-control none), with its key counters: achieved
occupancy, DRAM throughput, FMA pipe use, time.

    python tools/ncu_kernel.py k_layernorm_fwd                 # andrea-120m, B=8, T=1024
    python tools/ncu_kernel.py "matmul_fwd_fast (qkv)" --quick --json

KERNEL is a case of tools/kernel_cases.py (a reference kernel `k_<op>`, or a fast variant `<op>_fast`,
with the layer in parentheses for matmuls; the first case whose name starts with it is taken). The case
is launched once after a warm-up with the profiler on only around that launch, so only its kernels
(a fast variant may run several) are measured. The clocks are left as they are (--clock-control none).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys

from microgpt import GPTConfig
from microgpt import kernels as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_cases import Shape, build_cases  # noqa: E402
from timing import gpu_or_exit  # noqa: E402

METRICS = {
    "time_us": "gpu__time_duration.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
}
QUICK = dict(preset="andrea-12m", B=2, T=256)


def child(args) -> int:
    cuda = K.engine().cuda
    cfg = GPTConfig.preset(args.preset)
    shape = Shape(args.B, args.T or cfg.block_size, cfg.d_model, cfg.n_head, cfg.vocab_size)
    cases = build_cases(shape, wanted=lambda name: name.startswith(args.kernel))  # only its inputs are made
    if not cases:
        print(f"ncu_kernel: no case named {args.kernel!r}", file=sys.stderr)
        return 3
    case = cases[0]
    case.launch()  # warm-up: module load and first-launch costs stay out of the profile
    cuda.Context.synchronize()
    cuda.start_profiler()
    case.launch()
    cuda.Context.synchronize()
    cuda.stop_profiler()
    print(f"profiled case: {case.kernel}", file=sys.stderr)
    return 0


def parse(text):
    """ncu --csv --page raw: one row per profiled kernel launch."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if len(lines) < 2:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    units = rows[0] if rows and rows[0].get("ID", "").strip() == "" else {}  # the row under the header
    to_us = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    out = []
    for r in rows[1:] if units else rows:
        entry = {"kernel": r.get("Kernel Name", "?")}
        for key, metric in METRICS.items():
            try:
                entry[key] = float(r[metric].replace(",", ""))
            except (KeyError, ValueError, AttributeError):
                entry[key] = None
        if entry["time_us"] is not None:
            entry["time_us"] *= to_us.get(units.get(METRICS["time_us"], "nsecond").strip(), 1e-3)
        out.append(entry)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", help="a case name, e.g. k_softmax_fwd or 'matmul_fwd_fast (mlp.fc)'")
    ap.add_argument("--preset", default="andrea-120m")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="andrea-12m, B=2, T=256")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.preset, args.B, args.T = QUICK["preset"], QUICK["B"], QUICK["T"]
    if args.child:
        return child(args)
    device = gpu_or_exit("ncu_kernel")
    ncu = shutil.which("ncu")
    if ncu is None:
        print("ncu_kernel: ncu (Nsight Compute) is not on PATH")
        return 2
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--metrics", ",".join(METRICS.values()), sys.executable, os.path.abspath(__file__), args.kernel,
           "--preset", args.preset, "-B", str(args.B), "--child"] + (["-T", str(args.T)] if args.T else [])
    res = subprocess.run(cmd, capture_output=True, text=True)
    rows = parse(res.stdout)
    if res.returncode != 0 or not rows:
        print(f"ncu_kernel: ncu failed (exit {res.returncode})")
        print((res.stdout + res.stderr)[-3000:])
        return 1
    result = dict(device=device, case=args.kernel, preset=args.preset, B=args.B, T=args.T, launches=rows)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{device}: {args.kernel}, {args.preset} B={args.B} T={args.T or 'block_size'} (ncu --clock-control none)")
    print(f"{'kernel':<28}{'time us':>10}{'occupancy %':>13}{'DRAM %':>9}{'FMA pipe %':>12}{'SM %':>8}")
    fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    for r in rows:
        print(f"{r['kernel'][:27]:<28}{fmt(r['time_us']):>10}{fmt(r['achieved_occupancy_pct']):>13}"
              f"{fmt(r['dram_throughput_pct']):>9}{fmt(r['fma_pipe_pct']):>12}{fmt(r['sm_throughput_pct']):>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
