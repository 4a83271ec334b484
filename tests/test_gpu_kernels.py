"""Every kernel against the reference engine on the GPU.

Fresh random float32 inputs each run; outputs poisoned with NaN before the launch (so an element the
kernel forgets fails); weight gradients, which kernels add into, start from random values instead and
are compared with start + reference. The reference runs in float64 on the same float32 inputs; the
tolerance of each comparison is written beside it: 1e-6 for elementwise kernels, 1e-5 for reductions
and matmuls (relative error ||out - ref|| / ||ref||). A fast kernel that computes each element as its reference
kernel does (GELU, the head split and merge, the cross-entropy gradient, the embedding) must also give the
reference kernel's bits, on the same inputs; those kernels are run on odd sizes and on arrays one float off a
16-byte boundary too, which take their scalar paths.
"""
import functools

import numpy as np
import pytest

from microgpt import kernels
from microgpt import ops as O
from microgpt import reference as R
from microgpt.kernels import rows_fast
from microgpt.ops import VARIANTS

from helpers import record, rel_err

pytestmark = pytest.mark.gpu

ELEMENTWISE = 1e-6
REDUCTION = 1e-5

# (B, T, C, NH, V): T=1, T=7, small odd widths, and andrea-120m widths at T=1024
SHAPES = {
    "B1-T1": (1, 1, 20, 4, 37),
    "B2-T7-odd": (2, 7, 20, 4, 37),
    "B3-T33-odd": (3, 33, 36, 3, 101),
    "andrea-120m-T1024": (1, 1024, 768, 12, 8449),
}


def close(kernel, out, ref, tol, variant="reference", err=None):
    """||out - ref|| / ||ref|| below tol (or a given err, a relative error measured otherwise), recorded."""
    kernel = kernel if variant == "reference" else f"{kernel}_{variant}"
    err = rel_err(out, ref) if err is None else err
    record("kernels vs reference (float64)", kernel, err)
    assert err < tol, f"{kernel}: relative error {err:.2e} >= {tol:.0e}"


def close_mean(kernel, mean, ref_mean, x, variant):
    """A row mean's error measured on the centred rows x - mean, whose size the layernorm's output scales by:
    relative to itself, a mean near 0 (a sum that cancels) would be ill-conditioned and fail on chance."""
    x = x.astype(np.float64)
    close(kernel, x - mean[..., None].astype(np.float64), x - ref_mean[..., None], REDUCTION, variant)


def close_dx(kernel, dx, ref_dx, dout, w, rstd, variant):
    """A layernorm's dx measured against the size of the terms it is the difference of, rstd * dout * w: dx
    sums to 0 over a row, and on short rows (C = 3) its own norm can be far below its inputs' rounding."""
    terms = np.linalg.norm(rstd[..., None] * dout.astype(np.float64) * w.astype(np.float64))
    err = np.linalg.norm(np.asarray(dx, np.float64) - ref_dx) / terms if np.all(np.isfinite(dx)) else np.inf
    close(kernel, dx, ref_dx, REDUCTION, variant, err=err)


@pytest.fixture(scope="module")
def K():
    kernels.engine()  # compiled, in the primary context, before the first allocation
    return kernels


@pytest.fixture(scope="module")
def ga():
    import pycuda.gpuarray as ga
    return ga


@pytest.fixture(params=list(SHAPES), ids=list(SHAPES))
def shape(request):
    return SHAPES[request.param]


VARIANT = pytest.mark.parametrize("variant", list(VARIANTS))
FAST = pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "reference"])


class Shifted:
    """A device array `offset` elements past the start of its own allocation (offset 1: off a 16-byte boundary),
    by __cuda_array_interface__ as the launchers take arrays, with get() and set() as a GPUArray's."""

    def __init__(self, ga, host, offset):
        self._base = ga.empty(host.size + offset, host.dtype)  # kept: the memory lives as long as this
        self.shape, self.dtype = host.shape, host.dtype
        self.ptr = int(self._base.gpudata) + offset * host.itemsize
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "strides": None,
                                         "data": (self.ptr, False), "version": 3}
        self.set(host)

    def set(self, host):
        kernels.engine().cuda.memcpy_htod(self.ptr, np.ascontiguousarray(host, self.dtype))

    def get(self):
        out = np.empty(self.shape, self.dtype)
        kernels.engine().cuda.memcpy_dtoh(out, self.ptr)
        return out


class Dev:
    """Device arrays for one test: inputs uploaded as float32, outputs poisoned; offset=n places an array n
    elements past an aligned start (a Shifted array)."""

    def __init__(self, ga, rng):
        self.ga, self.rng = ga, rng

    def upload(self, host, offset=0):
        return self.ga.to_gpu(host) if offset == 0 else Shifted(self.ga, host, offset)

    def randn(self, *shape, scale=1.0, offset=0):
        host = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return host, self.upload(host, offset)

    def ints(self, high, *shape):
        host = self.rng.integers(0, high, size=shape).astype(np.int32)
        return host, self.ga.to_gpu(host)

    def poisoned(self, *shape, dtype=np.float32, offset=0):
        if offset:
            return Shifted(self.ga, np.full(shape, np.nan, dtype), offset)
        a = self.ga.empty(shape, dtype)
        a.fill(np.nan)
        return a


@pytest.fixture
def dev(ga, rng):
    return Dev(ga, rng)


def f64(*arrays):
    return [a.astype(np.float64) for a in arrays]


def same_bits(name, out, ref):
    assert out.shape == ref.shape, (name, out.shape, ref.shape)
    differ = int((out.view(np.uint32) != ref.view(np.uint32)).sum())
    assert differ == 0, f"{name}: {differ} of {ref.size} elements differ from the reference kernel's bits"


def same_as_reference(K, dev, op, variant, outs, *inputs, **kw):
    """Runs op's reference launcher on the same inputs into fresh poisoned outputs shaped as `outs` (the
    variant's outputs, which come first in every launcher) and holds the variant's outputs to its bits; where
    the variant runs the reference launcher itself, there is nothing to compare."""
    if O.launcher(op, variant) is O.launcher(op, "reference"):
        return
    refs = [dev.poisoned(*o.shape) for o in outs]
    O.launcher(op, "reference")(*refs, *inputs, **kw)
    for o, r in zip(outs, refs):
        same_bits(O.launcher(op, variant).__name__, o.get(), r.get())


# ---------------------------------------------------------------------------------------------- embedding
@VARIANT
def test_embed_fwd(K, dev, shape, variant):
    B, T, C, NH, V = shape
    idx_h, idx = dev.ints(V, B, T)
    wte_h, wte = dev.randn(V, C)
    wpe_h, wpe = dev.randn(T + 3, C)  # wpe longer than T, as block_size is
    x = dev.poisoned(B, T, C)
    O.launcher("embed_fwd", variant)(x, idx, wte, wpe)
    close("k_embed_fwd", x.get(), R.embed_fwd(idx_h, *f64(wte_h, wpe_h)), ELEMENTWISE, variant)
    same_as_reference(K, dev, "embed_fwd", variant, [x], idx, wte, wpe)


def check_embed_bwd(K, dev, variant, idx_h, C, V, T_max, offsets=(0, 0, 0)):
    """embed_bwd in `variant` from random dwte, dwpe (which it adds into) against float64, and against the reference
    kernel's bits from the same start (the fast kernel adds in its order); offsets: of dwte, dwpe and dx."""
    B, T = idx_h.shape
    idx, order = dev.ga.to_gpu(idx_h), dev.ga.to_gpu(K.token_order(idx_h))
    dx_h, dx = dev.randn(B, T, C, offset=offsets[2])
    dwte0, dwte = dev.randn(V, C, offset=offsets[0])
    dwpe0, dwpe = dev.randn(T_max, C, offset=offsets[1])
    O.launcher("embed_bwd", variant)(dwte, dwpe, dx, idx, order)
    ref_dwte, ref_dwpe = R.embed_bwd(dx_h.astype(np.float64), idx_h, V, T_max)
    got_wte, got_wpe = dwte.get(), dwpe.get()
    close("k_embed_bwd", got_wte, dwte0 + ref_dwte, REDUCTION, variant)
    close("k_embed_bwd", got_wpe, dwpe0 + ref_dwpe, REDUCTION, variant)
    same_bits("dwpe past T", got_wpe[T:], dwpe0[T:])  # not touched
    if O.launcher("embed_bwd", variant) is not O.launcher("embed_bwd", "reference"):
        ref_wte, ref_wpe = dev.upload(dwte0, offsets[0]), dev.upload(dwpe0, offsets[1])
        K.embed_bwd(ref_wte, ref_wpe, dx, idx, order)
        same_bits(f"embed_bwd_{variant} dwte", got_wte, ref_wte.get())
        same_bits(f"embed_bwd_{variant} dwpe", got_wpe, ref_wpe.get())


@VARIANT
def test_embed_bwd(K, dev, shape, variant):
    B, T, C, NH, V = shape
    idx_h = dev.rng.integers(0, V, (B, T)).astype(np.int32)
    idx_h[0, : min(T, 3)] = 5  # repeated tokens scatter into one row
    check_embed_bwd(K, dev, variant, idx_h, C, V, T + 3)

    # without the order (computed from idx), and deterministic: the same sums bit for bit
    idx = dev.ga.to_gpu(idx_h)
    dx_h, dx = dev.randn(B, T, C)
    dwte0, dwte = dev.randn(V, C)
    dwpe0, dwpe = dev.randn(T + 3, C)
    bwd = O.launcher("embed_bwd", variant)
    bwd(dwte, dwpe, dx, idx)
    once_wte, once_wpe = dwte.get(), dwpe.get()
    dwte.set(dwte0)
    dwpe.set(dwpe0)
    bwd(dwte, dwpe, dx, idx, dev.ga.to_gpu(K.token_order(idx_h)))
    same_bits("dwte, run again", dwte.get(), once_wte)
    same_bits("dwpe, run again", dwpe.get(), once_wpe)
    if B * T > 1:
        with pytest.raises(ValueError, match="order must be token_order"):
            bwd(dwte, dwpe, dx, idx, dev.ga.to_gpu(K.token_order(idx_h).ravel()[::-1].reshape(B, T).copy()))


def embed_tokens(rng, kind, B, T, V):
    """Token ids (B, T): 'random'; 'same' (every position one token: one run of B * T); 'blocks' (runs of 45,
    across the kernel's windows of 32 sorted positions); 'few' (a handful of tokens, runs of about B * T / 3)."""
    if kind == "random":
        ids = rng.integers(0, V, (B, T))
    elif kind == "same":
        ids = np.full((B, T), rng.integers(0, V))
    elif kind == "blocks":
        ids = (np.arange(B * T) // 45 * 7919 % V).reshape(B, T)
    else:
        ids = rng.integers(0, min(V, 3), (B, T))
    return ids.astype(np.int32)


# C = 1, odd, even but not a multiple of 4, just past one warp's 128 columns; B = 1; T below T_max; long runs
# (every position one token, at andrea-120m's shape too); arrays off a 16-byte boundary (offsets of dwte, dwpe,
# dx: either part on its scalar path, or both); andrea-120m's batch (B=8, T=1024, C=768) at V 8449 and 50257
@FAST
@pytest.mark.parametrize("B,T,C,V,T_max,tokens,offsets", [
    (1, 1, 1, 1, 1, "random", (0, 0, 0)),
    (1, 5, 1, 3, 9, "random", (0, 0, 0)),
    (2, 7, 5, 37, 10, "random", (0, 0, 0)),
    (3, 33, 6, 101, 40, "random", (0, 0, 0)),
    (2, 33, 20, 101, 40, "random", (1, 1, 1)),
    (2, 33, 20, 101, 33, "random", (1, 0, 0)),
    (2, 33, 20, 101, 33, "random", (0, 3, 0)),
    (2, 33, 20, 101, 33, "random", (0, 0, 2)),
    (4, 100, 132, 3, 120, "same", (0, 0, 0)),
    (3, 97, 260, 50, 97, "blocks", (0, 0, 0)),
    (3, 97, 258, 50, 100, "blocks", (0, 0, 0)),
    (5, 61, 36, 9, 64, "few", (0, 0, 0)),
    (1, 1024, 768, 8449, 1024, "random", (0, 0, 0)),
    (8, 1024, 768, 8449, 1024, "random", (0, 0, 0)),
    (8, 1024, 768, 50257, 1024, "random", (0, 0, 0)),
    (8, 1024, 768, 50257, 1024, "same", (0, 0, 0)),
    (8, 1024, 768, 8449, 1024, "few", (1, 1, 1)),
])
def test_embed_bwd_on_odd_shapes_long_runs_and_unaligned_arrays(K, dev, variant, B, T, C, V, T_max, tokens, offsets):
    check_embed_bwd(K, dev, variant, embed_tokens(dev.rng, tokens, B, T, V), C, V, T_max, offsets)


def test_token_ids_outside_the_vocabulary_are_refused_before_launch(K, dev):
    idx_h, idx = dev.ints(10, 2, 3)
    idx_h[1, 2] = 10
    idx.set(idx_h)
    _, wte = dev.randn(10, 4)
    _, wpe = dev.randn(3, 4)
    x = dev.poisoned(2, 3, 4)
    with pytest.raises(ValueError, match=r"idx holds token id 10, outside \[0, 10\)"):
        K.embed_fwd(x, idx, wte, wpe)
    assert np.isnan(x.get()).all()  # nothing ran
    idx_h[1, 2] = -3
    idx.set(idx_h)
    losses, probs = dev.poisoned(2, 3), dev.poisoned(2, 3, 10)
    _, logits = dev.randn(2, 3, 10)
    with pytest.raises(ValueError, match="targets holds token id -3"):
        K.crossentropy_fwd(losses, probs, logits, idx)
    assert np.isnan(probs.get()).all()


# ---------------------------------------------------------------------------------------------- layernorm


@VARIANT
def test_layernorm(K, dev, shape, variant):
    B, T, C, NH, V = shape
    x_h, x = dev.randn(B, T, C, scale=2.0)
    x_h += 1.5
    x.set(x_h)
    w_h, w = dev.randn(C)
    b_h, b = dev.randn(C)
    out, mean, rstd = dev.poisoned(B, T, C), dev.poisoned(B, T), dev.poisoned(B, T)
    O.launcher("layernorm_fwd", variant)(out, mean, rstd, x, w, b)
    ref, ref_mean, ref_rstd = R.layernorm_fwd(*f64(x_h, w_h, b_h))
    close("k_layernorm_fwd", out.get(), ref, REDUCTION, variant)
    close_mean("k_layernorm_fwd", mean.get(), ref_mean, x_h, variant)
    close("k_layernorm_fwd", rstd.get(), ref_rstd, REDUCTION, variant)

    dout_h, dout = dev.randn(B, T, C)
    dx = dev.poisoned(B, T, C)
    dw0, dw = dev.randn(C)
    db0, db = dev.randn(C)
    O.launcher("layernorm_bwd", variant)(dx, dw, db, dout, x, w, mean, rstd)
    rdx, rdw, rdb = R.layernorm_bwd(*f64(dout_h, x_h, w_h), ref_mean, ref_rstd)
    close_dx("k_layernorm_bwd", dx.get(), rdx, dout_h, w_h, ref_rstd, variant)
    close("k_layernorm_bwd", dw.get(), dw0 + rdw, REDUCTION, variant)
    close("k_layernorm_bwd", db.get(), db0 + rdb, REDUCTION, variant)


@VARIANT
def test_residual_layernorm_and_the_backward_that_adds_into_dx(K, dev, shape, variant):
    """The residual add fused with the layernorm that reads its sum gives what the two kernels give, bit for
    bit (the same roundings); layernorm_bwd(accumulate=True) adds into dx exactly what it would write, as
    the residual add after it did."""
    B, T, C, NH, V = shape
    r_h, resid = dev.randn(B, T, C, scale=2.0)
    d_h, branch = dev.randn(B, T, C)
    w_h, w = dev.randn(C)
    b_h, b = dev.randn(C)
    x, out, mean, rstd = dev.poisoned(B, T, C), dev.poisoned(B, T, C), dev.poisoned(B, T), dev.poisoned(B, T)
    O.launcher("residual_layernorm_fwd", variant)(x, out, mean, rstd, resid, branch, w, b)
    x_h = r_h + d_h  # float32, rounded as the kernel rounds
    np.testing.assert_array_equal(x.get(), x_h)
    ref, ref_mean, ref_rstd = R.layernorm_fwd(*f64(x_h, w_h, b_h))
    close("k_residual_layernorm_fwd", out.get(), ref, REDUCTION, variant)
    close_mean("k_residual_layernorm_fwd", mean.get(), ref_mean, x_h, variant)
    close("k_residual_layernorm_fwd", rstd.get(), ref_rstd, REDUCTION, variant)
    apart = [dev.poisoned(B, T, C), dev.poisoned(B, T), dev.poisoned(B, T)]
    O.launcher("layernorm_fwd", variant)(*apart, x, w, b)
    for fused, separate in zip((out, mean, rstd), apart):
        np.testing.assert_array_equal(fused.get(), separate.get())

    dout_h, dout = dev.randn(B, T, C)
    dx0_h, dx = dev.randn(B, T, C)
    (_, dw), (_, db) = dev.randn(C), dev.randn(C)
    O.launcher("layernorm_bwd", variant)(dx, dw, db, dout, x, w, mean, rstd, accumulate=True)
    written, summed = dev.poisoned(B, T, C), dev.poisoned(B, T, C)
    O.launcher("layernorm_bwd", variant)(written, dw, db, dout, x, w, mean, rstd)
    K.residual_fwd(summed, dev.ga.to_gpu(dx0_h), written)
    np.testing.assert_array_equal(dx.get(), summed.get())
    rdx = R.layernorm_bwd(*f64(dout_h, x_h, w_h), ref_mean, ref_rstd)[0]
    close_dx("k_layernorm_bwd_accumulate", dx.get() - dx0_h, rdx, dout_h, w_h, ref_rstd, variant)


# rows of every path of the fast kernels: held in registers (16-byte chunks, up to 1024 columns) or looped over
# (longer rows, C % 4 != 0, or the row arrays one float off a 16-byte boundary: offset); rows of 1 to 3
# columns, whose dx is 0 or nearly (close_dx measures it against its terms).
@VARIANT
@pytest.mark.parametrize("N,C,offset", [(7, 20, 0), (7, 1030, 0), (7, 1028, 0), (33, 1024, 0), (5, 3, 0), (3, 5, 1),
                                        (9, 1536, 0), (7, 20, 1), (7, 64, 1), (3, 2052, 1), (4, 1, 0), (4, 2, 1)])
def test_layernorms_on_rows_of_any_length_and_alignment(K, dev, variant, N, C, offset):
    r_h, resid = dev.randn(N, C, scale=2.0, offset=offset)
    d_h, branch = dev.randn(N, C, offset=offset)
    w_h, w = dev.randn(C)
    b_h, b = dev.randn(C)
    x, out = dev.poisoned(N, C, offset=offset), dev.poisoned(N, C, offset=offset)
    mean, rstd = dev.poisoned(N), dev.poisoned(N)
    O.launcher("residual_layernorm_fwd", variant)(x, out, mean, rstd, resid, branch, w, b)
    x_h = r_h + d_h
    np.testing.assert_array_equal(x.get(), x_h)
    ref, ref_mean, ref_rstd = R.layernorm_fwd(*f64(x_h, w_h, b_h))
    close("k_residual_layernorm_fwd", out.get(), ref, REDUCTION, variant)
    close_mean("k_residual_layernorm_fwd", mean.get(), ref_mean, x_h, variant)
    close("k_residual_layernorm_fwd", rstd.get(), ref_rstd, REDUCTION, variant)
    apart = [dev.poisoned(N, C, offset=offset), dev.poisoned(N), dev.poisoned(N)]
    O.launcher("layernorm_fwd", variant)(*apart, x, w, b)  # the same path: the same bits
    for fused, separate in zip((out, mean, rstd), apart):
        np.testing.assert_array_equal(fused.get(), separate.get())

    dout_h, dout = dev.randn(N, C, offset=offset)
    check_layernorm_bwd(K, dev, variant, dout_h, dout, x_h, x, w_h, w, mean, rstd, offset)


def sum_error(out, ref, abs_terms, n):
    """The relative error of column sums over n rows, ||out - ref|| / ||ref||, but never over less than the size of
    a sum of n terms of random sign (the norm of the columns' sums of |term| over sqrt(n)): over many columns the
    two agree, while one column whose terms happened to cancel (C = 1 or 3: a sum of 4099 normals that came out near
    0) is held to the rounding its terms' size gives, not to its own small value."""
    ref = np.asarray(ref, np.float64)
    scale = max(np.linalg.norm(ref), np.linalg.norm(abs_terms) / np.sqrt(n))
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / scale
    return float(err) if np.isfinite(err) else np.inf


def check_layernorm_bwd(K, dev, variant, dout_h, dout, x_h, x, w_h, w, mean, rstd, offset=0):
    """layernorm_bwd in `variant`, dx written (into NaN) and added into, dw and db added into random starts:
    against float64 from the mean and rstd it reads (the forward's, whose own error its test measures: where a
    row's values nearly agree, the float32 mean's rounding moves that row's xhat far more than the backward's
    own rounding does); then run again from the same starts: the same bits."""
    N, C = x_h.shape
    ref_mean, ref_rstd = f64(mean.get(), rstd.get())
    rdx, rdw, rdb = R.layernorm_bwd(*f64(dout_h, x_h, w_h), ref_mean, ref_rstd)
    bwd = O.launcher("layernorm_bwd", variant)
    for accumulate in (False, True):
        dx0_h = dev.rng.standard_normal((N, C)).astype(np.float32)
        dw0, db0 = dev.rng.standard_normal(C).astype(np.float32), dev.rng.standard_normal(C).astype(np.float32)
        runs = []
        for _ in range(2):
            dx = dev.upload(dx0_h, offset) if accumulate else dev.poisoned(N, C, offset=offset)
            dw, db = dev.upload(dw0), dev.upload(db0)
            bwd(dx, dw, db, dout, x, w, mean, rstd, accumulate=accumulate)
            runs.append((dx.get(), dw.get(), db.get()))
        (dx_a, dw_a, db_a), again = runs
        kernel = "k_layernorm_bwd" + "_accumulate" * accumulate
        close_dx(kernel, dx_a - dx0_h if accumulate else dx_a, rdx, dout_h, w_h, ref_rstd, variant)
        xhat = (x_h.astype(np.float64) - ref_mean[:, None]) * ref_rstd[:, None]
        terms_w, terms_b = np.abs(dout_h * xhat).sum(0), np.abs(dout_h.astype(np.float64)).sum(0)
        close(kernel, None, None, REDUCTION, variant, err=sum_error(dw_a, dw0 + rdw, np.abs(dw0) + terms_w, N))
        close(kernel, None, None, REDUCTION, variant, err=sum_error(db_a, db0 + rdb, np.abs(db0) + terms_b, N))
        for name, a, b in zip(("dx", "dw", "db"), (dx_a, dw_a, db_a), again):
            same_bits(f"{kernel} {name}, run again", b, a)


# The fast backward's blocks (bwd_rows_per_block of N: a multiple of the 4 rows a block takes at once, at most
# BWD_BLOCKS blocks): fewer rows than a block takes at once (N = 3), a block whose last rows are missing (N = 9,
# 2049, 8197: N not a multiple of a block's rows), many rows a block (8192: 16 a block, andrea-120m's B = 8,
# T = 1024); rows a block of threads spans (C <= 4096: 20, 36, 768, 1024, 1030, 1536, 3000), in 16-byte chunks
# (C % 4 == 0 and aligned) or single floats (C = 1, 3, 1030, or the arrays one float off a 16-byte boundary),
# and rows wider than a block's 1024 threads span (4100: k_layernorm_bwd_fast_wide)
@VARIANT
@pytest.mark.parametrize("N,C,offset", [(3, 20, 0), (9, 36, 0), (2049, 20, 0), (8197, 36, 0), (8192, 768, 0),
                                        (8197, 768, 1), (2049, 1024, 0), (2100, 1030, 0), (1000, 1536, 0),
                                        (300, 3000, 0), (300, 3000, 1), (37, 4100, 0), (37, 4100, 1), (4099, 1, 0),
                                        (4099, 3, 1)])
def test_layernorm_bwd_over_many_rows_a_block(K, dev, variant, N, C, offset):
    x_h, x = dev.randn(N, C, scale=2.0, offset=offset)
    x_h += 1.5
    x.set(x_h)
    w_h, w = dev.randn(C)
    b_h, b = dev.randn(C)
    out, mean, rstd = dev.poisoned(N, C, offset=offset), dev.poisoned(N), dev.poisoned(N)
    O.launcher("layernorm_fwd", variant)(out, mean, rstd, x, w, b)
    dout_h, dout = dev.randn(N, C, offset=offset)
    check_layernorm_bwd(K, dev, variant, dout_h, dout, x_h, x, w_h, w, mean, rstd, offset)


# dw and db of the fast backward are added in one order whatever the loads: each thread owns 4 columns, whose
# shares it adds row after row, then the blocks' partial rows in a fixed order; so the same bits from rows in
# 16-byte chunks or in single floats (the same data one float off a 16-byte boundary), whatever shared memory the
# device would allow (forced to none here: nothing may depend on it); dx too where the row takes the same path
@FAST
@pytest.mark.parametrize("N,C", [(9, 20), (2049, 36), (8192, 768), (300, 1536), (37, 1030)])
def test_layernorm_bwd_fast_dw_db_bits_do_not_depend_on_the_path(K, dev, variant, monkeypatch, N, C):
    x_h = (dev.rng.standard_normal((N, C)) * 2 + 1.5).astype(np.float32)
    dout_h = dev.rng.standard_normal((N, C)).astype(np.float32)
    w_h = dev.rng.standard_normal(C).astype(np.float32)
    _, mean_h, rstd_h = (a.astype(np.float32) for a in R.layernorm_fwd(*f64(x_h, w_h, w_h)))
    w, mean, rstd = dev.upload(w_h), dev.upload(mean_h), dev.upload(rstd_h)

    def run(offset, accumulate):
        dx = dev.upload(dout_h, offset) if accumulate else dev.poisoned(N, C, offset=offset)
        dw, db = dev.upload(w_h), dev.upload(w_h)
        O.launcher("layernorm_bwd", variant)(dx, dw, db, dev.upload(dout_h, offset), dev.upload(x_h, offset), w, mean,
                                             rstd, accumulate=accumulate)
        return dx.get(), dw.get(), db.get()

    for accumulate in (False, True):
        aligned, unaligned = run(0, accumulate), run(1, accumulate)
        monkeypatch.setattr(K.engine(), "max_shared", 0)
        global_aligned, global_unaligned = run(0, accumulate), run(1, accumulate)
        monkeypatch.undo()
        for other in (unaligned, global_aligned, global_unaligned):
            same_bits("dw", other[1], aligned[1])
            same_bits("db", other[2], aligned[2])
        same_bits("dx, unaligned, partials in global memory", global_unaligned[0], unaligned[0])
        if C > 1024 or C % 4:  # aligned rows loop over 16-byte chunks with either home of the partials
            same_bits("dx, partials in global memory", global_aligned[0], aligned[0])


# ---------------------------------------------------------------------------------------------- matmul
@VARIANT
@pytest.mark.parametrize("layer", ["qkv", "fc", "proj", "lm_head"])
def test_matmul(K, dev, shape, layer, variant):
    B, T, C, NH, V = shape
    IN, OUT = {"qkv": (C, 3 * C), "fc": (C, 4 * C), "proj": (4 * C, C), "lm_head": (C, V)}[layer]
    has_bias = layer != "lm_head"  # the tied output projection has no bias
    x_h, x = dev.randn(B, T, IN)
    w_h, w = dev.randn(OUT, IN, scale=0.05)
    b_h, b = dev.randn(OUT) if has_bias else (None, None)
    out = dev.poisoned(B, T, OUT)
    O.launcher("matmul_fwd", variant)(out, x, w, b)
    ref = R.linear_fwd(*f64(x_h, w_h), None if b_h is None else b_h.astype(np.float64))
    close("k_matmul_fwd", out.get(), ref, REDUCTION, variant)

    dout_h, dout = dev.randn(B, T, OUT)
    dx = dev.poisoned(B, T, IN)
    dw0, dw = dev.randn(OUT, IN)
    db0, db = dev.randn(OUT) if has_bias else (None, None)
    O.launcher("matmul_bwd", variant)(dx, dw, db, dout, x, w)
    rdx, rdw, rdb = R.linear_bwd(*f64(dout_h, x_h, w_h))
    close("k_matmul_bwd", dx.get(), rdx, REDUCTION, variant)
    close("k_matmul_bwd", dw.get(), dw0 + rdw, REDUCTION, variant)
    if has_bias:
        close("k_matmul_bwd", db.get(), db0 + rdb, REDUCTION, variant)


# ---------------------------------------------------------------------------------------------- attention
@VARIANT
def test_split_and_merge_heads(K, dev, shape, variant):
    B, T, C, NH, V = shape
    check_split_and_merge_heads(K, dev, variant, B, T, NH, C // NH)


def check_split_and_merge_heads(K, dev, variant, B, T, NH, d_k, offset=0):
    """The four head shuffles against float64 and the reference kernels; `offset` places an input and one
    output of each off a 16-byte boundary."""
    C = NH * d_k
    ops = O.select(variant)
    qkv_h, qkv = dev.randn(B, T, 3 * C, offset=offset)
    q, k, v = (dev.poisoned(B, NH, T, d_k, offset=offset if i == 1 else 0) for i in range(3))
    ops.split_heads_fwd(q, k, v, qkv, NH)
    for got, want in zip((q, k, v), R.split_heads_fwd(qkv_h.astype(np.float64), NH)):
        close("k_split_heads_fwd", got.get(), want, ELEMENTWISE, variant)
    same_as_reference(K, dev, "split_heads_fwd", variant, [q, k, v], qkv, NH)

    dq_h, dq = dev.randn(B, NH, T, d_k, offset=offset)
    dk_h, dk = dev.randn(B, NH, T, d_k)
    dv_h, dv = dev.randn(B, NH, T, d_k)
    dqkv = dev.poisoned(B, T, 3 * C, offset=offset)
    ops.split_heads_bwd(dqkv, dq, dk, dv)
    close("k_split_heads_bwd", dqkv.get(), R.split_heads_bwd(*f64(dq_h, dk_h, dv_h)), ELEMENTWISE, variant)
    same_as_reference(K, dev, "split_heads_bwd", variant, [dqkv], dq, dk, dv)

    heads_h, heads = dev.randn(B, NH, T, d_k, offset=offset)
    y = dev.poisoned(B, T, C)
    ops.merge_heads_fwd(y, heads)
    close("k_merge_heads_fwd", y.get(), R.merge_heads_fwd(heads_h.astype(np.float64)), ELEMENTWISE, variant)
    same_as_reference(K, dev, "merge_heads_fwd", variant, [y], heads)
    dy_h, dy = dev.randn(B, T, C)
    dheads = dev.poisoned(B, NH, T, d_k, offset=offset)
    ops.merge_heads_bwd(dheads, dy, NH)
    close("k_merge_heads_bwd", dheads.get(), R.merge_heads_bwd(dy_h.astype(np.float64), NH), ELEMENTWISE, variant)
    same_as_reference(K, dev, "merge_heads_bwd", variant, [dheads], dy, NH)


# heads whose rows are 16-byte chunks or not (d_k % 4), narrower and wider than a block's 256 threads, one
# float off a 16-byte boundary (the scalar path), a last pass of rows that fills part of the block
@FAST
@pytest.mark.parametrize("B,T,NH,d_k,offset", [(2, 33, 3, 12, 0), (2, 33, 3, 12, 1), (1, 7, 3, 5, 0),
                                               (3, 70, 2, 300, 0), (1, 5, 1, 1028, 0), (1, 5, 2, 1030, 0),
                                               (1, 1, 1, 1, 0), (2, 9, 2, 64, 1)])
def test_head_shuffles_on_odd_and_unaligned_arrays(K, dev, variant, B, T, NH, d_k, offset):
    check_split_and_merge_heads(K, dev, variant, B, T, NH, d_k, offset)


def test_attn_scores(K, dev, shape):
    B, T, C, NH, V = shape
    d_k = C // NH
    q_h, q = dev.randn(B, NH, T, d_k)
    k_h, k = dev.randn(B, NH, T, d_k)
    scores = dev.poisoned(B, NH, T, T)
    K.attn_scores_fwd(scores, q, k)
    close("k_attn_scores_fwd", scores.get(), R.attn_scores_fwd(*f64(q_h, k_h)), REDUCTION)

    ds_h, ds = dev.randn(B, NH, T, T)
    dq, dk = dev.poisoned(B, NH, T, d_k), dev.poisoned(B, NH, T, d_k)
    K.attn_scores_bwd(dq, dk, ds, q, k)
    rdq, rdk = R.attn_scores_bwd(*f64(ds_h, q_h, k_h))
    close("k_attn_scores_bwd", dq.get(), rdq, REDUCTION)
    close("k_attn_scores_bwd", dk.get(), rdk, REDUCTION)


def test_causal_mask(K, dev, shape, ga):
    B, T, C, NH, V = shape
    s_h, s = dev.randn(B, NH, T, T)
    out = dev.poisoned(B, NH, T, T)
    K.causal_mask_fwd(out, s)
    close("k_causal_mask_fwd", out.get(), R.causal_mask_fwd(s_h.astype(np.float64)), ELEMENTWISE)
    K.causal_mask_fwd(s, s)  # in place, as the engine masks
    np.testing.assert_array_equal(s.get(), out.get())

    d_h, d = dev.randn(B, NH, T, T)
    ds = dev.poisoned(B, NH, T, T)
    K.causal_mask_bwd(ds, d)
    close("k_causal_mask_bwd", ds.get(), R.causal_mask_bwd(d_h.astype(np.float64)), ELEMENTWISE)


@VARIANT
@pytest.mark.parametrize("causal", [False, True], ids=["rows", "causal"])
def test_softmax(K, dev, shape, variant, causal):
    B, T, C, NH, V = shape
    x_h, x = dev.randn(B, NH, T, T, scale=3.0)
    x_h = R.causal_mask_fwd(x_h)  # the rows the engine feeds it: masked scores
    x.set(x_h)
    p = dev.poisoned(B, NH, T, T)
    O.launcher("softmax_fwd", variant)(p, x, causal=causal)
    ref = R.softmax_fwd(x_h.astype(np.float64))
    close("k_softmax_fwd" + "_causal" * causal, p.get(), ref, REDUCTION, variant)
    np.testing.assert_allclose(p.get().sum(-1), 1.0, atol=1e-5)

    dp_h, dp = dev.randn(B, NH, T, T)
    dx = dev.poisoned(B, NH, T, T)
    O.launcher("softmax_bwd", variant)(dx, dp, p, causal=causal)
    close("k_softmax_bwd" + "_causal" * causal, dx.get(),
          R.softmax_bwd(dp_h.astype(np.float64), p.get().astype(np.float64)), REDUCTION, variant)
    if causal:  # never read above the diagonal, and written 0 there
        upper = np.triu(np.ones((T, T), bool), 1)
        assert not p.get()[..., upper].any() and not dx.get()[..., upper].any()


# rows of every length class of the fast kernel: a few columns, not a multiple of 4 (one float a load),
# a multiple of 4 (16-byte loads), up to and past the 1024 columns that the registers hold
@VARIANT
@pytest.mark.parametrize("cols", [1, 5, 36, 1000, 1023, 1024, 1025, 1028, 3000])
def test_softmax_rows_of_any_length(K, dev, variant, cols):
    x_h, x = dev.randn(3, 5, cols, scale=4.0)
    p = dev.poisoned(3, 5, cols)
    O.launcher("softmax_fwd", variant)(p, x)
    close("k_softmax_fwd", p.get(), R.softmax_fwd(x_h.astype(np.float64)), REDUCTION, variant)
    dp_h, dp = dev.randn(3, 5, cols)
    dx = dev.poisoned(3, 5, cols)
    O.launcher("softmax_bwd", variant)(dx, dp, p)
    close("k_softmax_bwd", dx.get(), R.softmax_bwd(dp_h.astype(np.float64), p.get().astype(np.float64)),
          REDUCTION, variant)


# causal matrices whose late rows pass the registers' 1024 columns, of odd and even T
@VARIANT
@pytest.mark.parametrize("T", [1030, 1100, 2048])
def test_causal_softmax_long_rows(K, dev, variant, T):
    x_h, x = dev.randn(1, 2, T, T, scale=3.0)
    x_h = R.causal_mask_fwd(x_h)
    x.set(x_h)
    p = dev.poisoned(1, 2, T, T)
    O.launcher("softmax_fwd", variant)(p, x, causal=True)
    close("k_softmax_fwd_causal", p.get(), R.softmax_fwd(x_h.astype(np.float64)), REDUCTION, variant)
    dp_h, dp = dev.randn(1, 2, T, T)
    dx = dev.poisoned(1, 2, T, T)
    O.launcher("softmax_bwd", variant)(dx, dp, p, causal=True)
    close("k_softmax_bwd_causal", dx.get(),
          R.softmax_bwd(dp_h.astype(np.float64), p.get().astype(np.float64)), REDUCTION, variant)


def test_attn_values(K, dev, shape, rng):
    B, T, C, NH, V = shape
    d_k = C // NH
    p_h = R.softmax_fwd(R.causal_mask_fwd(rng.standard_normal((B, NH, T, T)))).astype(np.float32)
    p = dev.ga.to_gpu(p_h)
    v_h, v = dev.randn(B, NH, T, d_k)
    out = dev.poisoned(B, NH, T, d_k)
    K.attn_values_fwd(out, p, v)
    close("k_attn_values_fwd", out.get(), R.attn_values_fwd(*f64(p_h, v_h)), REDUCTION)

    do_h, do = dev.randn(B, NH, T, d_k)
    dp, dv = dev.poisoned(B, NH, T, T), dev.poisoned(B, NH, T, d_k)
    K.attn_values_bwd(dp, dv, do, p, v)
    rdp, rdv = R.attn_values_bwd(*f64(do_h, p_h, v_h))
    close("k_attn_values_bwd", dp.get(), rdp, REDUCTION)
    close("k_attn_values_bwd", dv.get(), rdv, REDUCTION)


# ---------------------------------------------------------------------------------------------- fast attention
def causal_probs(rng, B, NH, T):
    return R.softmax_fwd(R.causal_mask_fwd(rng.standard_normal((B, NH, T, T)) * 2)).astype(np.float32)


@pytest.mark.parametrize("variant", ["fast", "tc"])
def test_attention_fast_variants_match_the_reference_kernels(K, dev, shape, rng, variant):
    """Each fast attention stage against the reference kernel(s) it replaces, on the same inputs, and
    both against the float64 reference."""
    ops = O.select(variant)
    B, T, C, NH, V = shape
    d_k = C // NH
    q_h, q = dev.randn(B, NH, T, d_k)
    k_h, k = dev.randn(B, NH, T, d_k)
    fast, ref = dev.poisoned(B, NH, T, T), dev.poisoned(B, NH, T, T)
    ops.causal_scores_fwd(fast, q, k)  # scores and mask in one
    K.attn_scores_fwd(ref, q, k)
    K.causal_mask_fwd(ref, ref)
    want = R.causal_mask_fwd(R.attn_scores_fwd(*f64(q_h, k_h)))
    close(f"causal_scores_fwd_{variant} vs reference kernels", fast.get(), ref.get(), REDUCTION)
    close(f"causal_scores_fwd_{variant}", fast.get(), want, REDUCTION)
    composite, kept = dev.poisoned(B, NH, T, T), dev.poisoned(B, NH, T, T)
    K.causal_scores_fwd(composite, q, k, scores=kept)  # the reference op: the two literal kernels
    np.testing.assert_array_equal(composite.get(), ref.get())
    close("k_attn_scores_fwd", kept.get(), R.attn_scores_fwd(*f64(q_h, k_h)), REDUCTION)
    with pytest.raises(ValueError, match="scores: the fast variant"):
        ops.causal_scores_fwd(fast, q, k, scores=kept)

    p_h = causal_probs(rng, B, NH, T)
    p = dev.ga.to_gpu(p_h)
    v_h, v = dev.randn(B, NH, T, d_k)
    out_f, out_r = dev.poisoned(B, NH, T, d_k), dev.poisoned(B, NH, T, d_k)
    ops.attn_values_fwd(out_f, p, v)
    K.attn_values_fwd(out_r, p, v)
    close(f"attn_values_fwd_{variant} vs reference kernel", out_f.get(), out_r.get(), REDUCTION)
    close(f"attn_values_fwd_{variant}", out_f.get(), R.attn_values_fwd(*f64(p_h, v_h)), REDUCTION)

    do_h, do = dev.randn(B, NH, T, d_k)
    dp_f, dv_f = dev.poisoned(B, NH, T, T), dev.poisoned(B, NH, T, d_k)
    dp_r, dv_r = dev.poisoned(B, NH, T, T), dev.poisoned(B, NH, T, d_k)
    ops.attn_values_bwd(dp_f, dv_f, do, p, v)
    K.attn_values_bwd(dp_r, dv_r, do, p, v)
    rdp, rdv = R.attn_values_bwd(*f64(do_h, p_h, v_h))
    lower = ~R.causal_mask(T)
    close(f"attn_values_bwd_{variant} vs reference kernel", dp_f.get()[..., lower], dp_r.get()[..., lower], REDUCTION)
    assert np.all(dp_f.get()[..., ~lower] == 0)  # the masked half is written 0, not computed
    close(f"attn_values_bwd_{variant}", dv_f.get(), rdv, REDUCTION)
    close(f"attn_values_bwd_{variant} vs reference kernel", dv_f.get(), dv_r.get(), REDUCTION)

    ds_h = R.causal_mask_bwd(rng.standard_normal((B, NH, T, T))).astype(np.float32)  # causal, as the pipeline's
    ds = dev.ga.to_gpu(ds_h)
    dq_f, dk_f = dev.poisoned(B, NH, T, d_k), dev.poisoned(B, NH, T, d_k)
    dq_r, dk_r = dev.poisoned(B, NH, T, d_k), dev.poisoned(B, NH, T, d_k)
    ops.causal_scores_bwd(dq_f, dk_f, ds, q, k)
    K.attn_scores_bwd(dq_r, dk_r, ds, q, k)
    rdq, rdk = R.attn_scores_bwd(*f64(ds_h, q_h, k_h))
    close(f"causal_scores_bwd_{variant}", dq_f.get(), rdq, REDUCTION)
    close(f"causal_scores_bwd_{variant}", dk_f.get(), rdk, REDUCTION)
    close(f"causal_scores_bwd_{variant} vs reference kernel", dq_f.get(), dq_r.get(), REDUCTION)
    close(f"causal_scores_bwd_{variant} vs reference kernel", dk_f.get(), dk_r.get(), REDUCTION)
    # the reference op masks a gradient that is not causal before the product
    dsr_h, dsr = dev.randn(B, NH, T, T)
    dq_c, dk_c = dev.poisoned(B, NH, T, d_k), dev.poisoned(B, NH, T, d_k)
    K.causal_scores_bwd(dq_c, dk_c, dsr, q, k)
    rdq, rdk = R.attn_scores_bwd(R.causal_mask_bwd(dsr_h.astype(np.float64)), *f64(q_h, k_h))
    close("causal_scores_bwd", dq_c.get(), rdq, REDUCTION)
    close("causal_scores_bwd", dk_c.get(), rdk, REDUCTION)


# odd sizes, batches, the 128 x 64 tile (N <= 64), and split-K (few tiles, long K: 256 x 256 x 4096)
@pytest.mark.parametrize("M,N,K_,batch", [(1, 1, 1, 1), (7, 5, 3, 2), (129, 131, 9, 1), (300, 257, 64, 3),
                                          (1024, 768, 768, 1), (130, 64, 77, 2), (256, 256, 4096, 1),
                                          (200, 130, 2048, 1)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("units", ["simt", "tc"])
def test_sgemm(K, dev, M, N, K_, batch, ta, tb, units):
    sgemm, name = functools.partial(K.sgemm, units=units), "sgemm" if units == "simt" else "sgemm_tc"
    a_h, a = dev.randn(batch, *((K_, M) if ta else (M, K_)))
    b_h, b = dev.randn(batch, *((N, K_) if tb else (K_, N)))
    bias_h, bias = dev.randn(N)
    c0, c = dev.randn(batch, M, N)
    sgemm(c, a, b, trans_a=ta, trans_b=tb, alpha=0.5, beta=1.0, bias=bias)
    A = a_h.astype(np.float64).swapaxes(-1, -2) if ta else a_h.astype(np.float64)
    Bm = b_h.astype(np.float64).swapaxes(-1, -2) if tb else b_h.astype(np.float64)
    close(name, c.get(), 0.5 * (A @ Bm) + bias_h + c0, REDUCTION)
    out = dev.poisoned(batch, M, N)  # beta 0: c is never read, so NaN there does not leak
    sgemm(out, a, b, trans_a=ta, trans_b=tb)
    close(name, out.get(), A @ Bm, REDUCTION)


# ---------------------------------------------------------------------------------------------- pointwise
@VARIANT
def test_gelu(K, dev, shape, variant):
    B, T, C, NH, V = shape
    check_gelu(K, dev, variant, (B, T, 4 * C))


# GELU's tanh form in FP32 rounds 1 + tanh(u) and 1 - tanh(u)^2 where tanh(u) is near -1 or 1: a lone value near
# x = -4 comes out about 1e-4 off its own size (the engine's expression and torch's alike), one near x = 5.4
# about 1e-6. Over thousands of values that stays inside the 1e-6 bound on the norm; an array of a few values is
# held value by value to the size of what multiplies the rounded sums (x / 2 forward, dout backward), within
# LONE_GELU (about 64 ulps). Its bits are also held to the reference kernel's.
LONE_GELU = 8e-6


def gelu_error(out, ref, scale):
    """||out - ref|| / ||ref|| for arrays of thousands of values; for a few, the worst of |out - ref| over the
    larger of |ref| and scale, value by value."""
    if out.size >= 4096:
        return rel_err(out, ref)
    return float(np.max(np.abs(out - ref) / np.maximum(np.abs(ref), np.abs(scale))))


def check_gelu(K, dev, variant, shape, offsets=(0, 0, 0)):
    """GELU forward and backward against float64 and the reference kernels; offsets (of the output, x and
    dout) place arrays off a 16-byte boundary."""
    o_out, o_x, o_d = offsets
    x_h, x = dev.randn(*shape, scale=2.0, offset=o_x)
    tol = ELEMENTWISE if x_h.size >= 4096 else LONE_GELU
    out = dev.poisoned(*shape, offset=o_out)
    O.launcher("gelu_fwd", variant)(out, x)
    ref = R.gelu_fwd(x_h.astype(np.float64))
    close("k_gelu_fwd", None, None, tol, variant, err=gelu_error(out.get(), ref, 0.5 * x_h.astype(np.float64)))
    same_as_reference(K, dev, "gelu_fwd", variant, [out], x)
    d_h, d = dev.randn(*shape, offset=o_d)
    dx = dev.poisoned(*shape, offset=o_out)
    O.launcher("gelu_bwd", variant)(dx, d, x)
    ref = R.gelu_bwd(*f64(d_h, x_h))
    close("k_gelu_bwd", None, None, tol, variant, err=gelu_error(dx.get(), ref, d_h.astype(np.float64)))
    same_as_reference(K, dev, "gelu_bwd", variant, [dx], d, x)


# sizes that leave a partial 16-byte chunk or a partial thread's share, and arrays one float off a 16-byte
# boundary (offsets of out, x, dout)
@FAST
@pytest.mark.parametrize("shape,offsets", [((7, 80), (0, 0, 0)), ((7, 4121), (0, 0, 0)), ((707,), (0, 0, 0)),
                                           ((1,), (0, 0, 0)), ((7, 4120), (1, 1, 1)), ((707,), (0, 1, 0)),
                                           ((5, 3), (3, 2, 1))])
def test_gelu_on_odd_and_unaligned_arrays(K, dev, variant, shape, offsets):
    check_gelu(K, dev, variant, shape, offsets)


def test_residual(K, dev, shape):
    B, T, C, NH, V = shape
    a_h, a = dev.randn(B, T, C)
    b_h, b = dev.randn(B, T, C)
    s = dev.poisoned(B, T, C)
    K.residual_fwd(s, a, b)
    close("k_residual_fwd", s.get(), R.residual_fwd(*f64(a_h, b_h)), ELEMENTWISE)
    da, db = dev.poisoned(B, T, C), dev.poisoned(B, T, C)
    K.residual_bwd(da, db, a)
    rda, rdb = R.residual_bwd(a_h.astype(np.float64))
    close("k_residual_bwd", da.get(), rda, ELEMENTWISE)
    close("k_residual_bwd", db.get(), rdb, ELEMENTWISE)


# ---------------------------------------------------------------------------------------------- cross-entropy
@VARIANT
def test_crossentropy(K, dev, shape, variant):
    B, T, C, NH, V = shape
    lg_h, lg = dev.randn(B, T, V, scale=3.0)
    tg_h, tg = dev.ints(V, B, T)
    losses, probs = dev.poisoned(B, T), dev.poisoned(B, T, V)
    O.launcher("crossentropy_fwd", variant)(losses, probs, lg, tg)
    rl, rp = R.crossentropy_fwd(lg_h.astype(np.float64), tg_h)
    close("k_crossentropy_fwd", losses.get(), rl, REDUCTION, variant)
    close("k_crossentropy_fwd", probs.get(), rp, REDUCTION, variant)

    check_crossentropy_bwd(K, dev, variant, probs.get(), tg_h)


def check_crossentropy_bwd(K, dev, variant, probs_h, tg_h, offsets=(0, 0)):
    """offsets: of dlogits and probs (equal: 16-byte chunks after a few scalar columns; unequal: scalar)."""
    shape = probs_h.shape
    probs, tg = dev.upload(probs_h, offsets[1]), dev.ga.to_gpu(tg_h)
    n = int(np.prod(shape[:-1]))
    dl_h = (np.full(shape[:-1], 1.0 / n) * dev.rng.uniform(0.5, 2.0, shape[:-1])).astype(np.float32)
    dl = dev.ga.to_gpu(dl_h)
    dlogits = dev.poisoned(*shape, offset=offsets[0])
    O.launcher("crossentropy_bwd", variant)(dlogits, probs, tg, dl)
    close("k_crossentropy_bwd", dlogits.get(),
          R.crossentropy_bwd(dl_h.astype(np.float64), probs_h.astype(np.float64), tg_h), ELEMENTWISE, variant)
    same_as_reference(K, dev, "crossentropy_bwd", variant, [dlogits], probs, tg, dl)


# rows of an odd V (each starting at another offset from 16 bytes), one float off (offsets of dlogits and
# probs), one or three columns, and more rows than a grid's 65535 along y (the kernel loops over them)
@FAST
@pytest.mark.parametrize("N,V,offsets", [(7, 101, (0, 0)), (7, 8449, (0, 0)), (7, 8449, (1, 1)), (7, 8449, (1, 0)),
                                         (5, 3, (0, 0)), (5, 1, (2, 2)), (70000, 3, (0, 0))])
def test_crossentropy_bwd_on_odd_and_unaligned_arrays(K, dev, variant, N, V, offsets):
    probs_h = dev.rng.random((N, V)).astype(np.float32)
    check_crossentropy_bwd(K, dev, variant, probs_h, dev.rng.integers(0, V, N).astype(np.int32), offsets)


# the forward on the same odd and unaligned rows (offsets of probs and logits: equal, 16-byte chunks after a
# scalar head; unequal, scalar), rows whose max rises late (ascending logits: the online sum rescaled at every
# batch of a thread's values) and a row with masked (-inf) logits
@FAST
@pytest.mark.parametrize("N,V,offsets", [(7, 101, (0, 0)), (7, 8449, (1, 1)), (7, 8449, (1, 0)), (5, 3, (0, 0)),
                                         (5, 1, (2, 2)), (3, 50257, (0, 0))])
def test_crossentropy_fwd_on_odd_and_unaligned_arrays(K, dev, variant, N, V, offsets):
    lg_h, tg_h = awkward_logits(dev, N, V)
    lg, tg = dev.upload(lg_h, offsets[1]), dev.ga.to_gpu(tg_h)
    losses, probs = dev.poisoned(N), dev.poisoned(N, V, offset=offsets[0])
    O.launcher("crossentropy_fwd", variant)(losses, probs, lg, tg)
    rl, rp = R.crossentropy_fwd(lg_h.astype(np.float64), tg_h)
    close("k_crossentropy_fwd", losses.get(), rl, REDUCTION, variant)
    close("k_crossentropy_fwd", probs.get(), rp, REDUCTION, variant)


def awkward_logits(dev, N, V):
    """(N, V) logits whose first row ascends (its max rises at every batch) and whose last has every other logit
    masked (-inf), and targets, the last one a finite logit."""
    lg_h = (dev.rng.standard_normal((N, V)) * 3).astype(np.float32)
    lg_h[0] = np.sort(lg_h[0])
    if V > 2:
        lg_h[-1, ::2] = -np.inf
    tg_h = dev.rng.integers(0, V, N).astype(np.int32)
    tg_h[-1] = V - 1 if V > 2 and (V - 1) % 2 else 1 % V
    return lg_h, tg_h


# The forward keeps a row of up to CE_SMEM_MAX_FLOATS - 3 logits in shared memory between its passes (the
# launcher gives it the memory): the same bits as the row read twice from global memory, which it takes where the
# device's shared memory is forced to none, and as close to float64. Rows at every offset from 16 bytes (odd V),
# probs aligned as the logits or not (offsets of probs and logits), the longest row kept and one past it.
@FAST
@pytest.mark.parametrize("N,V,offsets", [(9, 8449, (0, 0)), (9, 8449, (1, 1)), (9, 8449, (1, 0)), (9, 8449, (0, 3)),
                                         (6, "longest kept", (1, 1)), (6, "longest kept", (2, 0)),
                                         (6, "one past", (1, 1)), (3, 50257, (1, 1)), (3, 50257, (1, 0)),
                                         (5, 1, (2, 2)), (5, 3, (1, 0)), (7, 101, (0, 0))])
def test_crossentropy_fwd_bits_do_not_depend_on_where_the_row_is_read_again(K, dev, variant, monkeypatch, N, V,
                                                                             offsets):
    longest = min(rows_fast.kept_row_floats(), (K.engine().max_shared - rows_fast.CE_STATIC_SHARED) // 4) - 3
    V = {"longest kept": longest, "one past": longest + 1}.get(V, V)
    if V < 1:
        pytest.skip("CE_SMEM_MAX_FLOATS keeps no row in shared memory")
    lg_h, tg_h = awkward_logits(dev, N, V)
    lg, tg = dev.upload(lg_h, offsets[1]), dev.ga.to_gpu(tg_h)

    def run():
        losses, probs = dev.poisoned(N), dev.poisoned(N, V, offset=offsets[0])
        plan = K.Plan()
        O.launcher("crossentropy_fwd", variant)(losses, probs, lg, tg, stream=plan)
        K.replay(plan, None, "forward")
        K.engine().cuda.Context.synchronize()
        return losses.get(), probs.get(), plan[-1][4]

    kept_losses, kept_probs, shared = run()
    assert (shared > 0) == (V <= longest), (V, longest, shared)
    rl, rp = R.crossentropy_fwd(lg_h.astype(np.float64), tg_h)
    close("k_crossentropy_fwd", kept_losses, rl, REDUCTION, variant)
    close("k_crossentropy_fwd", kept_probs, rp, REDUCTION, variant)
    monkeypatch.setattr(K.engine(), "max_shared", 0)
    global_losses, global_probs, shared = run()
    assert shared == 0
    same_bits("losses, the row in shared memory", kept_losses, global_losses)
    same_bits("probs, the row in shared memory", kept_probs, global_probs)


# rows of C in 16-byte chunks or not, longer than a lane's MB_UNROLL chunks, wte off a 16-byte boundary
@FAST
@pytest.mark.parametrize("B,T,C,V,offset", [(2, 33, 20, 101, 0), (1, 7, 1030, 101, 0), (2, 33, 20, 101, 1),
                                            (1, 3, 5, 2, 0), (2, 2, 2000, 7, 1), (1, 1, 1, 1, 0)])
def test_embed_fwd_on_odd_and_unaligned_arrays(K, dev, variant, B, T, C, V, offset):
    idx_h, idx = dev.ints(V, B, T)
    wte_h, wte = dev.randn(V, C, offset=offset)
    wpe_h, wpe = dev.randn(T + 7, C)
    x = dev.poisoned(B, T, C, offset=offset)
    O.launcher("embed_fwd", variant)(x, idx, wte, wpe)
    close("k_embed_fwd", x.get(), R.embed_fwd(idx_h, *f64(wte_h, wpe_h)), ELEMENTWISE, variant)
    same_as_reference(K, dev, "embed_fwd", variant, [x], idx, wte, wpe)


# ---------------------------------------------------------------------------------------------- optimiser
# 7.09M: one andrea-120m layer; n not a multiple of 4 (16-byte loads, then a scalar tail) and g off a 16-byte
# boundary (scalar loads throughout)
@pytest.mark.parametrize("n,offset", [(1, 0), (1000, 0), (7_087_872, 0), (1_000_003, 0), (1_000_003, 1), (6, 2)])
def test_global_norm(K, dev, ga, n, offset):
    g_h, g = dev.randn(n, offset=offset)
    sumsq = ga.empty(1, np.float64)
    sumsq.fill(np.nan)
    K.global_norm(sumsq, g)
    ref = float(np.sum(g_h.astype(np.float64) ** 2))
    close("k_global_norm", sumsq.get()[0], ref, REDUCTION)
    first = sumsq.get()[0]
    K.global_norm(sumsq, g)
    assert sumsq.get()[0] == first  # deterministic, bit for bit
    K.global_norm(sumsq, g, accumulate=True)
    close("k_global_norm", sumsq.get()[0], 2 * ref, REDUCTION)


# n not a multiple of 4 (four parameters a thread by 16-byte loads, then a partial thread); every array off a
# 16-byte boundary (one at a time); a decay mask, 4-byte aligned or not
@pytest.mark.parametrize("clip", [None, 0.5, 1e9])
@pytest.mark.parametrize("n,offset,mask_offset", [(100_003, 0, None), (1_003, 1, None), (4_099, 0, 0), (4_099, 0, 1),
                                                  (7, 2, 3)])
def test_adamw(K, dev, ga, clip, n, offset, mask_offset):
    p_h, p = dev.randn(n, offset=offset)
    g_h, g = dev.randn(n, scale=0.01, offset=offset)
    m_h, m = dev.randn(n, scale=0.001, offset=offset)
    v_h = np.abs(dev.rng.standard_normal(n) * 1e-5).astype(np.float32)
    v = dev.upload(v_h, offset)
    mask_h = mask = None
    if mask_offset is not None:
        mask_h = (dev.rng.random(n) < 0.5).astype(np.uint8)
        mask = dev.upload(mask_h, mask_offset)
    sumsq = None
    gg = g_h.astype(np.float64)
    if clip is not None:
        sumsq = ga.empty(1, np.float64)
        K.global_norm(sumsq, g)
        gg = gg * R.clip_coef(np.sqrt(np.sum(gg ** 2)), clip)
    hp = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    K.adamw(p, g, m, v, step=3, decay_mask=mask, sumsq=sumsq, max_norm=clip, **hp)
    wd = hp["weight_decay"] if mask_h is None else np.where(mask_h != 0, hp["weight_decay"], 0.0)
    rp, rm, rv = R.adamw(*f64(p_h), gg, *f64(m_h, v_h), 3, hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], wd)
    close("k_adamw", p.get(), rp, ELEMENTWISE)
    close("k_adamw", m.get(), rm, ELEMENTWISE)
    close("k_adamw", v.get(), rv, ELEMENTWISE)
    close("k_adamw", g.get(), gg, ELEMENTWISE)  # clipped gradients written back, as torch does


# ---------------------------------------------------------------------------------------------- the launch layer
def test_bad_arguments_are_refused_naming_them(K, dev, ga):
    _, x = dev.randn(2, 3, 8)
    _, w = dev.randn(8)
    out, mean, rstd = dev.poisoned(2, 3, 8), dev.poisoned(2, 3), dev.poisoned(2, 3)
    with pytest.raises(TypeError, match="b must be float32, got float64"):
        K.layernorm_fwd(out, mean, rstd, x, w, ga.zeros(8, np.float64))
    with pytest.raises(ValueError, match=r"w must have shape \(8,\), got \(7,\)"):
        K.layernorm_fwd(out, mean, rstd, x, ga.zeros(7, np.float32), w)
    with pytest.raises(ValueError, match=r"mean must have shape \(2, 3\)"):
        K.layernorm_fwd(out, dev.poisoned(3, 2), rstd, x, w, w)
    with pytest.raises(TypeError, match="x must be a device array, got a NumPy array"):
        K.gelu_fwd(out, np.zeros((2, 3, 8), np.float32))
    with pytest.raises(ValueError, match="step must be an int >= 1"):
        K.adamw(w, w, w, w, lr=1e-3, beta1=0.9, beta2=0.9, eps=1e-8, weight_decay=0, step=0)
    assert np.isnan(out.get()).all()


def test_torch_tensors_go_straight_in_and_strided_ones_are_refused(K):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA here")
    x = torch.randn(5, 16, device="cuda")
    out = torch.full_like(x, float("nan"))
    K.gelu_fwd(out, x)
    ref = R.gelu_fwd(x.cpu().numpy().astype(np.float64))
    close("k_gelu_fwd", out.cpu().numpy(), ref, ELEMENTWISE)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        K.gelu_fwd(out.t(), x.t())


def test_a_failed_launch_names_the_kernel(K):
    # a grid too large is a launch error that leaves the context usable
    with pytest.raises(K.KernelError, match="k_gelu_fwd"):
        K.launch("k_gelu_fwd", [0, 0, 1], 2 ** 31)


# colsum, every bias gradient of the fast variants: against float64, added into a random start; a lane of 16-byte
# loads (C % 4 == 0, x on a 16-byte boundary) adds each column's rows in the order a lane of single floats does, so
# the same data one float off the boundary, or in padded rows, gives the same bits
@pytest.mark.parametrize("N,C", [(1, 4), (7, 20), (33, 36), (8192, 768), (1000, 3072), (37, 1030), (129, 5)])
def test_colsum_against_float64_and_the_same_bits_off_a_16_byte_boundary(K, dev, N, C):
    x_h, x = dev.randn(N, C)
    start_h, out = dev.randn(C)
    K.colsum(out, x)
    close("colsum", out.get(), start_h.astype(np.float64) + x_h.astype(np.float64).sum(0), REDUCTION)
    shifted = dev.upload(start_h)
    K.colsum(shifted, dev.upload(x_h, offset=1))
    same_bits("colsum, x one float off a 16-byte boundary", shifted.get(), out.get())
    again = dev.upload(start_h)
    K.colsum(again, x)
    same_bits("colsum, run again", again.get(), out.get())
    for pad in (3, 4):  # rows padded (checks.rows_ptr), the padding NaN: the same sums, the padding never read
        whole = np.full((N, C + pad), np.nan, np.float32)
        whole[:, :C] = x_h
        padded = dev.upload(start_h)
        K.colsum(padded, dev.ga.to_gpu(whole)[:, :C])
        same_bits(f"colsum, rows padded by {pad}", padded.get(), out.get())
