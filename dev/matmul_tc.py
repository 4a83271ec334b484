#!/usr/bin/env python3
"""Tuning the tensor-core products (cuda/matmul_tc.cuh) in one run: the header built with several settings
(-D TC_BK, TC_STAGES, TC_MIN_BLOCKS, TC_SPLIT), each checked against float64 and timed at the model's
product shapes beside the SIMT SGEMM, cuBLAS FP32 and cuBLAS TF32; and the mma.sync TF32 ceiling.

    python dev/matmul_tc.py                    # every setting in SETTINGS
    python dev/matmul_tc.py BK32_S2 BK32_S2_ch2  # some of them
    ncu ... python dev/matmul_tc.py --once BK32_S2  # one launch each, at mlp.fc's forward
    python dev/matmul_tc.py --wgmma              # the engine's wgmma kernels against its mma.sync ones
    python dev/matmul_tc.py --wg [SETTING ...]   # the wgmma kernels built with each WG_SETTINGS entry
    python dev/matmul_tc.py --wg-short-k         # their error ratio to SIMT at short K (WG_MIN_K)

Needs a GPU and PyTorch. Prints one row per (setting, shape): error against float64 (||x - ref|| / ||ref||)
beside the SIMT kernel's and cuBLAS's, milliseconds, TFLOP/s, and the ratio to cuBLAS FP32.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import torch
from pycuda.compiler import SourceModule

from microgpt import kernels as K

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tools"))
from timing import cuda_median_ms, torch_median_ms  # noqa: E402

SETTINGS = {  # name: -D options (2026-11-30, first run: BK 16 or 32, 2-4 stages within 3%; one block per SM
    # 15% slower; the cvt.rna split 15% slower; summing 2 k8 steps in the tensor cores (TC_CHUNK 2) no faster)
    "BK32_S2": dict(TC_BK=32, TC_STAGES=2, TC_MIN_BLOCKS=2, TC_CHUNK=1),
    "BK32_S2_ch2": dict(TC_BK=32, TC_STAGES=2, TC_MIN_BLOCKS=2, TC_CHUNK=2),
    "BK16_S4": dict(TC_BK=16, TC_STAGES=4, TC_MIN_BLOCKS=2, TC_CHUNK=1),
}
WG_SETTINGS = {  # name: -D options of the wgmma kernels (2026-11-30: two fragments a consumer through setmaxnreg
    # were 10-15% slower: ptxas keeps the launch's 168 registers, spills, and serializes the wgmmas)
    "wg_raw3": dict(WG_RAW=3),
    "wg_raw2": dict(WG_RAW=2),
}
SMALL_K = (1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64, 128)  # the error ratio to SIMT where K is short
B, T, C, NH, V = 8, 1024, 768, 12, 8449
N_ROWS = B * T
SHAPES = {  # name: (M, N, K, trans_a, trans_b, batch)
    "qkv fwd": (N_ROWS, 3 * C, C, False, True, 1),
    "fc fwd": (N_ROWS, 4 * C, C, False, True, 1),
    "proj fwd": (N_ROWS, C, 4 * C, False, True, 1),
    "lm_head fwd": (N_ROWS, V, C, False, True, 1),
    "fc dX": (N_ROWS, C, 4 * C, False, False, 1),
    "lm_head dX": (N_ROWS, C, V, False, False, 1),
    "fc dW": (4 * C, C, N_ROWS, True, False, 1),
    "scores": (T, T, 64, False, True, B * NH),
    "values": (T, 64, T, False, False, B * NH),
    "odd nt": (1000, 333, 100, False, True, 1),
    "odd tt": (333, 1000, 101, True, True, 2),
}


def rel_err(x, ref):
    x = x.double()
    if not torch.isfinite(x).all():
        return math.inf
    return float((x - ref).norm() / ref.norm())


def kernels(prefix: str, defines: dict, smem: int) -> dict:
    """The header built with these -D settings: its four layouts' kernels <prefix>_<op(A)><op(B)>, prepared
    with the SGEMM's arguments and allowed `smem` bytes of dynamic shared memory."""
    e = K.engine()
    opts = ["-lineinfo"] + [f"-D{k}={v}" for k, v in defines.items()]
    mod = SourceModule('#include "matmul_tc.cuh"\n', options=opts, arch=e.arch, no_extern_c=True,
                       include_dirs=[str(ROOT / "cuda")])
    fns = {}
    for ops in ("nn", "nt", "tn", "tt"):
        fn = mod.get_function(f"{prefix}_{ops}")
        fn.prepare(K.kernel_signatures()[f"{prefix}_{ops}"])  # the format GEMM_KERNEL declares
        fn.set_attribute(e.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        fns[ops] = fn
    return fns


def build(defines: dict) -> tuple:
    smem = defines["TC_STAGES"] * 2 * 128 * (defines["TC_BK"] + 8) * 4
    return kernels("k_gemm_tc", defines, smem), smem


def build_wg(defines: dict):
    """The wgmma kernels built with these settings: one unsplit launch of a product (a kernels.Gemm)."""
    threads = K.int_constants()["TC_WG_THREADS"]
    bufs, raw = defines.get("WG_BUFS", 2), defines.get("WG_RAW", 3)
    smem = bufs * 4 * 128 * 32 * 4 + raw * 2 * 128 * 32 * 4 + 2 * bufs * 8
    fns = kernels("k_gemm_wg", defines, smem)

    def product(g, c, a, b, bias, stream):
        fn = fns[("t" if g.trans_a else "n") + ("t" if g.trans_b else "n")]
        fn.prepared_async_call(g.grid, (threads, 1, 1), stream, *g.args(c, a, b, bias),
                               shared_size=smem)
    return product


def wg_settings(names, stream) -> None:
    """The wgmma kernels built with each setting of WG_SETTINGS, at the model's 128-wide shapes."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    products = {n: build_wg(WG_SETTINGS[n]) for n in names}
    print(f"{'shape':<13}{'setting':<14}{'err':>9}{'ms':>8}{'fp32':>8}{'TFLOP/s':>9}{'x fp32':>8}")
    for shape, (M, N, Kd, ta, tb, batch) in SHAPES.items():
        if N < 128:
            continue
        a = torch.randn(batch, *((Kd, M) if ta else (M, Kd)), device="cuda", generator=gen)
        b = torch.randn(batch, *((N, Kd) if tb else (Kd, N)), device="cuda", generator=gen)
        opa, opb = (a.transpose(1, 2) if ta else a), (b.transpose(1, 2) if tb else b)
        ref = opa.double() @ opb.double()
        g = K.Gemm.dense(M, N, Kd, trans_a=ta, trans_b=tb, batch=batch)
        t_fp32 = torch_median_ms(lambda: opa @ opb, 20, 3)
        for name, product in products.items():
            c = torch.full((batch, M, N), float("nan"), device="cuda")

            def ours(s, c=c, product=product):
                product(g, c.data_ptr(), a.data_ptr(), b.data_ptr(), 0, s)  # one launch, unsplit
            ours(stream)
            stream.synchronize()
            err, t = rel_err(c, ref), cuda_median_ms(ours, 20, 3, stream)
            print(f"{shape:<13}{name:<14}{err:>9.1e}{t:>8.3f}{t_fp32:>8.3f}{2 * M * N * Kd * batch / t / 1e9:>9.1f}"
                  f"{t_fp32 / t:>8.2f}", flush=True)


def wg_short_k(trials: int = 40) -> None:
    """The wgmma and mma.sync kernels' error over the SIMT kernel's where K is short and the product small
    (5 x 3 and 64 x 130 outputs): the worst ratio over fresh inputs, which sets matmul_tc.WG_MIN_K."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    print("worst tc / SIMT error ratio over", trials, "trials, by K")
    for M, N in ((5, 3), (64, 130)):
        for Kd in (128, 192, 256, 384, 512):
            worst = {True: 0.0, False: 0.0}
            for _ in range(trials):
                a = torch.randn(M, Kd, device="cuda", generator=gen)
                b = torch.randn(Kd, N, device="cuda", generator=gen)
                ref = a.double() @ b.double()
                simt = torch.empty(M, N, device="cuda")
                K.sgemm(simt, a, b)
                for path in worst:
                    c = torch.full((M, N), float("nan"), device="cuda")
                    K.sgemm(c, a, b, units="tc", wgmma=path)
                    worst[path] = max(worst[path], rel_err(c, ref) / rel_err(simt, ref))
            print(f"  {M} x {N}, K = {Kd}: wgmma {worst[True]:.2f}, mma.sync {worst[False]:.2f}", flush=True)


def mma_peak(stream) -> float:
    e = K.engine()
    mod = SourceModule((HERE / "cuda" / "mma_peak.cu").read_text(), arch=e.arch, no_extern_c=True)
    fn = mod.get_function("k_mma_tf32_peak")
    fn.prepare("Pi")
    blocks, threads, iters = e.sm_count * 8, 256, 4096
    out = torch.empty(blocks * threads, device="cuda")
    ms = cuda_median_ms(lambda s: fn.prepared_async_call((blocks, 1), (threads, 1, 1), s, out.data_ptr(), iters),
                        5, 2, stream)
    flop = blocks * (threads // 32) * iters * 8 * 16 * 8 * 8 * 2
    return flop / ms / 1e9


def small_k(builds, gen) -> None:
    """Where K is short the split's own rounding, not the sum's, decides the error: tc / SIMT error ratio."""
    print("error / SIMT error at M = N = 512, by K: " + " ".join(f"{k:>6}" for k in SMALL_K))
    ratios = {name: [] for name in builds}
    for Kd in SMALL_K:
        a = torch.randn(1, 512, Kd, device="cuda", generator=gen)
        b = torch.randn(1, 512, Kd, device="cuda", generator=gen)
        ref = a[0].double() @ b[0].double().T
        simt = torch.empty(512, 512, device="cuda")
        K.sgemm(simt, a[0], b[0], trans_b=True)
        err_simt = rel_err(simt, ref)
        g = K.Gemm.dense(512, 512, Kd, trans_b=True)
        for name, (fns, smem) in builds.items():
            c = torch.full((512, 512), float("nan"), device="cuda")
            fns["nt"].prepared_call((4, 4, 1), (256, 1, 1), *g.args(c.data_ptr(), a.data_ptr(), b.data_ptr(), 0),
                                    shared_size=smem)
            ratios[name].append(rel_err(c, ref) / err_simt)
    for name, r in ratios.items():
        print(f"  {name:<37}" + " ".join(f"{x:>6.2f}" for x in r))


def once(builds) -> None:
    """One launch of each setting at mlp.fc's forward, for ncu."""
    a = torch.randn(8192, 768, device="cuda")
    b = torch.randn(3072, 768, device="cuda")
    c = torch.empty(8192, 3072, device="cuda")
    g = K.Gemm.dense(8192, 3072, 768, trans_b=True)
    for fns, smem in builds.values():
        fns["nt"].prepared_call(g.grid, (256, 1, 1), *g.args(c.data_ptr(), a.data_ptr(), b.data_ptr(), 0),
                                shared_size=smem)
    torch.cuda.synchronize()


def wgmma(stream) -> None:
    """The engine's two tensor-core kernels as the tc variant runs them (split-K included), wgmma (sm_90a)
    against mma.sync, at the model's shapes: error against float64 and time, beside cuBLAS FP32."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    print(f"{'shape':<13}{'err wg':>9}{'err tc':>9}{'ms wg':>8}{'ms tc':>8}{'fp32':>8}{'TFLOP/s':>9}{'x fp32':>8}")
    for shape, (M, N, Kd, ta, tb, batch) in SHAPES.items():
        a = torch.randn(batch, *((Kd, M) if ta else (M, Kd)), device="cuda", generator=gen)
        b = torch.randn(batch, *((N, Kd) if tb else (Kd, N)), device="cuda", generator=gen)
        opa, opb = (a.transpose(1, 2) if ta else a), (b.transpose(1, 2) if tb else b)
        ref = opa.double() @ opb.double()
        g = K.Gemm.dense(M, N, Kd, trans_a=ta, trans_b=tb, batch=batch, units="tc")
        res = {}
        for path in (True, False):
            c = torch.full((batch, M, N), float("nan"), device="cuda")

            def ours(s, c=c, path=path):
                K.gemm(dataclasses.replace(g, wgmma=path), c.data_ptr(), a.data_ptr(), b.data_ptr(), stream=s)
            ours(stream)
            stream.synchronize()
            res[path] = rel_err(c, ref), cuda_median_ms(ours, 20, 3, stream)
        t_fp32 = torch_median_ms(lambda: opa @ opb, 20, 3)
        (err, t), (err_tc, t_tc) = res[True], res[False]
        print(f"{shape:<13}{err:>9.1e}{err_tc:>9.1e}{t:>8.3f}{t_tc:>8.3f}{t_fp32:>8.3f}"
              f"{2 * M * N * Kd * batch / t / 1e9:>9.1f}{t_fp32 / t:>8.2f}", flush=True)


def main(names) -> int:
    e = K.engine()
    stream = e.cuda.Stream()
    if names == ["--wgmma"]:
        wgmma(stream)
        return 0
    if names == ["--wg-short-k"]:
        wg_short_k()
        return 0
    if names and names[0] == "--wg":
        wg_settings(names[1:] or list(WG_SETTINGS), stream)
        return 0
    if names and names[0] == "--once":
        once({n: build(SETTINGS[n]) for n in names[1:]})
        return 0
    print(f"{K.device_summary()}, torch {torch.__version__}")
    peak = mma_peak(stream)
    print(f"mma.sync m16n8k8 TF32 ceiling: {peak:.0f} TFLOP/s (so {peak / 3:.0f} for three products)")
    builds = {n: build(SETTINGS[n]) for n in names}
    gen = torch.Generator(device="cuda").manual_seed(0)
    small_k(builds, gen)
    print(f"{'shape':<13}{'setting':<14}{'err':>9}{'simt':>9}{'cublas':>9}{'ms':>8}{'simt':>8}{'fp32':>8}"
          f"{'tf32':>8}{'TFLOP/s':>9}{'x fp32':>8}")
    for shape, (M, N, Kd, ta, tb, batch) in SHAPES.items():
        a = torch.randn(batch, *((Kd, M) if ta else (M, Kd)), device="cuda", generator=gen)
        b = torch.randn(batch, *((N, Kd) if tb else (Kd, N)), device="cuda", generator=gen)
        opa = a.transpose(1, 2) if ta else a
        opb = b.transpose(1, 2) if tb else b
        ref = opa.double() @ opb.double()
        c = torch.full((batch, M, N), float("nan"), device="cuda")
        g = K.Gemm.dense(M, N, Kd, trans_a=ta, trans_b=tb, batch=batch)
        args = g.args(c.data_ptr(), a.data_ptr(), b.data_ptr(), 0)
        grid = (math.ceil(N / 128), math.ceil(M / 128), batch)
        iters = 20 if M * N * Kd * batch > 1e9 else 5
        simt = torch.full_like(c, float("nan"))
        K.sgemm(simt if batch > 1 else simt[0], a if batch > 1 else a[0], b if batch > 1 else b[0],
                trans_a=ta, trans_b=tb)
        err_simt = rel_err(simt, ref)
        t_simt = cuda_median_ms(lambda s: K.gemm(g, simt.data_ptr(), a.data_ptr(), b.data_ptr(), stream=s),
                                iters, 3, stream)
        torch.backends.cuda.matmul.allow_tf32 = False
        err_cublas = rel_err(opa @ opb, ref)
        t_fp32 = torch_median_ms(lambda: opa @ opb, iters, 3)
        torch.backends.cuda.matmul.allow_tf32 = True
        t_tf32 = torch_median_ms(lambda: opa @ opb, iters, 3)
        torch.backends.cuda.matmul.allow_tf32 = False
        flop = 2 * M * N * Kd * batch
        for name, (fns, smem) in builds.items():
            fn = fns[("t" if ta else "n") + ("t" if tb else "n")]
            c.fill_(float("nan"))

            def ours(s, fn=fn, smem=smem):
                fn.prepared_async_call(grid, (256, 1, 1), s, *args, shared_size=smem)
            ours(stream)
            stream.synchronize()
            err = rel_err(c, ref)
            t = cuda_median_ms(ours, iters, 3, stream)
            print(f"{shape:<13}{name:<14}{err:>9.1e}{err_simt:>9.1e}{err_cublas:>9.1e}{t:>8.3f}{t_simt:>8.3f}"
                  f"{t_fp32:>8.3f}{t_tf32:>8.3f}{flop / t / 1e9:>9.1f}{t_fp32 / t:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(SETTINGS)))
