"""A linear layer's backward into the layernorm that made its input (matmul_layernorm_bwd): the tc variant runs its
dX product on the tensor cores into dinp, then the fast layernorm backward of dinp. Held, on fresh random inputs,
to float64: every output's worst relative error at most 1.5 times the fast variant's (its SIMT product, then the
same layernorm backward), at andrea-120m's shapes and at shapes that fill no tile; its bits repeat from one call to
the next."""
import numpy as np
import pytest

from microgpt import kernels as K
from microgpt import ops as O
from microgpt import reference as R

from helpers import device, record, rel_err

pytestmark = pytest.mark.gpu

BAR = 1.5  # the tc variant's error may be at most this many times the fast variant's
FAST, TC = O.select("fast"), O.select("tc")


@pytest.fixture(scope="module")
def ga():
    K.engine()
    import pycuda.gpuarray as ga
    return ga


def draw(rng, N, C, OUT):
    """The inputs, float32: x (N, C), its layernorm's w and output inp, mean and rstd; dout (N, OUT), weight."""
    x = (rng.standard_normal((N, C)) * 2 + 1.5).astype(np.float32)
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    mean = x.astype(np.float64).mean(1)
    rstd = 1.0 / np.sqrt(((x - mean[:, None]) ** 2).mean(1) + 1e-5)
    inp = ((x - mean[:, None]) * rstd[:, None] * w + b).astype(np.float32)
    return dict(dout=rng.standard_normal((N, OUT)).astype(np.float32), inp=inp,
                weight=(rng.standard_normal((OUT, C)) * 0.02).astype(np.float32), x=x, w=w,
                mean=mean.astype(np.float32), rstd=rstd.astype(np.float32))


def arguments(ga, h, dx0=None, offset=0):
    """(dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean, rstd) on the device, dx, dout and x `offset`
    floats off: dx NaN (dx0 where it is added into), the gradients zero."""
    (N, C), OUT = h["x"].shape, h["weight"].shape[0]
    dx = np.full((N, C), np.nan, np.float32) if dx0 is None else dx0
    zeros = [device(ga, np.zeros(shape, np.float32)) for shape in ((C,), (C,), (OUT, C), (OUT,))]
    return [device(ga, dx, offset), *zeros, device(ga, h["dout"], offset), device(ga, h["inp"]),
            device(ga, h["weight"]), device(ga, h["x"], offset), *(device(ga, h[k]) for k in ("w", "mean", "rstd"))]


def reference(h):
    """dx, dw, db, dweight, dbias in float64 from the float32 inputs, and the layernorm output's gradient."""
    D, W, X, w, m, s = (np.asarray(h[k], np.float64) for k in ("dout", "weight", "x", "w", "mean", "rstd"))
    dinp = D @ W
    dx, dw, db = R.layernorm_bwd(dinp, X, w, m, s)
    return dx, dw, db, D.T @ np.asarray(h["inp"], np.float64), D.sum(0), dinp


def run(ops, ga, h, accumulate, dx0, offset):
    """ops' matmul_layernorm_bwd on fresh device copies: its five outputs on the host, and the kernels it queued."""
    args, dinp = arguments(ga, h, dx0 if accumulate else None, offset), device(ga, np.zeros(h["x"].shape, np.float32))
    plan = K.Plan()  # the plan holds its scratch; the arrays it points into are held here
    ops.matmul_layernorm_bwd(*args, dinp=dinp, accumulate=accumulate, stream=plan)
    K.replay(plan, None, "test")
    K.engine().cuda.Context.synchronize()
    return [a.get() for a in args[:5]], {name for name, *_ in plan}


# (N, C, OUT): andrea-120m's qkv and mlp.fc at T = 1024 and B = 8; rows and columns that fill no tile (C = 700: a
# partial last column tile; N = 1000, 130, 257); odd C (single floats, not pairs); C = 1024; K = OUT not a multiple
# of the split's 32 (1000)
SHAPES = [(1024, 768, 2304), (8192, 768, 3072), (1000, 700, 320), (130, 257, 256), (300, 1024, 512), (257, 384, 1000)]


@pytest.mark.parametrize("N,C,OUT", SHAPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_the_tc_backward_is_as_accurate_as_the_fast_one(ga, rng, N, C, OUT, accumulate):
    h = draw(rng, N, C, OUT)
    ref = reference(h)
    dx0 = rng.standard_normal((N, C)).astype(np.float32)
    offset = (C % 2) | (N % 2)  # dx, dout and x a float off 16 bytes: rows of single floats, at even C too
    (fast, _), (tc, kernels) = (run(ops, ga, h, accumulate, dx0, offset) for ops in (FAST, TC))
    assert "k_layernorm_bwd_fast" in kernels and any(k.startswith("k_gemm_") for k in kernels), kernels
    terms = np.linalg.norm(np.asarray(h["rstd"], np.float64)[:, None] * ref[5] * h["w"])  # dx's terms' size
    for i, what in enumerate(("dx", "dw", "db", "dweight", "dbias")):
        errs = {}
        for name, out in (("fast", fast), ("tc", tc)):
            got = out[i] - dx0 if i == 0 and accumulate else out[i]
            if i == 0:  # dx sums to 0 over a row: measured against the size of its terms (test_gpu_kernels.close_dx)
                errs[name] = np.linalg.norm(got - ref[0]) / terms if np.isfinite(got).all() else np.inf
            else:
                errs[name] = rel_err(got, ref[i])
        label = f"{what} N={N} C={C} OUT={OUT}{' accumulate' * accumulate}"
        record("matmul_layernorm_bwd tc vs float64", label, errs["tc"])
        record("matmul_layernorm_bwd fast vs float64", label, errs["fast"])
        assert errs["fast"] < 1e-5, (label, errs)
        assert errs["tc"] <= BAR * errs["fast"], f"{label}: tc {errs['tc']:.2e} > {BAR} x fast's {errs['fast']:.2e}"
    again, _ = run(TC, ga, h, accumulate, dx0, offset)
    for what, a, b in zip(("dx", "dw", "db", "dweight", "dbias"), again, tc):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"{what}, run again")

