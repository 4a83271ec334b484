"""The reference engine's backward of every operation against central finite differences (float64).

For an operation out = f(inputs) and a random upstream gradient G, the gradient of L = sum(G * out) with
respect to each input is what the backward must return; finite differences of L measure it from outside.
"""
import numpy as np
import pytest

from microgpt import reference as R

from helpers import attention_bwd, attention_fwd, rel_err

H = 1e-6  # central differences in float64: truncation ~H^2, rounding ~1e-16/H
TOL = 1e-6


def numeric_grad(loss, x, rng, max_points=120):
    """d loss / d x at up to max_points random coordinates; returns (flat indices, values)."""
    n = x.size
    pts = np.arange(n) if n <= max_points else rng.choice(n, size=max_points, replace=False)
    flat = x.reshape(-1)
    out = np.empty(len(pts))
    for i, p in enumerate(pts):
        old = flat[p]
        flat[p] = old + H
        lp = loss()
        flat[p] = old - H
        lm = loss()
        flat[p] = old
        out[i] = (lp - lm) / (2 * H)
    return pts, out


def check(fwd, inputs, grads_of, rng, names):
    """fwd(*inputs) -> one array; grads_of(G) -> analytic gradients for inputs named in `names`."""
    out = fwd(*inputs)
    G = rng.standard_normal(out.shape)
    analytic = grads_of(G)
    for name, x, g in zip(names, [inputs[i] for i in range(len(names))], analytic):
        assert g.shape == x.shape, name
        pts, num = numeric_grad(lambda: float(np.sum(G * fwd(*inputs))), x, rng)
        err = rel_err(g.reshape(-1)[pts], num)
        assert err < TOL, f"d/d{name}: relative error {err:.2e}"


def randn(rng, *shape):
    return rng.standard_normal(shape)


def test_embed(rng):
    V, T_block, C, B, T = 11, 9, 6, 3, 7
    wte, wpe = randn(rng, V, C), randn(rng, T_block, C)
    idx = rng.integers(0, V, size=(B, T))
    idx[0, :3] = 4  # repeated tokens must add up
    check(lambda wte, wpe: R.embed_fwd(idx, wte, wpe), [wte, wpe],
          lambda G: R.embed_bwd(G, idx, V, T_block), rng, ["wte", "wpe"])


def test_layernorm(rng):
    x, w, b = randn(rng, 3, 5, 16), randn(rng, 16), randn(rng, 16)
    x *= 3.0
    x += 2.0  # an offset the normalisation must remove

    def grads(G):
        _, mean, rstd = R.layernorm_fwd(x, w, b)
        return R.layernorm_bwd(G, x, w, mean, rstd)
    check(lambda x, w, b: R.layernorm_fwd(x, w, b)[0], [x, w, b], grads, rng, ["x", "w", "b"])


def test_linear(rng):
    x, w, b = randn(rng, 2, 5, 7), randn(rng, 9, 7), randn(rng, 9)
    check(lambda x, w, b: R.linear_fwd(x, w, b), [x, w, b], lambda G: R.linear_bwd(G, x, w), rng,
          ["x", "w", "b"])


def test_split_heads(rng):
    B, T, NH, d_k = 2, 5, 3, 4
    qkv = randn(rng, B, T, 3 * NH * d_k)

    def fwd(qkv):
        return np.stack(R.split_heads_fwd(qkv, NH))
    check(fwd, [qkv], lambda G: [R.split_heads_bwd(G[0], G[1], G[2])], rng, ["qkv"])


def test_split_heads_layout():
    # head h of Q is columns h*d_k:(h+1)*d_k of the first C columns, K and V follow
    B, T, NH, d_k = 1, 2, 2, 3
    C = NH * d_k
    qkv = np.arange(B * T * 3 * C, dtype=np.float64).reshape(B, T, 3 * C)
    q, k, v = R.split_heads_fwd(qkv, NH)
    np.testing.assert_array_equal(q[0, 1, 1], qkv[0, 1, d_k:2 * d_k])
    np.testing.assert_array_equal(k[0, 0, 1], qkv[0, 1, C:C + d_k])
    np.testing.assert_array_equal(v[0, 1, 0], qkv[0, 0, 2 * C + d_k:2 * C + 2 * d_k])


def test_attn_scores(rng):
    q, k = randn(rng, 2, 3, 6, 4), randn(rng, 2, 3, 6, 4)
    check(R.attn_scores_fwd, [q, k], lambda G: R.attn_scores_bwd(G, q, k), rng, ["q", "k"])


def test_attn_scores_is_the_literal_line(rng):
    # scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k)), float32 as the kernel
    q = rng.standard_normal((1, 1, 5, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, 5, 64)).astype(np.float32)
    s = R.attn_scores_fwd(q, k)
    assert s.dtype == np.float32
    i, j = 3, 1
    scale = np.float32(1.0) / np.sqrt(np.float32(64))
    expected = np.dot(q[0, 0, i], k[0, 0, j]) * scale
    # the two float32 sums differ in order only: bounded by the size of the terms, not of their sum (which
    # cancellation can make small); a wrong formula (no scale, sqrt left out) is off by far more
    magnitude = np.dot(np.abs(q[0, 0, i]).astype(np.float64), np.abs(k[0, 0, j])) * scale
    assert abs(float(s[0, 0, i, j]) - float(expected)) <= 1e-6 * magnitude


def test_causal_mask(rng):
    s = randn(rng, 2, 2, 5, 5)
    m = R.causal_mask_fwd(s)
    i, j = np.indices((5, 5))
    assert np.all(m[..., j > i] == -1e9) and np.all(m[..., j <= i] == s[..., j <= i])
    # the -1e9 constants would drown the differences in rounding: take them out of the loss
    constant = R.causal_mask_fwd(np.zeros_like(s))
    check(lambda s: R.causal_mask_fwd(s) - constant, [s], lambda G: [R.causal_mask_bwd(G)], rng, ["scores"])


def test_softmax(rng):
    x = randn(rng, 2, 3, 4, 7) * 3
    check(R.softmax_fwd, [x], lambda G: [R.softmax_bwd(G, R.softmax_fwd(x))], rng, ["x"])


def test_attn_values(rng):
    p, v = R.softmax_fwd(randn(rng, 2, 3, 5, 5)), randn(rng, 2, 3, 5, 4)
    check(R.attn_values_fwd, [p, v], lambda G: R.attn_values_bwd(G, p, v), rng, ["probs", "v"])


def test_merge_heads(rng):
    y = randn(rng, 2, 3, 5, 4)
    check(R.merge_heads_fwd, [y], lambda G: [R.merge_heads_bwd(G, 3)], rng, ["heads"])
    np.testing.assert_array_equal(R.merge_heads_bwd(R.merge_heads_fwd(y), 3), y)


def test_gelu(rng):
    x = randn(rng, 4, 33) * 3
    check(R.gelu_fwd, [x], lambda G: [R.gelu_bwd(G, x)], rng, ["x"])


def test_residual(rng):
    a, b = randn(rng, 3, 4), randn(rng, 3, 4)
    check(R.residual_fwd, [a, b], lambda G: R.residual_bwd(G), rng, ["a", "b"])


def test_crossentropy(rng):
    B, T, V = 2, 3, 11
    logits = randn(rng, B, T, V) * 4
    targets = rng.integers(0, V, size=(B, T))

    def grads(G):
        _, probs = R.crossentropy_fwd(logits, targets)
        return [R.crossentropy_bwd(G, probs, targets)]
    check(lambda lg: R.crossentropy_fwd(lg, targets)[0], [logits], grads, rng, ["logits"])


def test_crossentropy_is_stable_for_large_logits():
    logits = np.array([[[1000.0, 0.0, -1000.0]]], dtype=np.float32)
    losses, probs = R.crossentropy_fwd(logits, np.array([[1]]))
    assert np.isfinite(losses).all() and abs(losses[0, 0] - 1000.0) < 1e-3
    assert abs(probs.sum() - 1) < 1e-6


def test_attention_sublayer(rng):
    B, T, NH, d_k = 2, 5, 3, 4
    C = NH * d_k
    x = randn(rng, B, T, C)
    wq, bq, wo, bo = randn(rng, 3 * C, C) * 0.3, randn(rng, 3 * C), randn(rng, C, C) * 0.3, randn(rng, C)

    def grads(G):
        _, cache = attention_fwd(x, wq, bq, wo, bo, NH)
        dx, d = attention_bwd(G, cache, wq, wo, NH)
        return dx, d["w_qkv"], d["b_qkv"], d["w_o"], d["b_o"]
    check(lambda x, wq, bq, wo, bo: attention_fwd(x, wq, bq, wo, bo, NH)[0], [x, wq, bq, wo, bo],
          grads, rng, ["x", "w_qkv", "b_qkv", "w_o", "b_o"])


def test_attention_probabilities_rows_sum_to_one_and_are_causal(rng):
    B, T, NH, d_k = 2, 9, 4, 8
    C = NH * d_k
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    w = (rng.standard_normal((3 * C, C)) * 0.5).astype(np.float32)
    _, cache = attention_fwd(x, w, np.zeros(3 * C, np.float32), np.eye(C, dtype=np.float32),
                               np.zeros(C, np.float32), NH)
    p = cache["probs"]
    assert p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=1e-6)
    i, j = np.indices((T, T))
    assert np.all(p[..., j > i] == 0.0)
    assert np.all(p[..., j <= i] > 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ops_keep_their_dtype(dtype, rng):
    x = rng.standard_normal((2, 3, 8)).astype(dtype)
    w = np.ones(8, dtype)
    for out in (R.layernorm_fwd(x, w, w)[0], R.gelu_fwd(x), R.softmax_fwd(x),
                R.linear_fwd(x, np.ones((4, 8), dtype), np.ones(4, dtype)), R.causal_mask_fwd(x[..., :3, :3])):
        assert out.dtype == dtype


def test_clip_coef_matches_torch_formula():
    assert R.clip_coef(10.0, 1.0) == pytest.approx(1.0 / (10.0 + 1e-6))
    assert R.clip_coef(0.5, 1.0) == 1.0
    g = [np.full(4, 3.0), np.full((2, 2), 4.0)]
    assert R.global_norm(g) == pytest.approx(np.sqrt(4 * 9 + 4 * 16))
