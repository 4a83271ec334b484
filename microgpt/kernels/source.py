"""The CUDA source as nvcc compiles it: where cuda/ is, the preprocessed translation unit, and what it declares.

The launch layer reads each kernel's argument format from the preprocessed translation unit
(`nvcc --preprocess`), so macros are expanded, only what microgpt_cuda.cu includes counts, and the format
cannot drift from what is compiled. The line markers of that text name the header each kernel comes from,
which tests use to hold every header to its launcher module. Needs nvcc on PATH (PyCUDA needs it too);
nothing here needs a GPU.
"""
from __future__ import annotations

import ast
import functools
import importlib.resources
import operator
import os
import re
import shutil
import subprocess
from pathlib import Path

TRANSLATION_UNIT = "microgpt_cuda.cu"
NVCC_OPTIONS = ("-lineinfo",)  # line numbers for compute-sanitizer and ncu; no effect on the code

# C parameter type -> PyCUDA argument format; an enum with an int base is passed as 'i'
_FORMATS = (("*", "P"), ("long long", "q"), ("double", "d"), ("float", "f"), ("unsigned int", "I"),
            ("int", "i"))
_LINE_MARKER = re.compile(r'^# (\d+) "([^"]+)"', re.M)
# a kernel's launch bounds (or its register cap, __maxnreg__) as the preprocessor leaves them, one level of
# parentheses within: (32 * (4 * 2), 1)
LAUNCH_BOUNDS = r'(?:__attribute__\(\((?:launch_bounds|maxnreg)\((?:[^()]|\([^()]*\))*\)\)\)\s+)?'
_KERNEL = re.compile(r'extern "C" __attribute__\(\(global\)\) void\s+' + LAUNCH_BOUNDS + r'(\w+)\s*\(([^)]*)\)')


def cuda_source_dir() -> Path:
    """Where the CUDA source is: MICROGPT_CUDA_DIR where set; else the package data microgpt/cuda of an
    installed package (found through importlib.resources), or cuda/ beside the package in a checkout (an
    editable install)."""
    override = os.environ.get("MICROGPT_CUDA_DIR")
    if override:
        candidates = [Path(override)]
    else:
        packaged = importlib.resources.files("microgpt") / "cuda"
        candidates = ([packaged] if isinstance(packaged, Path) else []) + \
            [Path(__file__).resolve().parents[2] / "cuda"]
    for c in candidates:
        if (c / TRANSLATION_UNIT).is_file():
            return c
    raise FileNotFoundError(f"{TRANSLATION_UNIT} not found in {', '.join(map(str, candidates))}")


def full_source() -> str:
    """The text of the translation unit and of every header it includes, in include order, as written (for
    reading and searching: macros unexpanded). The argument formats come from preprocessed() instead."""
    src_dir, seen, parts = cuda_source_dir(), set(), []

    def add(name):
        if name in seen:  # every header is #pragma once
            return
        seen.add(name)
        text = (src_dir / name).read_text()
        parts.append(text)
        for included in re.findall(r'^#include "([^"]+)"', text, re.M):
            add(included)
    add(TRANSLATION_UNIT)
    return "\n".join(parts)


def _source_fingerprint(src_dir: Path) -> tuple:
    """Changes whenever a file of cuda/ does, so an edit is seen by a long-lived process."""
    return tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in sorted(src_dir.iterdir()) if f.is_file())


def preprocessed() -> str:
    """The translation unit after nvcc's preprocessor, with its line markers."""
    src_dir = cuda_source_dir()
    return _preprocess(str(src_dir), _source_fingerprint(src_dir))


@functools.lru_cache(maxsize=4)
def _preprocess(src_dir: str, _fingerprint: tuple) -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH: the kernels' argument formats are read from its "
                                "preprocessor (install the CUDA toolkit)")
    cmd = [nvcc, "--preprocess", "-x", "cu", f"-I{src_dir}", *NVCC_OPTIONS, str(Path(src_dir) / TRANSLATION_UNIT)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc --preprocess {TRANSLATION_UNIT} failed:\n{res.stderr[-3000:]}")
    return res.stdout


def _format_of(kernel: str, param: str, enums: set[str]) -> str:
    words = [w for w in param.split() if w != "const"]
    if words and words[0] in enums:
        return "i"
    for ctype, fmt in _FORMATS:
        if ctype in param:
            return fmt
    raise ValueError(f"{kernel}: cannot map parameter {param!r} to a PyCUDA argument format")


def kernel_signatures(text: str | None = None) -> dict[str, str]:
    """name -> PyCUDA argument format ('P' pointer, 'i' int or int enum, 'q' long long, 'f' float, ...) of
    every extern "C" kernel of the preprocessed translation unit (or of `text`)."""
    text = preprocessed() if text is None else text
    enums = set(re.findall(r"\benum\s+(\w+)\s*:\s*int\b", text))
    return {name: "".join(_format_of(name, p.strip(), enums) for p in params.split(","))
            for name, params in _KERNEL.findall(text)}


def kernel_headers(text: str | None = None) -> dict[str, str]:
    """name -> the file of cuda/ that defines the kernel ('attention.cuh'), from the line markers."""
    text = preprocessed() if text is None else text
    markers = [(m.start(), Path(m.group(2)).name) for m in _LINE_MARKER.finditer(text)]
    out, i, current = {}, 0, None
    for m in _KERNEL.finditer(text):
        while i < len(markers) and markers[i][0] < m.start():
            current = markers[i][1]
            i += 1
        out[m.group(1)] = current
    return out


def kernel_names() -> list[str]:
    return sorted(kernel_signatures())


def int_constants(text: str | None = None) -> dict[str, int]:
    """The enumerators of the translation unit's `enum X : int { A = 0, ... }` declarations, by name; a
    value may be an integer expression of literals (what a macro expands to: `2 * 128 * (32 + 8) * 4`)."""
    text = preprocessed() if text is None else text
    out = {}
    for body in re.findall(r"\benum\s+\w+\s*:\s*int\s*\{([^}]*)\}", text):
        for name, value in re.findall(r"(\w+)\s*=\s*([-+*/() \d]+?)\s*(?:,|$)", body.strip()):
            out[name] = _integer(value)
    return out


@functools.cache
def int_constant(name: str) -> int:
    """One of int_constants(), read once: a launch size or layout constant that a launcher shares with its kernels
    (TC_WG_THREADS, TC_SPLIT_ROWS, SPLIT_TILE, a table's field JOB_SRC, ...)."""
    return int_constants()[name]


def _integer(expr: str) -> int:
    """The value of an integer expression of literals, + - * / (C's truncating division) and parentheses."""
    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not an integer expression of literals: {expr!r}")
    return value(ast.parse(expr.strip(), mode="eval").body)


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: lambda a, b: int(a / b)}
