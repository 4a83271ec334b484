"""FlatBuffer: the flat parameter vectors and their named views, and the numpy backend built on them."""
import gc

import numpy as np
import pytest

from microgpt import GPT, GPTConfig
from microgpt._host import ALIGNMENT, FlatBuffer
from microgpt.params import num_params, param_table

CFG = GPTConfig(n_layer=2, n_head=2, d_model=8, block_size=5, vocab_size=11)
N = num_params(CFG)


def test_owned_buffer_is_zeroed_aligned_and_sized():
    buf = FlatBuffer(N)
    assert buf.owns_memory and len(buf) == N and buf.size == N
    assert buf.dtype == np.float32 and buf.nbytes == 4 * N
    assert buf.array.shape == (N,) and buf.array.flags.c_contiguous and buf.array.flags.writeable
    assert buf.address % ALIGNMENT == 0
    assert buf.address == buf.array.ctypes.data
    assert not buf.array.any()


def test_views_are_zero_copy_and_tile_the_buffer_exactly():
    table = param_table(CFG)
    buf = FlatBuffer(N)
    buf.array[:] = np.arange(N, dtype=np.float32)
    named = buf.views(table)
    assert list(named) == [s.name for s in table]
    # in table order, the views laid end to end are the buffer: no gap, no overlap, nothing left over
    np.testing.assert_array_equal(np.concatenate([v.reshape(-1) for v in named.values()]), buf.array)
    for spec in table:
        view = named[spec.name]
        assert view.shape == spec.shape
        assert np.shares_memory(view, buf.array)
        assert view.ctypes.data == buf.address + 4 * spec.offset
    # a write through a view is a write to the buffer, and the other way round
    named["h.1.attn.qkv.w"][2, 3] = -7.0
    spec = next(s for s in table if s.name == "h.1.attn.qkv.w")
    assert buf.array[spec.offset + 2 * CFG.d_model + 3] == -7.0
    buf.array[-1] = 42.0
    assert named["lnf.b"][-1] == 42.0


@pytest.mark.parametrize("edit, message", [
    (lambda t: t[:-1], "covers"),                                            # leaves the end uncovered
    (lambda t: t[:1] + t[2:], "starts at offset"),                           # a gap
    (lambda t: [t[0], t[1]._replace(offset=t[1].offset - 1)] + t[2:], "starts at offset"),  # an overlap
    (lambda t: t[:-1] + [t[-1]._replace(shape=(CFG.d_model + 1,))], "past the buffer"),
])
def test_views_refuse_a_table_that_does_not_tile_the_buffer(edit, message):
    with pytest.raises(ValueError, match=message):
        FlatBuffer(N).views(edit(param_table(CFG)))


def test_views_outlive_the_buffer_object_that_made_them():
    buf = FlatBuffer(1000)
    view = buf.views([("a", (10, 100), 0)])["a"]
    view[...] = 3.0
    del buf
    gc.collect()
    _ = [np.ones(1000, dtype=np.float32) for _ in range(50)]  # reuse freed memory, were it freed
    assert np.all(view == 3.0)


def test_wraps_a_caller_buffer_without_copying(rng):
    pinned = np.zeros((4, N // 4 + 1), dtype=np.float32).reshape(-1)[:N]  # any C-contiguous float32 memory
    pinned = np.ascontiguousarray(pinned)
    buf = FlatBuffer(N, buffer=pinned)
    assert not buf.owns_memory
    assert buf.address == pinned.ctypes.data
    values = rng.standard_normal(N).astype(np.float32)
    buf.copy_from(values)
    np.testing.assert_array_equal(pinned, values)
    pinned[5] = 99.0
    assert buf.views(param_table(CFG))["wte"].reshape(-1)[5] == 99.0


def test_wrapping_keeps_the_caller_buffer_alive():
    buf = FlatBuffer(6, buffer=np.full((2, 3), 4.0, dtype=np.float32))  # shape does not matter, size does
    gc.collect()
    assert buf.array.tolist() == [4.0] * 6


@pytest.mark.parametrize("buffer, error, message", [
    (np.zeros(N, dtype=np.float64), TypeError, "dtype float32"),
    (np.zeros(2 * N, dtype=np.float32)[::2], ValueError, "C-contiguous"),
    (np.zeros(N + 1, dtype=np.float32), ValueError, f"expected n={N}"),
    ([0.0] * N, TypeError, "buffer must be an array"),
    (np.zeros(N, dtype=">f4" if np.little_endian else "<f4"), TypeError, "dtype float32"),
])
def test_refuses_a_caller_buffer_it_cannot_use(buffer, error, message):
    with pytest.raises(error, match=message):
        FlatBuffer(N, buffer=buffer)


def test_refuses_a_read_only_caller_buffer():
    ro = np.zeros(N, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        FlatBuffer(N, buffer=ro)


@pytest.mark.parametrize("n", [-1, 2.5, True, "3"])
def test_refuses_a_bad_size(n):
    with pytest.raises(ValueError, match="n must be an int"):
        FlatBuffer(n)


def test_refuses_other_dtypes():
    with pytest.raises(TypeError, match="float32 or float64"):
        FlatBuffer(4, dtype=np.float16)


def test_empty_buffer():
    buf = FlatBuffer(0)
    buf.fill(1.0)
    buf.copy_from(np.empty(0, dtype=np.float32))
    assert buf.array.shape == (0,) and buf.views([]) == {}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fill_and_copy_from(dtype, rng):
    buf = FlatBuffer(37, dtype=dtype)
    assert buf.dtype == dtype
    buf.fill(-1.5)
    assert np.all(buf.array == -1.5)
    src = rng.standard_normal(37).astype(dtype)
    buf.copy_from(src)  # same dtype: the memcpy path
    np.testing.assert_array_equal(buf.array, src)
    other = rng.standard_normal((37, 1))  # float64 of another shape: converted by NumPy
    buf.copy_from(other)
    np.testing.assert_array_equal(buf.array, other.reshape(-1).astype(dtype))
    buf.copy_from(np.arange(37, dtype=np.int16))
    np.testing.assert_array_equal(buf.array, np.arange(37))


def test_copy_from_refuses_a_wrong_size_or_non_numbers():
    buf = FlatBuffer(10)
    buf.fill(5.0)
    with pytest.raises(ValueError, match="src holds 9 numbers"):
        buf.copy_from(np.zeros(9, dtype=np.float32))
    with pytest.raises(TypeError, match="src must be an array of numbers"):
        buf.copy_from(np.array(["a"] * 10))
    assert np.all(buf.array == 5.0)  # untouched


# -- the numpy backend keeps its four vectors in FlatBuffers ------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_backend_vectors_are_flat_buffers(dtype):
    model = GPT(CFG, dtype=dtype)
    backend = model.backend
    for which in ("params", "grads", "m", "v"):
        buf = backend.buffers[which]
        assert isinstance(buf, FlatBuffer) and buf.dtype == dtype and len(buf) == N
        assert backend.pull(which) is buf.array
    for name, view in backend.P.items():
        assert np.shares_memory(view, backend.buffers["params"].array)
        np.testing.assert_array_equal(view.astype(np.float32), model.state_dict()[name])


def test_numpy_backend_push_checks_its_arguments():
    backend = GPT(CFG).backend
    with pytest.raises(ValueError, match="which must be one of"):
        backend.push("weights", np.zeros(N, dtype=np.float32))
    with pytest.raises(ValueError, match="which must be one of"):
        backend.pull("adam")
    with pytest.raises(ValueError, match=f"src holds {N - 1} numbers"):
        backend.push("m", np.zeros(N - 1, dtype=np.float32))
    backend.push("v", np.full(N, 2.0))
    assert np.all(backend.pull("v") == 2.0)
