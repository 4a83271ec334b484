#!/usr/bin/env python3
"""The memory-bound kernels' second versions (dev/cuda/memory_bound.cu) in one run: each k_<name>_v2 checked
against the current kernel on the same inputs, then both timed at andrea-120m's shapes.

    python dev/memory_bound.py            # the checks, then the times (B=8, T=1024)
    python dev/memory_bound.py --check    # the checks only

Written without a GPU and not yet run on one: the kernels compile for sm_90a and sm_80 without spills, and
their indexing was exercised on the CPU only (an emulation of the launches under AddressSanitizer, not kept).

Each v2 kernel takes the argument list the current launcher passes to the current kernel (recorded through
kernels.recording(), so they cannot drift apart), on the grid its comment in the .cu names. The checks use
fresh random inputs (--seed repeats a run) and outputs poisoned with NaN: the elementwise kernels (GELU,
the head split and merge, the cross-entropy gradient, the embedding) must equal the current kernel's output
bit for bit; the layernorms are compared with float64 (microgpt.reference), ||x - ref|| / ||ref|| beside the
current kernel's, and fail above 1.5x it unless below 2^-23 (one float32 ulp at 1; 1e-6 where the current
one's is 0). Shapes: andrea-120m's, odd ones, and arrays one float off a 16-byte boundary (the kernels'
scalar paths). Exit status 1 if any check fails.

The times are medians of CUDA events over launches rotating among --sets copies of the inputs, as
tools/profile_kernels.py times them, with the bytes each kernel must move counted as tools/kernel_cases.py
counts them (layernorm_bwd_fast: its dx kernel only), against the copy bandwidth measured in the same run.
The times are the kernels' alone: tools/timing.py queues a spin kernel before each start event, so that the
GPU stays busy while Python queues the launch.
"""
from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from microgpt import GPTConfig
from microgpt import kernels as K
from microgpt import reference as R

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCE = HERE / "cuda" / "memory_bound.cu"
sys.path.insert(0, str(ROOT / "tools"))
from profile_kernels import copy_bandwidth  # noqa: E402
from timing import cuda_median_ms, gpu_or_exit  # noqa: E402

F = 4  # bytes per float32 / int32
WARP = 32
# A layernorm's error may be at most BAR times the current kernel's, or FLOOR (one float32 ulp at 1): below it
# both are at float32's own rounding, and over a few values (the 7 means of an odd shape) their ratio is noise.
BAR, FLOOR = 1.5, 2.0 ** -23
PRESET = GPTConfig.preset("andrea-120m")


def preprocessed(path: Path) -> str:
    """The file after nvcc's preprocessor, as microgpt.kernels.source reads the engine's."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    cmd = [nvcc, "--preprocess", "-x", "cu", f"-I{ROOT / 'cuda'}", *K.NVCC_OPTIONS, str(path)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc --preprocess {path.name} failed:\n{res.stderr[-3000:]}")
    return res.stdout


class V2:
    """dev/cuda/memory_bound.cu compiled as the engine is (its options, the device's architecture), each kernel
    prepared with the format read from the preprocessed file."""

    def __init__(self):
        from pycuda.compiler import SourceModule
        e = K.engine()
        self.cuda = e.cuda
        module = SourceModule(SOURCE.read_text(), options=list(K.NVCC_OPTIONS), arch=e.arch, no_extern_c=True,
                              include_dirs=[str(ROOT / "cuda")])
        text = preprocessed(SOURCE)
        constants = K.int_constants(text)
        self.block, self.unroll = constants["MB_BLOCK"], constants["MB_UNROLL"]
        signatures = K.kernel_signatures(text)
        self.fns = {}
        for name, fmt in signatures.items():
            if not name.endswith("_v2"):
                continue  # the engine's kernels that rows_fast.cuh brings in
            if name.endswith("_v2") and fmt != e.signatures[name[:-3]]:
                raise RuntimeError(f"{name} takes {fmt}, {name[:-3]} {e.signatures[name[:-3]]}: not the same arguments")
            self.fns[name] = module.get_function(name)
            self.fns[name].prepare(fmt)

    def grid(self, name: str, args: list) -> tuple:
        """The grid of kernel `name` for the current kernel's argument list, as the .cu's comments say."""
        blocks = lambda threads: max(1, -(-threads // self.block))  # noqa: E731
        if name in ("k_gelu_fwd_v2", "k_gelu_bwd_v2"):
            return blocks(-(-args[-1] // (4 * self.unroll))), 1  # 4 * MB_UNROLL elements a thread
        if name in ("k_layernorm_fwd_fast_v2", "k_residual_layernorm_fwd_fast_v2"):
            return blocks(args[-2] * WARP), 1
        if name == "k_layernorm_bwd_fast_v2":
            return blocks(args[-3] * WARP), 1
        if name.startswith(("k_split_heads", "k_merge_heads")):
            B, T, NH, d_k = args[-4:]
            width = d_k // 4 if d_k % 4 == 0 else d_k  # chunks a row (16-byte ones on aligned arrays)
            tiles = -(-T // (self.unroll * max(1, self.block // width)))  # of MB_UNROLL passes of rows
            return (3 if "split" in name else 1) * B * NH, min(tiles, 65535)
        if name == "k_crossentropy_bwd_v2":
            return 1, min(args[-2], 65535)
        if name == "k_embed_fwd_v2":
            return blocks(args[-3] * args[-2] * WARP), 1
        raise KeyError(name)

    def launch(self, name: str, args: list, grid=None, stream=None) -> None:
        self.fns[name].prepared_async_call(grid or self.grid(name, args), (self.block, 1, 1), stream, *args)
        if stream is None:
            self.cuda.Context.synchronize()


class Dev:
    """A device array `offset` elements into its own allocation (offset 1: off the 16-byte boundary, which
    sends the kernels down their scalar paths), with __cuda_array_interface__ for the launchers' checks."""

    def __init__(self, host: np.ndarray, offset: int = 0):
        self.cuda = K.engine().cuda
        self.shape, self.dtype = host.shape, host.dtype
        self._mem = self.cuda.mem_alloc(max(1, host.nbytes + offset * host.itemsize))
        self.ptr = int(self._mem) + offset * host.itemsize
        self.set(host)
        K.release_at_exit(self)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None}

    def set(self, host: np.ndarray) -> None:
        self.cuda.memcpy_htod(self.ptr, np.ascontiguousarray(host, self.dtype))

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.cuda.memcpy_dtoh(out, self.ptr)
        return out

    def release(self) -> None:
        if self._mem is not None:
            self._mem.free()
            self._mem = None


def nan(shape, offset=0) -> Dev:
    return Dev(np.full(shape, np.nan, np.float32), offset)


def args_of(call, kernel: str) -> tuple[list, K.Plan]:
    """The checked argument list that call() (a launcher) passes to `kernel`, recorded rather than launched;
    the plan keeps the scratch buffers its other launches point into alive."""
    with K.recording() as plan:
        call()
    for name, _fn, _grid, args, _shared, _block in plan:
        if name == kernel:
            return list(args), plan
    raise RuntimeError(f"the launcher did not launch {kernel}")


# ---------------------------------------------------------------------------------------------- checks
def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    """||x - ref|| / ||ref||; where ref is exactly 0, ||x|| itself."""
    if not np.isfinite(x).all():
        return math.inf
    norm = float(np.linalg.norm(ref))
    return float(np.linalg.norm(x.astype(np.float64) - ref)) / (norm if norm > 0 else 1.0)


class Report:
    def __init__(self):
        self.ok = True

    def exact(self, op: str, shape: str, pairs) -> None:
        """pairs: (name, v2 output, current output), which must be equal bit for bit."""
        bad = []
        for name, new, cur in pairs:
            if not same_bits(new, cur):
                diff = np.abs(new.astype(np.float64) - cur)
                bad.append(f"{name}: {int((new.view(np.uint32) != cur.view(np.uint32)).sum())} of {new.size} differ"
                           f" (max |diff| {np.nanmax(diff) if np.isfinite(diff).any() else math.nan:.1e}, "
                           f"{int(np.isnan(new).sum())} NaN)")
        self.ok &= not bad
        print(f"{op:<33}{shape:<36}{'exact' if not bad else 'FAIL ' + '; '.join(bad)}", flush=True)

    def close(self, op: str, shape: str, pairs) -> None:
        """pairs: (name, v2 output, current output, float64 reference): v2's error at most BAR x the current's
        or FLOOR."""
        cells, row_ok = [], True
        for name, new, cur, ref in pairs:
            a, b = rel_err(new, ref), rel_err(cur, ref)
            ok = a <= max(BAR * b, FLOOR) or (b == 0 and a <= 1e-6)
            row_ok &= ok
            cells.append(f"{name} {a:.1e} / {b:.1e}{'' if ok else ' FAIL'}")
        self.ok &= row_ok
        print(f"{op:<33}{shape:<36}{'  '.join(cells)}", flush=True)


def check_gelu(v2, rng, rep, shape, offsets=(0, 0, 0)) -> None:
    """offsets: of out, x and dout, in floats."""
    o_out, o_x, o_d = offsets
    x = Dev((rng.standard_normal(shape) * 2).astype(np.float32), o_x)
    dout = Dev(rng.standard_normal(shape).astype(np.float32), o_d)
    label = f"{shape} off {o_out},{o_x},{o_d}"
    cur, new = nan(shape, o_out), nan(shape, o_out)
    K.gelu_fwd(cur, x)
    v2.launch("k_gelu_fwd_v2", args_of(lambda: K.gelu_fwd(new, x), "k_gelu_fwd")[0])
    rep.exact("gelu_fwd", label, [("out", new.get(), cur.get())])
    cur, new = nan(shape, o_out), nan(shape, o_out)
    K.gelu_bwd(cur, dout, x)
    v2.launch("k_gelu_bwd_v2", args_of(lambda: K.gelu_bwd(new, dout, x), "k_gelu_bwd")[0])
    rep.exact("gelu_bwd", label, [("dx", new.get(), cur.get())])


def check_layernorm(v2, rng, rep, N, C, offset=0) -> None:
    """The three layernorm kernels on (N, C); `offset` shifts the row-wide inputs off 16 bytes."""
    label = f"N={N} C={C}" + (f" off {offset}" if offset else "")
    x_h = (rng.standard_normal((N, C)) + 0.5).astype(np.float32)
    w_h, b_h = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    x, w, b = Dev(x_h, offset), Dev(w_h), Dev(b_h)
    ref, ref_mean, ref_rstd = R.layernorm_fwd(x_h.astype(np.float64), w_h.astype(np.float64), b_h.astype(np.float64))

    def outputs():
        return nan((N, C), offset), nan(N), nan(N)
    cur, new = outputs(), outputs()
    K.layernorm_fwd_fast(*cur, x, w, b)
    v2.launch("k_layernorm_fwd_fast_v2", args_of(lambda: K.layernorm_fwd_fast(*new, x, w, b),
                                                 "k_layernorm_fwd_fast")[0])
    rep.close("layernorm_fwd_fast", label, [(n, a.get(), c.get(), r) for n, a, c, r in
                                            zip(("out", "mean", "rstd"), new, cur, (ref, ref_mean, ref_rstd))])

    resid_h, branch_h = x_h, (rng.standard_normal((N, C)) * 0.5).astype(np.float32)
    resid, branch = Dev(resid_h, offset), Dev(branch_h, offset)
    cur, new = (nan((N, C), offset),) + outputs(), (nan((N, C), offset),) + outputs()
    K.residual_layernorm_fwd_fast(*cur, resid, branch, w, b)
    v2.launch("k_residual_layernorm_fwd_fast_v2",
              args_of(lambda: K.residual_layernorm_fwd_fast(*new, resid, branch, w, b),
                      "k_residual_layernorm_fwd_fast")[0])
    rep.exact("residual_layernorm_fwd_fast", label, [("x", new[0].get(), cur[0].get())])
    s64 = (resid_h + branch_h).astype(np.float64)  # the float32 sum both kernels normalise (held equal above)
    ref, ref_mean, ref_rstd = R.layernorm_fwd(s64, w_h.astype(np.float64), b_h.astype(np.float64))
    rep.close("residual_layernorm_fwd_fast", label, [(n, a.get(), c.get(), r) for n, a, c, r in
                                                     zip(("out", "mean", "rstd"), new[1:], cur[1:],
                                                         (ref, ref_mean, ref_rstd))])

    # backward from the float32 mean and rstd a forward saved: what both kernels read
    mean_h, rstd_h = ref_mean.astype(np.float32), ref_rstd.astype(np.float32)
    dout_h = rng.standard_normal((N, C)).astype(np.float32)
    dout, mean, rstd = Dev(dout_h, offset), Dev(mean_h), Dev(rstd_h)
    ref_dx = R.layernorm_bwd(dout_h.astype(np.float64), s64, w_h.astype(np.float64), mean_h.astype(np.float64),
                             rstd_h.astype(np.float64))[0]
    xs = Dev(s64.astype(np.float32), offset)
    for accumulate in (False, True):
        old = rng.standard_normal((N, C)).astype(np.float32)
        cur, new = (Dev(old, offset), Dev(old, offset)) if accumulate else (nan((N, C), offset), nan((N, C), offset))
        dw, db = Dev(np.zeros(C, np.float32)), Dev(np.zeros(C, np.float32))
        K.layernorm_bwd_fast(cur, dw, db, dout, xs, w, mean, rstd, accumulate=accumulate)
        args, _plan = args_of(lambda: K.layernorm_bwd_fast(new, dw, db, dout, xs, w, mean, rstd,
                                                           accumulate=accumulate), "k_layernorm_bwd_fast")
        v2.launch("k_layernorm_bwd_fast_v2", args)
        ref = ref_dx + old if accumulate else ref_dx
        rep.close(f"layernorm_bwd_fast{' (accumulate)' if accumulate else ''}", label,
                  [("dx", new.get(), cur.get(), ref)])


def check_heads(v2, rng, rep, B, T, NH, d_k, offset=0) -> None:
    label = f"B={B} T={T} NH={NH} d_k={d_k}" + (f" off {offset}" if offset else "")
    C = NH * d_k
    hs = (B, NH, T, d_k)
    qkv = Dev(rng.standard_normal((B, T, 3 * C)).astype(np.float32), offset)
    cur, new = [nan(hs, offset) for _ in range(3)], [nan(hs) for _ in range(3)]
    K.split_heads_fwd(*cur, qkv, NH)
    v2.launch("k_split_heads_fwd_v2", args_of(lambda: K.split_heads_fwd(*new, qkv, NH), "k_split_heads_fwd")[0])
    rep.exact("split_heads_fwd", label, [(n, a.get(), c.get()) for n, a, c in zip("qkv", new, cur)])

    dqkv = [Dev(rng.standard_normal(hs).astype(np.float32), offset if i == 0 else 0) for i in range(3)]
    cur, new = nan((B, T, 3 * C), offset), nan((B, T, 3 * C))
    K.split_heads_bwd(cur, *dqkv)
    v2.launch("k_split_heads_bwd_v2", args_of(lambda: K.split_heads_bwd(new, *dqkv), "k_split_heads_bwd")[0])
    rep.exact("split_heads_bwd", label, [("dqkv", new.get(), cur.get())])

    heads = Dev(rng.standard_normal(hs).astype(np.float32), offset)
    cur, new = nan((B, T, C)), nan((B, T, C), offset)
    K.merge_heads_fwd(cur, heads)
    v2.launch("k_merge_heads_fwd_v2", args_of(lambda: K.merge_heads_fwd(new, heads), "k_merge_heads_fwd")[0])
    rep.exact("merge_heads_fwd", label, [("y", new.get(), cur.get())])

    dy = Dev(rng.standard_normal((B, T, C)).astype(np.float32), offset)
    cur, new = nan(hs), nan(hs, offset)
    K.merge_heads_bwd(cur, dy, NH)
    v2.launch("k_merge_heads_bwd_v2", args_of(lambda: K.merge_heads_bwd(new, dy, NH), "k_merge_heads_bwd")[0])
    rep.exact("merge_heads_bwd", label, [("dheads", new.get(), cur.get())])


def check_crossentropy_bwd(v2, rng, rep, N, V, offsets=(0, 0)) -> None:
    """offsets: of dlogits and probs (equal: 16-byte chunks after a scalar head; unequal: the scalar path)."""
    label = f"N={N} V={V}" + (f" off {offsets[0]},{offsets[1]}" if any(offsets) else "")
    probs = Dev(rng.random((N, V)).astype(np.float32), offsets[1])
    targets = Dev(rng.integers(0, V, N).astype(np.int32))
    dlosses = Dev(rng.standard_normal(N).astype(np.float32))
    cur, new = nan((N, V), offsets[0]), nan((N, V), offsets[0])
    K.crossentropy_bwd(cur, probs, targets, dlosses)
    v2.launch("k_crossentropy_bwd_v2", args_of(lambda: K.crossentropy_bwd(new, probs, targets, dlosses),
                                               "k_crossentropy_bwd")[0])
    rep.exact("crossentropy_bwd", label, [("dlogits", new.get(), cur.get())])


def check_embed(v2, rng, rep, B, T, C, V, T_max, offset=0) -> None:
    label = f"B={B} T={T} C={C} V={V}" + (f" off {offset}" if offset else "")
    idx = Dev(rng.integers(0, V, (B, T)).astype(np.int32))
    wte = Dev(rng.standard_normal((V, C)).astype(np.float32), offset)
    wpe = Dev(rng.standard_normal((T_max, C)).astype(np.float32))
    cur, new = nan((B, T, C)), nan((B, T, C), offset)
    K.embed_fwd(cur, idx, wte, wpe)
    v2.launch("k_embed_fwd_v2", args_of(lambda: K.embed_fwd(new, idx, wte, wpe), "k_embed_fwd")[0])
    rep.exact("embed_fwd", label, [("x", new.get(), cur.get())])


def check(v2, seed: int) -> bool:
    rng = np.random.default_rng(seed)
    rep = Report()
    B, T, C, NH, V = 8, PRESET.block_size, PRESET.d_model, PRESET.n_head, PRESET.vocab_size
    N = B * T
    print(f"checks (seed {seed}); the layernorms' errors: v2 / current")
    for shape, offsets in (((N, 4 * C), (0, 0, 0)), ((7, 80), (0, 0, 0)), ((7, 4120), (0, 0, 0)), ((707,), (0, 0, 0)),
                           ((7, 4120), (1, 1, 1)), ((707,), (0, 1, 0)), ((5, 3), (3, 2, 1))):
        check_gelu(v2, rng, rep, shape, offsets)
    for n_rows, cols, offset in ((N, C, 0), (7, 20, 0), (7, 1030, 0), (7, 1028, 0), (33, 1024, 0), (5, 3, 0),
                                 (3, 1, 0), (9, 1536, 0), (7, 20, 1), (7, C, 1), (3, 2052, 1)):
        check_layernorm(v2, rng, rep, n_rows, cols, offset)
    for b, t, nh, d_k, offset in ((B, T, NH, C // NH, 0), (2, 33, 3, 12, 0), (2, 33, 3, 12, 1), (1, 7, 3, 5, 0),
                                  (1, 5, 1, 1028, 0), (1, 5, 2, 1030, 0), (1, 1, 1, 1, 0)):
        check_heads(v2, rng, rep, b, t, nh, d_k, offset)
    for n_rows, vocab, offsets in ((N, V, (0, 0)), (7, 101, (0, 0)), (7, V, (0, 0)), (7, V, (1, 1)), (7, V, (1, 0)),
                                   (5, 3, (0, 0)), (5, 1, (2, 2))):
        check_crossentropy_bwd(v2, rng, rep, n_rows, vocab, offsets)
    for b, t, c, vocab, t_max, offset in ((B, T, C, V, T, 0), (2, 33, 20, 101, 40, 0), (1, 7, 1030, 101, 7, 0),
                                          (2, 33, 20, 101, 40, 1), (1, 3, 5, 2, 4, 0)):
        check_embed(v2, rng, rep, b, t, c, vocab, t_max, offset)
    print("checks: all passed" if rep.ok else "checks: FAILED")
    return rep.ok


# ---------------------------------------------------------------------------------------------- timing
def timing_cases(rng, sets: int):
    """(label, current kernel, bytes, [call per input set]) at andrea-120m's shapes: each call, a launcher
    (recorded, not run), launches the current kernel on that set of inputs."""
    B, T, C, NH, V = 8, PRESET.block_size, PRESET.d_model, PRESET.n_head, PRESET.vocab_size
    N = B * T

    def randn(*shape, scale=1.0):
        return Dev((rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32))

    def empty(*shape):
        return Dev(np.zeros(shape, np.float32))

    cases = []
    h, h_out = [randn(B, T, 4 * C) for _ in range(sets)], empty(B, T, 4 * C)
    cases.append(("gelu_fwd", "k_gelu_fwd", F * 8 * N * C, [lambda i=i: K.gelu_fwd(h_out, h[i]) for i in range(sets)]))
    cases.append(("gelu_bwd", "k_gelu_bwd", F * 12 * N * C,
                  [lambda i=i: K.gelu_bwd(h_out, h[(i + 1) % sets], h[i]) for i in range(sets)]))

    xs, w, b = [randn(B, T, C) for _ in range(sets)], randn(C), randn(C)
    out, mean, rstd, x_sum = empty(B, T, C), empty(B, T), empty(B, T), empty(B, T, C)
    douts = [randn(B, T, C) for _ in range(sets)]
    cases.append(("layernorm_fwd_fast", "k_layernorm_fwd_fast", F * (2 * N * C + 2 * C + 2 * N),
                  [lambda i=i: K.layernorm_fwd_fast(out, mean, rstd, xs[i], w, b) for i in range(sets)]))
    cases.append(("residual_layernorm_fwd_fast", "k_residual_layernorm_fwd_fast", F * (4 * N * C + 2 * C + 2 * N),
                  [lambda i=i: K.residual_layernorm_fwd_fast(x_sum, out, mean, rstd, xs[i], douts[i], w, b)
                   for i in range(sets)]))
    K.layernorm_fwd_fast(out, mean, rstd, xs[0], w, b)
    dx, dw, db = empty(B, T, C), empty(C), empty(C)
    for accumulate in (False, True):  # dx only: dout and x read, dx written (and read, accumulated), w, mean, rstd
        cases.append((f"layernorm_bwd_fast dx{' (acc)' if accumulate else ''}", "k_layernorm_bwd_fast",
                      F * ((4 if accumulate else 3) * N * C + C + 2 * N),
                      [lambda i=i, a=accumulate: K.layernorm_bwd_fast(dx, dw, db, douts[i], xs[0], w, mean, rstd,
                                                                      accumulate=a) for i in range(sets)]))

    qkvs = [randn(B, T, 3 * C) for _ in range(sets)]
    q, k, v = (empty(B, NH, T, C // NH) for _ in range(3))
    cases.append(("split_heads_fwd", "k_split_heads_fwd", F * 6 * N * C,
                  [lambda i=i: K.split_heads_fwd(q, k, v, qkvs[i], NH) for i in range(sets)]))
    dqkv = empty(B, T, 3 * C)
    dq = [[randn(B, NH, T, C // NH) for _ in range(3)] for _ in range(sets)]
    cases.append(("split_heads_bwd", "k_split_heads_bwd", F * 6 * N * C,
                  [lambda i=i: K.split_heads_bwd(dqkv, *dq[i]) for i in range(sets)]))
    heads = [randn(B, NH, T, C // NH) for _ in range(sets)]
    y, dheads = empty(B, T, C), empty(B, NH, T, C // NH)
    cases.append(("merge_heads_fwd", "k_merge_heads_fwd", F * 2 * N * C,
                  [lambda i=i: K.merge_heads_fwd(y, heads[i]) for i in range(sets)]))
    cases.append(("merge_heads_bwd", "k_merge_heads_bwd", F * 2 * N * C,
                  [lambda i=i: K.merge_heads_bwd(dheads, xs[i], NH) for i in range(sets)]))

    probs = [Dev(rng.random((B, T, V), dtype=np.float32)) for _ in range(sets)]
    targets = [Dev(rng.integers(0, V, (B, T)).astype(np.int32)) for _ in range(sets)]
    dlosses, dlogits = Dev(np.full((B, T), 1.0 / N, np.float32)), empty(B, T, V)
    cases.append(("crossentropy_bwd", "k_crossentropy_bwd", F * (2 * N * V + 2 * N),
                  [lambda i=i: K.crossentropy_bwd(dlogits, probs[i], targets[i], dlosses, check_token_ids=False)
                   for i in range(sets)]))

    wte, wpe, x = randn(V, C, scale=0.02), randn(T, C, scale=0.02), empty(B, T, C)
    cases.append(("embed_fwd", "k_embed_fwd", F * (N + 2 * N * C + T * C),
                  [lambda i=i: K.embed_fwd(x, targets[i], wte, wpe, check_token_ids=False) for i in range(sets)]))
    # the arrays stay alive as long as the calls that point at them
    return cases


def bench(v2, seed: int, iters: int, sets: int) -> None:
    rng = np.random.default_rng(seed)
    stream = v2.cuda.Stream()
    bw = copy_bandwidth(stream)
    print(f"\n{K.device_summary()}: andrea-120m B=8 T={PRESET.block_size}; copy {bw / 1e3:.2f} TB/s; "
          f"median of {iters}, {sets} input sets")
    hdr = f"{'kernel':<32}{'MB':>7}{'ms':>9}{'v2 ms':>8}{'GB/s':>7}{'v2 GB/s':>8}{'%copy':>7}{'v2 %':>6}{'x':>6}"
    print(hdr)
    print("-" * len(hdr))
    for label, kernel, nbytes, calls in timing_cases(rng, sets):
        entries = [[e for e in args_of(call, kernel)[1] if e[0] == kernel][0] for call in calls]
        new_name = f"{kernel}_v2"
        new_grids = [v2.grid(new_name, list(e[3])) for e in entries]
        state = {"i": 0}

        def current(s):
            _name, fn, grid, args, shared, block = entries[state["i"]]
            fn.prepared_async_call(grid, (block, 1, 1), s, *args, shared_size=shared)

        def new(s):
            v2.launch(new_name, entries[state["i"]][3], new_grids[state["i"]], s)

        def rotate():
            state["i"] = (state["i"] + 1) % len(entries)
        ms = [cuda_median_ms(fn, iters, 3, stream, rotate) for fn in (current, new)]
        gbs = [nbytes / t / 1e6 for t in ms]
        print(f"{label:<32}{nbytes / 1e6:>7.1f}{ms[0]:>9.4f}{ms[1]:>8.4f}{gbs[0]:>7.0f}{gbs[1]:>8.0f}"
              f"{100 * gbs[0] / bw:>7.1f}{100 * gbs[1] / bw:>6.1f}{ms[0] / ms[1]:>6.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="the checks only")
    ap.add_argument("--seed", type=int, default=None, help="the inputs' seed (default: a fresh one, printed)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sets", type=int, default=3, help="copies of the inputs to rotate among")
    args = ap.parse_args()
    gpu_or_exit("memory_bound")
    seed = np.random.SeedSequence().entropy % 2 ** 32 if args.seed is None else args.seed
    v2 = V2()
    ok = check(v2, seed)
    if not args.check:
        bench(v2, seed, args.iters, args.sets)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
