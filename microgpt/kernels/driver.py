"""The CUDA driver's calls that PyCUDA has no binding for, through ctypes, in the primary context PyCUDA made: stream
capture and graphs (microgpt.kernels.graph), launches by cuLaunchKernelEx (DependentKernel), and tensor maps
(encode_tensor_map).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


class KernelError(RuntimeError):
    """A CUDA error raised by (or surfacing after) a named kernel's launch."""


class GraphUnavailable(RuntimeError):
    """This process cannot capture the plan (no driver library, no stream handle, a capture error)."""


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, then a 64-byte union at offset 8
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8      # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
# a pointer may come as an int or as what has one (a PyCUDA DeviceAllocation), as PyCUDA's launches take it
_ARG_TYPES = {"P": lambda a: ctypes.c_void_p(int(a or 0)), "i": ctypes.c_int, "I": ctypes.c_uint,
              "q": ctypes.c_longlong, "f": ctypes.c_float, "d": ctypes.c_double}


@functools.cache
def driver():
    """The CUDA driver library with the prototypes of the calls used here, loaded once."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        raise GraphUnavailable(f"the CUDA driver library is not loadable ({e})") from None
    p, P = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    for fn, args in (("cuStreamBeginCapture_v2", [p, ctypes.c_int]), ("cuStreamEndCapture", [p, P]),
                     ("cuGraphInstantiateWithFlags", [P, p, ctypes.c_ulonglong]), ("cuGraphLaunch", [p, p]),
                     ("cuGraphExecDestroy", [p]), ("cuGraphDestroy", [p]),
                     ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
                     ("cuModuleLoadData", [P, ctypes.c_char_p]), ("cuModuleGetFunction", [P, p, ctypes.c_char_p]),
                     ("cuFuncSetAttribute", [p, ctypes.c_int, ctypes.c_int]),
                     ("cuLaunchKernelEx", [ctypes.POINTER(_LaunchConfig), p, P, P])):
        getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, ctypes.c_int
    return lib


def check(rc: int, what: str, error=KernelError) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        driver().cuGetErrorName(rc, ctypes.byref(name))
        raise error(f"{what} failed: {(name.value or b'CUDA error').decode()} ({rc})")


def shared_without_opt_in(static: int) -> int:
    """The dynamic shared memory a block of a kernel with `static` bytes of static shared memory may take before
    the opt-in (MAX_DYNAMIC_SHARED_SIZE_BYTES): 48 KB, the static part counted."""
    return 48 * 1024 - static


_FLOAT32, _L2_PROMOTION_256B = 7, 3  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CU_TENSOR_MAP_L2_PROMOTION_L2_256B


def encode_tensor_map(address: int, rows: int, cols: int, ld: int, box_cols: int, box_rows: int) -> bytes:
    """The 128 bytes of a CUtensorMap over the row-major FP32 matrix at `address` (rows x cols, rows ld floats
    apart) in boxes of box_cols x box_rows, by cuTensorMapEncodeTiled (a driver of CUDA 12.0 on; looked up here, so
    that older drivers run everything else): no interleave, no swizzle, L2 promotion of 256 bytes, zeros past the
    matrix's edges. The map is written at a 64-byte aligned address, as the driver asks."""
    what = f"a tensor map over {rows} x {cols} floats (ld {ld}) in boxes of {box_cols} x {box_rows}"
    encode = getattr(driver(), "cuTensorMapEncodeTiled", None)
    if encode is None:
        raise KernelError(f"{what}: this CUDA driver has no cuTensorMapEncodeTiled (CUDA 12.0 on)")
    p = ctypes.c_void_p
    encode.argtypes, encode.restype = [p, ctypes.c_int, ctypes.c_uint, p, p, p, p, p] + [ctypes.c_int] * 4, ctypes.c_int
    buf = ctypes.create_string_buffer(128 + 63)
    out = (ctypes.addressof(buf) + 63) // 64 * 64
    dims, strides = (ctypes.c_uint64 * 2)(cols, rows), (ctypes.c_uint64 * 1)(ld * 4)
    box, element_strides = (ctypes.c_uint32 * 2)(box_cols, box_rows), (ctypes.c_uint32 * 2)(1, 1)
    check(encode(out, _FLOAT32, 2, address, ctypes.byref(dims), ctypes.byref(strides), ctypes.byref(box),
                 ctypes.byref(element_strides), 0, 0, _L2_PROMOTION_256B, 0), what)
    return ctypes.string_at(out, 128)


def load_module(cubin: bytes) -> ctypes.c_void_p:
    """The cubin loaded as a module of the current context, through the driver (PyCUDA's module hands out no
    handle that cuLaunchKernelEx could launch)."""
    module = ctypes.c_void_p()
    check(driver().cuModuleLoadData(ctypes.byref(module), cubin), "loading the module for dependent launches")
    return module


class DependentKernel:
    """Kernel `name` of a module from load_module() (the engine's cubin loaded once more: PyCUDA launches no
    other way than cuLaunchKernel), launched by cuLaunchKernelEx as a programmatic dependent launch: it may start
    while the launch before it on the stream finishes, and waits for it in pdl_wait() (cuda/common.cuh). Called as
    a prepared PyCUDA function is, so that a Plan replays it, or a Graph captures it, as any other launch."""

    def __init__(self, module: ctypes.c_void_p, name: str, signature: str, static: int):
        """static: the kernel's static shared memory in bytes."""
        lib = driver()
        self._fn, self.name, self._types = ctypes.c_void_p(), name, [_ARG_TYPES[c] for c in signature]
        check(lib.cuModuleGetFunction(ctypes.byref(self._fn), module, name.encode()), f"finding {name}")
        self._shared = shared_without_opt_in(static)
        self._attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)

    def allow_shared(self, shared: int) -> None:
        """Lets a block take `shared` bytes of dynamic shared memory (the opt-in past 48 KB, once)."""
        if shared > self._shared:
            check(driver().cuFuncSetAttribute(self._fn, _MAX_DYNAMIC_SHARED_SIZE_BYTES, shared), f"{self.name}'s "
                   "shared memory")
            self._shared = shared

    def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
        values = [t(a) for t, a in zip(self._types, args)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        grid = tuple(grid) + (1,) * (3 - len(grid))
        config = _LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), shared_size,
                               ctypes.c_void_p(getattr(stream, "handle", 0) or None), ctypes.pointer(self._attr), 1)
        check(driver().cuLaunchKernelEx(ctypes.byref(config), self._fn, params, None), self.name)
