"""Sampling with a key-value cache on the GPU: the decode kernels against float64 (NaN-poisoned outputs, the
caches' other rows left as they were), and the cuda backend's prefill/decode against its own full forward
and the numpy backend's cache."""
import numpy as np
import pytest

from microgpt import GPT, GPTConfig
from microgpt import kernels as K
from microgpt import ops as O
from microgpt.ops import VARIANTS

from helpers import record, rel_err

pytestmark = pytest.mark.gpu

SMALL = GPTConfig(n_layer=2, n_head=4, d_model=64, block_size=19, vocab_size=97)
VARIANT = pytest.mark.parametrize("variant", list(VARIANTS))


@pytest.fixture(scope="module")
def ga():
    K.engine()
    import pycuda.gpuarray as ga
    return ga


def close(what, got, want, tol):
    err = rel_err(got, want)
    record("decode vs float64 / full forward", what, err)
    assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"


def nan(ga, *shape):
    a = ga.empty(shape, np.float32)
    a.fill(np.nan)
    return a


def pos_array(ga, p):
    return ga.to_gpu(np.array([p], np.int32))


# (B, NH, T_max, d_k, p): d_k of 8, 64 and 100 (float4s), 5 (one float a lane, a row's 4 lanes uneven), 130 and
# 300 (a lane's weighted values looped over d past 32 and 256), p at the first row, the last and between, at the
# first and last row of a chunk of 64 positions (a warp's 8 rows all used, or one) and in a last chunk of one row
@pytest.mark.parametrize("B,NH,T_max,d_k,p", [(2, 3, 16, 8, 0), (1, 2, 33, 5, 32), (1, 2, 64, 5, 63),
                                               (1, 2, 40, 100, 39), (2, 12, 1024, 64, 1023), (3, 4, 300, 130, 150),
                                               (1, 1, 50, 300, 49), (1, 12, 1024, 64, 517), (2, 2, 130, 8, 64),
                                               (1, 3, 129, 16, 127), (1, 3, 129, 16, 128)])
def test_attention_decode(ga, rng, B, NH, T_max, d_k, p):
    check_attention_decode(ga, rng, B, NH, T_max, d_k, p)


@pytest.mark.parametrize("d_k,p", [(64, 20), (64, 200), (8, 70)])
def test_attention_decode_of_caches_off_a_16_byte_boundary(ga, rng, d_k, p):
    """Caches one float past an allocation's start: the kernel copies their rows a float at a time."""
    check_attention_decode(ga, rng, 1, 3, 256, d_k, p, offset=1)


def on_gpu_at(ga, a, offset):
    """a copied to the device `offset` floats past the start of an allocation."""
    return ga.to_gpu(np.concatenate([np.zeros(offset, np.float32), a.ravel()]))[offset:].reshape(a.shape)


def check_attention_decode(ga, rng, B, NH, T_max, d_k, p, offset=0):
    C = NH * d_k
    k_h = rng.standard_normal((B, NH, T_max, d_k)).astype(np.float32)
    v_h = rng.standard_normal((B, NH, T_max, d_k)).astype(np.float32)
    qkv_h = rng.standard_normal((B, 1, 3 * C)).astype(np.float32)
    k_cache, v_cache = on_gpu_at(ga, k_h, offset), on_gpu_at(ga, v_h, offset)
    qkv, y = ga.to_gpu(qkv_h), nan(ga, B, 1, C)
    K.attention_decode(y, k_cache, v_cache, qkv, pos_array(ga, p))
    want = attention_decode64(qkv_h, k_h, v_h, p)  # row p written, every other row as it was
    np.testing.assert_array_equal(k_cache.get(), k_h)
    np.testing.assert_array_equal(v_cache.get(), v_h)
    close("k_attention_decode", y.get(), want.reshape(B, 1, C), 1e-5)


def attention_decode64(qkv, k, v, p):
    """k_attention_decode in float64: row p of the caches k, v (B, NH, T_max, d_k) set from qkv (B, 1, 3C) in place,
    as the kernel writes it; returns softmax(q . k[:p + 1] * the literal line's float32 scale) v[:p + 1], (B, NH,
    d_k)."""
    B, NH, _, d_k = k.shape
    q, k[:, :, p], v[:, :, p] = (qkv[:, 0, i * NH * d_k:(i + 1) * NH * d_k].reshape(B, NH, d_k) for i in range(3))
    scale = np.float64(np.float32(1.0) / np.sqrt(np.float32(d_k)))
    s = np.einsum("bhd,bhtd->bht", q.astype(np.float64), k[:, :, :p + 1].astype(np.float64)) * scale
    probs = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bht,bhtd->bhd", probs / probs.sum(-1, keepdims=True), v[:, :, :p + 1].astype(np.float64))


# rows 8 .. 15 of a chunk are one warp's whole group of rows (at the launcher's 256 threads, a warp a group)
@pytest.mark.parametrize("p,rows", [(40, slice(8, 16)), (100, slice(72, 80)), (40, slice(20, 21))])
@pytest.mark.parametrize("poison", [np.nan, -np.inf])
def test_attention_decode_of_non_finite_scores(ga, rng, p, rows, poison):
    """Cached keys of one head that score NaN reach that head's output, as softmax's do; keys that score -inf
    weigh nothing (the head's other rows finite); the other heads are untouched either way."""
    B, NH, T_max, d_k = 1, 3, 128, 64
    C = NH * d_k
    k_h, v_h = (rng.standard_normal((B, NH, T_max, d_k)).astype(np.float32) for _ in range(2))
    qkv_h = rng.standard_normal((B, 1, 3 * C)).astype(np.float32)
    qkv_h[:, :, :C] = np.abs(qkv_h[:, :, :C])  # q > 0: keys of -inf score -inf, not NaN
    k_h[0, 1, rows] = poison
    y = nan(ga, B, 1, C)
    K.attention_decode(y, ga.to_gpu(k_h), ga.to_gpu(v_h), ga.to_gpu(qkv_h), pos_array(ga, p))
    with np.errstate(invalid="ignore"):
        want = attention_decode64(qkv_h, k_h, v_h, p)
    got = y.get().reshape(B, NH, d_k)
    if np.isnan(poison):
        assert np.isnan(got[0, 1]).all()
    else:
        close("k_attention_decode, keys of -inf", got[0, 1], want[0, 1], 1e-5)
    close("k_attention_decode, the other heads", got[0, [0, 2]], want[0, [0, 2]], 1e-5)


@pytest.mark.parametrize("p", [-1, 8, 100])
def test_attention_decode_writes_nothing_for_a_position_outside_the_cache(ga, rng, p):
    k_h, v_h = (rng.standard_normal((1, 2, 8, 4)).astype(np.float32) for _ in range(2))
    k_cache, v_cache = ga.to_gpu(k_h), ga.to_gpu(v_h)
    y = nan(ga, 1, 1, 8)
    K.attention_decode(y, k_cache, v_cache, ga.to_gpu(rng.standard_normal((1, 1, 24)).astype(np.float32)),
                       pos_array(ga, p))
    np.testing.assert_array_equal(k_cache.get(), k_h)
    np.testing.assert_array_equal(v_cache.get(), v_h)
    assert np.isnan(y.get()).all()


@pytest.mark.parametrize("B,NH,T,T_max,d_k", [(2, 3, 5, 16, 8), (1, 12, 1024, 1024, 64), (2, 2, 1, 7, 5)])
def test_kv_store(ga, rng, B, NH, T, T_max, d_k):
    cache_h = rng.standard_normal((B, NH, T_max, d_k)).astype(np.float32)
    src_h = rng.standard_normal((B, NH, T, d_k)).astype(np.float32)
    cache = ga.to_gpu(cache_h)
    K.kv_store(cache, ga.to_gpu(src_h))
    cache_h[:, :, :T] = src_h
    np.testing.assert_array_equal(cache.get(), cache_h)


def test_embed_decode(ga, rng):
    B, V, T_max, C, p = 3, 101, 17, 20, 16
    wte_h = rng.standard_normal((V, C)).astype(np.float32)
    wpe_h = rng.standard_normal((T_max, C)).astype(np.float32)
    tokens_h = rng.integers(0, V, size=(B, 1)).astype(np.int32)
    x = nan(ga, B, 1, C)
    K.embed_decode(x, ga.to_gpu(tokens_h), ga.to_gpu(wte_h), ga.to_gpu(wpe_h), pos_array(ga, p))
    np.testing.assert_array_equal(x.get(), wte_h[tokens_h] + wpe_h[p])  # float32 adds: the same bits
    with pytest.raises(ValueError, match="tokens holds token id"):
        K.embed_decode(x, ga.to_gpu(np.full((B, 1), V, np.int32)), ga.to_gpu(wte_h), ga.to_gpu(wpe_h),
                       pos_array(ga, p))


# (M, IN, OUT, offset): a decode step's products (B = 1 and 8 rows, andrea-120m's widths, the tied lm_head), every
# row count to 8, IN not a multiple of 4 and arrays off a 16-byte boundary (scalar loads), a single column
@pytest.mark.parametrize("M,IN,OUT,offset", [(1, 768, 2304, 0), (8, 3072, 768, 0), (8, 768, 50257, 0), (2, 1, 1, 0),
                                             (3, 77, 50, 0), (4, 64, 1001, 1), (5, 130, 3, 0), (6, 9, 7, 1),
                                             (7, 3072, 19, 0)])
@pytest.mark.parametrize("variant", ["fast", "tc"])
def test_few_row_products_take_k_matvec_as_accurate_as_the_sgemm(ga, rng, variant, M, IN, OUT, offset):
    x_h = rng.standard_normal(M * IN + offset).astype(np.float32)
    w_h = rng.standard_normal(OUT * IN + offset).astype(np.float32)
    b_h = rng.standard_normal(OUT).astype(np.float32)
    x, w, b = ga.to_gpu(x_h)[offset:].reshape(M, IN), ga.to_gpu(w_h)[offset:].reshape(OUT, IN), ga.to_gpu(b_h)
    out, ref = nan(ga, M, OUT), nan(ga, M, OUT)
    plan = K.Plan()
    O.select(variant).matmul_fwd(out, x, w, b, stream=plan)
    assert [name for name, *_ in plan] == [f"k_matvec_{1 << (M - 1).bit_length()}"]
    O.select(variant).matmul_fwd(out, x, w, b)
    K.sgemm(ref, x, w, trans_b=True, bias=b)  # the SIMT SGEMM's error on the same inputs: the bar
    want = x_h[offset:].reshape(M, IN).astype(np.float64) @ w_h[offset:].reshape(OUT, IN).T.astype(np.float64) + b_h
    close(f"k_matvec ({variant})", out.get(), want, max(1.5 * rel_err(ref.get(), want), 1e-7))


def gelu64(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


# (M, C, N): the decode step's qkv, fc and lm_head at B = 1 .. 8 (andrea-120m's widths; gpt2-124m's vocabulary), a
# width not a multiple of 4 (scalar loads), a short N (K split over a block's warps), rows too wide for the
# layernorm to hold in registers (its rounds through shared memory, float4 and scalar), and past MATVEC_ROWS (the
# unfused kernels)
@pytest.mark.parametrize("M,C,N", [(1, 768, 2304), (2, 768, 3072), (3, 768, 8449), (8, 768, 50257), (5, 77, 300),
                                   (4, 384, 257), (7, 1536, 100), (6, 301, 50), (1, 4100, 33), (9, 768, 3072),
                                   (16, 64, 96)])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_layernorm_and_gelu_fused_into_the_product(ga, rng, variant, M, C, N):
    """out = gelu(layernorm(x) @ W^T + b), and without GELU, against float64 within the SGEMM's own error."""
    x_h = (3 * rng.standard_normal((M, 1, C)) + 1).astype(np.float32)
    w_h, b_h = (1 + 0.1 * rng.standard_normal(C)).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    W_h = (rng.standard_normal((N, C)) / np.sqrt(C)).astype(np.float32)
    bias_h = rng.standard_normal(N).astype(np.float32)
    x64 = x_h.astype(np.float64)
    ln = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * w_h + b_h
    for gelu in (False, True):
        want = ln @ W_h.T.astype(np.float64) + bias_h
        want = gelu64(want) if gelu else want
        out = nan(ga, M, 1, N)
        O.select(variant).layernorm_matmul_fwd(out, ga.to_gpu(x_h), ga.to_gpu(w_h), ga.to_gpu(b_h), ga.to_gpu(W_h),
                                               ga.to_gpu(bias_h), gelu=gelu)
        # the reference variant's literal kernels sum each row and each dot product one term after the other: their
        # error grows as the square root of C past the widths the bar was set at
        tol = 2e-6 * max(1.0, np.sqrt(C / 1536)) if variant == "reference" else 2e-6
        close(f"layernorm_matmul_fwd ({variant}{', gelu' * gelu})", out.get(), want, tol)


# a block of about 48 KB of dynamic shared memory (4 staged columns of 1000 and 8 layernormed rows of it: 48,512
# bytes): past 48 KB less the kernel's static shared memory, a block needs the opt-in, in a recorded plan too
@pytest.mark.parametrize("M,C,N", [(8, 1000, 8)])
def test_a_recorded_product_near_48_kb_of_shared_memory(ga, rng, M, C, N):
    """layernorm_matmul_fwd recorded into a plan (a programmatic dependent launch on sm_90) and replayed."""
    x_h = rng.standard_normal((M, 1, C)).astype(np.float32)
    w_h, b_h = np.ones(C, np.float32), np.zeros(C, np.float32)
    W_h = (rng.standard_normal((N, C)) / np.sqrt(C)).astype(np.float32)
    x64 = x_h.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) @ W_h.T.astype(np.float64)
    out, plan = nan(ga, M, 1, N), K.Plan()
    O.select("tc").layernorm_matmul_fwd(out, ga.to_gpu(x_h), ga.to_gpu(w_h), ga.to_gpu(b_h), ga.to_gpu(W_h), None,
                                        stream=plan)
    K.replay(plan, None, "test")
    close("layernorm_matmul_fwd, recorded", out.get(), want, 2e-6)


@pytest.mark.parametrize("M,K,C", [(1, 768, 768), (1, 3072, 768), (8, 3072, 768), (3, 1536, 384), (2, 50, 9),
                                   (12, 256, 64)])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_residual_add_fused_into_the_product(ga, rng, variant, M, K, C):
    """x += inp @ W^T + b, in place, against float64."""
    x_h, inp_h = rng.standard_normal((M, 1, C)).astype(np.float32), rng.standard_normal((M, 1, K)).astype(np.float32)
    W_h, b_h = (rng.standard_normal((C, K)) / np.sqrt(K)).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    x = ga.to_gpu(x_h)
    O.select(variant).matmul_residual_fwd(x, ga.to_gpu(inp_h), ga.to_gpu(W_h), ga.to_gpu(b_h))
    want = x_h + (inp_h.astype(np.float64) @ W_h.T.astype(np.float64) + b_h)
    close(f"matmul_residual_fwd ({variant})", x.get(), want, 2e-6)


# ---------------------------------------------------------------------------------------------- the model
def twins(seed, variant):
    ref = GPT(SMALL, backend="numpy", seed=seed)
    gpu = GPT(SMALL, backend="cuda", seed=seed + 1, variant=variant)
    gpu.load_state_dict(ref.state_dict())
    return ref, gpu


@VARIANT
def test_each_decoded_position_has_the_logits_of_a_full_forward(rng, variant):
    """Prefill 3 positions, then decode one at a time up to block_size: each step's logits are those of the full
    forward at that position (on the GPU) and those of the numpy backend's cache."""
    ref, gpu = twins(4, variant)
    T = SMALL.block_size
    idx = rng.integers(0, SMALL.vocab_size, size=(2, T)).astype(np.int32)
    steps = [gpu.backend.prefill(idx[:, :3])]
    ref_steps = [ref.backend.prefill(idx[:, :3])]
    for pos in range(3, T):
        steps.append(gpu.backend.decode(idx[:, pos], pos))
        ref_steps.append(ref.backend.decode(idx[:, pos], pos))
    full, _ = gpu.forward(idx)
    for pos, got, want in zip(range(2, T), steps, ref_steps):
        close(f"decoded logits vs the full forward ({variant})", got, full[:, pos], 1e-5)
        close(f"decoded logits vs the numpy backend's ({variant})", got, want, 1e-5)


# up to, at and past block_size (17 + 5: two decoded tokens, then a window re-run for each)
@pytest.mark.parametrize("prompt_len, new", [(1, 10), (5, 30), (10, 15), (17, 5)])
def test_greedy_sampling_with_the_cache_gives_the_tokens_of_full_recomputation(rng, prompt_len, new):
    prompt = rng.integers(0, SMALL.vocab_size, size=(3, prompt_len))
    gpu = GPT(SMALL, backend="cuda", seed=7)
    cached = gpu.generate(prompt, new, temperature=0)
    gpu.backend.decode_steps = None  # generate runs the whole window for every token
    np.testing.assert_array_equal(cached, gpu.generate(prompt, new, temperature=0))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (0.9, 20, 0.95)])
def test_decode_steps_queued_ahead_choose_the_tokens_of_one_step_at_a_time(rng, temperature, top_k, top_p):
    """decode_steps (each step reading the last one's tokens on the GPU, a step queued ahead) gives the tokens of
    decode() called a step at a time with the same draws."""
    from microgpt.sampling import Choice, draw
    idx = rng.integers(0, SMALL.vocab_size, size=(3, 4)).astype(np.int32)
    draws = np.random.default_rng(1)
    choices = [Choice(temperature, top_k, top_p, draw(draws, 3, temperature)) for _ in range(SMALL.block_size - 3)]
    runs = []
    for ahead in (True, False):
        gpu = GPT(SMALL, backend="cuda", seed=9)
        tokens = [gpu.backend.prefill(idx, choices[0])]
        if ahead:
            tokens += list(gpu.backend.decode_steps(tokens[0], 4, choices[1:]))
        else:
            for pos, choose in enumerate(choices[1:], start=4):
                tokens.append(gpu.backend.decode(tokens[-1], pos, choose))
        runs.append(np.stack(tokens))
    np.testing.assert_array_equal(*runs)


def test_decode_needs_a_prefill_and_a_position_in_the_context(rng):
    gpu = GPT(SMALL, backend="cuda", seed=2)
    with pytest.raises(RuntimeError, match="needs a prefill"):
        gpu.backend.decode(np.zeros(2, np.int32), 3)
    gpu.backend.prefill(rng.integers(0, SMALL.vocab_size, size=(2, 3)).astype(np.int32))
    for pos in (2, 4, SMALL.block_size):  # the next position is 3
        with pytest.raises(ValueError, match="pos must be the position after the cached ones, 3"):
            gpu.backend.decode(np.zeros(2, np.int32), pos)
    with pytest.raises(ValueError, match="tokens must have shape"):
        gpu.backend.decode(np.zeros(3, np.int32), 3)
    with pytest.raises(ValueError, match="tokens must lie in"):
        gpu.backend.decode(np.array([0, SMALL.vocab_size]), 3)
    assert gpu.backend.decode(np.array([0, 1]), 3).shape == (2, SMALL.vocab_size)  # refused ones cost nothing


def test_the_decode_graph_runs_the_plan_as_its_launches_do(rng):
    """One CUDA graph a token (the plan captured once) gives the bits of the plan replayed launch by launch."""
    idx = rng.integers(0, SMALL.vocab_size, size=(2, 8)).astype(np.int32)
    runs = []
    for graph in (True, False):
        gpu = GPT(SMALL, backend="cuda", seed=3)
        gpu.backend.prefill(idx[:, :4])
        if not graph:
            gpu.backend._dec.step.unavailable = "replayed for the test"
        runs.append([gpu.backend.decode(idx[:, p], p) for p in range(4, 8)])
        assert (gpu.backend._dec.step.graph is not None) == graph, gpu.backend._dec.step.unavailable
    for with_graph, replayed in zip(*runs):
        np.testing.assert_array_equal(with_graph, replayed)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (1.0, None, None), (0.7, 5, None),
                                                     (1.3, None, 0.8), (0.9, 20, 0.95)])
def test_the_gpu_chooses_the_token_the_host_rule_chooses_from_the_same_logits(rng, temperature, top_k, top_p):
    from microgpt.sampling import Choice, draw
    gpu = GPT(SMALL, backend="cuda", seed=5)
    idx = rng.integers(0, SMALL.vocab_size, size=(4, 6)).astype(np.int32)
    for seed in range(5):
        choose = Choice(temperature, top_k, top_p, draw(np.random.default_rng(seed), 4, temperature))
        logits = gpu.backend.prefill(idx)
        np.testing.assert_array_equal(gpu.backend.prefill(idx, choose), choose(logits))
        logits = gpu.backend.decode(idx[:, 0], 6)
        gpu.backend.prefill(idx)
        np.testing.assert_array_equal(gpu.backend.decode(idx[:, 0], 6, choose), choose(logits))


def test_sampling_on_the_gpu_repeats_with_its_seed(rng):
    prompt = rng.integers(0, SMALL.vocab_size, size=(3, 4))
    gpu = GPT(SMALL, backend="cuda", seed=9)
    runs = [gpu.generate(prompt, 30, temperature=0.9, top_k=20, top_p=0.9, seed=s) for s in (1, 1, 2)]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert ((0 <= runs[2]) & (runs[2] < SMALL.vocab_size)).all() and runs[2].shape == (3, 34)


def test_a_prefill_through_flash_attention_fills_the_caches_as_a_full_forward_reads_them(rng):
    """A prompt long enough for flash attention (the tc variant, T >= MIN_T): prefill splits each layer's keys and
    values out of its qkv for the caches; the decoded positions after it have the full forward's logits."""
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64, block_size=136, vocab_size=97)  # d_k 32
    gpu = GPT(cfg, backend="cuda", seed=3, variant="tc")
    T = cfg.block_size
    if not K.flash_attention_supported(cfg.d_model // cfg.n_head, 130, K.engine()):
        pytest.skip("flash attention does not run on this device")
    idx = rng.integers(0, cfg.vocab_size, size=(2, T)).astype(np.int32)
    steps = [gpu.backend.prefill(idx[:, :130])]
    assert gpu.backend._bufs.fused  # the prompt's forward ran flash attention
    for pos in range(130, T):
        steps.append(gpu.backend.decode(idx[:, pos], pos))
    full, _ = gpu.forward(idx)
    for pos, got in zip(range(129, T), steps):
        close("decoded logits vs the full forward, after a flash-attention prefill", got, full[:, pos], 1e-5)
