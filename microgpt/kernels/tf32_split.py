"""Launchers of cuda/tf32_split.cuh: FP32 operands split into the TF32 hi and lo that the tensor cores' products
read B from (products.split_b_into_workspace, matmul_tc.areg_launch, the fused epilogues).

    tf32_split(hi, lo, src, rows, K, ld, K_pad, stream)   # one operand, before the product that reads it
    splits = SplitOperands([(w, rows, K, ld, transposed), ...])   # the operands that may be split once
    plan = Plan()
    with splits.reading(plan):
        ...         # the products recorded into plan whose B is one of them read its split from here, not a pass
                    # each; the plan starts with one launch (k_tf32_split_batch) that splits every one they found

Every pass splits each float alike, so a product reads the same bits whichever made them.
"""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np

from .runtime import Plan, blocks, device_of, launch
from .source import int_constant


def split_padding(rows: int, K: int) -> tuple[int, int]:
    """(rows_pad, K_pad) of a split operand: whole tiles, rows to TC_SPLIT_ROWS and K to TC_SPLIT_K, so that
    k_gemm_wg_areg's copies of it check no bounds."""
    tile_rows, tile_k = int_constant("TC_SPLIT_ROWS"), int_constant("TC_SPLIT_K")
    return math.ceil(rows / tile_rows) * tile_rows, math.ceil(K / tile_k) * tile_k


def split_floats(candidates) -> int:
    """Floats that the splits of these operands (src, rows, K, ld, transposed) take, hi and lo each padded."""
    return sum(2 * math.prod(split_padding(rows, K)) for _, rows, K, _, _ in candidates)


def tf32_split(hi: int, lo: int, src: int, rows: int, K: int, ld: int, K_pad: int, stream, transposed=False,
               why: str = "") -> None:
    """src's rows (rows x K, ld; transposed: stored K x rows) split into TF32 hi and lo, padded to whole tiles:
    rows_pad x K_pad floats each at hi and lo (split_padding), in the 128 x 32 swizzled tiles the products copy whole
    (split_at, cuda/matmul_tc.cuh), zero past the matrix (k_tf32_split; k_tf32_split_t through a 32 x 32 tile of
    shared memory where transposed)."""
    rows_pad, _ = split_padding(rows, K)
    if transposed:
        launch("k_tf32_split_t", [hi, lo, src, rows, K, ld, K_pad], (K_pad // 32, rows_pad // 32), stream,
               why=why + ", transposed through shared memory")
    else:
        quads = rows_pad * K_pad // 4
        launch("k_tf32_split", [hi, lo, src, rows, K, ld, K_pad, quads], blocks(quads), stream, why=why)


class SplitOperands:
    """Operands split once for the many products that read them, all in one launch (k_tf32_split_batch), where each
    product would otherwise split its own before it: the model's weights, in each pass. candidates: the operands
    that may be taken from here, (src, rows, K, ld, transposed) as tf32_split takes them, src a device pointer.

    While products are recorded into a plan inside reading(plan), a product of split operands whose B is a
    candidate (find) reads it from here instead of launching a split pass of its own; on leaving, the plan's first
    launch splits every operand found here so far (by this plan's products or an earlier plan's), and no other
    candidate. So the plan must not write a candidate before its products read it: the split runs ahead of every
    launch of the plan (the model's forward and backward plans write no weights). Each is held hi then lo, rows_pad
    x K_pad each (split_padding), as a product's workspace would hold it, allocated by `new(n)` (n float32s; the
    process's engine's memory by default) when first found. The caller keeps this object as long as the plans that
    read it."""

    def __init__(self, candidates, new=None):
        self.candidates = {(int(src), rows, K, ld, bool(transposed)) for src, rows, K, ld, transposed in candidates}
        self.new = new or (lambda n: device_of().ga.empty(n, np.float32))
        self.found = {}    # candidate -> its buffer, in the order found
        self.tables = []   # (the operands it lists, the table, their tiles): each plan's launch reads its own

    def __len__(self) -> int:
        return len(self.found)

    def find(self, src: int, rows: int, K: int, ld: int, transposed: bool) -> int | None:
        """Where the operand's hi lies (its lo after it, rows_pad x K_pad on), or None where it is no candidate."""
        key = (int(src), rows, K, ld, bool(transposed))
        if key not in self.candidates:
            return None
        if key not in self.found:
            self.found[key] = self.new(split_floats([key]))
        return int(self.found[key].gpudata)

    def split(self, stream=None) -> None:
        """Every operand found so far split, in one launch: a block a 64 x 64 tile of one of them."""
        if not self.found:
            return
        if not self.tables or self.tables[-1][0] != len(self.found):
            jobs, tiles = self._jobs()
            self.tables.append((len(self.found), device_of(stream).ga.to_gpu(jobs), tiles))
        n, table, tiles = self.tables[-1]
        launch("k_tf32_split_batch", [int(table.gpudata), n], tiles, stream, block=int_constant("SPLIT_THREADS"),
               why=f"the {n} weights the pass's products read, split once into TF32 hi and lo ahead of them")

    def _jobs(self) -> tuple[np.ndarray, int]:
        """k_tf32_split_batch's table (enum SplitJob), a row of fields an operand found, its tiles after the last's;
        and the tiles of all, the launch's grid."""
        rows_of_table, first, tile = [], 0, int_constant("SPLIT_TILE")
        for (src, rows, K, ld, transposed), buf in self.found.items():
            rows_pad, K_pad = split_padding(rows, K)
            hi, tiles_k = int(buf.gpudata), math.ceil(K_pad / tile)
            row = {"JOB_SRC": src, "JOB_HI": hi, "JOB_LO": hi + 4 * rows_pad * K_pad, "JOB_ROWS": rows, "JOB_K": K,
                   "JOB_LD": ld, "JOB_K_PAD": K_pad, "JOB_TRANSPOSED": int(transposed), "JOB_FIRST_TILE": first,
                   "JOB_TILES_K": tiles_k}
            rows_of_table.append([row[f] for f in sorted(row, key=int_constant)])
            first += rows_pad // tile * tiles_k
        return np.array(rows_of_table, np.int64), first

    @contextlib.contextmanager
    def reading(self, plan: Plan):
        """Inside, the products recorded into `plan` find their B here (plan.splits); on leaving, the split of every
        operand found goes first in the plan."""
        if not isinstance(plan, Plan):
            raise TypeError(f"SplitOperands.reading(plan): plan must be a runtime.Plan, got {type(plan).__name__}")
        plan.splits.append(self)
        try:
            yield self
        finally:
            plan.splits.remove(self)
        if self.found:
            plan.op = "weight splits"
            self.split(plan)
            plan.insert(0, plan.pop())


def weight_splits(weights, transposed: bool, new=None) -> SplitOperands:
    """The weights (device arrays, each OUT x IN as a linear layer's) as the products from split operands may read
    them once split: as the forward does (out = inp @ W^T) or, transposed, as the dX product does (dinp = dout @ W).
    Only those the products recorded inside reading(plan) find are split."""
    return SplitOperands([(int(w.gpudata), w.shape[1], w.shape[0], w.shape[1], True) if transposed else
                          (int(w.gpudata), w.shape[0], w.shape[1], w.shape[1], False) for w in weights], new)


class SplitArena:
    """One allocation for sets of split operands that are never read at once (the model's forward and backward
    weights, each split at the start of its own pass, the passes in order on one stream): each set lays its splits
    out from the arena's start, so it is the largest set's size, not their sum. Made by new(floats) when first taken
    from, so a device whose products split nothing ahead allocates none."""

    def __init__(self, floats: int, new=None):
        self.floats, self.new, self.buf = floats, new or (lambda n: device_of().ga.empty(n, np.float32)), None

    def allocator(self):
        """A SplitOperands' new(n), for one set: n floats after the set's earlier ones."""
        taken = 0

        def take(n: int) -> SimpleNamespace:
            nonlocal taken
            if taken + n > self.floats:
                raise RuntimeError(f"SplitArena: {taken + n} floats asked of one of {self.floats}")
            if self.buf is None:
                self.buf = self.new(self.floats)
            at = SimpleNamespace(gpudata=int(self.buf.gpudata) + 4 * taken, size=n, base=self.buf)
            taken += n
            return at
        return take


def find_split(stream, src: int, rows: int, K: int, ld: int, transposed: bool) -> int | None:
    """The split of the operand (as tf32_split takes it) in a SplitOperands that the Plan `stream` reads (reading()),
    or None."""
    for splits in reversed(stream.splits if isinstance(stream, Plan) else []):
        at = splits.find(src, rows, K, ld, transposed)
        if at is not None:
            return at
    return None
