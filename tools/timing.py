"""What the tools share: the one-line stop where there is no GPU, median timings with CUDA events, of our
launches (PyCUDA events on a stream) and of PyTorch's (torch events), the copy bandwidth on the GPU and on
the CPU, and the bytes a decode step must read, the two that bound a decode step's time from below."""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from microgpt import kernels
from microgpt.config import GPTConfig
from microgpt.params import param_table


def gpu_or_exit(tool: str) -> str:
    """The device's summary; where PyCUDA or a GPU is missing, one line saying so and exit status 2."""
    try:
        return kernels.device_summary()
    except Exception as e:  # no pycuda, no driver, no device
        print(f"{tool}: no CUDA GPU here ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        sys.exit(2)


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
_spin = None


def spin(stream) -> None:
    """Queues SPIN_NS of a one-thread spin on `stream` (compiled once, beside the engine's module)."""
    global _spin
    if _spin is None:
        from pycuda.compiler import SourceModule
        _spin = SourceModule(_SPIN_SOURCE, no_extern_c=True, arch=kernels.engine().arch).get_function("k_timing_spin")
        _spin.prepare("q")
    _spin.prepared_async_call((1, 1, 1), (1, 1, 1), stream, SPIN_NS)


def cuda_median_ms(launch, iters, warmup, stream, rotate=None, batch=1):
    """Median milliseconds of launch(stream), timed with CUDA events on `stream`, the GPU kept busy (spin)
    while the host queues it; rotate() (if given) switches the inputs before each launch, so that the cache
    does not flatter. batch > 1: each timing spans `batch` launches queued back to back, as a step queues
    its kernels, and counts their mean: one launch alone also counts the GPU's own gap between the start
    event and the kernel, a large share of a kernel of a few microseconds."""
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
    return statistics.median(times)


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


def cuda_copy_gbs(stream, nbytes=2 << 30) -> float:
    """GB/s of a device-to-device copy of nbytes (the median of 10), counting bytes read and written."""
    cuda = kernels.engine().cuda
    src, dst = cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes)
    cuda.memset_d32(src, 0x3F800000, nbytes // 4)
    ms = cuda_median_ms(lambda s: cuda.memcpy_dtod_async(dst, src, nbytes, s), 10, 3, stream)
    return 2 * nbytes / ms / 1e6


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
    """Bytes (FP32) of weights and cache each op of a decode step at position pos reads, as model.forward calls
    them: matmul_fwd the linear weights and biases and all of wte (the tied lm_head); attention_decode each
    layer's keys and values 0..pos of B sequences; the layernorms their gains and biases; embed_decode wpe's row
    pos (its B rows of wte are the lm_head's, counted there). Activations (a few vectors a sequence) are not
    counted. Summed: what the step must read, every weight once, wpe one row, and the cache."""
    C, L, n = cfg.d_model, cfg.n_layer, {}
    for spec in param_table(cfg):
        op = ("matmul_fwd" if spec.name == "wte" or ".attn." in spec.name or ".mlp." in spec.name else
              "embed_decode" if spec.name == "wpe" else
              "layernorm_fwd" if spec.name.startswith("h.0.ln1.") else "residual_layernorm_fwd")
        n[op] = n.get(op, 0) + (C if spec.name == "wpe" else spec.size)
    n["attention_decode"] = 2 * L * B * (pos + 1) * C
    return {op: 4 * k for op, k in n.items()}
