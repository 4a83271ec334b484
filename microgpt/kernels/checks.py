"""The argument checks every launcher runs before a launch: a device array (a PyCUDA GPUArray, or anything with
__cuda_array_interface__, such as PyTorch and CuPy tensors), its dtype, its shape against the other arguments,
C-contiguity (or rows at a pitch: rows_ptr), token ids inside the vocabulary. Each failure is a TypeError or
ValueError that names the argument; nothing has been launched when it is raised.
"""
from __future__ import annotations

import math

import numpy as np

from .runtime import device_of


def _describe(name, a):
    """(device pointer, dtype, shape, strides in bytes or None for C order) of a device array; TypeError for anything
    else."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        if isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a device array, got a NumPy array (copy it with "
                            f"pycuda.gpuarray.to_gpu)")
        raise TypeError(f"{name} must be a device array (pycuda GPUArray or an object with "
                        f"__cuda_array_interface__), got {type(a).__name__}")
    strides = cai.get("strides")
    return int(cai["data"][0]), np.dtype(cai["typestr"]), tuple(cai["shape"]), strides and tuple(strides)


def _pitch(shape, strides, itemsize):
    """The elements from one row (the last axis) to the next where the array is rows at an even pitch in C order,
    each row contiguous (C order itself: pitch = shape[-1]); None where it is not. Axes of length 1 never step, so
    their strides do not count."""
    if strides is None or not shape:
        return shape[-1] if shape else 1
    if shape[-1] != 1 and strides[-1] != itemsize:
        return None
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    if not lead:
        return shape[-1]
    step = lead[-1][1]
    if step % itemsize or step // itemsize < shape[-1]:
        return None
    pitch = step // itemsize
    for n, s in reversed(lead):
        if s != step:
            return None
        step *= n
    return pitch


def shape_of(name, a, ndim=None) -> tuple:
    """The shape of device array `a`, which must not be empty (and must have ndim axes, if given)."""
    shape = _describe(name, a)[2]
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {shape}")
    if any(n == 0 for n in shape):
        raise ValueError(f"{name} must not be empty, got shape {shape}")
    return shape


def ptr(name, a, shape, dtype=np.float32) -> int:
    """The device pointer of `a` after checking its dtype, shape and contiguity."""
    p, pitch = rows_ptr(name, a, shape, dtype)
    if pitch != (shape[-1] if len(shape) else 1):
        raise ValueError(f"{name} must be C-contiguous")
    return p


def rows_ptr(name, a, shape, dtype=np.float32) -> tuple[int, int]:
    """(device pointer, pitch) of `a` after checking its dtype and shape: its rows (the last axis) may lie `pitch`
    elements apart, pitch >= shape[-1] (the rows of a wider buffer, padded: a[..., :n] of a C-contiguous array),
    each row contiguous, the rows in C order; pitch = shape[-1] where `a` is C-contiguous."""
    p, dt, sh, strides = _describe(name, a)
    if dt != np.dtype(dtype):
        raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {dt.name}")
    if sh != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {sh}")
    pitch = _pitch(sh, strides, dt.itemsize)
    if pitch is None:
        raise ValueError(f"{name} must be C-contiguous, or rows of {sh[-1]} contiguous elements each a fixed pitch "
                         f"after the last (a[..., :{sh[-1]}] of a C-contiguous array), got strides {strides}")
    return p, pitch


def opt_ptr(name, a, shape, dtype=np.float32) -> int:
    """ptr() of an optional argument; NULL (0) for None."""
    return 0 if a is None else ptr(name, a, shape, dtype)


def read_ids(p, shape, stream=None) -> np.ndarray:
    """The int32 array at device pointer p on the device of `stream` (device_of), copied to the host (token ids: a
    few KB)."""
    host = np.empty(shape, dtype=np.int32)
    device_of(stream).cuda.memcpy_dtoh(host, p)
    return host


def check_ids(name, a, shape, vocab_size, check=True, stream=None) -> int:
    """ptr() of int32 token ids; with check, read back and refused unless every id lies in [0, vocab_size)."""
    p = ptr(name, a, shape, np.int32)
    if check:
        host = read_ids(p, shape, stream)
        lo, hi = int(host.min()), int(host.max())
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} holds token id {lo if lo < 0 else hi}, outside [0, {vocab_size})")
    return p


def flag(name, value) -> int:
    """A kernel's int flag from a bool argument; anything else is refused by name."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return int(value)


def causal_flag(name, shape, causal) -> int:
    """flag() of a row-wise kernel's causal argument: causal rows are those of square (..., T, T) matrices."""
    value = flag("causal", causal)
    if value and (len(shape) < 2 or shape[-1] != shape[-2]):
        raise ValueError(f"{name} must be square matrices (..., T, T) where causal=True, got shape {shape}")
    return value


def rows(shape) -> tuple[int, int]:
    """(rows, last) of an array of shape (..., last)."""
    return math.prod(shape[:-1]), shape[-1]


def head_dims(name, a) -> tuple[int, int, int, int]:
    """(B, NH, T, d_k) of a per-head array."""
    return shape_of(name, a, 4)
