"""What the tools share: the one-line stop where there is no GPU, and median timings with CUDA events,
of our launches (PyCUDA events on a stream) and of PyTorch's (torch events)."""
from __future__ import annotations

import statistics
import sys

from microgpt import kernels


def gpu_or_exit(tool: str) -> str:
    """The device's summary; where PyCUDA or a GPU is missing, one line saying so and exit status 2."""
    try:
        return kernels.device_summary()
    except Exception as e:  # no pycuda, no driver, no device
        print(f"{tool}: no CUDA GPU here ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
        sys.exit(2)


def cuda_median_ms(launch, iters, warmup, stream, rotate=None):
    """Median milliseconds of launch(stream), each timed alone with CUDA events on `stream`; rotate()
    (if given) switches the inputs before each timed launch, so that the cache does not flatter."""
    cuda = kernels.engine().cuda
    for _ in range(warmup):
        launch(stream)
    start, end, times = cuda.Event(), cuda.Event(), []
    for _ in range(iters):
        if rotate:
            rotate()
        start.record(stream)
        launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(end.time_since(start))
    return statistics.median(times)


def torch_median_ms(fn, iters, warmup):
    """Median milliseconds of fn() on PyTorch's current stream, each timed alone with torch events."""
    import torch
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)
