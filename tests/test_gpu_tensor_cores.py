"""The tensor-core products (variant tc, cuda/matmul_tc.cuh) held to the accuracy bar: on the same fresh
random inputs, their worst relative error against float64 is at most 1.5 times the SIMT SGEMM's (variant
fast), for every product of andrea-120m at T=1024 (the linear layers forward, dX and dW, the tied lm_head,
the attention products) and for odd shapes that fill no tile; the bias gradient the wgmma kernel sums inside the
dW product, against the fast variant's column sums; and they repeat bit for bit.

The errors are ||out - ref|| / ||ref|| in float64; conftest prints the worst of each at the end of the run.
"""
import functools

import numpy as np
import pytest

from microgpt import kernels as K
from microgpt import ops as O
from microgpt import reference as R

from helpers import record, rel_err

pytestmark = pytest.mark.gpu

BAR = 1.5  # the tensor cores' error may be at most this many times the SIMT kernel's
SIMT, TC = O.select("fast"), O.select("tc")
C, NH, V, T = 768, 12, 8449, 1024  # andrea-120m at T=1024, one sequence
LAYERS = {"qkv": (C, 3 * C), "attn.proj": (C, C), "mlp.fc": (C, 4 * C), "mlp.proj": (4 * C, C), "lm_head": (C, V)}


@pytest.fixture(scope="module")
def ga():
    K.engine()
    import pycuda.gpuarray as ga
    return ga


def within_bar(name, tc_out, simt_out, ref):
    err_tc, err_simt = rel_err(tc_out, ref), rel_err(simt_out, ref)
    record("tensor cores (tc) vs float64", name, err_tc)
    record("SIMT (fast) vs float64", name, err_simt)
    assert err_tc <= BAR * err_simt, f"{name}: tc error {err_tc:.2e} > {BAR} x SIMT's {err_simt:.2e}"
    assert err_simt < 1e-5


def poisoned(ga, *shape):
    a = ga.empty(shape, np.float32)
    a.fill(np.nan)
    return a


def test_the_device_has_tensor_cores():
    """The rest of this file measures the tensor cores; below sm_80 tc runs the SIMT SGEMM instead, and on
    compute capability 9.0 the module is built for sm_90a, whose wgmma kernels run the products."""
    assert K.tensor_cores(K.engine()), f"{K.device_summary()}: no TF32 tensor cores (sm_80 and later)"
    assert K.warpgroup_mma(K.engine()) == (K.engine().device.compute_capability() == (9, 0))


@pytest.mark.parametrize("layer", list(LAYERS))
def test_linear_layers_forward_and_backward(ga, rng, layer):
    IN, OUT = LAYERS[layer]
    x_h = rng.standard_normal((1, T, IN)).astype(np.float32)
    w_h = (rng.standard_normal((OUT, IN)) * 0.02).astype(np.float32)
    b_h = None if layer == "lm_head" else rng.standard_normal(OUT).astype(np.float32)
    d_h = rng.standard_normal((1, T, OUT)).astype(np.float32)
    x, w, d = ga.to_gpu(x_h), ga.to_gpu(w_h), ga.to_gpu(d_h)
    b = None if b_h is None else ga.to_gpu(b_h)
    X, W, D = (a.astype(np.float64) for a in (x_h, w_h, d_h))
    outs = {}
    for name, ops in (("fast", SIMT), ("tc", TC)):
        y = poisoned(ga, 1, T, OUT)
        ops.matmul_fwd(y, x, w, b)
        dx, dw = poisoned(ga, 1, T, IN), ga.zeros((OUT, IN), np.float32)  # dW is added into
        db = None if b is None else ga.zeros(OUT, np.float32)
        ops.matmul_bwd(dx, dw, db, d, x, w)
        outs[name] = (y.get(), dx.get(), dw.get())
    ref = (X @ W.T + (0 if b_h is None else b_h), D @ W, D[0].T @ X[0])
    for i, what in enumerate(("forward", "dX", "dW")):
        within_bar(f"{layer} {what}", outs["tc"][i], outs["fast"][i], ref[i].reshape(outs["tc"][i].shape))


def test_the_lm_head_on_padded_rows_gives_the_bits_of_contiguous_ones(ga, rng):
    """The model's logits and their gradient lie in rows padded to 16 bytes (model.padded_rows): the tied lm_head's
    forward, dX and dW products on them (rows copied whole, the forward's tiles but the last column's stored by the
    bulk copy engine) give the bits of the same products on contiguous rows of 8,449, and never write the padding.
    At B = 8 neither forward cuts K (a contiguous one of fewer rows may: gemm's split-K takes only ldc = N)."""
    from microgpt.model import padded_rows
    x = ga.to_gpu(rng.standard_normal((8, T, C)).astype(np.float32))
    w = ga.to_gpu((rng.standard_normal((V, C)) * 0.02).astype(np.float32))
    d_h = rng.standard_normal((8, T, V)).astype(np.float32)
    wide = []  # the padded rows' whole buffers, NaN

    def new(*shape):
        wide.append(ga.to_gpu(np.full(shape, np.nan, np.float32)))
        return wide[-1]
    layouts = {"contiguous": (poisoned(ga, 8, T, V), ga.to_gpu(d_h)),
               "padded": (padded_rows(new, 8, T, V), padded_rows(new, 8, T, V))}
    layouts["padded"][1].set(d_h)
    outs = {}
    for layout, (y, d) in layouts.items():
        dx, dw = poisoned(ga, 8, T, C), ga.zeros((V, C), np.float32)
        TC.matmul_fwd(y, x, w, None)
        TC.matmul_bwd(dx, dw, None, d, x, w)
        outs[layout] = [a.get() for a in (y, dx, dw)]
    assert all(whole.shape[-1] % 4 == 0 and whole.shape[-1] > V for whole in wide)
    for whole in wide:
        assert np.isnan(whole.get()[..., V:]).all(), "a product wrote the padding of the logits' rows"
    for what, padded, contiguous in zip(("forward", "dX", "dW"), outs["padded"], outs["contiguous"]):
        assert np.isfinite(contiguous).all(), what
        np.testing.assert_array_equal(padded, contiguous, err_msg=what)


# andrea-120m's heads; and heads of 128 at an odd T, where dK and dV (A stored K x M, causal) take the wgmma kernel
# that splits A in registers on sm_90a
@pytest.mark.parametrize("nh,t,d_k", [(NH, T, C // NH), (2, 300, 128)])
def test_attention_products(ga, rng, nh, t, d_k):
    """Scores (the mask fused), probabilities times values, and both backward, on causal inputs."""
    NH, T = nh, t
    hs = (1, NH, T, d_k)
    q_h, k_h, v_h, do_h = (rng.standard_normal(hs).astype(np.float32) for _ in range(4))
    p_h = R.softmax_fwd(R.causal_mask_fwd(rng.standard_normal((1, NH, T, T)) * 2)).astype(np.float32)
    ds_h = R.causal_mask_bwd(rng.standard_normal((1, NH, T, T))).astype(np.float32)
    q, k, v, do, p, ds = (ga.to_gpu(a) for a in (q_h, k_h, v_h, do_h, p_h, ds_h))
    lower = ~R.causal_mask(T)
    if d_k == 128 and K.warpgroup_mma(K.engine()):
        g = K.Gemm.dense(T, d_k, T, trans_a=True, batch=NH, causal=K.Causal.A_UPPER, units="tc")
        assert K.matmul_tc.tc_kernel(g, K.engine())[0] == "k_gemm_wg_areg_tn"
    outs = {}
    for name, ops in (("fast", SIMT), ("tc", TC)):
        s, o = poisoned(ga, 1, NH, T, T), poisoned(ga, *hs)
        dp, dv, dq, dk = poisoned(ga, 1, NH, T, T), poisoned(ga, *hs), poisoned(ga, *hs), poisoned(ga, *hs)
        ops.causal_scores_fwd(s, q, k)
        ops.attn_values_fwd(o, p, v)
        ops.attn_values_bwd(dp, dv, do, p, v)
        ops.causal_scores_bwd(dq, dk, ds, q, k)
        outs[name] = {"scores": s.get()[..., lower], "values": o.get(), "dprobs": dp.get()[..., lower],
                      "dV": dv.get(), "dQ": dq.get(), "dK": dk.get()}
        assert np.all(s.get()[..., ~lower] == R.MASK_VALUE) and np.all(dp.get()[..., ~lower] == 0)
    Q, Km, Vm, dO, P, dS = (a.astype(np.float64) for a in (q_h, k_h, v_h, do_h, p_h, ds_h))
    rdp, rdv = R.attn_values_bwd(dO, P, Vm)
    rdq, rdk = R.attn_scores_bwd(dS, Q, Km)
    ref = {"scores": R.attn_scores_fwd(Q, Km)[..., lower], "values": R.attn_values_fwd(P, Vm),
           "dprobs": rdp[..., lower], "dV": rdv, "dQ": rdq, "dK": rdk}
    for what in ref:
        within_bar(f"attention d_k {d_k} {what}", outs["tc"][what], outs["fast"][what], ref[what])


# M, N, K not multiples of a tile (128 x 128, 128 x 64, K by 32), unaligned rows (K odd), batches, split-K; K of
# 258 and 771 whole (no split-K), so that the wgmma kernel copies A's unaligned rows by shifted chunks
@pytest.mark.parametrize("M,N,K_,batch", [(1000, 333, 200, 1), (129, 65, 1023, 2), (77, 64, 3, 3), (70, 90, 129, 2),
                                          (300, 130, 4097, 1), (1, 1, 1, 1), (256, 200, 8192, 1), (5, 3, 128, 1),
                                          (40, 50, 127, 1), (129, 64, 300, 2), (1000, 37, 1000, 1),
                                          (5, 3, 256, 1), (7, 130, 256, 1), (1000, 256, 258, 1), (1000, 256, 771, 1)])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("wgmma", [None, False], ids=["device's kernel", "mma.sync"])
def test_odd_shapes(ga, rng, M, N, K_, batch, ta, tb, wgmma):
    a_h = rng.standard_normal((batch, *((K_, M) if ta else (M, K_)))).astype(np.float32)
    b_h = rng.standard_normal((batch, *((N, K_) if tb else (K_, N)))).astype(np.float32)
    a, b = ga.to_gpu(a_h), ga.to_gpu(b_h)
    A = a_h.astype(np.float64).swapaxes(-1, -2) if ta else a_h.astype(np.float64)
    Bm = b_h.astype(np.float64).swapaxes(-1, -2) if tb else b_h.astype(np.float64)
    outs = {}
    for name, sgemm in (("fast", K.sgemm), ("tc", functools.partial(K.sgemm, units="tc", wgmma=wgmma))):
        c = poisoned(ga, batch, M, N)
        sgemm(c, a, b, trans_a=ta, trans_b=tb)
        outs[name] = c.get()
    if K_ < K.matmul_tc.TC_MIN_K:  # too short for the tensor cores: the SIMT kernel's own result
        np.testing.assert_array_equal(outs["tc"], outs["fast"])
    path = "mma.sync " if wgmma is False else ""
    within_bar(f"odd {path}{'t' if ta else 'n'}{'t' if tb else 'n'}", outs["tc"], outs["fast"], A @ Bm)


def test_the_products_repeat_bit_for_bit(ga, rng):
    """The same inputs give the same bits: no atomics, split-K reduced in slice order (the bias gradient's
    slices too)."""
    x = ga.to_gpu(rng.standard_normal((4096, 768)).astype(np.float32))
    d = ga.to_gpu(rng.standard_normal((4096, 3072)).astype(np.float32))
    w = ga.to_gpu(rng.standard_normal((3072, 768)).astype(np.float32))
    runs = []
    for _ in range(2):
        y, dx, dw = poisoned(ga, 4096, 3072), poisoned(ga, 4096, 768), ga.zeros((3072, 768), np.float32)
        db = ga.zeros(3072, np.float32)
        TC.matmul_fwd(y, x, w)
        TC.matmul_bwd(dx, dw, db, d, x, w)
        runs.append([a.get() for a in (y, dx, dw, db)])
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)


# (N = B*T, OUT, IN): andrea-120m's linear layers at B*T = 8192 (dW's K in parts on the wgmma kernel), odd shapes
# (K = 1000 and 4099), a long odd K, and K too short to cut
BIAS_SHAPES = {"qkv": (8192, 3 * C, C), "attn.proj": (8192, C, C), "mlp.fc": (8192, 4 * C, C),
               "mlp.proj": (8192, C, 4 * C), "odd": (1000, 333, 130), "odd-long": (4099, 130, 772),
               "long": (8191, C, C), "one-part": (256, 300, 200)}


@pytest.mark.parametrize("case", list(BIAS_SHAPES))
def test_the_bias_gradient_inside_the_weight_gradients_product(ga, rng, case):
    """On sm_90a tc's dW product sums dbias from the dout it reads, with no column-sum pass: dbias (added into a
    random start) within the bar of the fast variant's column sums; dX and dW the same bits as the same product
    without dbias; dbias the same bits on a second run."""
    N, OUT, IN = BIAS_SHAPES[case]
    x_h = rng.standard_normal((N, IN)).astype(np.float32)
    w_h = (rng.standard_normal((OUT, IN)) * 0.02).astype(np.float32)
    d_h = rng.standard_normal((N, OUT)).astype(np.float32)
    dw0, db0 = rng.standard_normal((OUT, IN)).astype(np.float32), rng.standard_normal(OUT).astype(np.float32)
    x, w, d = ga.to_gpu(x_h), ga.to_gpu(w_h), ga.to_gpu(d_h)
    if K.warpgroup_mma(K.engine()):  # the path under test: the wgmma kernel, split or not as the case says
        g = K.Gemm.dense(OUT, IN, N, trans_a=True, beta=1.0)
        assert K.matmul_tc.tc_kernel(g, K.engine())[0] == "k_gemm_wg_areg_tn"
        assert (K.matmul_tc.tn_parts(g, K.engine().sm_count) == 1) == (case == "one-part"), case
        plan = K.Plan()
        TC.matmul_bwd(poisoned(ga, N, IN), ga.to_gpu(dw0), ga.to_gpu(db0), d, x, w, stream=plan)
        names = [name for name, *_ in plan]
        assert names[-1] == "k_gemm_wg_areg_tn" and not [n for n in names if n.startswith(("k_colsum", "k_splitk"))]

    def bwd(ops, bias=True):
        dx, dw, db = poisoned(ga, N, IN), ga.to_gpu(dw0), ga.to_gpu(db0) if bias else None
        ops.matmul_bwd(dx, dw, db, d, x, w)
        return dx.get(), dw.get(), None if db is None else db.get()

    _, _, db_fast = bwd(SIMT)
    dx_tc, dw_tc, db_tc = bwd(TC)
    dx_plain, dw_plain, _ = bwd(TC, bias=False)
    np.testing.assert_array_equal(dx_tc, dx_plain)
    np.testing.assert_array_equal(dw_tc, dw_plain)
    np.testing.assert_array_equal(bwd(TC)[2], db_tc)
    within_bar(f"{case} dbias", db_tc, db_fast, db0.astype(np.float64) + d_h.astype(np.float64).sum(axis=0))


@pytest.mark.parametrize("wgmma", [None, False], ids=["device's kernel", "mma.sync"])
def test_bias_alpha_beta_and_strided_batches(ga, rng, wgmma):
    """c = alpha * a @ b + bias + beta * c, over a batch, on both tensor-core kernels."""
    batch, M, N, K_ = 3, 260, 200, 300
    a_h = rng.standard_normal((batch, M, K_)).astype(np.float32)
    b_h = rng.standard_normal((batch, K_, N)).astype(np.float32)
    bias_h, c0 = rng.standard_normal(N).astype(np.float32), rng.standard_normal((batch, M, N)).astype(np.float32)
    c = ga.to_gpu(c0)
    K.sgemm(c, ga.to_gpu(a_h), ga.to_gpu(b_h), alpha=0.5, beta=-2.0, bias=ga.to_gpu(bias_h), wgmma=wgmma, units="tc")
    ref = 0.5 * (a_h.astype(np.float64) @ b_h) + bias_h + -2.0 * c0
    assert record("tensor cores (tc) vs float64", "alpha, bias, beta", rel_err(c.get(), ref)) < 1e-6


# Products that run from split operands on sm_90a (A stored M x K, one product, the 128 x 128 tile, wgmma-sized):
# M, N not multiples of 128, K not of the 32 it is padded to, unaligned rows (K or N odd: the splits' one-float
# path), fewer rows than a tile, and mlp.fc's dX at B*T = 8192
SPLIT_SHAPES = [(300, 200, 256), (1000, 333, 300), (4099, 130, 772), (129, 257, 4097), (100, 260, 261),
                (8192, C, 4 * C)]


@pytest.mark.parametrize("M,N,K_", SPLIT_SHAPES)
@pytest.mark.parametrize("tb", [False, True])
def test_split_operands_give_the_wgmma_kernels_bits(ga, rng, M, N, K_, tb):
    """B's split pass and k_gemm_wg_areg (A split in registers) compute what the wgmma kernel computes from the raw
    operands, to the bit (the same split, the same products in the same order), with and without alpha, bias and
    beta, on fresh inputs and a poisoned c; and the default takes that path."""
    if not K.warpgroup_mma(K.engine()):
        pytest.skip(f"{K.device_summary()}: split operands are the wgmma path's (sm_90a)")
    a = ga.to_gpu(rng.standard_normal((M, K_)).astype(np.float32))
    b = ga.to_gpu(rng.standard_normal((N, K_) if tb else (K_, N)).astype(np.float32))
    bias, c0 = ga.to_gpu(rng.standard_normal(N).astype(np.float32)), rng.standard_normal((M, N)).astype(np.float32)
    plan = K.Plan()
    K.sgemm(poisoned(ga, M, N), a, b, trans_b=tb, bias=bias, stream=plan, units="tc")
    assert [name for name, *_ in plan] == ["k_tf32_split" if tb else "k_tf32_split_t", "k_gemm_wg_areg"], plan
    for kw in (dict(), dict(alpha=0.5, beta=-2.0, bias=bias)):
        outs = []
        for split in (None, False):
            c = ga.to_gpu(c0) if "beta" in kw else poisoned(ga, M, N)
            K.sgemm(c, a, b, trans_b=tb, split=split, **kw, units="tc")
            outs.append(c.get())
        assert np.isfinite(outs[0]).all()
        np.testing.assert_array_equal(outs[0], outs[1])


# Operands of one batch split (k_tf32_split_batch): (rows, K, transposed) of each, as the weights of odd layers give
# them, and one read from a pointer 4 bytes past an aligned one (the single-float path)
BATCH_OPERANDS = [(300, 257, False), (257, 300, True), (129, 772, False), (772, 129, True), (1000, 64, False),
                  (64, 1000, True), (4097, 33, True)]


def test_a_batch_split_gives_each_operands_split_bits(ga, rng):
    """Every operand of a SplitOperands (one launch) holds, padding and all, the bits tf32_split gives it alone, on
    fresh inputs and poisoned outputs; an unaligned source too."""
    srcs, ops = [], []
    for rows, K_, transposed in BATCH_OPERANDS:
        stored = (K_, rows) if transposed else (rows, K_)
        srcs.append(ga.to_gpu(rng.standard_normal(stored).astype(np.float32)))
        ops.append((int(srcs[-1].gpudata), rows, K_, stored[1], transposed))
    flat = ga.to_gpu(rng.standard_normal(1 + 96 * 130).astype(np.float32))
    ops.append((int(flat.gpudata) + 4, 96, 130, 130, False))
    ops.append((int(flat.gpudata) + 4, 130, 96, 130, True))
    splits = K.SplitOperands(ops, new=lambda n: poisoned(ga, n))
    found = [splits.find(*op) for op in ops]
    assert len(splits) == len(ops) and len(set(found)) == len(ops)
    splits.split()
    for op, at in zip(ops, found):
        src, rows, K_, ld, transposed = op
        rows_pad, K_pad = K.tf32_split.split_padding(rows, K_)
        alone = poisoned(ga, 2 * rows_pad * K_pad)
        K.tf32_split.tf32_split(int(alone.gpudata), int(alone.gpudata) + 4 * rows_pad * K_pad, src, rows, K_, ld,
                                K_pad, None, transposed=transposed)
        batched = splits.found[(src, rows, K_, ld, transposed)]
        assert int(batched.gpudata) == at
        want = alone.get().view(np.uint32)
        assert not np.isnan(alone.get()).any()
        np.testing.assert_array_equal(batched.get().view(np.uint32), want, err_msg=str((rows, K_, ld, transposed)))


@pytest.mark.parametrize("M,OUT,IN", [(300, 300, 256), (1000, 333, 300), (8192, 4 * C, C)])
def test_products_reading_weights_split_once_give_the_same_bits(ga, rng, M, OUT, IN):
    """A linear layer's forward and dX product recorded inside weight_splits(...).reading(plan) take the weight's split
    from the batch launch the plan starts with (no split pass of their own for it) and give the bits of the products
    that split it themselves."""
    if not K.warpgroup_mma(K.engine()):
        pytest.skip(f"{K.device_summary()}: split operands are the wgmma path's (sm_90a)")
    w = ga.to_gpu((0.05 * rng.standard_normal((OUT, IN))).astype(np.float32))
    bias = ga.to_gpu(rng.standard_normal(OUT).astype(np.float32))
    inp = ga.to_gpu(rng.standard_normal((M, IN)).astype(np.float32))
    dout = ga.to_gpu(rng.standard_normal((M, OUT)).astype(np.float32))

    def products(batched):
        out, dinp = poisoned(ga, M, OUT), poisoned(ga, M, IN)
        splits = [K.weight_splits([w] if batched else [], transposed) for transposed in (False, True)]
        plan = K.Plan()
        with splits[0].reading(plan), splits[1].reading(plan):
            TC.matmul_fwd(out, inp, w, bias, stream=plan)
            K.sgemm(dinp, dout, w, stream=plan, units="tc")  # the dX product: dinp = dout @ W
        K.replay(plan, None, "products")
        return [name for name, *_ in plan], out.get(), dinp.get(), [len(s) for s in splits]

    batched = products(True)
    own = products(False)
    assert batched[0] == ["k_tf32_split_batch", "k_tf32_split_batch", "k_gemm_wg_areg", "k_gemm_wg_areg"], batched[0]
    assert batched[3] == [1, 1] and own[3] == [0, 0]
    assert own[0] == ["k_tf32_split", "k_gemm_wg_areg", "k_tf32_split_t", "k_gemm_wg_areg"], own[0]
    assert np.isfinite(own[1]).all() and np.isfinite(own[2]).all()
    np.testing.assert_array_equal(batched[1], own[1])
    np.testing.assert_array_equal(batched[2], own[2])


# (M, N, K, parts, blocks) of k_gemm_wg_areg_tn's parts of K: chains of parts within a block and across blocks, more
# jobs than blocks, a block whose later job waits on its own earlier one, unaligned rows (M, N odd), partial tiles,
# parts of uneven length, and andrea-120m's qkv dW at the engine's own count
TN_PARTS = [(1000, 333, 1000, 4, 5), (700, 301, 1001, 7, 132), (130, 130, 8192, 16, 3), (257, 129, 300, 2, 1),
            (2304, 768, 2048, 6, 132), (129, 1, 300, 3, 2), (64, 700, 4097, 9, 40)]


@pytest.mark.parametrize("M,N,K_,parts,blocks", TN_PARTS)
@pytest.mark.parametrize("beta,with_bias", [(-2.0, False), (1.0, True)], ids=["beta-2", "beta1-bias"])
def test_the_dw_kernels_parts_of_k_add_up_in_order(ga, rng, M, N, K_, parts, blocks, beta, with_bias):
    """k_gemm_wg_areg_tn with K in parts, launched directly: C = beta * C + alpha * A^T B (+ bias) and a_sums += the
    row sums of A^T, against float64 (1.5x the SIMT kernel's error, sums within 1e-5 of sum |a|); the same bits on a
    second run from the same start; the flags left zero for the next launch; one part gives the unsplit product's
    error too. beta = 1 is the dW products' (every part added into C by reductions), N odd their one-float path."""
    if not K.warpgroup_mma(K.engine()):
        pytest.skip(f"{K.device_summary()}: k_gemm_wg_areg_tn is the wgmma path's (sm_90a)")
    a_h = rng.standard_normal((K_, M)).astype(np.float32)
    b_h = rng.standard_normal((K_, N)).astype(np.float32)
    c0, s0 = rng.standard_normal((M, N)).astype(np.float32), rng.standard_normal(M).astype(np.float32)
    bias_h = rng.standard_normal(N).astype(np.float32)
    a, b, bias = ga.to_gpu(a_h), ga.to_gpu(b_h), ga.to_gpu(bias_h) if with_bias else None
    tiles = -(-M // 128) * -(-N // 128)
    flags = ga.zeros(2 * tiles, np.int32)
    sizes = K.int_constants()

    def run(n_parts):
        c, sums = ga.to_gpu(c0), ga.to_gpu(s0)
        args = [c.gpudata, a.gpudata, b.gpudata, bias.gpudata if with_bias else 0, M, N, K_, M, N, N, 0, 0, 0, 0.5,
                beta, int(K.Causal.NONE), 0.0, sums.gpudata, 1, n_parts, flags.gpudata]
        K.runtime.launch("k_gemm_wg_areg_tn", args, min(blocks, tiles * n_parts),
                         shared=sizes["TC_AREG_TN_SMEM_BYTES"], block=sizes["TC_WG_THREADS"])
        assert not flags.get().any(), "the last part sets its tile's flags back to zero"
        return c.get(), sums.get()

    A = a_h.astype(np.float64)
    ref = 0.5 * (A.T @ b_h.astype(np.float64)) + beta * c0 + (bias_h if with_bias else 0.0)
    simt = ga.to_gpu(c0)
    K.sgemm(simt, a, b, trans_a=True, alpha=0.5, beta=beta, bias=bias)
    first, sums = run(parts)
    within_bar(f"dW parts {parts}", first, simt.get(), ref)
    np.testing.assert_allclose(sums, s0 + A.sum(axis=0), rtol=0, atol=1e-5 * (np.abs(A).sum(axis=0) + 1).max())
    again, sums_again = run(parts)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(sums, sums_again)
    within_bar("dW one part", run(1)[0], simt.get(), ref)
