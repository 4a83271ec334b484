"""Launcher of cuda/persistent.cuh: a recorded decode step's runs of launches folded into one persistent kernel.

    plan = Plan(); model.decode(ops.on(plan), ...)     # k_embed_decode, then 5 launches a layer, then the lm_head
    step = fold(plan)                                   # one k_persistent_<R> launch, the launches as its steps

A decode step at B <= MATVEC_ROWS is some sixty launches of a few microseconds each, and each launch boundary
costs about as much as the launch's own work. fold() replaces each run of two or more launches that k_persistent
takes (k_embed_decode, k_matvec_<R> of one R, k_attention_decode) by one launch of as many blocks as are resident at
once, which take each launch's blocks in turn and wait on a count in global memory where a launch boundary was.
Each of its steps runs the folded kernel's own device function with the same arguments: the same bits.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .runtime import Plan, counters, device_of, launch
from .source import int_constants

STEP = np.dtype([("kind", "<i4"), ("grid_x", "<i4"), ("grid_y", "<i4"), ("first", "<i4"), ("p", "<u8", 8),
                 ("a", "<i4", 8)])  # struct Step of cuda/persistent.cuh
assert STEP.itemsize == 112


@functools.cache  # (read from the preprocessed source once)
def constants() -> dict:
    """cuda/persistent.cuh's enum PersistentLaunch (the kinds of step, STEP_SLOTS) and the block it shares with
    k_matvec and k_attention_decode (MATVEC_THREADS)."""
    c = int_constants()
    return {k: c[k] for k in ("STEP_EMBED", "STEP_MATVEC", "STEP_ATTENTION", "STEP_SLOTS", "MATVEC_THREADS")}


def _kind(name: str) -> tuple[int, int] | None:
    """(kind, R) of a launch of kernel `name` that k_persistent takes (R = 0 where any R takes it), else None."""
    c = constants()
    if name == "k_embed_decode":
        return c["STEP_EMBED"], 0
    if name == "k_attention_decode":
        return c["STEP_ATTENTION"], 0
    if name.startswith("k_matvec_"):
        return c["STEP_MATVEC"], int(name.rsplit("_", 1)[1])
    return None


def _runs(plan: Plan) -> list[tuple[int, int, int]]:
    """(start, stop, R) of each longest run of two or more launches that one k_persistent_<R> takes."""
    runs, start, R = [], None, 0

    def close(stop):
        if start is not None and stop - start >= 2:
            runs.append((start, stop, R or 1))
    for i, entry in enumerate(plan):
        kind = _kind(entry[0])
        if kind is not None and start is not None and (kind[1] == 0 or R in (0, kind[1])):
            R = R or kind[1]
            continue
        close(i)
        start, R = (i, kind[1]) if kind is not None else (None, 0)
    close(len(plan))
    return runs


def _steps(run, signatures) -> np.ndarray:
    """The Step table of the launches of `run`: each one's kind, grid and arguments (pointers, then ints, each in
    the kernel's order). k_embed_decode's grid is counted again in blocks of MATVEC_THREADS."""
    c = constants()
    table = np.zeros(len(run), STEP)
    for row, (name, _, grid, args, _, _) in zip(table, run):
        sig = signatures[name]
        pointers = [int(a) for a, f in zip(args, sig) if f == "P"]
        ints = [int(a) for a, f in zip(args, sig) if f == "i"]
        if len(pointers) > c["STEP_SLOTS"] or len(ints) > c["STEP_SLOTS"] or len(pointers) + len(ints) != len(sig):
            raise ValueError(f"{name}'s arguments do not fit a Step of cuda/persistent.cuh")
        kind = _kind(name)[0]
        if kind == c["STEP_EMBED"]:  # (x, tokens, wte, wpe, pos; B, C): an element a thread
            grid = (math.ceil(ints[0] * ints[1] / c["MATVEC_THREADS"]), 1)
        row["kind"], row["grid_x"], row["grid_y"] = kind, grid[0], grid[1] if len(grid) > 1 else 1
        row["p"][:len(pointers)], row["a"][:len(ints)] = pointers, ints
    return table


def fold(plan: Plan, most: int | None = None) -> Plan:
    """`plan` with each run of two or more launches that k_persistent_<R> takes replaced by one launch of it, its
    steps those launches (Launch.steps); the other launches as they were. The grid: every block resident at once
    (the launch is cooperative, so it fails rather than waits forever where they are not), no more blocks than the
    largest step has, and no more than `most` (the tests' small grids, whose blocks take several of a step's)."""
    e = device_of(plan)
    out = Plan(plan.device)
    out.keep, out.workspace, out.splits = list(plan.keep), plan.workspace, plan.splits
    runs = {start: (stop, R) for start, stop, R in _runs(plan)}
    i = 0
    while i < len(plan):
        if i not in runs:
            out.append(plan[i])
            i += 1
            continue
        stop, R = runs[i]
        run = plan[i:stop]
        table = _steps(run, e.signatures)
        name, threads = f"k_persistent_{R}", constants()["MATVEC_THREADS"]
        shared = max(entry[4] for entry in run)
        per_sm = e.resident_blocks(name, threads, shared)
        blocks = table["grid_x"] * table["grid_y"]
        grid = min(e.sm_count * per_sm, int(blocks.max()), most or math.inf)
        table["first"] = (np.cumsum(blocks) - blocks) % grid  # each step's blocks after the step before's
        steps, count = e.ga.to_gpu(table.view(np.uint8)), counters(len(run) + 1, out)
        out.keep.append(steps)
        out.op = "decode step"
        launch(name, [int(steps.gpudata), len(run), int(count.gpudata)], grid, out, shared=shared, block=threads,
               why=f"the {len(run)} launches below as one: {grid} blocks ({per_sm} an SM) resident throughout take "
               "each launch's blocks in turn, waiting on a count in global memory where a launch ended",
               cooperative=True, steps=run)
        i = stop
    out.op = ""
    return out
