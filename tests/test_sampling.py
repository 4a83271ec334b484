"""Sampling on the numpy backend: the key-value cache against full recomputation, the cost of a token,
top-k and top-p, the streaming decoder, and the sample command; the rule itself (choose: ties at the top-k and
top-p boundaries kept or dropped together, in any order) and its draws (draw: the stream sample_next used)."""
import numpy as np
import pytest

from microgpt import GPT, GPTConfig, checkpoint
from microgpt.cli import main
from microgpt.sampling import Choice, check_sampling, choose, draw, sample_next
from microgpt.tokenizer import ByteTokenizer

CFG = GPTConfig(n_layer=2, n_head=4, d_model=32, block_size=16, vocab_size=50)


def without_cache(model):
    """The same model, its backend's cache hidden: generate runs the whole window for every token."""
    model.backend.decode_steps = None
    return model


@pytest.mark.parametrize("prompt_len, new", [(1, 10), (5, 30), (16, 5), (20, 12)])  # up to, at and past block_size
def test_the_cache_gives_the_tokens_of_full_recomputation_in_float64(rng, prompt_len, new):
    prompt = rng.integers(0, CFG.vocab_size, size=(3, prompt_len))
    cached = GPT(CFG, seed=3, dtype=np.float64).generate(prompt, new, temperature=0)
    full = without_cache(GPT(CFG, seed=3, dtype=np.float64)).generate(prompt, new, temperature=0)
    np.testing.assert_array_equal(cached, full)
    sampled = GPT(CFG, seed=3, dtype=np.float64).generate(prompt, new, temperature=0.9, top_k=20, seed=5)
    np.testing.assert_array_equal(sampled, without_cache(GPT(CFG, seed=3, dtype=np.float64)).generate(
        prompt, new, temperature=0.9, top_k=20, seed=5))


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_each_decoded_position_has_the_logits_of_a_full_forward(rng, dtype, tol):
    model = GPT(CFG, seed=4, dtype=dtype)
    idx = rng.integers(0, CFG.vocab_size, size=(2, CFG.block_size)).astype(np.int32)
    steps = [model.backend.prefill(idx[:, :3])]
    for pos in range(3, CFG.block_size):
        steps.append(model.backend.decode(idx[:, pos], pos))
    full, _ = model.forward(idx)
    for pos, logits in zip(range(2, CFG.block_size), steps):
        err = np.abs(logits - full[:, pos]).max() / np.abs(full[:, pos]).max()
        assert err < tol, (pos, err)


def test_a_token_costs_one_position_not_a_window():
    """400 new tokens run about 4x the positions of 100 through the model (a window each: about 14x)."""
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, block_size=512, vocab_size=30)
    prompt = np.arange(8)[None] % cfg.vocab_size

    def positions(model, n):
        model.backend.positions = 0
        model.generate(prompt, n, temperature=0)
        return model.backend.positions
    cached = positions(GPT(cfg), 400) / positions(GPT(cfg), 100)
    full = positions(without_cache(GPT(cfg)), 400) / positions(without_cache(GPT(cfg)), 100)
    assert cached <= 6 < full, (cached, full)


def test_generate_calls_on_token_with_each_new_column(rng):
    model = GPT(CFG, seed=1)
    prompt = rng.integers(0, CFG.vocab_size, size=(2, 4))
    seen = []
    out = model.generate(prompt, 7, seed=2, on_token=lambda ids: seen.append(ids.copy()))
    np.testing.assert_array_equal(np.stack(seen, axis=1), out[:, 4:])
    np.testing.assert_array_equal(out, model.generate(prompt, 7, seed=2))  # the callback changes nothing
    with pytest.raises(TypeError, match="on_token must be callable"):
        model.generate(prompt, 1, on_token=3)


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 20000))
    draw = lambda **kw: sample_next(logits, 1.0, kw.get("top_k"), kw.get("top_p"),  # noqa: E731
                                    np.random.default_rng(0))
    counts = np.bincount(draw(top_p=0.6), minlength=4) / 20000  # 0.5 is short of 0.6: the 0.3 joins
    np.testing.assert_allclose(counts, [0.625, 0.375, 0, 0], atol=0.015)
    counts = np.bincount(draw(top_p=0.5), minlength=4) / 20000  # 0.5 reaches 0.5 alone
    np.testing.assert_array_equal(counts, [1, 0, 0, 0])
    counts = np.bincount(draw(top_p=0.9, top_k=2), minlength=4) / 20000  # top_k cuts first
    np.testing.assert_allclose(counts, [0.625, 0.375, 0, 0], atol=0.015)
    np.testing.assert_array_equal(draw(top_p=1.0), draw())  # 1 cuts nothing
    assert (sample_next(logits[:3], 0.0, None, 0.1, None) == 0).all()  # greedy draws nothing


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_p=0), r"top_p must be None or a number in \(0, 1\], got 0"),
    (dict(top_p=1.01), r"top_p must be None or a number in \(0, 1\], got 1.01"),
    (dict(top_p=True), r"top_p must be None or a number in \(0, 1\], got True"),
    (dict(top_p="0.5"), r"top_p must be None or a number in \(0, 1\], got '0.5'"),
    (dict(top_k=0), r"top_k must be None or an int in \[1, vocab_size=50\], got 0"),
    (dict(temperature=-1), "temperature must be >= 0, got -1.0"),
])
def test_bad_sampling_options_are_refused_by_name(kwargs, match):
    args = dict(temperature=1.0, top_k=None, top_p=None) | kwargs
    with pytest.raises(ValueError, match=match):
        check_sampling(args["temperature"], args["top_k"], args["top_p"], 50)
    with pytest.raises(ValueError, match=match):
        GPT(CFG).generate([1, 2], 1, **kwargs)


def test_the_stream_decoder_gives_decode_of_the_whole(rng):
    tok = ByteTokenizer()
    utf8 = np.frombuffer("aé☃😀".encode(), np.uint8)
    for _ in range(500):
        n = int(rng.integers(0, 14))
        ids = np.where(rng.random(n) < 0.5, rng.integers(0, 257, n), utf8[rng.integers(0, len(utf8), n)])
        stream, cuts = tok.stream(), np.sort(rng.integers(0, n + 1, 3))
        text = "".join(stream.push(part) for part in np.split(ids, cuts)) + stream.flush()
        assert text == tok.decode(ids), ids
    stream = tok.stream()
    snowman = list("☃".encode())
    assert stream.push(snowman[:2]) == "" and stream.push(snowman[2:]) == "☃"  # waits for the rest
    with pytest.raises(ValueError, match="token id 300"):
        stream.push([300])


def test_sample_streams_one_and_prints_several(tmp_path, corpus, capsys):
    from test_cli import train
    train(["--data", corpus, "--steps", "3", "--out", str(tmp_path / "run")], capsys)
    ckpt = str(tmp_path / "run" / "model.ckpt")
    base = ["sample", ckpt, "--backend", "numpy", "--prompt", "the ", "--max-new-tokens", "20", "--seed", "3"]
    assert main(base + ["--top-p", "0.9"]) == 0
    one = capsys.readouterr()
    model = GPT.from_checkpoint(checkpoint.read(ckpt))
    tok = ByteTokenizer()
    expected = model.generate(tok.encode("the "), 20, temperature=0.8, top_p=0.9, seed=3)[0]
    assert one.out == tok.decode(expected) + "\n"
    assert "microgpt: 20 tokens in" in one.err and "tokens/s" in one.err
    assert main(base + ["--num-samples", "3"]) == 0
    several = capsys.readouterr()
    assert several.out.count("--- sample ") == 3 and "microgpt: 60 tokens in" in several.err


def test_a_tiny_temperature_is_greedy_not_nan():
    logits = np.array([[1.0, 3.0, 2.0], [0.5, -1.0, 0.25]])
    draw = sample_next(logits, 1e-300, None, None, np.random.default_rng(0))
    np.testing.assert_array_equal(draw, [1, 0])
    zero_first = np.log(np.array([[0.0, 0.5, 0.5]]))  # a token of probability 0 is never drawn, u = 0 included
    assert all(sample_next(zero_first, 1.0, None, None, np.random.default_rng(s))[0] != 0 for s in range(200))


# ---------------------------------------------------------------------------------------------- the rule
def chosen(logits, top_k=None, top_p=None, temperature=1.0, n=4000):
    """The tokens choose() can give for one row, found by sweeping u over [0, 1)."""
    u = (np.arange(n) + 0.5) / n
    return set(choose(np.repeat(np.asarray(logits)[None], n, 0), temperature, top_k, top_p, u).tolist())


def test_top_p_keeps_or_drops_tied_tokens_together_whatever_their_order(rng):
    """0.3, then two of 0.2, then two of 0.15: the mass strictly above a 0.2 is 0.3, above a 0.15 it is 0.7.
    The stable-sorted cumulative sum split the pairs by index (at top_p 0.4 it kept the first 0.2 only)."""
    probs = np.array([0.3, 0.2, 0.2, 0.15, 0.15])
    for _ in range(10):
        order = rng.permutation(5)
        logits = np.log(probs[order]).astype(np.float32)
        names = {int(np.nonzero(order == i)[0][0]): i for i in range(5)}  # token id -> index into probs
        for top_p, kept in [(0.25, {0}), (0.4, {0, 1, 2}), (0.65, {0, 1, 2}), (0.75, {0, 1, 2, 3, 4})]:
            assert {names[t] for t in chosen(logits, top_p=top_p)} == kept, (order, top_p)


def test_top_k_keeps_the_tokens_tied_with_the_kth_and_signed_zeros_tie():
    assert chosen([1.0, 3.0, 2.0, 2.0, 0.5], top_k=2) == {1, 2, 3}
    assert chosen([1.0, 0.0, -0.0, -1.0, 0.0], top_k=2) == {0, 1, 2, 4}  # -0.0 == 0.0
    assert chosen([2.0, 2.0, 2.0], top_k=1) == {0, 1, 2}  # all equal: nothing to cut
    assert chosen([2.0, 2.0, 2.0], top_p=0.1) == {0, 1, 2}
    np.testing.assert_array_equal(choose(np.array([[1.0, 3.0, 3.0], [-0.0, 0.0, -1.0]]), 0, None, None, None),
                                  [1, 0])  # greedy: the first of the largest


def test_more_likely_compares_the_logits_not_their_rounded_probabilities():
    """At a temperature of 1e30 every exp(z) rounds to 1.0; the logits still order the tokens."""
    logits = np.arange(10, dtype=np.float32)
    assert chosen(logits, top_p=0.45, temperature=1e30) == {5, 6, 7, 8, 9}
    assert chosen(logits, top_k=3, temperature=1e30) == {7, 8, 9}


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, None, None), (0.7, None, None), (1.0, 5, None),
                                                       (1.3, None, 0.8), (0.5, 20, 0.9)])
def test_draw_then_choose_is_sample_next_on_the_same_stream(rng, temperature, top_k, top_p):
    logits = rng.standard_normal((6, 50)) * 2
    seed = int(rng.integers(2 ** 31))
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(3):  # several steps: the stream stays in step
        u = draw(b, 6, temperature)
        np.testing.assert_array_equal(sample_next(logits, temperature, top_k, top_p, a),
                                      choose(logits, temperature, top_k, top_p, u))
        np.testing.assert_array_equal(Choice(temperature, top_k, top_p, u)(logits),
                                      choose(logits, temperature, top_k, top_p, u))
    # the stream sample_next drew from before the split: rng.random((B, 1)) a step, nothing at temperature 0
    old, c = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(3):
        u = draw(c, 6, temperature)
        if temperature == 0:
            assert u is None
        else:
            assert u.dtype == np.float64 and u.shape == (6,) and ((0 <= u) & (u < 1)).all()
            np.testing.assert_array_equal(u, old.random((6, 1))[:, 0])
    assert c.random() == old.random()  # in step after the three
