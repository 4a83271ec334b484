"""The data pipeline: corpus -> tokens -> split -> seeded (B, T+1) batches from the Cython sampler."""
import json
import pickle
import threading

import numpy as np
import pytest

from microgpt import ByteTokenizer
from microgpt.data import BatchSampler, NotText, builtin_corpus, load_tokens, split

MASK = 2 ** 64 - 1


# -- an independent pure-Python model of the sampler's generator: splitmix64 -> xoshiro256** ------------

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return x, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


class Xoshiro:
    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed, word = splitmix64(seed)
            self.s.append(word)

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        threshold = (2 ** 64 - n) % n
        while True:
            r = self.next()
            if r >= threshold:
                return r % n


def test_python_model_matches_the_published_splitmix64_vector():
    _, first = splitmix64(0)
    assert first == 0xE220A8397B1DCDAF  # the reference implementation's first output for seed 0


@pytest.mark.parametrize("seed", [0, 1, 12345, 2 ** 64 - 1])
def test_sampler_draws_what_splitmix64_and_xoshiro256ss_define(seed):
    tokens = np.arange(1000, dtype=np.int32)
    B, T = 3, 7
    sampler = BatchSampler(tokens, B, T, seed=seed)
    model = Xoshiro(seed)
    assert sampler.state["words"] == model.s
    for _ in range(5):
        batch = sampler.next()
        starts = [model.below(len(tokens) - T) for _ in range(B)]
        np.testing.assert_array_equal(batch[:, 0], starts)


# -- corpus, tokens, split ---------------------------------------------------------------------------

def test_builtin_corpus_is_a_sizeable_text():
    text = builtin_corpus()
    assert isinstance(text, str) and len(text) > 100_000 and "def" in text


def test_load_tokens_defaults_to_the_builtin_corpus():
    tokens = load_tokens()
    assert tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens, np.frombuffer(builtin_corpus().encode("utf-8"), dtype=np.uint8))


def test_load_tokens_from_a_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("héllo ☃\nworld\n", encoding="utf-8")
    tokens = load_tokens(str(path))
    assert ByteTokenizer().decode(tokens) == "héllo ☃\nworld\n"


@pytest.mark.parametrize("data, offset, what", [
    (b"ok \xff bad byte", 3, "byte 0xff at offset 3"),
    ("h\u00e9llo".encode("utf-16"), 0, "byte 0xff at offset 0"),          # with its byte-order mark
    ("hello".encode("utf-16-le"), 1, "a NUL byte at offset 1"),           # ASCII as UTF-16: valid UTF-8 but NULs
    (bytes(range(256)) * 4, 0, "a NUL byte at offset 0"),
    (b"caf\xc3", 3, "byte 0xc3 at offset 3"),                              # cut inside a character
])
def test_load_tokens_refuses_what_is_not_utf8_text_naming_the_offset(tmp_path, data, offset, what):
    path = tmp_path / "corpus.bin"
    path.write_bytes(data)
    with pytest.raises(NotText, match=f"corpus.bin is not UTF-8 text: {what}"):
        load_tokens(path)


def test_load_tokens_refuses_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_tokens(str(tmp_path / "nope.txt"))


def test_split_keeps_the_tail_for_validation():
    tokens = np.arange(1000, dtype=np.int32)
    train, val = split(tokens, 0.1)
    assert len(train) == 900 and len(val) == 100
    np.testing.assert_array_equal(np.concatenate([train, val]), tokens)
    with pytest.raises(ValueError, match="val_fraction"):
        split(tokens, 1.0)


# -- the sampler ----------------------------------------------------------------------------------------

def batches(sampler, k):
    return [sampler.next() for _ in range(k)]


def test_same_seed_same_batches_other_seed_other_batches():
    tokens = load_tokens()
    a = batches(BatchSampler(tokens, 4, 64, seed=3), 5)
    b = batches(BatchSampler(tokens, 4, 64, seed=3), 5)
    c = batches(BatchSampler(tokens, 4, 64, seed=4), 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not any(np.array_equal(x, y) for x, y in zip(a, c))
    assert not np.array_equal(a[0], a[1])  # and the batches move on


def test_every_window_is_a_slice_of_the_stream_with_targets_shifted_by_one(rng):
    tokens = rng.permutation(50_000).astype(np.int32)  # distinct values: a window's first token is its start
    where = np.argsort(tokens)
    B, T = 6, 33
    sampler = BatchSampler(tokens, B, T, seed=int(rng.integers(2 ** 63)))
    for _ in range(20):
        batch = sampler.next()
        inputs, targets = batch[:, :-1], batch[:, 1:]
        for b in range(B):
            s = where[batch[b, 0]]
            assert s + T + 1 <= len(tokens)
            np.testing.assert_array_equal(inputs[b], tokens[s:s + T])
            np.testing.assert_array_equal(targets[b], tokens[s + 1:s + T + 1])


def test_windows_of_real_text_are_slices_of_it():
    tokens = load_tokens()[:4000]
    T = 16
    windows = np.lib.stride_tricks.sliding_window_view(tokens, T + 1)
    for row in BatchSampler(tokens, 8, T, seed=1).next():
        assert (windows == row).all(axis=1).any()


def test_every_start_is_drawn_uniformly_and_none_past_the_end():
    n, T = 20, 4  # starts 0 .. n-T-1 = 15, so the last window ends exactly at the last token
    sampler = BatchSampler(np.arange(n, dtype=np.int32), 100, T, seed=11)
    starts = np.concatenate([sampler.next()[:, 0] for _ in range(160)])
    counts = np.bincount(starts, minlength=n)
    assert counts[n - T:].sum() == 0
    assert np.all(np.abs(counts[:n - T] - 1000) < 150)  # 16,000 draws: each start 1000 +- 5 sigma


def test_awkward_shape_one_row_one_position():
    sampler = BatchSampler(np.array([7, 9], dtype=np.int32), 1, 1, seed=0)  # exactly one window fits
    out = np.full((1, 2), -1, dtype=np.int32)
    assert sampler.fill(out) is out
    assert out.tolist() == [[7, 9]]
    sampler = BatchSampler(np.array([1, 2, 3], dtype=np.int32), 1, 1, seed=0)
    seen = {tuple(sampler.next()[0]) for _ in range(100)}
    assert seen == {(1, 2), (2, 3)}


def test_fill_writes_into_a_view_of_a_larger_buffer_and_nothing_else():
    B, T = 3, 5
    pinned = np.full((4, B, T + 1), -1, dtype=np.int32)  # stands in for a page-locked ring of batches
    sampler = BatchSampler(np.arange(100, dtype=np.int32), B, T, seed=2)
    sampler.fill(pinned[1])
    assert np.all(pinned[[0, 2, 3]] == -1)
    assert np.all(pinned[1] >= 0)
    np.testing.assert_array_equal(pinned[1], BatchSampler(np.arange(100, dtype=np.int32), B, T, seed=2).next())


@pytest.mark.parametrize("out, error, message", [
    (np.zeros((2, 9), dtype=np.int64), TypeError, "out must have dtype int32"),
    (np.zeros((3, 9), dtype=np.int32), ValueError, r"out must have shape \(B, T\+1\) = \(2, 9\)"),
    (np.zeros((2, 8), dtype=np.int32), ValueError, "out must have shape"),
    (np.zeros((2, 9), dtype=np.int32, order="F"), ValueError, "C-contiguous"),
    (np.zeros((2, 18), dtype=np.int32)[:, ::2], ValueError, "C-contiguous"),
    ([[0] * 9] * 2, TypeError, "out must be a NumPy int32 array"),
])
def test_fill_refuses_a_buffer_it_cannot_write(out, error, message):
    sampler = BatchSampler(np.arange(100, dtype=np.int32), 2, 8, seed=0)
    with pytest.raises(error, match=message):
        sampler.fill(out)


def test_fill_refuses_a_read_only_buffer():
    out = np.zeros((2, 9), dtype=np.int32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writeable"):
        BatchSampler(np.arange(100, dtype=np.int32), 2, 8, seed=0).fill(out)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(B=0), ValueError, "B must be an int >= 1"),
    (dict(T=0), ValueError, "T must be an int >= 1"),
    (dict(B=True), ValueError, "B must be an int"),
    (dict(T=2.0), ValueError, "T must be an int"),
    (dict(T=100), ValueError, "too few for windows of T\\+1=101"),
    (dict(seed=-1), ValueError, "seed must be an int in"),
    (dict(seed=2 ** 64), ValueError, "seed must be an int in"),
    (dict(seed=1.5), ValueError, "seed must be an int in"),
    (dict(tokens=np.zeros(50)), TypeError, "tokens must be a 1-D integer array"),
    (dict(tokens=np.zeros((5, 10), dtype=np.int32)), TypeError, "tokens must be a 1-D integer array"),
])
def test_sampler_refuses_bad_arguments(kwargs, error, message):
    args = dict(tokens=np.arange(100, dtype=np.int32), B=2, T=8, seed=0) | kwargs
    with pytest.raises(error, match=message):
        BatchSampler(args.pop("tokens"), **args)


def test_state_survives_json_and_pickle_and_resumes_the_sequence():
    tokens = load_tokens()
    first = BatchSampler(tokens, 4, 32, seed=5)
    batches(first, 3)
    saved = first.state
    assert saved["batches_drawn"] == 3
    expected = batches(first, 4)
    for restore in (lambda s: json.loads(json.dumps(s)), lambda s: pickle.loads(pickle.dumps(s))):
        resumed = BatchSampler(tokens, 4, 32, seed=999)
        resumed.state = restore(saved)
        assert resumed.batches_drawn == 3
        assert all(np.array_equal(x, y) for x, y in zip(batches(resumed, 4), expected))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s | {"T": 31}, r"state\['T'\] is 31, this sampler has T=32"),
    (lambda s: s | {"B": 5}, r"state\['B'\] is 5"),
    (lambda s: s | {"n_tokens": 10}, r"state\['n_tokens'\] is 10"),
    (lambda s: s | {"rng": "pcg64"}, "this sampler uses 'xoshiro256\\*\\*'"),
    (lambda s: s | {"words": [1, 2, 3]}, r"state\['words'\]: rng_state must be four ints"),
    (lambda s: s | {"words": [0, 0, 0, 0]}, "all zeros"),
    (lambda s: s | {"words": [-1, 0, 0, 1]}, "four ints"),
    (lambda s: s | {"batches_drawn": -1}, "batches_drawn"),
    (lambda s: {k: v for k, v in s.items() if k != "words"}, "state is missing words"),
])
def test_state_refuses_another_samplers_or_a_broken_state(edit, message):
    sampler = BatchSampler(np.arange(100, dtype=np.int32), 4, 32, seed=5)
    before = sampler.state
    with pytest.raises(ValueError, match=message):
        sampler.state = edit(sampler.state)
    assert sampler.state == before


def test_samplers_in_threads_draw_what_they_draw_alone():
    tokens = load_tokens()
    alone = [batches(BatchSampler(tokens, 8, 256, seed=s), 50) for s in range(4)]
    together = [None] * 4

    def work(s):
        together[s] = batches(BatchSampler(tokens, 8, 256, seed=s), 50)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(alone, together):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_text_file_is_tokenized_once_into_a_mapped_token_file(tmp_path, monkeypatch):
    from microgpt import data
    from microgpt.tokenizer import ByteTokenizer
    text = tmp_path / "text.txt"
    text.write_text("héllo wörld, " * 500, encoding="utf-8")
    tok = ByteTokenizer()
    first = data.cached_tokens(text, tok)
    assert isinstance(first, np.memmap) and first.dtype == np.uint16
    np.testing.assert_array_equal(first, tok.encode(text.read_text(encoding="utf-8")))
    assert (tmp_path / "text.txt.bytes.tokens").stat().st_size == 2 * first.size

    def no_second_encoding(*a, **k):
        raise AssertionError("encoded again")
    monkeypatch.setattr(data, "encode_file", no_second_encoding)
    np.testing.assert_array_equal(data.cached_tokens(text, tok), first)  # mapped, not encoded
    monkeypatch.undo()
    with open(text, "a", encoding="utf-8") as fh:
        fh.write("more")  # another text: encoded again
    again = data.cached_tokens(text, tok)
    assert again.size == first.size + 4 and bytes(again[-4:].astype(np.uint8)) == b"more"


def test_the_sampler_reads_a_uint16_token_file_as_it_reads_int32(tmp_path):
    from microgpt import data
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 60000, size=5000).astype(np.int32)
    path = tmp_path / "t.bin"
    tokens.astype(np.uint16).tofile(path)
    mapped = np.memmap(path, dtype=np.uint16, mode="r")
    a, b = data.BatchSampler(tokens, 4, 33, seed=3), data.BatchSampler(mapped, 4, 33, seed=3)
    assert b.tokens is mapped or b.tokens.base is not None  # kept as it lies, not copied to int32
    assert b.tokens.dtype == np.uint16
    for _ in range(5):
        np.testing.assert_array_equal(a.next(), b.next())
    wide = data.BatchSampler(tokens.astype(np.uint32), 4, 33, seed=3)  # uint32: the same bytes as int32
    np.testing.assert_array_equal(wide.next(), data.BatchSampler(tokens, 4, 33, seed=3).next())
