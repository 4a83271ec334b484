# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: auto_pickle=False
"""The host side in Cython, part one: flat parameter buffers and ANDREA checkpoint I/O (microgpt._tokens holds
the byte tokenizer and the batch sampler). Every hot loop runs with the GIL released, so a training loop's other
threads (a prefetcher, a checkpoint writer, PyCUDA's copies) keep going while it runs.

The Python faces are thin and live beside it: microgpt.params (the layout) and microgpt.checkpoint. They check
arguments and give the errors their wording; the routines here still refuse anything that would make them read
or write out of bounds.
"""
from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree
from libc.errno cimport EINTR, EIO, errno
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy
from posix.unistd cimport read as c_read, write as c_write

import os

import numpy as np
cimport numpy as cnp

cnp.import_array()


# ==================================================================================================
# Flat buffers: one contiguous vector of every parameter (or gradient, or Adam moment)
# ==================================================================================================

cdef enum:
    _ALIGN = 64  # bytes: a cache line, and more than any SIMD load or DMA engine asks for
    _HEADER = 8

ALIGNMENT = _ALIGN


cdef class _AlignedBlock:
    """Zeroed memory aligned to ALIGNMENT bytes; the base object of a FlatBuffer's array, so the memory
    lives exactly as long as some view of it does."""
    cdef void *raw
    cdef char *data

    def __cinit__(self, size_t nbytes):
        self.raw = PyMem_RawCalloc(nbytes + _ALIGN, 1)
        if self.raw == NULL:
            raise MemoryError(f"cannot allocate a flat buffer of {nbytes:,} bytes")
        self.data = <char *>((<uintptr_t>self.raw + _ALIGN - 1) & ~(<uintptr_t>(_ALIGN - 1)))

    def __dealloc__(self):
        PyMem_RawFree(self.raw)


ctypedef fused real_t:
    float
    double


cdef void _fill(real_t *p, Py_ssize_t n, real_t value) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        p[i] = value


cdef class FlatBuffer:
    """A flat float32 (or float64) vector of n numbers, with zero-copy NumPy views.

    FlatBuffer(n) owns zeroed memory aligned to 64 bytes. FlatBuffer(n, buffer=arr) wraps a C-contiguous,
    writeable array of n numbers of the same dtype that the caller allocated (a PyCUDA
    pagelocked_empty(n, np.float32), say, so the device copies from it asynchronously) and keeps it
    alive. `array` is the whole vector, `views(table)` one named view per tensor of a parameter table
    (microgpt.params.param_table), all sharing the buffer's memory.
    """
    cdef readonly object array
    cdef readonly bint owns_memory
    cdef readonly Py_ssize_t size
    cdef char *data

    def __init__(self, n, buffer=None, dtype=np.float32):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be an int >= 0 (the number of elements), got {n!r}")
        dtype = np.dtype(dtype)
        if dtype != np.float32 and dtype != np.float64:
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        cdef cnp.npy_intp dim = n
        if buffer is None:
            block = _AlignedBlock(<size_t>n * dtype.itemsize)
            arr = cnp.PyArray_SimpleNewFromData(1, &dim, dtype.num, <void *>block.data)
            cnp.set_array_base(arr, block)
            self.owns_memory = True
        else:
            arr = _wrap_caller_buffer(buffer, n, dtype)
            self.owns_memory = False
        self.array = arr
        self.size = n
        self.data = <char *>cnp.PyArray_DATA(arr)

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    @property
    def address(self) -> int:
        """The address of element 0, for a host-to-device copy."""
        return <uintptr_t>self.data

    def __len__(self):
        return self.size

    def __repr__(self):
        kind = "owned" if self.owns_memory else "wrapped"
        return f"FlatBuffer({self.size}, dtype={self.array.dtype}, {kind})"

    def views(self, table) -> dict:
        """name -> zero-copy view shaped as its tensor, for a table of (name, shape, offset) in the order
        of the vector. Refuses a table that does not tile the buffer exactly: a gap, an overlap or a
        size mismatch would mean views that disagree with the layout the checkpoint writes."""
        out, end = {}, 0
        for name, shape, offset in table:
            size = 1
            for d in shape:
                size *= d
            if offset != end:
                raise ValueError(f"table: {name!r} starts at offset {offset}, expected {end} "
                                 f"(the tensors must follow each other without gaps or overlaps)")
            end = offset + size
            if end > self.size:
                raise ValueError(f"table: {name!r} ends at {end}, past the buffer's {self.size} elements")
            out[name] = self.array[offset:end].reshape(shape)
        if end != self.size:
            raise ValueError(f"table covers {end} elements, the buffer holds {self.size}")
        return out

    def fill(self, value) -> None:
        """Sets every element to value."""
        cdef double v = float(value)
        if self.array.dtype == np.float32:
            with nogil:
                _fill(<float *>self.data, self.size, <float>v)
        else:
            with nogil:
                _fill(<double *>self.data, self.size, v)

    def copy_from(self, src) -> None:
        """Copies n numbers from src (any array-like of n numbers; same-dtype contiguous arrays are copied
        with memcpy and the GIL released, others are converted by NumPy)."""
        if not isinstance(src, np.ndarray):
            src = np.asarray(src)
        if src.dtype.kind not in "fiub":
            raise TypeError(f"src must be an array of numbers, got dtype {src.dtype}")
        if src.size != self.size:
            raise ValueError(f"src holds {src.size} numbers (shape {src.shape}), the buffer holds {self.size}")
        cdef const unsigned char[::1] raw
        cdef size_t nbytes = self.array.nbytes
        if src.dtype == self.array.dtype and src.flags.c_contiguous and self.size > 0:
            raw = src.reshape(-1).view(np.uint8)
            with nogil:
                memcpy(self.data, &raw[0], nbytes)
        else:
            self.array[...] = src.reshape(-1)


cdef object _wrap_caller_buffer(buffer, Py_ssize_t n, dtype):
    try:
        memoryview(buffer)
    except TypeError:
        raise TypeError(f"buffer must be an array exposing its memory (a NumPy or PyCUDA page-locked array), "
                        f"got {type(buffer).__name__}") from None
    arr = np.asarray(buffer)  # no copy: the object exposes the buffer protocol
    if arr.dtype != dtype:
        raise TypeError(f"buffer must have dtype {dtype}, got {arr.dtype}")
    if not arr.flags.c_contiguous:
        raise ValueError("buffer must be C-contiguous")
    if not arr.flags.writeable:
        raise ValueError("buffer must be writeable")
    if arr.size != n:
        raise ValueError(f"buffer holds {arr.size} elements (shape {arr.shape}), expected n={n}")
    return arr.reshape(-1)


# ==================================================================================================
# ANDREA checkpoints: [int32 step][int32 n_params][n_params f32 weights][n_params f32 m][n_params f32 v]
# ==================================================================================================

class CheckpointError(ValueError):
    """A file that is not a whole ANDREA checkpoint of the model it is loaded into."""


HEADER_BYTES = _HEADER
INT32_MAX = 2 ** 31 - 1


def pack_header(step, n_params) -> bytes:
    """The 8-byte little-endian header [int32 step][int32 n_params]."""
    if not 0 <= step <= INT32_MAX:
        raise ValueError(f"step must be in [0, {INT32_MAX}] to fit the header's int32, got {step}")
    if not 0 < n_params <= INT32_MAX:
        raise ValueError(f"n_params must be in [1, {INT32_MAX}] to fit the header's int32, got {n_params}")
    return int(step).to_bytes(4, "little", signed=True) + int(n_params).to_bytes(4, "little", signed=True)


def checkpoint_bytes(n_params) -> int:
    """The size of a whole checkpoint of n_params parameters."""
    return HEADER_BYTES + 3 * 4 * n_params


def parse_header(bytes header, file_size, expected_n_params, name) -> tuple:
    """(step, n_params) of a checkpoint whose first bytes are `header` and whose size is file_size.

    Raises CheckpointError, naming the file, for anything but a whole checkpoint: fewer bytes than a
    header, a negative or zero field, a header that does not describe the file's size, an n_params other
    than expected_n_params (None: any), bytes past the last vector.
    """
    if file_size < HEADER_BYTES or len(header) < HEADER_BYTES:
        raise CheckpointError(f"checkpoint {name!r} is not an ANDREA checkpoint: {file_size} bytes, "
                              f"fewer than its {HEADER_BYTES}-byte header")
    step = int.from_bytes(header[0:4], "little", signed=True)
    n = int.from_bytes(header[4:8], "little", signed=True)
    if step < 0 or n <= 0:
        raise CheckpointError(f"checkpoint {name!r} has an impossible header: step={step}, n_params={n} "
                              f"(expected step >= 0 and n_params > 0); it is not an ANDREA checkpoint or it "
                              f"is corrupt")
    need = checkpoint_bytes(n)
    if expected_n_params is not None and n != expected_n_params:
        if need == file_size:
            raise CheckpointError(f"checkpoint {name!r} holds n_params={n} parameters, the config needs "
                                  f"{expected_n_params}: it belongs to another model")
        raise CheckpointError(f"checkpoint {name!r} is not an ANDREA checkpoint of this model: its header "
                              f"claims n_params={n}, which needs {need} bytes, the file has {file_size}, and "
                              f"the config needs n_params={expected_n_params}")
    if file_size < need:
        raise CheckpointError(f"checkpoint {name!r} is truncated: expected {need} bytes, found {file_size}")
    if file_size > need:
        raise CheckpointError(f"checkpoint {name!r} has {file_size - need} bytes past its last vector: "
                              f"expected {need} bytes, found {file_size}")
    return step, n


cdef int _read_exact(int fd, char *p, size_t n, size_t *got) noexcept nogil:
    """Reads n bytes (a read may return fewer, and more than 2 GiB never comes in one); 0 or an errno.
    *got is what arrived, short of n at end of file."""
    cdef ssize_t r
    got[0] = 0
    while got[0] < n:
        r = c_read(fd, p + got[0], min(n - got[0], <size_t>(1 << 30)))
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:
            return 0
        got[0] += r
    return 0


cdef int _write_all(int fd, const char *p, size_t n) noexcept nogil:
    cdef ssize_t r
    cdef size_t done = 0
    while done < n:
        r = c_write(fd, p + done, min(n - done, <size_t>(1 << 30)))
        if r < 0:
            if errno == EINTR:
                continue
            return errno
        if r == 0:  # no progress and no error: give up rather than spin
            return EIO
        done += r
    return 0


def read_vectors(int fd, unsigned char[::1] weights, unsigned char[::1] m, unsigned char[::1] v, name) -> None:
    """Reads the three vectors that follow the header, from fd positioned after it, into the byte views
    of three little-endian float32 arrays of n_params each."""
    cdef size_t size = weights.shape[0]
    if m.shape[0] != <Py_ssize_t>size or v.shape[0] != <Py_ssize_t>size:
        raise ValueError("weights, m and v must have the same size")
    if size == 0:
        return
    cdef unsigned char *dst[3]
    dst[0], dst[1], dst[2] = &weights[0], &m[0], &v[0]
    cdef size_t got = 0
    cdef int err = 0, i, short = -1
    with nogil:
        for i in range(3):
            err = _read_exact(fd, <char *>dst[i], size, &got)
            if err or got < size:
                short = i
                break
    if err:
        raise OSError(err, os.strerror(err), name)
    if short >= 0:
        raise CheckpointError(f"checkpoint {name!r} ended inside its {('weights', 'm', 'v')[short]} vector "
                              f"(it was truncated while being read)")


def write_vectors(int fd, const unsigned char[::1] header, const unsigned char[::1] weights,
                  const unsigned char[::1] m, const unsigned char[::1] v, name) -> None:
    """Writes the header and the three vectors (byte views of little-endian float32 arrays) to fd."""
    cdef size_t size = weights.shape[0]
    if header.shape[0] != _HEADER or m.shape[0] != <Py_ssize_t>size or v.shape[0] != <Py_ssize_t>size \
            or size == 0:
        raise ValueError(f"write_vectors needs an {HEADER_BYTES}-byte header and weights, m and v of one "
                         f"non-zero size")
    cdef const unsigned char *src[4]
    src[0], src[1], src[2], src[3] = &header[0], &weights[0], &m[0], &v[0]
    cdef size_t sizes[4]
    sizes[0], sizes[1], sizes[2], sizes[3] = _HEADER, size, size, size
    cdef int err = 0, i
    with nogil:
        for i in range(4):
            err = _write_all(fd, <const char *>src[i], sizes[i])
            if err:
                break
    if err:
        raise OSError(err, os.strerror(err), name)
