#!/usr/bin/env python3
"""Runs one launch of every kernel under compute-sanitizer (memcheck, then racecheck) and fails on any
report.

    python tools/sanitize_kernels.py            # both tools, small awkward shapes
    python tools/sanitize_kernels.py --tool memcheck --log-dir out/

Shapes are small and odd on purpose (T=7, C=20, d_k=5, V=37): out-of-bounds accesses show up where
sizes are not multiples of a block. Flash attention takes no sequence that short (T >= 128, d_k >= 20), so its
kernels run again at FLASH_SHAPE (T=130: two key tiles and two rows of a third; d_k 20, and 32, 64, 128). The
tensor-core products copy A by the TMA only where its rows are 16-byte aligned, which no product at those odd
widths has; so they run again at PRODUCT_SHAPE (260 rows: two whole slices of 128 and an edge of 4; widths 128
and 512, aligned), the TMA's boxes passing the matrices' edges there too, and V = 261: the lm_head's dX and dW
products read rows that are not 16-byte aligned, copied by shifted 16-byte chunks, and again rows of 264 as the
model pads them (the last column tile's 16-byte chunk partly past V).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

from microgpt import kernels as K

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_cases import Shape, build_cases  # noqa: E402

SHAPE = dict(B=2, T=7, C=20, NH=4, V=37)
FLASH_SHAPE = dict(B=2, T=130, C=60, NH=3, V=37)
PRODUCT_SHAPE = dict(B=2, T=130, C=128, NH=2, V=261)
PRODUCTS = ("matmul", "sgemm_tc", "k_tf32_split")  # the cases of the tensor-core products and their split passes


def child() -> int:
    """Inside the sanitizer: launch every kernel once, synchronously."""
    cases = build_cases(Shape(**SHAPE), seed=1)
    if K.flash_attention_supported(FLASH_SHAPE["C"] // FLASH_SHAPE["NH"], FLASH_SHAPE["T"], K.engine()):
        cases += [c for c in build_cases(Shape(**FLASH_SHAPE), seed=2, variants=("tc",))
                  if c.kernel.startswith("fused_attention")]
    cases += build_cases(Shape(**PRODUCT_SHAPE), seed=3, variants=("tc",),
                         wanted=lambda name: name.startswith(PRODUCTS))
    for case in cases:
        case.launch()
    print(f"launched {len(cases)} kernel cases: {', '.join(sorted({c.kernel.split()[0] for c in cases}))}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", choices=["memcheck", "racecheck", "all"], default="all")
    ap.add_argument("--log-dir", default=None, help="write each tool's full report here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        print("sanitize_kernels: compute-sanitizer is not on PATH (it ships with the CUDA toolkit)")
        return 2
    tools = ["memcheck", "racecheck"] if args.tool == "all" else [args.tool]
    failed = False
    for tool in tools:
        cmd = [sanitizer, "--tool", tool, "--error-exitcode", "99", "--print-limit", "20",
               sys.executable, os.path.abspath(__file__), "--child"]
        if tool == "racecheck":
            cmd[3:3] = ["--racecheck-report", "all"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        text = res.stdout + res.stderr
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            with open(os.path.join(args.log_dir, f"sanitizer-{tool}.log"), "w") as f:
                f.write(text)
        summary = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", text)
        launched = re.search(r"launched \d+ kernel cases", text)
        ok = res.returncode == 0 and launched is not None and \
            all(re.search(r": 0 (errors|hazards)", s) for s in summary) and summary
        print(f"{tool}: {'clean' if ok else 'FAILED'} (exit {res.returncode}; "
              f"{'; '.join(summary) or 'no summary'}; {launched.group(0) if launched else 'no launches'})")
        if not ok:
            failed = True
            print(text[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
