"""Speed before and after a change, measured in one run: the benchmarks of other trees of this repository (the
bases) and of this one, one after the other on the same machine, matched row by row.

    git archive <base-commit> | (mkdir -p ../base && tar -x -C ../base)
    (cd ../base && python setup.py -q build_ext --inplace)       # the base's own host module
    python tools/bench_compare.py --base ../base                 # bench_train, bench_attention, bench_generate
    python tools/bench_compare.py --base ../base --bench generate --quick --json
    python tools/bench_compare.py --base ../main ../one --bench train --args="--preset andrea-120m" --repeat 2

Each benchmark runs as a fresh process of the tree's own tools/<bench>.py, that tree first on the import path; the
trees take turns (the bases in order, then this one), --repeat times, and the fastest time of each is kept. The
figure compared is microgpt's own time of each row (a training step, the attention forward and forward+backward, a
generate call); "after / before" below 1 is faster, and a row within --tolerance of 1 is marked "same". With
several bases, each is compared with this tree in turn. A benchmark that cannot run (no GPU) is skipped with its
reason.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
# microgpt is compared with itself: the benchmarks' peers (PyTorch, transformers) are skipped where they can be
NO_PEER = {"train": ["--no-torch"], "attention": [], "generate": ["--no-peer"]}


def figures(bench: str, result: dict) -> dict:
    """row name -> seconds (or ms) of microgpt's own time, from a benchmark's JSON."""
    if bench == "train" and "rows" not in result:  # a tree before several presets: the first one's variants
        return {f"step {v}": r["step_ms"] for v, r in result["variants"].items()}
    if bench == "train":  # the first preset's rows named as before, so that they match such a tree's
        return {(f"step {r['variant']}" if r["preset"] == result["preset"] else f"{r['preset']} step {r['variant']}"):
                r["step_ms"] for r in result["rows"]}
    if bench == "attention":
        return {f"T={r['T']} {r['who']} {part}": r[key] for r in result["rows"] if r["who"].startswith("microgpt")
                for part, key in (("fwd", "fwd_ms"), ("fwd+bwd", "fwd_bwd_ms"))}
    return {f"{r['preset']} B={r['B']} prompt={r['prompt']}": r["microgpt_s"] for r in result["rows"]}


def run(tree: Path, bench: str, extra: list[str]) -> tuple[dict | None, str]:
    """(figures, "") of tree's tools/bench_<bench>.py --json, or (None, why it did not run)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    res = subprocess.run([sys.executable, str(tree / "tools" / f"bench_{bench}.py"), "--json", *NO_PEER[bench], *extra],
                         capture_output=True, text=True, env=env, cwd=tree)
    if res.returncode != 0:
        said = (res.stderr + res.stdout).strip().splitlines()
        return None, said[-1] if said else f"exit status {res.returncode}"
    return figures(bench, json.loads(res.stdout)), ""


def compare(bases: list[Path], benches: list[str], extra: list[str], repeat: int) -> list[dict]:
    """Each base's rows against this tree's: dict(bench, base, row, before, after, ratio), or a benchmark's
    dict(bench, base, row=None, skipped=why) where a tree could not run it."""
    rows = []
    trees = [*bases, HERE]
    for bench in benches:
        best = [{} for _ in trees]
        why = ""
        for _ in range(repeat):
            for i, tree in enumerate(trees):
                got, why = run(tree, bench, extra)
                if got is None:
                    break
                for name, t in got.items():
                    best[i][name] = min(t, best[i].get(name, t))
            if why:
                break
        for b, base in enumerate(bases):
            if why:
                rows.append(dict(bench=bench, base=str(base), row=None, skipped=why))
                continue
            for name, before in best[b].items():
                after = best[-1].get(name)
                rows.append(dict(bench=bench, base=str(base), row=name, before=before, after=after,
                                 ratio=after / before if after is not None and before else None))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, nargs="+",
                    help="the other trees: checkouts or exports of this repository, each compared with this one")
    ap.add_argument("--bench", nargs="+", choices=["train", "attention", "generate"],
                    default=["train", "attention", "generate"])
    ap.add_argument("--repeat", type=int, default=1, help="turns each tree takes; the fastest time is kept")
    ap.add_argument("--tolerance", type=float, default=0.03, help="|after / before - 1| marked same (default 3%%)")
    ap.add_argument("--quick", action="store_true", help="each benchmark's --quick")
    ap.add_argument("--args", default="",
                    help="more options for every benchmark, a shell's words in one string: --args=\"-B 4\"")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    bases = [Path(b).absolute() for b in args.base]  # as given: two names of one tree stay two bases
    for i, (given, base) in enumerate(zip(args.base, bases)):
        if not (base / "tools").is_dir():
            print(f"bench_compare: --base {given}: no tools/ there (a tree of this repository?)", file=sys.stderr)
            return 2
        if base in bases[:i]:
            print(f"bench_compare: --base {given}: given twice", file=sys.stderr)
            return 2
    if args.repeat < 1:
        print(f"bench_compare: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    try:
        extra = shlex.split(args.args)
    except ValueError as e:
        print(f"bench_compare: --args {args.args!r}: {e}", file=sys.stderr)
        return 2
    rows = compare(bases, args.bench, (["--quick"] if args.quick else []) + extra, args.repeat)
    if args.json:
        print(json.dumps(dict(base=str(bases[0]), bases=[str(b) for b in bases], after=str(HERE),
                              tolerance=args.tolerance, rows=rows)))
        return 0
    for base in bases:
        print(f"before: {base}\nafter:  {HERE}")
        for r in rows:
            if r["base"] != str(base):
                continue
            if r["row"] is None:
                print(f"{r['bench']:<10} skipped: {r['skipped']}")
                continue
            mark = "" if r["ratio"] is None else "same" if abs(r["ratio"] - 1) <= args.tolerance else \
                "faster" if r["ratio"] < 1 else "SLOWER"
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
            print(f"{r['bench']:<10} {r['row']:<44} {r['before']:>10.4g} {r['after'] or float('nan'):>10.4g} "
                  f"{ratio:>7}  {mark}")
    print("after / before: microgpt's time after the change over before it (below 1: faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
