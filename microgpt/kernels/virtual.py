"""A described GPU in place of a real one: the launch layer checks and records launches on it, and runs none.

    h200 = virtual.Engine(virtual.H200)                 # no GPU, no PyCUDA needed
    backend = CudaBackend(config, "tc", device=h200)    # allocations are addresses only
    backend.plan("forward", 8, 1024)                    # its plans are Plan(h200): recorded as they would be there

`microgpt info --explain` plans a step this way, and the tests check the launch layer and the model's plans on the
CPU. Arrays are shapes, dtypes and made-up addresses (with __cuda_array_interface__, so the checks take them);
reads of device memory return zeros. Which kernel a launcher picks depends on the description (architecture, SMs,
shared memory, registers a kernel takes), as on the device itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from . import runtime
from .source import kernel_signatures


@dataclass(frozen=True)
class Device:
    name: str
    arch: str           # what the engine builds for: sm_90a on compute capability 9.0
    sm_count: int
    max_shared: int     # dynamic shared memory a block may take, after the opt-in
    sm_threads: int = 2048
    sm_registers: int = 65536
    sm_shared: int = 233472
    regs: int = 64      # registers a thread, taken for every kernel (the layernorm backward's on sm_90a)
    # FLOP/s of products at FP32 accuracy on the tensor cores (3xTF32: a third of the dense TF32 rate), the
    # peak a training run's MFU is relative to (microgpt.runlog)
    peak_flops: float = 0.0


H200 = Device("NVIDIA H200 (described)", "sm_90a", 132, 227 * 1024, peak_flops=165e12)
A100 = Device("NVIDIA A100 (described)", "sm_80", 108, 163 * 1024, sm_shared=167936, peak_flops=52e12)
DEVICES = {"h200": H200, "a100": A100}


class VirtualArray:
    """A device array by its address, shape, dtype and strides (None: C order); slices along the first axis and
    reshapes of a C-contiguous one, and a[..., :n] (rows at a pitch: kernels.checks.rows_ptr), give views, as a
    GPUArray's do."""

    def __init__(self, shape, dtype, gpudata: int, strides=None):
        self.shape, self.dtype = tuple(int(n) for n in np.atleast_1d(shape)), np.dtype(dtype)
        self.gpudata, self.strides = int(gpudata), strides

    size = property(lambda self: math.prod(self.shape))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)
    ndim = property(lambda self: len(self.shape))

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": self.strides,
                "data": (self.gpudata, False), "version": 3}

    def _contiguous(self, what):
        if self.strides is not None:
            raise ValueError(f"a virtual array {what} only where it is C-contiguous")

    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == 2 and key[0] is Ellipsis:  # a[..., start:stop]
            self._contiguous("takes a[..., :n]")
            start, stop, step = key[1].indices(self.shape[-1])
            if step != 1:
                raise ValueError("a virtual array slices with step 1 only")
            strides = tuple(self.dtype.itemsize * math.prod(self.shape[i + 1:]) for i in range(self.ndim))  # C order
            return VirtualArray(self.shape[:-1] + (max(0, stop - start),), self.dtype,
                                self.gpudata + start * self.dtype.itemsize, strides)
        self._contiguous("slices")
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        if isinstance(key, (int, np.integer)):
            return VirtualArray(self.shape[1:] or (1,), self.dtype, self.gpudata + int(key) * row)
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise ValueError("a virtual array slices with step 1 only")
        return VirtualArray((max(0, stop - start),) + self.shape[1:], self.dtype, self.gpudata + start * row)

    def reshape(self, *shape):
        self._contiguous("reshapes")
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return VirtualArray(shape, self.dtype, self.gpudata)

    def __int__(self):
        return self.gpudata

    def get(self, *_, **__):
        return np.zeros(self.shape, self.dtype)

    def set(self, *_, **__):
        pass


class Engine:
    """runtime's engine on a described device: function() names a kernel of the translation unit (KeyError for
    one it lacks), allocations are VirtualArrays at addresses counted from the same start on every engine (so the
    plans of two engines given the same calls are equal), copies and memsets do nothing."""

    def __init__(self, device: Device, signatures=None):
        self.arch, self.sm_count = device.arch, device.sm_count
        self.max_shared, self.regs = device.max_shared, device.regs
        self.signatures = kernel_signatures() if signatures is None else signatures
        self.sm_limits = runtime.SmLimits(device.sm_threads, device.sm_registers, device.sm_shared)
        self.device = SimpleNamespace(name=lambda: device.name)
        self.next_address = 1 << 20
        self.tensor_maps = {}  # runtime.tensor_map's, allocated and never encoded
        self.ga = SimpleNamespace(empty=self._empty, zeros=self._empty, to_gpu=lambda a: self._empty(
            np.shape(a), np.asarray(a).dtype), zeros_like=lambda a: self._empty(a.shape, a.dtype))
        self.cuda = SimpleNamespace(
            mem_alloc=lambda n: self._empty((n,), np.uint8), Stream=lambda: SimpleNamespace(handle=0,
                                                                                             synchronize=_nothing),
            pagelocked_empty=lambda shape, dtype: np.zeros(shape, dtype), memset_d32=_nothing,
            memset_d32_async=_nothing, memcpy_htod=_nothing, memcpy_htod_async=_nothing, memcpy_dtoh_async=_nothing,
            memcpy_dtod_async=_nothing, memcpy_dtoh=lambda host, p: host.fill(0),
            Context=SimpleNamespace(synchronize=_nothing), Error=RuntimeError,
            Event=lambda: SimpleNamespace(record=_nothing, synchronize=_nothing))

    def _empty(self, shape, dtype=np.float32, allocator=None):
        at, nbytes = self.next_address, math.prod(np.atleast_1d(shape)) * np.dtype(dtype).itemsize
        self.next_address += 256 * (1 + nbytes // 256)
        return VirtualArray(shape, dtype, at)

    def mapped_empty(self, shape, dtype):
        return runtime.Mapped(np.zeros(shape, dtype), self._empty(shape, dtype).gpudata)

    def memory_pool(self):
        return SimpleNamespace(allocate=None, free_held=_nothing)

    @staticmethod
    def encode_tensor_map(*_):
        return bytes(128)

    def resident_blocks(self, name, threads, shared=0):
        return self.sm_limits.blocks(self.regs, threads, shared)

    def function(self, name, shared=0):
        if name not in self.signatures:
            raise KeyError(f"no kernel {name} in the translation unit")
        return Kernel(name)

    dependent_function = function  # the launch runtime.launch(..., dependent=True) records, as the real engine's


class Kernel(str):
    """A kernel by its name; launching it does nothing."""

    shared_size_bytes = 0  # its static shared memory: not known without the compiled kernel

    def prepared_async_call(self, *_, **__):
        pass


def _nothing(*_, **__):
    pass
