"""The attention's output projection's backward into flash attention's (matmul_attention_bwd): on sm_90a the tc
variant sums flash attention's delta in the epilogue of the dX product that makes dy (cuda/matmul_attention_tc.cuh).
The kernel alone, on fresh random inputs with its outputs poisoned: dy the bits of the split-operand product it
stands in for, delta the float64 sum of dy * y rounded once, the counters of its query tiles zeroed and nothing
else touched. The op: dy, dweight and dbias the bits of the same ops apart, dqkv within 1.5x the fast pipeline's
error against float64, and its bits repeat. At andrea-120m's shape, and at shapes that fill no tile."""
import numpy as np
import pytest

from microgpt import kernels as K
from microgpt import ops as O

from helpers import device, record
from test_gpu_fused_attention import BAR, check_delta_rows, err, fast_pipeline, float64_attention, parts, poisoned

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ga():
    K.engine()
    import pycuda.gpuarray as ga
    return ga


def needs_wgmma():
    if not K.warpgroup_mma(K.engine()):
        pytest.skip(f"{K.device_summary()}: the fused kernel is the wgmma path's (sm_90a)")


def bits(a):
    return np.asarray(a).view(np.uint32)


# (B, T, NH, d_k, offset): andrea-120m at T = 1024; d_k 32 and 128; T past a tile's 128 rows, so that a tile holds
# the end of one batch row and the start of the next (200, 129, 260); C = 320, a partial last column tile of one
# head; y a float past 16-byte alignment (offset 1: the tile's scalar loads); T = 128, no rows past the pass kernel's
SHAPES = [(8, 1024, 12, 64, 0), (3, 200, 8, 32, 0), (1, 260, 2, 128, 1), (2, 129, 5, 64, 0), (2, 300, 6, 64, 1),
          (2, 128, 4, 64, 0)]
IDS = [f"B{b}-T{t}-NH{h}-dk{d}-off{o}" for b, t, h, d, o in SHAPES]


@pytest.mark.parametrize("B,T,NH,d_k,offset", SHAPES, ids=IDS)
def test_the_kernel_writes_the_products_dy_and_the_float64_delta_of_its_rows(ga, rng, B, T, NH, d_k, offset):
    """k_gemm_wg_split_delta alone: dy = dout @ W in the bits of k_gemm_wg_areg (K.sgemm's with units="tc" there), delta of
    the rows past the pass kernel's query tiles within half an FP32 ulp of the float64 sum of dy * y over the head,
    those tiles' counters 0; the rows and counters before them, and the ticket, as they were (poisoned)."""
    needs_wgmma()
    from microgpt.kernels.runtime import launch
    from microgpt.kernels.source import int_constant
    tiles, C, N = -(-T // K.flash_attention._sizes(K.flash_attention.width(d_k))["keys"]), NH * d_k, B * T
    dout_h = rng.standard_normal((N, C)).astype(np.float32)
    w_h = (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32)
    y_h = rng.standard_normal((N, C)).astype(np.float32)
    dout, w, y = ga.to_gpu(dout_h), ga.to_gpu(w_h), device(ga, y_h, offset)
    dy, want_dy = poisoned(ga, N, C), poisoned(ga, N, C)
    delta = poisoned(ga, B, NH, T)
    sync = ga.to_gpu(np.full(B * NH * tiles + 1, -1, np.int32))
    g = K.Gemm.dense(N, C, C, units="tc")
    ws, b_split, K_pad, grid = K.products.split_b_into_workspace(g, int(w.gpudata), None)
    a_map = K.matmul_tc.a_tensor_map(g, int(dout.gpudata), None)  # dout by the TMA, as the launcher copies it
    assert a_map != 0
    launch("k_gemm_wg_split_delta", [int(dy.gpudata), int(delta.gpudata), int(sync.gpudata), int(dout.gpudata), C,
                                     a_map, b_split, int(y.gpudata), N, C, C, K_pad, T, d_k], grid, None,
           shared=int_constant("TC_AREG_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"))
    K.engine().cuda.Context.synchronize()
    del ws
    plan = K.Plan()
    K.sgemm(want_dy, dout, w, stream=plan, units="tc")
    assert [name for name, *_ in plan][-1] == "k_gemm_wg_areg"
    K.replay(plan, None, "test")
    got_dy = dy.get()
    np.testing.assert_array_equal(bits(got_dy), bits(want_dy.get()))
    check_delta_rows(delta.get(), sync.get(), y_h, got_dy, B, T, NH, d_k)


def run(ga, fn, args, offset):
    """fn (an op's launcher) on fresh device copies of args (dqkv and dy poisoned, dweight and dbias zero, y
    `offset` floats off): dqkv, dweight, dbias and dy on the host, and the kernels it queued."""
    dqkv_h, dweight_h, dbias_h, dout_h, y, w_h, qkv, lse, NH = args
    dqkv, dy = poisoned(ga, *dqkv_h.shape), poisoned(ga, *dout_h.shape)
    dweight, dbias = ga.to_gpu(np.zeros_like(dweight_h)), ga.to_gpu(np.zeros_like(dbias_h))
    dout, w = ga.to_gpu(dout_h), ga.to_gpu(w_h)
    plan = K.Plan()  # the plan holds its scratch; the arrays it points into are held here
    fn(dqkv, dweight, dbias, dout, y, w, qkv, lse, NH, dy=dy, stream=plan)
    K.replay(plan, None, "test")
    K.engine().cuda.Context.synchronize()
    return [a.get() for a in (dqkv, dweight, dbias, dy)], {name for name, *_ in plan}


@pytest.mark.parametrize("B,T,NH,d_k,offset", SHAPES, ids=IDS)
def test_the_fused_backward_gives_the_ops_apart_bits_and_flash_attentions_accuracy(ga, rng, B, T, NH, d_k, offset):
    needs_wgmma()
    C = NH * d_k
    qkv_h = rng.standard_normal((B, T, 3 * C)).astype(np.float32)
    qkv_h[..., :C] *= 2.0  # scores of order 1 and more, so the softmax is far from uniform
    qkv = ga.to_gpu(qkv_h)
    y, lse = device(ga, np.zeros((B, T, C), np.float32), offset), poisoned(ga, B, NH, T)
    K.fused_attention_fwd_tc(y, lse, qkv, NH)
    args = (np.zeros((B, T, 3 * C), np.float32), np.zeros((C, C), np.float32), np.zeros(C, np.float32),
            rng.standard_normal((B, T, C)).astype(np.float32), y,
            (rng.standard_normal((C, C)) / np.sqrt(C)).astype(np.float32), qkv, lse, NH)
    fused, kernels = run(ga, O.select("tc").matmul_attention_bwd, args, offset)
    apart, kernels_apart = run(ga, K.matmul_attention_tc.unfused, args, offset)
    assert "k_gemm_wg_split_delta" in kernels and "k_flash_bwd_delta_rows" not in kernels, kernels
    assert "k_gemm_wg_split_delta" not in kernels_apart, kernels_apart
    for what, a, b in zip(("dweight", "dbias", "dy"), fused[1:], apart[1:]):
        np.testing.assert_array_equal(bits(a), bits(b), err_msg=what)
    assert np.all(np.isfinite(fused[3])) and np.abs(fused[2]).sum() > 0
    # dqkv from the op's own dy, against float64 and the fast pipeline on the same dy
    dy_h = fused[3]
    _, _, dqkv64 = float64_attention(qkv_h, dy_h, NH)
    _, dqkv_fast = fast_pipeline(ga, qkv, ga.to_gpu(dy_h), NH)
    for name, got in parts(fused[0], C).items():
        want, e, e_fast = parts(dqkv64, C)[name], err(got, parts(dqkv64, C)[name]), err(parts(dqkv_fast, C)[name],
                                                                                         parts(dqkv64, C)[name])
        record("matmul_attention_bwd tc (fused) vs float64", f"{name} B={B} T={T} NH={NH} d_k={d_k}", e)
        limit = BAR * max(e_fast, 2 ** -23)
        assert e <= limit, f"{name}: the fused backward's error {e:.2e} > {limit:.2e} (fast: {e_fast:.2e})"
        # and the ops apart, whose delta sums the same products in another order
        e_apart = err(parts(apart[0], C)[name], want)
        assert e <= BAR * max(e_apart, 2 ** -23), f"{name}: {e:.2e} against {e_apart:.2e} apart"
    again, _ = run(ga, O.select("tc").matmul_attention_bwd, args, offset)
    for what, a, b in zip(("dqkv", "dweight", "dbias", "dy"), again, fused):
        np.testing.assert_array_equal(bits(a), bits(b), err_msg=f"{what}, run again")
