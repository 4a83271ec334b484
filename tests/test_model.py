"""The GPT API on the numpy backend: properties of the model and the errors of bad calls."""
import numpy as np
import pytest

from microgpt import GPT, GPTConfig

CFG = GPTConfig(n_layer=2, n_head=4, d_model=32, block_size=16, vocab_size=50)


@pytest.fixture
def model():
    return GPT(CFG, seed=1)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = GPT(CFG, seed=5).state_dict(), GPT(CFG, seed=5).state_dict(), GPT(CFG, seed=6).state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wte"], c["wte"])


def test_causal_changing_token_j_moves_no_output_before_j(model, rng):
    T, j = 12, 7
    idx = rng.integers(0, CFG.vocab_size, size=(2, T))
    other = idx.copy()
    other[:, j] = (other[:, j] + 1 + rng.integers(0, CFG.vocab_size - 1, size=2)) % CFG.vocab_size
    a, _ = model.forward(idx)
    b, _ = model.forward(other)
    np.testing.assert_array_equal(a[:, :j], b[:, :j])
    assert np.abs(a[:, j:] - b[:, j:]).max() > 1e-4  # and it does move the outputs from j on


def test_float64_gradients_against_finite_differences(rng):
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=8, block_size=6, vocab_size=13)
    model = GPT(cfg, seed=2, dtype=np.float64)
    idx = rng.integers(0, 13, size=(2, 5))
    tgt = rng.integers(0, 13, size=(2, 5))
    model.forward(idx, tgt)
    model.backward()
    grads = model.backend.G
    params = model.backend.P
    h = 1e-6
    for name in ["wte", "wpe", "h.0.attn.qkv.w", "h.0.mlp.fc.b", "h.0.ln1.w", "lnf.b"]:
        p, g = params[name].reshape(-1), grads[name].reshape(-1)
        for i in rng.choice(p.size, size=min(8, p.size), replace=False):
            old = p[i]
            p[i] = old + h
            lp = model.forward(idx, tgt)[1]
            p[i] = old - h
            lm = model.forward(idx, tgt)[1]
            p[i] = old
            assert abs((lp - lm) / (2 * h) - g[i]) < 1e-7 + 1e-5 * abs(g[i]), (name, i)


def test_backward_accumulates_until_zero_grad(model, rng):
    idx = rng.integers(0, CFG.vocab_size, size=(2, 8))
    model.forward(idx, idx)
    model.backward()
    once = model.grad_dict()["h.1.attn.qkv.w"]
    model.forward(idx, idx)
    model.backward()
    np.testing.assert_allclose(model.grad_dict()["h.1.attn.qkv.w"], 2 * once, rtol=1e-6, atol=1e-9)
    model.zero_grad()
    assert not any(g.any() for g in model.grad_dict().values())


def test_training_lowers_the_loss(rng):
    model = GPT(CFG, seed=0)
    idx = rng.integers(0, CFG.vocab_size, size=(4, 16))
    first = None
    for _ in range(15):
        model.zero_grad()
        _, loss = model.forward(idx[:, :-1], idx[:, 1:])
        first = first or loss
        model.backward()
        model.step(lr=1e-2, grad_clip=1.0)
    assert loss < 0.7 * first


def test_generate(model, rng):
    prompt = rng.integers(0, CFG.vocab_size, size=(2, 3))
    out = model.generate(prompt, 20, seed=4)
    assert out.shape == (2, 23) and out.dtype == np.int32
    np.testing.assert_array_equal(out[:, :3], prompt)
    assert out.min() >= 0 and out.max() < CFG.vocab_size
    np.testing.assert_array_equal(out, model.generate(prompt, 20, seed=4))  # same seed, same text
    greedy = model.generate(prompt, 5, temperature=0)
    logits, _ = model.forward(prompt)
    np.testing.assert_array_equal(greedy[:, 3], logits[:, -1].argmax(-1))
    top1 = model.generate(prompt, 5, top_k=1, seed=9)
    np.testing.assert_array_equal(top1, greedy)
    assert model.generate(np.array([1, 2]), 2, seed=0).shape == (1, 4)  # 1-D prompt


def test_generate_beyond_block_size_crops_the_context(model):
    out = model.generate(np.zeros((1, CFG.block_size + 3), dtype=np.int64), 4, seed=0)
    assert out.shape == (1, CFG.block_size + 7)


def test_state_dict_round_trip(model):
    sd = model.state_dict()
    assert set(sd) == {s.name for s in model.table}
    assert all(v.dtype == np.float32 for v in sd.values())
    sd["wte"][0, 0] = 123.0  # a copy: changing it changes nothing until loaded
    assert model.state_dict()["wte"][0, 0] != 123.0
    other = GPT(CFG, seed=99)
    other.load_state_dict(sd)
    assert other.state_dict()["wte"][0, 0] == 123.0
    assert all(np.array_equal(other.state_dict()[k], sd[k]) for k in sd)


# -- bad calls -------------------------------------------------------------------------------------
@pytest.mark.parametrize("idx,exc,match", [
    (np.zeros((2, 4), dtype=np.float32), TypeError, "idx must be an integer array"),
    (np.zeros(4, dtype=np.int64), ValueError, r"idx must have shape \(B, T\)"),
    (np.zeros((1, 2, 3), dtype=np.int64), ValueError, r"idx must have shape \(B, T\)"),
    (np.full((1, 3), 50), ValueError, r"idx holds token id 50, outside \[0, vocab_size=50\)"),
    (np.full((1, 3), -1), ValueError, "idx holds token id -1"),
    (np.zeros((1, 17), dtype=np.int64), ValueError, "T=17 positions, above block_size=16"),
    (np.zeros((0, 3), dtype=np.int64), ValueError, "B >= 1 and T >= 1"),
    ([[1, 2], [3]], TypeError, "idx"),
])
def test_bad_idx(model, idx, exc, match):
    with pytest.raises(exc, match=match):
        model.forward(idx)


def test_bad_targets(model):
    idx = np.zeros((2, 4), dtype=np.int64)
    with pytest.raises(ValueError, match=r"targets must have the shape of idx \(2, 4\), got \(2, 3\)"):
        model.forward(idx, np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="targets holds token id 77"):
        model.forward(idx, np.full((2, 4), 77))
    with pytest.raises(TypeError, match="targets must be an integer array"):
        model.forward(idx, np.zeros((2, 4)))


def test_backward_before_forward(model):
    with pytest.raises(RuntimeError, match="backward"):
        model.backward()
    model.forward(np.zeros((1, 3), dtype=np.int64))  # no targets: nothing to differentiate
    with pytest.raises(RuntimeError, match="targets"):
        model.backward()


def test_bad_state_dict_loads_nothing(model):
    before = model.state_dict()
    sd = model.state_dict()
    del sd["h.0.ln1.b"]
    with pytest.raises(ValueError, match="missing h.0.ln1.b"):
        model.load_state_dict(sd)
    sd = model.state_dict()
    sd["h.9.extra"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="unexpected h.9.extra"):
        model.load_state_dict(sd)
    sd = model.state_dict()
    sd["wpe"] = np.zeros((3, 3), np.float32)
    sd["wte"] = sd["wte"] + 1  # would be loaded first if loading were not all or nothing
    with pytest.raises(ValueError, match=r"state_dict\['wpe'\] has shape \(3, 3\), expected \(16, 32\)"):
        model.load_state_dict(sd)
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-1.0), "lr"), (dict(lr=1e-3, betas=(1.0, 0.9)), r"betas\[0\]"),
    (dict(lr=1e-3, betas=(0.9,)), "betas"), (dict(lr=1e-3, eps=0.0), "eps"),
    (dict(lr=1e-3, weight_decay=-0.1), "weight_decay"), (dict(lr=1e-3, grad_clip=0.0), "grad_clip"),
])
def test_bad_step_arguments(model, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        model.step(**kwargs)
    assert model.step_count == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(max_new_tokens=2, temperature=-1.0), "temperature"),
    (dict(max_new_tokens=2, top_k=0), "top_k"), (dict(max_new_tokens=2, top_k=51), "top_k"),
])
def test_bad_generate_arguments(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        model.generate(np.zeros((1, 2), dtype=np.int64), **kwargs)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="backend must be one of"):
        GPT(CFG, backend="tpu")
    with pytest.raises(TypeError, match="config must be a GPTConfig"):
        GPT({"n_layer": 1})
