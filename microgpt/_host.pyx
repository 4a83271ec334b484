# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: auto_pickle=False
"""The host side in Cython: flat parameter buffers, ANDREA checkpoint I/O, the byte tokenizer and the
batch sampler. Every hot loop runs with the GIL released, so a training loop's other threads (a
prefetcher, a checkpoint writer, PyCUDA's copies) keep going while it runs.

The Python faces are thin and live beside it: microgpt.params (the layout), microgpt.checkpoint,
microgpt.tokenizer and microgpt.data. They check arguments and give the errors their wording; the
routines here still refuse anything that would make them read or write out of bounds.
"""
from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_Malloc, PyMem_Free
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH, PyUnicode_KIND
from libc.errno cimport EINTR, EIO, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
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
    _EOT = 256
    _VOCAB = 257

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


# ==================================================================================================
# Byte tokenizer: UTF-8 bytes are tokens 0..255, end-of-text is 256
# ==================================================================================================

EOT = _EOT
VOCAB_SIZE = _VOCAB

ctypedef fused ucs_t:
    uint8_t
    uint16_t
    uint32_t


cdef enum:
    _CHUNK = 1 << 20  # code points per 32-bit count: 3 * 2^20 cannot overflow it


cdef Py_ssize_t _utf8_length(const ucs_t *s, Py_ssize_t n, Py_ssize_t *surrogate) noexcept nogil:
    """Bytes of the UTF-8 form of n code points. *surrogate is the index of the first lone surrogate
    (U+D800..U+DFFF, which UTF-8 cannot encode), or -1.

    The loop is branch-free with 32-bit counts, so the compiler vectorises it; the surrogate's index is
    looked for only when the scan saw one."""
    cdef Py_ssize_t i, start = 0, end, total = n
    cdef uint32_t c, extra, seen = 0
    while start < n:
        end = min(n, start + _CHUNK)
        extra = 0
        for i in range(start, end):
            c = s[i]
            extra += (c >= 0x80) + (c >= 0x800) + (c >= 0x10000)
            seen |= (c - 0xD800) < 0x800
        total += extra
        start = end
    surrogate[0] = -1
    if seen:
        for i in range(n):
            if (<uint32_t>s[i] - 0xD800) < 0x800:
                surrogate[0] = i
                break
    return total


cdef void _widen(const uint8_t *s, Py_ssize_t n, int32_t *o) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        o[i] = s[i]


cdef inline Py_ssize_t _put_utf8(uint32_t c, int32_t *o) noexcept nogil:
    """Writes the UTF-8 bytes of code point c; returns how many."""
    if c < 0x80:
        o[0] = c
        return 1
    if c < 0x800:
        o[0] = 0xC0 | (c >> 6)
        o[1] = 0x80 | (c & 0x3F)
        return 2
    if c < 0x10000:
        o[0] = 0xE0 | (c >> 12)
        o[1] = 0x80 | ((c >> 6) & 0x3F)
        o[2] = 0x80 | (c & 0x3F)
        return 3
    o[0] = 0xF0 | (c >> 18)
    o[1] = 0x80 | ((c >> 12) & 0x3F)
    o[2] = 0x80 | ((c >> 6) & 0x3F)
    o[3] = 0x80 | (c & 0x3F)
    return 4


cdef enum:
    _BLOCK = 16  # code points checked at once for the all-ASCII fast path


cdef void _utf8_write(const ucs_t *s, Py_ssize_t n, int32_t *o) noexcept nogil:
    # Text is mostly ASCII even when it is not all ASCII: a block of 16 code points that are all below
    # 0x80 is copied by a loop the compiler vectorises; any other block goes one code point at a time.
    cdef Py_ssize_t i = 0, j, k = 0
    cdef uint32_t seen
    while i + _BLOCK <= n:
        seen = 0
        for j in range(_BLOCK):
            seen |= s[i + j]
        if seen < 0x80:
            for j in range(_BLOCK):
                o[k + j] = s[i + j]
            k += _BLOCK
        else:
            for j in range(_BLOCK):
                k += _put_utf8(s[i + j], o + k)
        i += _BLOCK
    while i < n:
        k += _put_utf8(s[i], o + k)
        i += 1


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)


def encode_utf8(str text):
    """The UTF-8 bytes of text as int32 token ids, read straight from the str's own storage (no bytes
    object in between). A lone surrogate, which UTF-8 cannot encode, raises UnicodeEncodeError."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), count = 0, bad = -1
    cdef int kind = PyUnicode_KIND(text)
    cdef const void *data = PyUnicode_DATA(text)
    cdef bint ascii = PyUnicode_IS_ASCII(text)  # a flag CPython keeps: then bytes == code points
    with nogil:
        if ascii:
            count = n
        elif kind == 1:
            count = _utf8_length(<const uint8_t *>data, n, &bad)
        elif kind == 2:
            count = _utf8_length(<const uint16_t *>data, n, &bad)
        else:
            count = _utf8_length(<const uint32_t *>data, n, &bad)
    if bad >= 0:
        raise UnicodeEncodeError("utf-8", text, bad, bad + 1,
                                 "text holds a lone surrogate, which UTF-8 cannot encode")
    out = np.empty(count, dtype=np.int32)
    if count == 0:
        return out
    cdef int32_t *o = <int32_t *>cnp.PyArray_DATA(out)
    with nogil:
        if ascii:
            _widen(<const uint8_t *>data, n, o)
        elif kind == 1:
            _utf8_write(<const uint8_t *>data, n, o)
        elif kind == 2:
            _utf8_write(<const uint16_t *>data, n, o)
        else:
            _utf8_write(<const uint32_t *>data, n, o)
    return out


ctypedef fused id_t:
    int32_t
    int64_t


def decode_ids(const id_t[::1] ids, bytes eot_text):
    """Token ids back to text: bytes as themselves, each end-of-text as eot_text, then one UTF-8 decode
    that turns what is not valid UTF-8 into U+FFFD. Raises ValueError for an id outside [0, 257)."""
    cdef Py_ssize_t i, k = 0, n = ids.shape[0], n_eot = 0, bad = -1
    cdef Py_ssize_t marker_len = len(eot_text)
    cdef const char *marker = eot_text
    cdef int64_t t
    cdef uint64_t out_of_range = 0
    with nogil:
        for i in range(n):  # branch-free, so it vectorises; the bad index is looked for only if needed
            t = ids[i]
            n_eot += t == _EOT
            out_of_range |= <uint64_t>t > _EOT  # a negative id wraps to a huge unsigned one
        if out_of_range:
            for i in range(n):
                if <uint64_t>ids[i] > _EOT:
                    bad = i
                    break
    if bad >= 0:
        raise ValueError(f"ids holds token id {ids[bad]} at index {bad}, outside [0, {VOCAB_SIZE})")
    cdef Py_ssize_t total = n + n_eot * (marker_len - 1)
    cdef char *buf = <char *>PyMem_Malloc(total + 1)
    if buf == NULL:
        raise MemoryError()
    try:
        with nogil:
            if n_eot == 0:
                for i in range(n):
                    buf[i] = <char>ids[i]
            else:
                for i in range(n):
                    t = ids[i]
                    if t == _EOT:
                        memcpy(buf + k, marker, marker_len)
                        k += marker_len
                    else:
                        buf[k] = <char>t
                        k += 1
        # eot_text is ASCII, which never continues a multi-byte sequence: a sequence cut short by an
        # end-of-text decodes to U+FFFD before the marker, exactly as if each piece were decoded alone
        return PyUnicode_DecodeUTF8(buf, total, "replace")
    finally:
        PyMem_Free(buf)


# ==================================================================================================
# Batch sampler: windows of T+1 tokens at uniform random starts, xoshiro256** seeded by splitmix64
# ==================================================================================================

cdef inline uint64_t _rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef inline uint64_t _splitmix64(uint64_t *x) noexcept nogil:
    x[0] += 0x9E3779B97F4A7C15ULL
    cdef uint64_t z = x[0]
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline uint64_t _xoshiro_next(uint64_t *s) noexcept nogil:
    cdef uint64_t result = _rotl(s[1] * 5, 7) * 9
    cdef uint64_t t = s[1] << 17
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = _rotl(s[3], 45)
    return result


cdef inline uint64_t _below(uint64_t *s, uint64_t n) noexcept nogil:
    """Uniform in [0, n), n >= 1: rejects the lowest (2^64 mod n) draws so that every residue is
    equally likely (plain modulo would favour small starts)."""
    cdef uint64_t threshold = (0 - n) % n
    cdef uint64_t r = _xoshiro_next(s)
    while r < threshold:
        r = _xoshiro_next(s)
    return r % n


RNG_NAME = "xoshiro256**"
UINT64_MAX = 2 ** 64 - 1


cdef class WindowSampler:
    """Fills (B, T+1) int32 buffers with windows tokens[s:s+T+1], s uniform in [0, len(tokens) - T).

    tokens: int32, or uint16 (a memory-mapped token file of a vocabulary up to 65536, read as it lies and
    widened row by row). One sampler belongs to one thread: fill() releases the GIL and advances the
    generator's state.
    """
    cdef object _tokens  # keeps the token array alive under the memoryview
    cdef const int32_t[::1] tokens
    cdef const uint16_t[::1] tokens16
    cdef bint narrow
    cdef Py_ssize_t n_tokens
    cdef readonly Py_ssize_t T
    cdef uint64_t s[4]

    def __init__(self, tokens, Py_ssize_t T, seed):
        if T < 1:
            raise ValueError(f"T must be >= 1, got {T}")
        if not isinstance(tokens, np.ndarray) or tokens.dtype not in (np.int32, np.uint16) or tokens.ndim != 1 \
                or not tokens.flags.c_contiguous:
            raise TypeError("tokens must be a 1-D C-contiguous int32 or uint16 array")
        if tokens.shape[0] < T + 1:
            raise ValueError(f"tokens: {tokens.shape[0]} tokens are too few for windows of T+1={T + 1}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= UINT64_MAX:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
        self._tokens = tokens
        self.narrow = tokens.dtype == np.uint16
        if self.narrow:
            self.tokens16 = tokens
        else:
            self.tokens = tokens
        self.n_tokens = tokens.shape[0]
        self.T = T
        cdef uint64_t x = <uint64_t>int(seed)
        cdef int i
        for i in range(4):
            self.s[i] = _splitmix64(&x)

    @property
    def rng_state(self) -> list:
        """The generator's four 64-bit words; assigning them back replays the same windows."""
        return [int(self.s[i]) for i in range(4)]

    @rng_state.setter
    def rng_state(self, words):
        words = list(words)
        if len(words) != 4 or not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w <= UINT64_MAX
                                      for w in words):
            raise ValueError(f"rng_state must be four ints in [0, 2**64), got {words!r}")
        if not any(words):
            raise ValueError("rng_state must not be all zeros (xoshiro256** would return only zeros)")
        cdef int i
        for i in range(4):
            self.s[i] = <uint64_t>words[i]

    def fill(self, int32_t[:, ::1] out) -> None:
        """Writes one window per row of out, which must be (B, T+1)."""
        cdef Py_ssize_t b, j, B = out.shape[0], width = self.T + 1
        cdef uint64_t start, n_starts = self.n_tokens - self.T
        if out.shape[1] != width:
            raise ValueError(f"out must have T+1={width} columns, got shape ({out.shape[0]}, {out.shape[1]})")
        with nogil:
            for b in range(B):
                start = _below(self.s, n_starts)
                if self.narrow:
                    for j in range(width):
                        out[b, j] = self.tokens16[start + j]
                else:
                    memcpy(&out[b, 0], &self.tokens[start], width * sizeof(int32_t))
