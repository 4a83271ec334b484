"""What the tools share: the one-line stop where there is no GPU, median timings with CUDA events, of our
launches (PyCUDA events on a stream) and of PyTorch's (torch events), and the ceilings measured with them:
the copy bandwidth on the GPU and on the CPU, the 3xTF32 rate that MFU is relative to (product_ceiling),
and the bytes a decode step must read, which bound its time from below with the copy bandwidth."""
from __future__ import annotations

import functools
import statistics
import sys
import textwrap
import time

import numpy as np

from microgpt import kernels
from microgpt.config import GPTConfig
from microgpt.params import param_table
from microgpt.runlog import described_peak
from microgpt.usage import cuda_available


def gpu_or_none() -> tuple[str | None, str]:
    """(the device's summary, ""), or (None, why) where PyCUDA or a GPU is missing (usage.cuda_available)."""
    ok, what = cuda_available()
    return (what, "") if ok else (None, what)


def gpu_or_exit(tool: str) -> str:
    """The device's summary; where PyCUDA or a GPU is missing, one line saying so and exit status 2."""
    device, why = gpu_or_none()
    if device is None:
        print(f"{tool}: no CUDA GPU here ({why})")
        sys.exit(2)
    return device


# A kernel that keeps the GPU busy while the host queues the start event and the launches to time: without
# it a short kernel's time includes the host's (a checked launcher's Python), since the GPU records the start
# as soon as it reaches it and then waits for the launch. One thread, spinning on the global timer.
_SPIN_SOURCE = r"""
extern "C" __global__ void k_timing_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < (unsigned long long)ns);
}
"""
SPIN_NS = 2_000_000  # longer than queuing any launch sequence the tools time


@functools.cache
def _spin():
    """k_timing_spin, compiled once, beside the engine's module."""
    from pycuda.compiler import SourceModule
    fn = SourceModule(_SPIN_SOURCE, no_extern_c=True, arch=kernels.engine().arch).get_function("k_timing_spin")
    fn.prepare("q")
    return fn


def spin(stream) -> None:
    """Queues SPIN_NS of a one-thread spin on `stream`."""
    _spin().prepared_async_call((1, 1, 1), (1, 1, 1), stream, SPIN_NS)


def cuda_median_ms(launch, iters, warmup, stream, rotate=None, batch=1):
    """Median milliseconds of launch(stream), timed with CUDA events on `stream`, the GPU kept busy (spin)
    while the host queues it; rotate() (if given) switches the inputs before each launch, so that the cache
    does not flatter. batch > 1: each timing spans `batch` launches queued back to back, as a step queues
    its kernels, and counts their mean: one launch alone also counts the GPU's own gap between the start
    event and the kernel, a large share of a kernel of a few microseconds."""
    return statistics.median(cuda_times_ms(launch, iters, warmup, stream, rotate, batch))


def cuda_times_ms(launch, iters, warmup, stream, rotate=None, batch=1) -> list[float]:
    """The `iters` timings that cuda_median_ms takes the median of, in order."""
    cuda = kernels.engine().cuda
    for _ in range(warmup):
        launch(stream)
    start, end, times = cuda.Event(), cuda.Event(), []
    for _ in range(iters):
        spin(stream)
        start.record(stream)
        for _ in range(batch):
            if rotate:
                rotate()
            launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(end.time_since(start) / batch)
    return times


def torch_median_ms(fn, iters, warmup, batch=1):
    """Median milliseconds of fn() on PyTorch's current stream, timed with torch events, the GPU kept busy
    (torch.cuda._sleep) while the host queues it, as cuda_median_ms does ours (batch: the same)."""
    import torch
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(4_000_000)  # cycles: about 2 ms at the H200's clock
        s.record()
        for _ in range(batch):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / batch)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------- ceilings
def cuda_copy_gbs(stream, nbytes=2 << 30) -> float:
    """GB/s of a device-to-device copy of nbytes (the median of 10), counting bytes read and written."""
    cuda = kernels.engine().cuda
    src, dst = cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes)
    cuda.memset_d32(src, 0x3F800000, nbytes // 4)
    ms = cuda_median_ms(lambda s: cuda.memcpy_dtod_async(dst, src, nbytes, s), 10, 3, stream)
    return 2 * nbytes / ms / 1e6


SQUARE = 8192  # the square product of the ceiling: large enough to fill any GPU's tensor cores
CEILING_ITERS = 5
CEILING_HELP = textwrap.fill(  # the tools' --help epilog
    f"MFU is the model's FLOPs a second (microgpt.runlog.flops_per_token: nanoGPT's 6 a weight plus 12 * n_layer * "
    f"T * d_model a token, the count the training log's mfu uses) over the 3xTF32 ceiling measured in the same run "
    f"on this GPU: microgpt's own fastest FP32-accurate product, sgemm(units='tc') (3xTF32 on the tensor cores; the "
    f"SIMT SGEMM before sm_80), on random operands (split into TF32 hi and lo beforehand, untimed, where the kernel "
    f"reads them split, as the model's weights are), "
    f"at {SQUARE}^3 and at each model's largest products (the lm_head's forward, dX and dW and mlp.fc's forward, "
    f"B*T rows), each the best of {CEILING_ITERS} launches timed with CUDA events; the ceiling is the best rate of "
    f"these. Only where that measurement cannot run, the 3xTF32 peak microgpt.kernels.virtual describes for the "
    f"GPU, and the output says so.", 116)


def ceiling_shapes(models) -> list[tuple[str, int, int, int, bool, bool]]:
    """(label, M, N, K, trans_a, trans_b) of the products product_ceiling times: SQUARE^3 laid out as a linear layer's
    forward, and for each (config, B, T) of models its largest: the lm_head's forward, dX and dW, and mlp.fc's
    forward, at N = B*T rows (out = inp @ W^T, dinp = dout @ W, dW = dout^T @ inp)."""
    shapes = [(f"{SQUARE}^3", SQUARE, SQUARE, SQUARE, False, True)]
    for cfg, B, T in models:
        N, C, V = B * T, cfg.d_model, cfg.vocab_size
        shapes += [(f"lm_head fwd {N}x{V}x{C}", N, V, C, False, True),
                   (f"lm_head dX {N}x{C}x{V}", N, C, V, False, False),
                   (f"lm_head dW {V}x{C}x{N}", V, C, N, True, False),
                   (f"mlp.fc fwd {N}x{4 * C}x{C}", N, 4 * C, C, False, True)]
    return list(dict.fromkeys(shapes))


def random_array(shape, rng, block=1 << 24):
    """A float32 device array of shape: `block` standard normals drawn on the host, repeated to fill it (drawing
    every one would take seconds at the lm_head's sizes)."""
    e = kernels.engine()
    n, out = int(np.prod(shape)), e.ga.empty(shape, np.float32)
    src = e.ga.to_gpu(rng.standard_normal(min(n, block), dtype=np.float32))
    for start in range(0, n, block):
        e.cuda.memcpy_dtod(int(out.gpudata) + 4 * start, src.gpudata, 4 * min(block, n - start))
    return out


def product_tflops(M, N, K, trans_a, trans_b, stream, iters=CEILING_ITERS) -> tuple[float, list[str]]:
    """TFLOP/s of the tc variant's product c = op(a) @ op(b) at M x N x K (the best of `iters` launches) on random
    operands, the split of B into TF32 hi and lo (where the product reads one) done once beforehand and not timed, as
    the model's weights are split once a pass; and the kernels it ran."""
    rng = np.random.default_rng(0)
    a, b = random_array((K, M) if trans_a else (M, K), rng), random_array((N, K) if trans_b else (K, N), rng)
    c = kernels.engine().ga.empty((M, N), np.float32)
    plan = kernels.Plan()  # holds the split operands' workspace while its product launches replay
    kernels.sgemm(c, a, b, trans_a=trans_a, trans_b=trans_b, units="tc", stream=plan)
    kernels.replay(plan, stream, "ceiling")
    products = kernels.Plan()
    products.extend(launch for launch in plan if not launch[0].startswith("k_tf32_split"))
    times = cuda_times_ms(lambda s: kernels.replay(products, s, "ceiling"), iters, 2, stream)
    return 2 * M * N * K / min(times) / 1e9, sorted({launch[0] for launch in products})


def product_ceiling(models, stream, measure=product_tflops) -> dict:
    """The 3xTF32 ceiling as CEILING_HELP says: {"tflops", "source", "measured": True/False, "shapes": each
    shape's label and TFLOP/s}. Falls back to the described peak (None where there is none) only where the
    measurement raises."""
    rows = []
    try:
        for label, M, N, K, trans_a, trans_b in ceiling_shapes(models):
            tflops, ran = measure(M, N, K, trans_a, trans_b, stream)
            rows.append(dict(shape=label, tflops=tflops, kernels=ran))
    except Exception as e:  # out of memory, a kernel that fails: no measured ceiling
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        peak = described_peak(kernels.engine().arch)
        source = (f"described, not measured: the {peak / 1e12:.0f} TFLOP/s peak microgpt.kernels.virtual gives "
                  f"{kernels.engine().arch} (the measurement failed: {why})" if peak else
                  f"none: the measurement failed ({why}) and microgpt.kernels.virtual describes no peak for "
                  f"{kernels.engine().arch}")
        return dict(tflops=peak / 1e12 if peak else None, source=source, measured=False, shapes=rows)
    best = max(rows, key=lambda r: r["tflops"])
    source = (f"measured: microgpt's tc product, best at {best['shape']} ({', '.join(best['kernels'])}), "
              f"of {len(rows)} shapes")
    return dict(tflops=best["tflops"], source=source, measured=True, shapes=rows)


def host_copy_gbs(nbytes=256 << 20, repeats=5) -> float:
    """GB/s of np.copyto of nbytes in host memory (the best of `repeats`, the first touching the pages),
    counting bytes read and written, as cuda_copy_gbs does."""
    src, dst = np.ones(nbytes // 4, np.float32), np.zeros(nbytes // 4, np.float32)
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def decode_reads(cfg: GPTConfig, B: int, pos: int) -> dict[str, int]:
    """Bytes (FP32) of weights and cache each op of a decode step at position pos reads, as model.decode calls
    them: layernorm_matmul_fwd the layernorms' gains and biases and the products after them (qkv, fc, and all of
    wte: the tied lm_head); matmul_residual_fwd the two output projections; attention_decode each layer's keys
    and values 0..pos of B sequences; embed_decode wpe's row pos (its B rows of wte are the lm_head's, counted
    there). Activations (a few vectors a sequence) are not counted. Summed: what the step must read, every weight
    once, wpe one row, and the cache."""
    C, L, n = cfg.d_model, cfg.n_layer, {}
    for spec in param_table(cfg):
        op = ("embed_decode" if spec.name == "wpe" else
              "matmul_residual_fwd" if ".proj." in spec.name else "layernorm_matmul_fwd")
        n[op] = n.get(op, 0) + (C if spec.name == "wpe" else spec.size)
    n["attention_decode"] = 2 * L * B * (pos + 1) * C
    return {op: 4 * k for op, k in n.items()}
