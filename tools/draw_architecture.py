#!/usr/bin/env python3
"""microgpt's modules drawn from the package's own imports: each module a box with its name and its lines, one
row above everything it imports, an arrow from each importer to each module it imports.

    python tools/draw_architecture.py                      # writes docs/architecture.png
    python tools/draw_architecture.py --out /tmp/arch.png

microgpt/kernels/ is one box "kernels/" holding its modules' names; the Cython modules (_host.pyx, _tokens.pyx)
import nothing of ours and sit at the bottom, under the modules that import them.
"""
from __future__ import annotations

import argparse
import ast
import math
import sys
from pathlib import Path

try:
    from matplotlib.figure import Figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
except ImportError:
    Figure = None

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "microgpt"
PER_ROW = 10  # box widths a row holds at most; a longer layer wraps onto more rows
KERNEL_COLUMNS = 4  # the kernels/ box spans this many slots and lists its modules in as many columns
ROW_GAP = 0.55  # between rows, in the units of a box's width


def boxes(package_dir: Path) -> dict[str, list[Path]]:
    """box name ("cli.py", "_host.pyx", "kernels/") -> the files it stands for."""
    out = {p.name: [p] for p in sorted(package_dir.glob("*.py")) + sorted(package_dir.glob("*.pyx"))}
    out["kernels/"] = sorted((package_dir / "kernels").glob("*.py"))
    return out


def _box_of(parts: list[str], package_dir: Path) -> str | None:
    """The box of a dotted name split in parts (microgpt.x.y...): None outside the package; a name that is no
    module of the package (an attribute of its face) is __init__.py's."""
    if not parts or parts[0] != "microgpt":
        return None
    if len(parts) == 1:
        return "__init__.py"
    head = parts[1]
    if head == "kernels":
        return "kernels/"
    for suffix in (".py", ".pyx"):
        if (package_dir / (head + suffix)).exists():
            return head + suffix
    return "__init__.py"


def imports(package_dir: Path = PACKAGE) -> dict[str, set[str]]:
    """box -> the boxes its files import (at any depth of the file), itself left out. A .pyx file's imports
    are of outside modules only (numpy, libc), so it imports no box."""
    graph = {}
    for name, files in boxes(package_dir).items():
        found = set()
        for path in (f for f in files if f.suffix == ".py"):
            package = ["microgpt", *path.relative_to(package_dir).parts[:-1]]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {_box_of(a.name.split("."), package_dir) for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = (package[:len(package) - node.level + 1] if node.level else []) + \
                        (node.module.split(".") if node.module else [])
                    found |= {_box_of(base + [a.name], package_dir) for a in node.names}
        graph[name] = found - {None, name}
    return graph


def layers(package_dir: Path = PACKAGE) -> dict[str, int]:
    """box -> its row: 0 for a box that imports none, else 1 + the highest row among what it imports."""
    graph, rows = imports(package_dir), {}

    def row(name, trail=()):
        assert name not in trail, "import circle: " + " -> ".join(trail + (name,))
        if name not in rows:
            rows[name] = 1 + max((row(m, trail + (name,)) for m in graph[name]), default=-1)
        return rows[name]
    for name in graph:
        row(name)
    return rows


def place(graph, rows, width, height):
    """(x, y) of each box's centre: rows bottom-up, wrapped at PER_ROW slots, each row's boxes spread apart and
    ordered by the mean x of the boxes they import and are imported by (of the row below, or of the last pass)."""
    users = {n: {m for m in graph if n in graph[m]} for n in graph}
    x = {}
    for _ in range(4):
        prev, x, y, top = x, {}, {}, 0.0
        for layer in range(max(rows.values()) + 1):
            def key(n):
                near = [x.get(m, prev.get(m)) for m in graph[n] | users[n]]
                near = [v for v in near if v is not None]
                return (sum(near) / len(near) if near else PER_ROW / 2, n)
            wrapped, slots = [[]], 0
            for n in sorted((n for n in graph if rows[n] == layer), key=key):
                if slots + width[n] > PER_ROW:
                    wrapped, slots = wrapped + [[]], 0
                wrapped[-1].append(n)
                slots += width[n]
            for row in wrapped:
                used, h = sum(width[n] for n in row), max(height[n] for n in row)
                gap = min(0.8, (PER_ROW - used) / len(row))
                left = (PER_ROW - used - gap * len(row)) / 2 + gap / 2
                for n in row:
                    x[n], y[n] = left + width[n] / 2, top + h / 2
                    left += width[n] + gap
                top += h + ROW_GAP
    return x, y, top - ROW_GAP


def draw(out: Path, package_dir: Path = PACKAGE) -> None:
    """The picture of layers() and imports() as a PNG at `out`, about 1600 pixels wide."""
    graph, rows, files = imports(package_dir), layers(package_dir), boxes(package_dir)
    lines = {n: sum(len(f.read_text().splitlines()) for f in fs) for n, fs in files.items()}
    kernel_names = [f"{f.stem} {len(f.read_text().splitlines())}" for f in files["kernels/"]]
    kernel_rows = math.ceil(len(kernel_names) / KERNEL_COLUMNS)
    width = {n: KERNEL_COLUMNS if n == "kernels/" else 1 for n in graph}
    height = {n: 0.45 + 0.2 * kernel_rows if n == "kernels/" else 0.5 for n in graph}
    x, y, top = place(graph, rows, width, height)

    fig = Figure(figsize=(16, 1.1 * top + 1.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.01, 0.01, 0.98, 1.1 * top / (1.1 * top + 1.0)))
    ax.set_xlim(0, PER_ROW)
    ax.set_ylim(-0.02, top + 0.02)
    ax.axis("off")
    pad = 0.05
    for n in graph:
        w, h = width[n] - 2 * pad, height[n]
        ax.add_patch(FancyBboxPatch((x[n] - w / 2, y[n] - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                    facecolor="#e8eef6", edgecolor="#4a6a90", linewidth=1.0, zorder=2))
        if n == "kernels/":
            ax.text(x[n] - w / 2 + 0.1, y[n] + h / 2 - 0.17, f"kernels/  {lines[n]} lines", ha="left",
                    va="center", fontsize=8.5, weight="bold", zorder=3)
        else:
            ax.text(x[n], y[n] + 0.08, n, ha="center", va="center", fontsize=8.5, weight="bold", zorder=3)
            count = f"{lines[n]} line" + "s" * (lines[n] != 1)
            ax.text(x[n], y[n] - 0.12, count, ha="center", va="center", fontsize=7.5, color="#555555", zorder=3)
        for m in graph[n]:
            # each arrow leaves and enters its boxes' edges on the side of the other box, so that they fan out
            start = x[n] + max(-w / 2 + 0.1, min(w / 2 - 0.1, (x[m] - x[n]) * 0.15))
            end = x[m] + max(-width[m] / 2 + 0.15, min(width[m] / 2 - 0.15, (x[n] - x[m]) * 0.15))
            ax.add_patch(FancyArrowPatch((start, y[n] - h / 2), (end, y[m] + height[m] / 2), arrowstyle="-|>",
                                         mutation_scale=7, color="#c8c8c8", linewidth=0.6, shrinkA=0, shrinkB=0.5,
                                         zorder=1))
    col_w = (width["kernels/"] - 2 * pad - 0.2) / KERNEL_COLUMNS
    for i, name in enumerate(kernel_names):
        ax.text(x["kernels/"] - width["kernels/"] / 2 + pad + 0.1 + col_w * (i % KERNEL_COLUMNS),
                y["kernels/"] + height["kernels/"] / 2 - 0.42 - 0.2 * (i // KERNEL_COLUMNS), name,
                ha="left", va="center", fontsize=7.5, color="#333333", zorder=3)
    fig.text(0.5, 1 - 0.3 / fig.get_figheight(), "microgpt's modules, each above what it imports", ha="center",
             va="center", fontsize=13)
    fig.text(0.5, 1 - 0.6 / fig.get_figheight(), "box: a module and its lines; arrow: imports", ha="center",
             va="center", fontsize=9, color="#555555")
    fig.savefig(out, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png", help="the PNG to write")
    args = ap.parse_args(argv)
    if Figure is None:
        print("draw_architecture: matplotlib is not installed; pip install 'microgpt[plot]'", file=sys.stderr)
        return 2
    draw(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
