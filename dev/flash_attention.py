#!/usr/bin/env python3
"""The flash-attention prototype (dev/cuda/flash_attention.cu, issue 12) in one run: each kernel checked
against float64 beside the fast variant's pipeline at the same inputs (NaN-poisoned outputs), then timed
against PyTorch's SDPA (FP32, TF32 off) and the tc variant's pipeline.

    python dev/flash_attention.py            # the checks, then the times at B=8, 12 heads, d_k=64
    python dev/flash_attention.py --check    # the checks only
    python dev/flash_attention.py --tc       # the kernels on the tensor cores (flash_attention_tc.cu, 3xTF32)
    python dev/flash_attention.py --tc2      # their second version (flash_attention_tc2.cu): 4 warps a block, and
                                             # 8 in the forward
    python dev/flash_attention.py --tc3      # the third (flash_attention_tc3.cu): tc2's forward, the backward in
                                             # one kernel (dQ added in a fixed order); also checks two runs give
                                             # the same bits

Needs a GPU and PyTorch. A check prints the worst relative error (||x - ref|| / ||ref||) of O, dQ, dK, dV
and the fast pipeline's; it fails (exit 1) where flash's passes 1.5x the fast one's.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from pycuda.compiler import SourceModule

from microgpt import kernels as K
from microgpt import ops as O

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tools"))
from timing import cuda_median_ms, torch_median_ms  # noqa: E402

TILE, THREADS, LD = 64, 256, 64 + 4
TC_THREADS = 128  # FT_THREADS of flash_attention_tc.cu: four warps of 16 query rows
CHECKS = [(2, 3, T, d_k) for T in (1, 7, 33, 1000, 1024, 2048) for d_k in (32, 64)] + \
         [(1, 2, 65, 48), (1, 2, 130, 100), (1, 1, 77, 5), (2, 2, 200, 128)]  # (B, NH, T, d_k)
BAR = 1.5


def padded(d_k: int) -> int:
    for D in (32, 64, 128):
        if d_k <= D:
            return D
    raise ValueError(f"d_k = {d_k}: at most 128")


def smem(kind: str, D: int) -> int:
    """Bytes of dynamic shared memory, as the kernels lay it out."""
    floats = {"fwd": 2 * D * LD + TILE * (D + 4) + TILE * LD,
              # FtLayout of flash_attention_tc.cu: FWD_FLOATS, BWD_FLOATS
              "tc_fwd": 5 * TILE * (D + 8),
              "tc_dq": 6 * TILE * (D + 8) + 2 * TILE, "tc_dkdv": 6 * TILE * (D + 8) + 2 * TILE,
              "dq": 4 * D * LD + TILE * (D + 4) + TILE * LD,
              "dkdv": 4 * D * LD + 2 * TILE * (D + 4) + TILE * LD + 2 * TILE}[kind]
    return 4 * floats


class Flash:
    def __init__(self, tc=False):
        e = K.engine()
        self.tc = tc
        self.cuda = e.cuda
        mod = SourceModule((HERE / "cuda" / "flash_attention.cu").read_text(), options=["-lineinfo"],
                           arch=e.arch, no_extern_c=True, include_dirs=[str(ROOT / "cuda")])
        self.fns = {}
        limit = e.device.get_attribute(e.cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        for D in (32, 64, 128):
            for kind, fmt in (("fwd", "PPPPPii"), ("dq", "PPPPPPPii"), ("dkdv", "PPPPPPPPii")):
                if smem(kind, D) > limit:
                    continue  # d_k up to D cannot run on this device (D = 128 before Hopper)
                name = {"fwd": "k_flash_fwd", "dq": "k_flash_bwd_dq", "dkdv": "k_flash_bwd_dkdv"}[kind]
                fn = mod.get_function(f"{name}_d{D}")
                fn.prepare(fmt)
                fn.set_attribute(e.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem(kind, D))
                self.fns[kind, D] = fn
        if tc:
            mod = SourceModule((HERE / "cuda" / "flash_attention_tc.cu").read_text(), options=["-lineinfo"],
                               arch=e.arch, no_extern_c=True, include_dirs=[str(ROOT / "cuda")])
            for D in (32, 64, 128):
                for kind, fmt in (("tc_fwd", "PPPPPii"), ("tc_dq", "PPPPPPPii"), ("tc_dkdv", "PPPPPPPPii")):
                    if smem(kind, D) > limit:
                        continue
                    fn = mod.get_function({"tc_fwd": "k_flash_tc_fwd", "tc_dq": "k_flash_tc_bwd_dq",
                                           "tc_dkdv": "k_flash_tc_bwd_dkdv"}[kind] + f"_d{D}")
                    fn.prepare(fmt)
                    fn.set_attribute(e.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem(kind, D))
                    self.fns[kind, D] = fn

    def _call(self, kind, D, grid, stream, *args):
        threads = TC_THREADS if kind.startswith("tc_") else THREADS
        self.fns[kind, D].prepared_async_call(grid, (threads, 1, 1), stream, *args, shared_size=smem(kind, D))

    def forward(self, o, lse, q, k, v, stream=None):
        B, NH, T, d_k = q.shape
        D, grid = padded(d_k), (math.ceil(T / TILE), B * NH)
        self._call("tc_fwd" if self.tc else "fwd", D, grid, stream, o.data_ptr(), lse.data_ptr(), q.data_ptr(),
                   k.data_ptr(), v.data_ptr(), T, d_k)

    def backward(self, dq, dk, dv, delta, d_o, lse, q, k, v, stream=None):
        """dq, dk, dv from the saved lse; delta (B, NH, T) is scratch, written by the dq kernel for the
        dk, dv one."""
        B, NH, T, d_k = q.shape
        D, grid = padded(d_k), (math.ceil(T / TILE), B * NH)
        qkv = [t.data_ptr() for t in (q, k, v, d_o)]
        tc = "tc_" if self.tc else ""
        self._call(tc + "dq", D, grid, stream, dq.data_ptr(), delta.data_ptr(), *qkv, lse.data_ptr(), T, d_k)
        self._call(tc + "dkdv", D, grid, stream, dk.data_ptr(), dv.data_ptr(), *qkv, lse.data_ptr(),
                   delta.data_ptr(), T, d_k)


class Flash2:
    """The kernels of flash_attention_tc2.cu: fwd_warps and bwd_warps warps a block (16 rows each)."""

    def __init__(self, fwd_warps=4, bwd_warps=4, defines=()):
        e = K.engine()
        self.warps = {"fwd": fwd_warps, "dq": bwd_warps, "dkdv": bwd_warps}
        mod = SourceModule((HERE / "cuda" / "flash_attention_tc2.cu").read_text(),
                           options=["-lineinfo"] + [f"-D{d}" for d in defines],
                           arch=e.arch, no_extern_c=True, include_dirs=[str(ROOT / "cuda")])
        limit = e.device.get_attribute(e.cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.fns = {}
        for D in (32, 64, 128):
            for kind, fmt in (("fwd", "PPPPPii"), ("dq", "PPPPPPPPii"), ("dkdv", "PPPPPPPPii")):
                name = f"k_flash2_{'bwd_' if kind != 'fwd' else ''}{kind}_d{D}_w{self.warps[kind]}"
                try:
                    fn = mod.get_function(name)
                except Exception:  # not instantiated for this width
                    continue
                if self.smem(kind, D) > limit:
                    continue
                fn.prepare(fmt)
                fn.set_attribute(e.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem(kind, D))
                self.fns[kind, D] = fn

    def smem(self, kind, D):
        """F2Smem of flash_attention_tc2.cu, in bytes."""
        ld, rows, tile = D + 8, 16 * self.warps[kind], TILE * (D + 8)
        return 4 * {"fwd": rows * ld + 4 * tile, "dq": 2 * rows * ld + 4 * tile,
                    "dkdv": 2 * rows * ld + 4 * tile + 4 * TILE}[kind]

    def supports(self, d_k):
        return all((kind, padded(d_k)) in self.fns for kind in ("fwd", "dq", "dkdv"))

    def _call(self, kind, T, d_k, B_NH, stream, *args):
        D, rows = padded(d_k), 16 * self.warps[kind]
        self.fns[kind, D].prepared_async_call((math.ceil(T / rows), B_NH), (32 * self.warps[kind], 1, 1), stream,
                                              *args, T, d_k, shared_size=self.smem(kind, D))

    def forward(self, o, lse, q, k, v, stream=None):
        B, NH, T, d_k = q.shape
        self._call("fwd", T, d_k, B * NH, stream, o.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(),
                   v.data_ptr())

    def backward(self, dq, dk, dv, delta, d_o, lse, q, k, v, o, stream=None):
        B, NH, T, d_k = q.shape
        q, k, v, o, d_o, lse = (t.data_ptr() for t in (q, k, v, o, d_o, lse))
        self._call("dq", T, d_k, B * NH, stream, dq.data_ptr(), delta.data_ptr(), q, k, v, o, d_o, lse)
        self._call("dkdv", T, d_k, B * NH, stream, dk.data_ptr(), dv.data_ptr(), q, k, v, d_o, lse,
                   delta.data_ptr())


class Flash3:
    """The kernels of flash_attention_tc3.cu: tc2's forward (8 warps a block at d_k 64, 4 at 32 and 128), and the
    backward as a delta kernel and one kernel for dQ, dK and dV (4 warps of 16 keys a block), which adds dQ's
    parts in a fixed order through per-(head, query tile) counters and a ticket in an int scratch (the delta
    kernel zeroes it before each backward and the backward kernel leaves it at 0: allocated once, never
    cleared)."""

    FWD_WARPS = {32: 4, 64: 8, 128: 4}
    BWD_WARPS = 4

    def __init__(self, defines=()):
        e = K.engine()
        mod = SourceModule((HERE / "cuda" / "flash_attention_tc3.cu").read_text(),
                           options=["-lineinfo"] + [f"-D{d}" for d in defines],
                           arch=e.arch, no_extern_c=True, include_dirs=[str(ROOT / "cuda")])
        limit = e.device.get_attribute(e.cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.fns = {}
        for D in (32, 64, 128):
            for kind, name, fmt in (("fwd", f"k_flash3_fwd_d{D}_w{self.FWD_WARPS[D]}", "PPPPPii"),
                                    ("delta", f"k_flash3_bwd_delta_d{D}", "PPPPPPPPii"),
                                    ("bwd", f"k_flash3_bwd_d{D}", "PPPPPPPPPPii")):
                if self.smem(kind, D) > limit:
                    continue  # d_k up to D cannot run on this device
                fn = mod.get_function(name)
                fn.prepare(fmt)
                fn.set_attribute(e.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem(kind, D))
                self.fns[kind, D] = fn
        self.sync = None  # int32: B * NH * ceil(T / 64) counters, then the ticket

    def smem(self, kind, D):
        """F3Smem of flash_attention_tc3.cu, in bytes (the backward's last 4 floats: the block's ticket)."""
        ld, tile = D + 8, TILE * (D + 8)
        rows = 16 * (self.FWD_WARPS[D] if kind == "fwd" else self.BWD_WARPS)
        return 4 * {"fwd": rows * ld + 4 * tile, "delta": 2 * rows * ld + 4 * tile,
                    "bwd": 2 * rows * ld + 4 * tile + 4 * TILE + 4}[kind]

    def supports(self, d_k):
        return all((kind, padded(d_k)) in self.fns for kind in ("fwd", "delta", "bwd"))

    def forward(self, o, lse, q, k, v, stream=None):
        B, NH, T, d_k = q.shape
        D, warps = padded(d_k), self.FWD_WARPS[padded(d_k)]
        self.fns["fwd", D].prepared_async_call((math.ceil(T / (16 * warps)), B * NH), (32 * warps, 1, 1), stream,
                                               o.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(),
                                               v.data_ptr(), T, d_k, shared_size=self.smem("fwd", D))

    def backward(self, dq, dk, dv, delta, d_o, lse, q, k, v, o, stream=None, kernels=("delta", "bwd")):
        """kernels: the launches to queue (the delta kernel alone, for its time; the backward kernel alone only
        after a complete backward, which leaves the counters at 0)."""
        B, NH, T, d_k = q.shape
        D, n, heads = padded(d_k), math.ceil(T / TILE), B * NH
        if self.sync is None or self.sync.numel() < heads * n + 1:
            torch.cuda.synchronize()  # a launch in flight on another stream may still hold the old one
            self.sync = torch.zeros(heads * n + 1, dtype=torch.int32, device="cuda")
        q, k, v, o, d_o, lse = (t.data_ptr() for t in (q, k, v, o, d_o, lse))
        threads = (32 * self.BWD_WARPS, 1, 1)
        if "delta" in kernels:
            self.fns["delta", D].prepared_async_call((n, heads), threads, stream, delta.data_ptr(),
                                                     self.sync.data_ptr(), q, k, v, o, d_o, lse, T, d_k,
                                                     shared_size=self.smem("delta", D))
        if "bwd" in kernels:
            self.fns["bwd", D].prepared_async_call((n * heads, 1), threads, stream, dq.data_ptr(), dk.data_ptr(),
                                                   dv.data_ptr(), self.sync.data_ptr(), q, k, v, d_o, lse,
                                                   delta.data_ptr(), T, d_k, shared_size=self.smem("bwd", D))


def reference(q, k, v, d_o):
    """O, dQ, dK, dV in float64 with autograd, the scale rounded to float32 as the kernels take it."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    scale = float(torch.tensor(1.0, dtype=torch.float32) / torch.sqrt(torch.tensor(float(q.shape[-1]))))
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ v
    o.backward(d_o.double())
    return o.detach(), q.grad, k.grad, v.grad


def pipeline(ops, q, k, v, d_o):
    """The variant's attention stages on the same inputs: O, dQ, dK, dV."""
    B, NH, T, d_k = q.shape
    nan = lambda *s: torch.full(s, float("nan"), device="cuda")  # noqa: E731
    masked, probs, o = nan(B, NH, T, T), nan(B, NH, T, T), nan(B, NH, T, d_k)
    ops.causal_scores_fwd(masked, q, k)
    ops.softmax_fwd(probs, masked)
    ops.attn_values_fwd(o, probs, v)
    dprobs, dv, dscores, dq, dk = nan(B, NH, T, T), nan(B, NH, T, d_k), nan(B, NH, T, T), nan(B, NH, T, d_k), \
        nan(B, NH, T, d_k)
    ops.attn_values_bwd(dprobs, dv, d_o, probs, v)
    ops.softmax_bwd(dscores, dprobs, probs)
    ops.causal_scores_bwd(dq, dk, dscores, q, k)
    return o, dq, dk, dv


def rel_err(x, ref):
    """||x - ref|| / ||ref||; where ref is exactly zero (dQ and dK at T = 1), ||x|| itself."""
    if not torch.isfinite(x).all():
        return math.inf
    norm = float(ref.norm())
    return float((x.double() - ref).norm()) / (norm if norm > 0 else 1.0)


def attend(flash, q, k, v, d_o):
    """O, lse, dQ, dK, dV and delta from flash's kernels into NaN-poisoned buffers."""
    B, NH, T, d_k = q.shape
    nan = lambda *s: torch.full(s, float("nan"), device="cuda")  # noqa: E731
    o, lse = nan(B, NH, T, d_k), nan(B, NH, T)
    dq, dk, dv, delta = nan(B, NH, T, d_k), nan(B, NH, T, d_k), nan(B, NH, T, d_k), nan(B, NH, T)
    flash.forward(o, lse, q, k, v)
    if isinstance(flash, (Flash2, Flash3)):
        flash.backward(dq, dk, dv, delta, d_o, lse, q, k, v, o)
    else:
        flash.backward(dq, dk, dv, delta, d_o, lse, q, k, v)
    torch.cuda.synchronize()
    return o, lse, dq, dk, dv, delta


def check(flash) -> bool:
    gen = torch.Generator(device="cuda").manual_seed(0)
    fast = O.select("fast")
    ok = True
    print(f"{'B NH T d_k':<18}" + "".join(f"{n:>20}" for n in ("O", "dQ", "dK", "dV")) + "   (flash / fast)")
    for B, NH, T, d_k in CHECKS:
        q, k, v, d_o = (torch.randn(B, NH, T, d_k, device="cuda", generator=gen) for _ in range(4))
        ref = reference(q, k, v, d_o)
        if isinstance(flash, (Flash2, Flash3)) and not flash.supports(d_k):
            continue
        out = attend(flash, q, k, v, d_o)
        o, lse, dq, dk, dv, delta = out
        ours = [rel_err(x, r) for x, r in zip((o, dq, dk, dv), ref)]
        theirs = [rel_err(x, r) for x, r in zip(pipeline(fast, q, k, v, d_o), ref)]
        zero = [float(r.norm()) == 0 for r in ref]  # there both are rounding residue: an absolute floor
        # a floor at FP32's resolution: at T = 1 the pipeline's O is V itself (error 0), the tensor cores' the
        # high part plus the rest, 3e-8 off
        row_ok = all(a <= BAR * max(b, 2 ** -23) or (z and a < 1e-6) for a, b, z in zip(ours, theirs, zero))
        note = ""
        if isinstance(flash, Flash3):
            # deterministic: a second run gives the same bits (dQ's parts are added in a fixed order)
            same = all(torch.equal(a, b) for a, b in zip(out, attend(flash, q, k, v, d_o)))
            row_ok &= same
            note += "" if same else "   two runs differ"
            if T == 1:  # the backward recomputes the forward's S bit for bit: p = 1, ds = 0 exactly
                note += "   (dQ, dK exactly 0)" if not (dq.any() or dk.any()) else \
                    f"   (dQ, dK not exactly 0: {float(dq.abs().max()):.1e}, {float(dk.abs().max()):.1e})"
        ok &= row_ok
        print(f"{f'{B} {NH} {T} {d_k}':<18}" + "".join(f"{a:>10.1e} /{b:>8.1e}" for a, b in zip(ours, theirs)) +
              ("" if row_ok else "   FAIL") + note, flush=True)
    return ok


def bench(flash) -> bool:
    """The times at B=8, 12 heads, d_k=64; for Flash3 also the backward's launches (the delta kernel alone, and
    both), and whether two runs at the shape give the same bits (False where they do not)."""
    stream = K.engine().cuda.Stream()
    torch.backends.cuda.matmul.allow_tf32 = False
    tc = O.select("tc")
    three, ok = isinstance(flash, Flash3), True
    print(f"{'T':>6}{'flash fwd':>11}{'fwd+bwd':>9}{'SDPA fwd':>10}{'fwd+bwd':>9}{'tc fwd+bwd':>12}" +
          (f"{'delta':>8}{'bwd':>8}{'bits':>6}" if three else "") + "   (ms)")
    for T in (1024, 2048, 4096):
        B, NH, d_k = 8, 12, 64
        q, k, v, d_o = (torch.randn(B, NH, T, d_k, device="cuda") for _ in range(4))
        o, lse = torch.empty_like(q), torch.empty(B, NH, T, device="cuda")
        dq, dk, dv, delta = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q), torch.empty_like(lse)
        args = (dq, dk, dv, delta, d_o, lse, q, k, v) + ((o,) if isinstance(flash, (Flash2, Flash3)) else ())
        t_f = cuda_median_ms(lambda s: flash.forward(o, lse, q, k, v, s), 20, 3, stream)
        t_fb = cuda_median_ms(lambda s: (flash.forward(o, lse, q, k, v, s), flash.backward(*args, s)), 20, 3, stream)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        t_sf = torch_median_ms(lambda: sdpa(qg, kg, vg, is_causal=True), 20, 3)
        t_sfb = torch_median_ms(lambda: torch.autograd.grad(sdpa(qg, kg, vg, is_causal=True), (qg, kg, vg), d_o),
                                20, 3)  # grad, not backward: no accumulation into .grad
        t_tc = float("nan")
        # the pipeline's T x T buffers (allocated inside: an upper bound on its time)
        if T <= 2048 and not isinstance(flash, (Flash2, Flash3)):
            t_tc = torch_median_ms(lambda: pipeline(tc, q, k, v, d_o), 5, 1)
        extra = ""
        if three:
            t_d = cuda_median_ms(lambda s: flash.backward(*args, s, kernels=("delta",)), 20, 3, stream)
            t_b = cuda_median_ms(lambda s: flash.backward(*args, s), 20, 3, stream)
            same = all(torch.equal(x, y) for x, y in zip(attend(flash, q, k, v, d_o), attend(flash, q, k, v, d_o)))
            ok &= same
            extra = f"{t_d:>8.3f}{t_b:>8.3f}{'same' if same else 'DIFF':>6}"
        print(f"{T:>6}{t_f:>11.3f}{t_fb:>9.3f}{t_sf:>10.3f}{t_sfb:>9.3f}{t_tc:>12.3f}{extra}", flush=True)
    return ok


def main(argv) -> int:
    if "--tc2" in argv:
        ok = True
        for fw, bw, defines in ((4, 4, ()), (8, 4, ())):
            print(f"flash_attention_tc2.cu, {fw} warps a block forward, {bw} backward {' '.join(defines)}")
            flash = Flash2(fw, bw, defines)
            ok &= check(flash)
            if "--check" not in argv:
                bench(flash)
        return 0 if ok else 1
    if "--tc3" in argv:
        print("flash_attention_tc3.cu: tc2's forward (8 warps a block at d_k 64), the backward in one kernel")
        flash = Flash3()
        ok = check(flash)
        if "--check" not in argv:
            ok &= bench(flash)
        return 0 if ok else 1
    flash = Flash(tc="--tc" in argv)
    ok = check(flash)
    if "--check" not in argv:
        bench(flash)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
