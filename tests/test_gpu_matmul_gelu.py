"""mlp.proj's backward into GELU's (matmul_gelu_bwd: dpre = (dout @ W) * gelu'(pre), dW and db added into): on sm_90a
the tc variant runs the GELU backward in the dX product's epilogue (cuda/matmul_gelu_tc.cuh), pre's tile copied in
while the tile's products run. Held, on fresh random inputs and poisoned outputs, to the same ops apart bit for bit
(the tc product, then the fast GELU backward), to float64 within the fast variant's error times BAR, and to the ops
apart where the kernel does not apply (rows the bulk copies cannot write, a product that splits K)."""
import numpy as np
import pytest

from microgpt import kernels as K
from microgpt import ops as O
from microgpt import reference as R

from helpers import device, record, rel_err

pytestmark = pytest.mark.gpu

BAR = 1.5  # the tc variant's error may be at most this many times the fast variant's
FAST, TC = O.select("fast"), O.select("tc")
FUSED = "k_gemm_wg_areg_gelu_bwd"
TAIL, SENTINEL = 64, 1234.5  # floats past an output's end, which nothing may write


@pytest.fixture(scope="module")
def ga():
    K.engine()
    import pycuda.gpuarray as ga
    return ga


def wgmma_only():
    if not K.warpgroup_mma(K.engine()):
        pytest.skip(f"{K.device_summary()}: the fused kernel is the wgmma path's (sm_90a)")


def poisoned(ga, shape, offset=0):
    """An output of `shape`, NaN, `offset` floats past an allocation's start and TAIL floats of SENTINEL after its
    end: (the array, the whole allocation)."""
    size = int(np.prod(shape))
    buf = ga.to_gpu(np.concatenate([np.zeros(offset), np.full(size, np.nan), np.full(TAIL, SENTINEL)])
                    .astype(np.float32))
    return buf[offset:offset + size].reshape(shape), buf


def untouched(buf, what):
    assert (buf.get()[-TAIL:] == SENTINEL).all(), f"{what}: written past its end"


def queued(fn, *args):
    """fn(*args) recorded into a plan and run: the kernels it launched."""
    plan = K.Plan()
    fn(*args, stream=plan)
    K.replay(plan, None, "test")
    K.engine().cuda.Context.synchronize()
    return {name for name, *_ in plan}


def backward(ops, ga, dout, act, pre, weight, offset=0):
    """ops' matmul_gelu_bwd on fresh device copies, dpre poisoned (NaN), dweight and dbias zero, dpre and pre
    `offset` floats off 16 bytes: (dpre, dweight, dbias) on the host, and the kernels it queued."""
    OUT, IN = weight.shape
    dpre, dpre_buf = poisoned(ga, act.shape, offset)
    dweight, dbias = device(ga, np.zeros((OUT, IN), np.float32)), device(ga, np.zeros(OUT, np.float32))
    kernels = queued(ops.matmul_gelu_bwd, dpre, dweight, dbias, device(ga, dout), device(ga, act),
                     device(ga, pre, offset), device(ga, weight))
    untouched(dpre_buf, "dpre")
    return (dpre.get(), dweight.get(), dbias.get()), kernels


def same_bits(a, b, what):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32), err_msg=what)


# (N, C, OUT): mlp.proj's backward (OUT -> C), andrea-120m's at B = 8, T = 1024 (each block many tiles, pre copied in
# ahead of each); rows and columns that fill no tile (N = 1000, 130; OUT = 700 + 4, a partial last column tile); K
# not a multiple of the split's 32 (C = 300); fewer tiles than blocks (130 x 512). At N = 1000, C = 768 the product
# apart splits K (on 132 SMs), and so it runs unfused
SHAPES = [(8192, 768, 3072), (1000, 768, 3072), (130, 256, 512), (1000, 300, 704)]


def draw(rng, N, C, OUT):
    """mlp.proj's dout (N, C) and weight (C, OUT); a pre-activation (N, OUT) spread over GELU's curve, and act = its
    GELU."""
    h = dict(dout=rng.standard_normal((N, C)), proj_w=rng.standard_normal((C, OUT)) * 0.05,
             pre=rng.standard_normal((N, OUT)) * 2)
    h = {k: v.astype(np.float32) for k, v in h.items()}
    h["act"] = R.gelu_fwd(h["pre"].astype(np.float64)).astype(np.float32)
    return h


@pytest.mark.parametrize("N,C,OUT", SHAPES)
def test_the_fused_backward_is_the_ops_apart_bit_for_bit(ga, rng, N, C, OUT):
    wgmma_only()
    h = draw(rng, N, C, OUT)
    args = (h["dout"], h["act"], h["pre"], h["proj_w"])
    got, kernels = backward(TC, ga, *args)
    apart, apart_kernels = backward(TC, ga, *args, offset=1)
    assert FUSED not in apart_kernels and "k_gelu_bwd_fast" in apart_kernels, apart_kernels
    if K.Gemm.dense(N, OUT, C).splits(K.engine().sm_count, 1) > 1:  # the product apart splits K: so does this one
        assert FUSED not in kernels and "k_splitk_reduce" in kernels & apart_kernels, (kernels, apart_kernels)
    else:
        assert FUSED in kernels and "k_gelu_bwd_fast" not in kernels, kernels
        assert "k_gemm_wg_areg" in apart_kernels and "k_splitk_reduce" not in apart_kernels, apart_kernels
    for what, a, b in zip(("dpre", "dweight", "dbias"), got, apart):
        same_bits(a, b, f"{what} N={N} C={C} OUT={OUT}")
    D, W, X = (h[k].astype(np.float64) for k in ("dout", "proj_w", "pre"))
    ref = (R.gelu_bwd(D @ W, X), D.T @ h["act"].astype(np.float64), D.sum(0))
    fast, _ = backward(FAST, ga, *args)
    for what, g, f, r in zip(("dpre", "dweight", "dbias"), got, fast, ref):
        label = f"{what} N={N} C={C} OUT={OUT}"
        err, err_fast = record("matmul_gelu_bwd tc vs float64", label, rel_err(g, r)), rel_err(f, r)
        assert err_fast < 1e-5, (label, err_fast)
        assert err <= BAR * err_fast, f"{label}: tc {err:.2e} > {BAR} x fast's {err_fast:.2e}"
    again, _ = backward(TC, ga, *args)
    for what, a, b in zip(("dpre", "dweight", "dbias"), again, got):
        same_bits(a, b, f"{what}, run again")

