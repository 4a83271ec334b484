# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The host side: byte tokenizer and the batch sampler, with the GIL released in the hot loops."""
import numpy as np
cimport numpy as cnp

cnp.import_array()

EOT = 256  # end-of-text: the one token that is not a byte


def encode_bytes(const unsigned char[::1] data):
    """Every byte its own token id (0..255)."""
    cdef Py_ssize_t i, n = data.shape[0]
    out = np.empty(n, dtype=np.int32)
    cdef int[::1] o = out
    with nogil:
        for i in range(n):
            o[i] = data[i]
    return out


def decode_bytes(const int[::1] ids):
    """Token ids back to bytes; ids that are not bytes (end-of-text) are dropped."""
    cdef Py_ssize_t i, k = 0, n = ids.shape[0]
    buf = bytearray(n)
    cdef unsigned char[::1] b = buf
    with nogil:
        for i in range(n):
            if 0 <= ids[i] < 256:
                b[k] = <unsigned char>ids[i]
                k += 1
    return bytes(buf[:k])
