"""The runtime: cuda/microgpt_cuda.cu compiled once through PyCUDA (the engine), and the one way a kernel is
launched.

The module is compiled once per (source, options, device architecture): PyCUDA's compiler cache keys on
the preprocessed source, so an edit to any header recompiles. Everything runs in the device's primary
context, the one PyTorch and CuPy use, so their arrays can be passed straight in.

A launch is synchronous without a stream, queued on the stream with one, and recorded where its `stream` is a
Plan, which replay(plan, stream) runs later without checking anything again; a CUDA error becomes a KernelError
naming the kernel (set MICROGPT_SYNC=1 to synchronise after every queued launch, so that an asynchronous error
names its kernel too).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import math
import os
import re
import weakref

import numpy as np

from .driver import DependentKernel, KernelError, encode_tensor_map, load_module, shared_without_opt_in
from .source import NVCC_OPTIONS, TRANSLATION_UNIT, cuda_source_dir, kernel_signatures

BLOCK = 256  # threads per block of every launch; the fast kernels are written for it
SYNC_EVERY_LAUNCH = os.environ.get("MICROGPT_SYNC", "0") not in ("", "0")


class _Engine:
    """The compiled module in the primary context, with each kernel prepared once."""

    def __init__(self):
        # PyCUDA is an optional dependency (the numpy backend needs none of it): imported here, when the
        # GPU is first asked for. autoprimaryctx retains and pushes the device's primary context, and pops it
        # at exit; release_at_exit, registered after it, runs before it (atexit runs last in, first out).
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver as cuda
        import pycuda.gpuarray as ga
        from pycuda.compiler import compile as nvcc_compile
        from pycuda.tools import DeviceMemoryPool

        atexit.register(_release_at_exit)
        self.cuda, self.ga = cuda, ga
        self._new_pool = DeviceMemoryPool
        self.device = cuda.Context.get_device()
        # sm_90a: Hopper's own instructions (wgmma) are built only for the architecture-specific target
        cc = self.device.compute_capability()
        self.arch = "sm_%d%d" % cc + ("a" if cc == (9, 0) else "")
        self.sm_count = self.device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
        # the most dynamic shared memory a block may be given (after the opt-in past 48 KB)
        self.max_shared = self.device.get_attribute(cuda.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        attr = cuda.device_attribute
        self.sm_limits = SmLimits(self.device.get_attribute(attr.MAX_THREADS_PER_MULTIPROCESSOR),
                                  self.device.get_attribute(attr.MAX_REGISTERS_PER_MULTIPROCESSOR),
                                  self.device.get_attribute(attr.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR))
        src_dir = cuda_source_dir()
        self.cubin = nvcc_compile((src_dir / TRANSLATION_UNIT).read_text(), options=list(NVCC_OPTIONS), arch=self.arch,
                             no_extern_c=True, include_dirs=[str(src_dir)])
        self.module = cuda.module_from_buffer(self.cubin)
        self.signatures = kernel_signatures()
        self.functions, self.dependents, self.dependent_module = {}, {}, None
        self._shared_limit = {}  # name -> the dynamic shared memory the kernel may take now
        self._resident = {}  # (name, threads, shared) -> resident_blocks
        self.tensor_maps = {}  # tensor_map's arguments -> the map in device memory

    encode_tensor_map = staticmethod(encode_tensor_map)

    def resident_blocks(self, name: str, threads: int, shared: int = 0) -> int:
        """Blocks of kernel `name` (threads a block, `shared` dynamic bytes) that fit on one SM at once; asked of
        the driver once per launch shape, not at every launch."""
        key = (name, threads, shared)
        if key not in self._resident:
            fn = self.function(name, shared)
            self._resident[key] = self.sm_limits.blocks(fn.num_regs, threads, fn.shared_size_bytes + shared)
        return self._resident[key]

    def memory_pool(self):
        """A pool whose blocks are reused rather than freed; it gives its memory back at exit, while the
        context is still there to give it back to."""
        pool = self._new_pool()
        _pools.add(pool)
        return pool

    def mapped_empty(self, shape, dtype) -> "Mapped":
        """Page-locked host memory mapped into the device (Mapped): what a kernel writes there, the host reads."""
        host = self.cuda.pagelocked_empty(shape, dtype, mem_flags=self.cuda.host_alloc_flags.DEVICEMAP)
        return Mapped(host, host.base.get_device_pointer())

    def dependent_function(self, name, shared: int = 0):
        """Kernel `name` launched as a programmatic dependent launch (launch(..., dependent=True)), its dynamic
        shared memory allowed as function() allows it."""
        fn = self.dependents.get(name)
        if fn is None:
            if self.dependent_module is None:  # the cubin loaded once more, at the first dependent launch
                self.dependent_module = load_module(self.cubin)
            fn = self.dependents[name] = DependentKernel(self.dependent_module, name, self.signatures[name],
                                                         self.function(name).shared_size_bytes)
        fn.allow_shared(shared)
        return fn

    def function(self, name, shared: int = 0):
        """The prepared kernel; allowed `shared` bytes of dynamic shared memory (past what a block may take
        without the opt-in, the limit is raised once, here)."""
        fn = self.functions.get(name)
        if fn is None:
            fn = self.module.get_function(name)
            fn.prepare(self.signatures[name])
            self.functions[name] = fn
            self._shared_limit[name] = shared_without_opt_in(fn.shared_size_bytes)
        if shared > self._shared_limit[name]:
            fn.set_attribute(self.cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
            self._shared_limit[name] = shared
        return fn


class Mapped:
    """An array in page-locked host memory that kernels reach too: `host` is its NumPy view, and the object passes
    as a device array (__cuda_array_interface__) to any launcher. A kernel's writes are in `host` once the launch
    is waited for (an event or the stream synchronized), with no copy queued after it."""

    def __init__(self, host: np.ndarray, pointer: int):
        self.host = host
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "data": (int(pointer), False),
                                         "strides": None, "version": 3}


class SmLimits:
    """What one SM holds (threads, registers, shared memory), for how many blocks of a kernel fit on it at once:
    a kernel whose blocks wait for the launch's other blocks must leave room for them to run."""

    def __init__(self, threads: int, registers: int, shared: int):
        self.threads, self.registers, self.shared = threads, registers, shared

    def blocks(self, regs: int, threads: int, shared: int) -> int:
        warps = math.ceil(threads / 32)
        per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256  # registers are given a warp 256 at a time
        fit = min(self.threads // (32 * warps), self.registers // (per_warp * warps),
                  self.shared // (shared + 1024))  # the 1 KB a block's shared memory costs the SM besides
        return max(1, min(fit, 32))


_pools = weakref.WeakSet()       # memory pools, emptied at exit
_holders = weakref.WeakSet()     # objects holding device memory, asked to release() it at exit
_persistent = []                 # allocations that live as long as the process, freed at exit


def release_at_exit(holder) -> None:
    """holder.release() will drop its device memory at exit, before the context goes."""
    _holders.add(holder)


def persistent_alloc(key: str, nbytes: int, stream=None):
    """The device memory named `key` of the engine `stream` launches on (device_of), made at the first call: a kernel's
    scratch that lives as long as that engine (freed at exit)."""
    e = device_of(stream)
    held = e.__dict__.setdefault("persistent", {})
    if key not in held:
        held[key] = e.cuda.mem_alloc(nbytes)
        if isinstance(e, _Engine):
            _persistent.append(held[key])
    return held[key]


def _release_at_exit() -> None:
    """Frees what microgpt holds on the device while the primary context is alive: after PyCUDA has popped
    it, a pool's destructor (and some frees) fail and abort the process (terminate ... pycuda::error,
    exit status 134) after the program's output is done."""
    for holder in list(_holders):
        holder.release()
    for block in _persistent:
        block.free()
    _persistent.clear()
    gc.collect()  # what only a reference cycle kept
    for pool in list(_pools):
        pool.free_held()
        pool.stop_holding()


class NoDevice(RuntimeError):
    """The cuda backend cannot start here. `reason` says what is missing (PyCUDA, a CUDA device, nvcc); the
    message says that and how to get it."""

    def __init__(self, reason: str, how: str):
        super().__init__(f"the cuda backend cannot start: {reason}; {how}")
        self.reason = reason


@functools.cache
def engine() -> _Engine:
    """The compiled module on this process's GPU, made at the first call and kept (NoDevice where it cannot be, asked
    again at the next call). Kernels are chosen for device_of(stream): this one, unless a Plan is for another."""
    try:
        return _Engine()
    except ImportError as e:
        raise NoDevice(f"PyCUDA is not installed ({e})", "install it with pip install 'microgpt[cuda]' on a machine "
                       "with an NVIDIA GPU and the CUDA toolkit (nvcc), or use the numpy backend (the CPU)") from e
    except Exception as e:  # the driver's errors (no device, no driver) and nvcc's
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if type(e).__name__ == "CompileError" or isinstance(e, OSError):
            raise NoDevice(f"the kernels did not compile ({first})", "the CUDA toolkit's nvcc must be on PATH") from e
        raise NoDevice(f"no usable CUDA GPU ({first})", "check the GPU with nvidia-smi, or use the numpy backend (the "
                       "CPU)") from e


def device_of(stream=None):
    """The engine a launch on `stream` is for: a Plan's own device (the process's engine or a described one,
    microgpt.kernels.virtual), else the process's engine (a real stream, or None: now). A launcher takes the
    device it chooses its kernel for from here, never from the side."""
    return stream.device if isinstance(stream, Plan) and stream.device is not None else engine()


def shared_limit(name: str, stream=None) -> int:
    """The most dynamic shared memory a block of kernel `name` may take on the device of `stream`: the device's
    most after the opt-in, less the kernel's static shared memory (none on a described device)."""
    e = device_of(stream)
    return e.max_shared - getattr(e.function(name), "shared_size_bytes", 0)


def sm_version(device) -> int:
    """The compute capability `device` (an engine) is built for as one number: 80 for sm_80, 90 for sm_90a."""
    return int(re.match(r"sm_(\d+)", device.arch).group(1))


def device_summary() -> str:
    """'NVIDIA H200 (sm_90, 132 SMs)'; raises where PyCUDA or a CUDA device is missing."""
    e = engine()
    return f"{e.device.name()} ({e.arch}, {e.sm_count} SMs)"


def memory_free() -> int:
    """Bytes of device memory free now; raises where PyCUDA or a CUDA device is missing."""
    return engine().cuda.mem_get_info()[0]


# -------------------------------------------------------------------------------------------- plans
class Launch(tuple):
    """One recorded launch: (kernel name, function, grid, arguments, dynamic shared-memory bytes, threads a block),
    and what explains it: `op`, the op of microgpt.ops that launched it, and `why`, the reason for this kernel."""
    op = why = ""


class Plan(list):
    """Launches recorded with their checked arguments, to be replayed on a stream: a launcher given a Plan as its
    `stream` checks its arguments and appends Launch entries here instead of running them; replay(plan, stream) then
    runs them all, unchecked. A model's passes are fixed sequences per (B, T): checking once is enough.
    device: the engine it is planned for, whose kernels, limits and memory its launchers take (device_of; None: the
    process's engine), so that a plan for a described GPU (microgpt.kernels.virtual) records what that GPU would run;
    keep: the scratch buffers the launches point into, alive as long as the plan; workspace: the split operands'
    buffer its launches share; splits: the weights its products read split once (tf32_split.SplitOperands); op: the
    op now being recorded (set by microgpt.ops.Kernels.on); notes: the reasons (noting()) its launches now carry."""

    def __init__(self, device=None):
        super().__init__()
        self.device, self.keep, self.workspace, self.splits, self.op, self.notes = device, [], None, [], "", []

    def record(self, name: str, fn, grid: tuple, args: list, shared: int, block: int, why: str) -> None:
        """Appends one launch, noting the op being recorded and why (the reasons noted around it, then its own)."""
        entry = Launch((name, fn, grid, args, shared, block))
        entry.op, entry.why = self.op, "; ".join(n for n in self.notes + [why] if n)
        self.append(entry)

    def __str__(self) -> str:
        """A line a launch: op (and whose launcher, where not the reference's), kernel, grid, threads a block,
        dynamic shared memory, and why this kernel."""
        rows = [("op", "kernel", "grid", "block", "smem", "why")]
        rows += [(e.op, e[0], "x".join(map(str, e[2])), str(e[5]), str(e[4]), e.why or "the op's one kernel")
                 for e in self]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows)


def replay(plan: Plan, stream, phase: str) -> None:
    cuda = engine().cuda
    for name, fn, grid, args, shared, block in plan:
        try:
            fn.prepared_async_call(grid, (block, 1, 1), stream, *args, shared_size=shared)
            if SYNC_EVERY_LAUNCH:
                stream.synchronize()
        except cuda.Error as err:
            raise KernelError(f"{name} failed in the {phase} pass: {err}") from None


def synchronize(stream, phase: str) -> None:
    """Waits for the stream; an error of an earlier asynchronous launch is named by the pass it came from."""
    cuda = engine().cuda
    try:
        stream.synchronize()
    except cuda.Error as err:
        raise KernelError(f"a kernel launched in the {phase} failed: {err} (MICROGPT_SYNC=1 names "
                          f"it)") from None


# -------------------------------------------------------------------------------------------- launches
def blocks(n_threads: int) -> int:
    """Blocks of BLOCK threads that cover n_threads (at least one)."""
    return max(1, math.ceil(n_threads / BLOCK))


def launch(name: str, args: list, grid, stream=None, shared: int = 0, block: int = BLOCK, why: str = "",
           dependent: bool = False) -> None:
    """Launches kernel `name` on a grid (blocks in x, or a tuple (x, y[, z])) of `block`-thread blocks, with
    `shared` bytes of dynamic shared memory: now (stream None), queued on a stream, or recorded into a Plan (with
    `why`, the reason for this kernel, which a printed plan shows). dependent: the kernel calls pdl_wait() before
    it touches what the launch before it writes or reads, so a plan may launch it as a programmatic dependent
    launch (cuda/common.cuh), to start while that launch finishes, where the device has them."""
    e = device_of(stream)
    grid = tuple(grid) if isinstance(grid, tuple) else (grid, 1)
    fn = e.function(name, shared)
    if isinstance(stream, Plan):
        if dependent and sm_version(e) >= 90:
            fn = e.dependent_function(name, shared)
            why = "; ".join(filter(None, (why, "launched as a programmatic dependent of the launch before")))
        stream.record(name, fn, grid, args, shared, block, why)
        return
    try:
        fn.prepared_async_call(grid, (block, 1, 1), stream, *args, shared_size=shared)
        if stream is None:
            e.cuda.Context.synchronize()
        elif SYNC_EVERY_LAUNCH:
            stream.synchronize()
    except e.cuda.Error as err:
        raise KernelError(f"{name} failed: {err}") from None


@contextlib.contextmanager
def noting(stream, reason: str):
    """Inside, the launches recorded into `stream` (where it is a Plan) carry `reason` in their why: the choice a
    launcher made for the launches it delegates (split-K, a fallback, a fusion)."""
    plan = stream if isinstance(stream, Plan) else None
    if plan is not None:
        plan.notes.append(reason)
    try:
        yield
    finally:
        if plan is not None:
            plan.notes.pop()


def scratch(n: int, stream=None):
    """A float32 device buffer of n elements for partial sums; held by `stream` where it is a Plan, as long as the
    plan whose launches point into it (otherwise the caller holds it until its launches are queued)."""
    return _kept(device_of(stream).ga.empty(n, np.float32), stream)


def workspace(n: int, stream=None):
    """A float32 device buffer of at least n elements, for what one launch writes and the next reads (split
    operands): a Plan's own, shared by its launches, which run in order on one stream (a larger one takes its place
    when asked for more; the plan keeps both); otherwise scratch(n)."""
    if not isinstance(stream, Plan):
        return scratch(n)
    if stream.workspace is None or stream.workspace.size < n:
        stream.workspace = scratch(n, stream)
    return stream.workspace


class _Memset:
    """A plan's entry that sets n_words 32-bit words at a pointer to zero: replayed as cuMemsetD32Async."""

    def prepared_async_call(self, grid, block, stream, ptr, n_words, shared_size=0):
        engine().cuda.memset_d32_async(ptr, 0, n_words, stream)


_MEMSET = _Memset()


def zero(ptr: int, n_words: int, stream=None, why: str = "") -> None:
    """n_words 32-bit words at ptr set to zero: now (stream None), queued on a stream, or recorded into a Plan (as
    an entry named "memset", which replay runs in its place)."""
    e = device_of(stream)
    if isinstance(stream, Plan):
        stream.record("memset", _MEMSET, (1, 1), [ptr, n_words], 0, 1, why)
    elif stream is None:
        e.cuda.memset_d32(ptr, 0, n_words)
    else:
        e.cuda.memset_d32_async(ptr, 0, n_words, stream)


def counters(n: int, stream=None):
    """n uint32 counters, held like scratch and zeroed before the launch on `stream` (now, where it is None or a
    Plan): for a kernel whose last block to finish does the final step of a reduction and sets its counters back to
    zero, so that every replay of a plan finds them zero."""
    e = device_of(stream)
    buf = e.ga.empty(n, np.uint32)
    if stream is None or isinstance(stream, Plan):
        e.cuda.memset_d32(buf.gpudata, 0, n)
    else:
        e.cuda.memset_d32_async(buf.gpudata, 0, n, stream)
    return _kept(buf, stream)


def tensor_map(a: int, rows: int, cols: int, ld: int, box_cols: int, box_rows: int, stream=None) -> int:
    """The device address of a tensor map over the row-major FP32 matrix at address a (rows x cols, rows ld floats
    apart) in boxes of box_cols x box_rows, zeros past its edges, for copies by the tensor memory accelerator (sm_90);
    0 where it cannot read the matrix: a or a row (ld floats) not a multiple of 16 bytes, or a matrix smaller than
    a box (boxes that pass the matrix's edges are zero-filled there, but one larger than the whole matrix is not a
    case the driver's documentation speaks of). A map is a function of these numbers alone, so the engine makes each
    once, at its first use, and keeps it as long as the process (freed at exit): a plan or a graph may hold its
    address."""
    if a % 16 or ld % 4 or rows < box_rows or cols < box_cols:
        return 0
    e = device_of(stream)
    key = (a, rows, cols, ld, box_cols, box_rows)
    if key not in e.tensor_maps:
        encoded = e.encode_tensor_map(*key)  # first: a map the driver refuses leaves nothing behind
        block = e.cuda.mem_alloc(128)
        if isinstance(e, _Engine):
            _persistent.append(block)
        e.cuda.memcpy_htod(block, encoded)
        e.cuda.Context.synchronize()  # landed before any launch, on any stream, can read it
        e.tensor_maps[key] = block
    return int(e.tensor_maps[key])


def _kept(buf, stream):
    if isinstance(stream, Plan):
        stream.keep.append(buf)
    return buf
