# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: auto_pickle=False
"""The host side in Cython, part two: the byte tokenizer (UTF-8 to token ids and back) and the batch sampler's
windows, each hot loop with the GIL released. The Python faces are microgpt.tokenizer and microgpt.data; the
routines here still refuse anything that would make them read or write out of bounds.
"""
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH, PyUnicode_KIND
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

import numpy as np
cimport numpy as cnp

cnp.import_array()

cdef enum:
    _EOT = 256
    _VOCAB = 257


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
