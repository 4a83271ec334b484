#!/usr/bin/env python3
"""The 3xTF32 tensor-core prototype (dev/cuda/gemm_3xtf32.cu) at the model's linear-layer shapes, in one run:
its worst relative error against float64 beside the SIMT fast SGEMM's and cuBLAS FP32's, and its time
against cuBLAS FP32 (TF32 off) and the SIMT SGEMM.

    python dev/gemm_3xtf32.py            # andrea-120m's linear layers forward at B*T = 8192, and odd shapes

C = A @ B^T (the linear layer's forward: inp (M x K) times W (N x K) transposed). Needs a GPU and PyTorch.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from pycuda.compiler import SourceModule

from microgpt import kernels as K

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from timing import cuda_median_ms, torch_median_ms  # noqa: E402

SHAPES = {  # name: (M, N, K)
    "qkv": (8192, 2304, 768), "attn.proj": (8192, 768, 768), "mlp.fc": (8192, 3072, 768),
    "mlp.proj": (8192, 768, 3072), "lm_head": (8192, 8449, 768),
    "odd": (1000, 333, 100), "tiny": (1, 1, 4), "tall": (4099, 130, 772),
}


def rel_err(x, ref):
    x = x.double()
    if not torch.isfinite(x).all():
        return math.inf
    return float((x - ref).norm() / ref.norm())


def main() -> int:
    e = K.engine()
    module = SourceModule((HERE / "cuda" / "gemm_3xtf32.cu").read_text(), options=["-lineinfo"], arch=e.arch,
                          no_extern_c=True)
    variants = {}
    for kernel in ("k_gemm_nt_3xtf32", "k_gemm_nt_3xtf32_regsum"):
        variants[kernel] = module.get_function(kernel)
        variants[kernel].prepare("PPPPiii")
    torch.backends.cuda.matmul.allow_tf32 = False
    stream = e.cuda.Stream()
    print(f"{K.device_summary()}, torch {torch.__version__}")
    print(f"{'shape':<11}{'kernel':<25}{'M x N x K':>18}{'err':>9}{'err simt':>10}{'err cublas':>11}"
          f"{'ms':>8}{'ms simt':>9}{'ms cublas':>11}{'TFLOP/s':>9}{'x cublas':>9}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, (M, N, Kd) in SHAPES.items():
        a = torch.randn(M, Kd, device="cuda", generator=gen)
        b = torch.randn(N, Kd, device="cuda", generator=gen)
        ref = a.double() @ b.double().T
        c = torch.full((M, N), float("nan"), device="cuda")
        grid = (math.ceil(N / 128), math.ceil(M / 128))

        simt = torch.full((M, N), float("nan"), device="cuda")
        K.sgemm(simt, a, b, trans_b=True)
        err_simt = rel_err(simt, ref)
        err_cublas = rel_err(a @ b.T, ref)
        iters = 20 if M * N * Kd > 1e9 else 5
        t_simt = cuda_median_ms(lambda s: K.sgemm(simt, a, b, trans_b=True, stream=s), iters, 3, stream)
        t_cublas = torch_median_ms(lambda: a @ b.T, iters, 3)
        for kernel, fn in variants.items():
            c.fill_(float("nan"))

            def ours(s, fn=fn):
                fn.prepared_async_call(grid, (256, 1, 1), s, c.data_ptr(), a.data_ptr(), b.data_ptr(), 0, M, N, Kd)
            ours(stream)
            stream.synchronize()
            err_ours = rel_err(c, ref)
            t_ours = cuda_median_ms(ours, iters, 3, stream)
            tflops = 2 * M * N * Kd / t_ours / 1e9
            print(f"{name:<11}{kernel[10:] or '-':<25}{f'{M}x{N}x{Kd}':>18}{err_ours:>9.1e}{err_simt:>10.1e}"
                  f"{err_cublas:>11.1e}{t_ours:>8.3f}{t_simt:>9.3f}{t_cublas:>11.3f}{tflops:>9.1f}"
                  f"{t_cublas / t_ours:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
