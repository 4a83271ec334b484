"""Choosing the next token on the GPU: k_sample's ids against microgpt.sampling.choose on the same float32 logits
and draws, row by row (fresh random logits, a poisoned output), at every temperature, top-k and top-p; exact ties
at the argmax and at the top-k and top-p boundaries kept or dropped as the host keeps them; the same ids on every
launch; and the launcher's refusals, named, before anything is launched."""
import numpy as np
import pytest

from microgpt import kernels as K
from microgpt.sampling import choose

pytestmark = pytest.mark.gpu

TEMPERATURES = [0.0, 0.3, 1.0, 2.5]
TOP_PS = [None, 0.5, 0.9, 1.0]


@pytest.fixture(scope="module")
def ga():
    K.engine()
    import pycuda.gpuarray as ga
    return ga


def top_ks(V):
    return sorted({None, 1, min(40, V), V}, key=lambda k: -1 if k is None else k)


def on_gpu(ga, logits, u, temperature, top_k=None, top_p=None):
    """k_sample's ids for logits (B, V) float32 and draws u (B,) (None: a null pointer), into ids poisoned -1."""
    tokens = ga.to_gpu(np.full(logits.shape[0], -1, np.int32))
    K.sample(tokens, ga.to_gpu(logits), None if u is None else ga.to_gpu(u), temperature, top_k, top_p)
    return tokens.get()


def same_as_host(ga, logits, u, temperature, top_k=None, top_p=None):
    got = on_gpu(ga, logits, u, temperature, top_k, top_p)
    want = choose(logits, temperature, top_k, top_p, u)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, (f"T={temperature}, top_k={top_k}, top_p={top_p}, V={logits.shape[1]}: rows {bad.tolist()} "
                           f"chose {got[bad].tolist()}, the host {want[bad].tolist()}"
                           + ("" if u is None else f" (u={u[bad].tolist()})"))
    return got


# B from 1 to 8; V of 1 and 2, below a block (97), a block's 512 and one past it, and not multiples of it; past
# what a block's shared memory holds (60,000: the row read from global memory in every pass)
@pytest.mark.parametrize("B,V", [(1, 1), (3, 2), (2, 97), (8, 97), (4, 512), (5, 513), (1, 8449), (8, 8449),
                                 (2, 50257), (8, 50257), (2, 60000)])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_k_sample_chooses_the_hosts_token(ga, rng, B, V, temperature):
    scale = rng.choice([0.5, 2.0, 8.0])  # flat to peaked distributions
    logits = (rng.standard_normal((B, V)) * scale).astype(np.float32)
    for top_k in top_ks(V):
        for top_p in TOP_PS:
            same_as_host(ga, logits, rng.random(B), temperature, top_k, top_p)
    if temperature == 0:  # greedy reads no draws: a null pointer is fine
        np.testing.assert_array_equal(on_gpu(ga, logits, None, 0.0), logits.argmax(-1))


@pytest.mark.parametrize("V", [11_800, 12_000, 12_288])
def test_a_recorded_k_sample_with_its_row_near_48_kb_of_shared_memory(ga, rng, V):
    """A row of 4 V bytes staged in shared memory, about the 48 KB a block takes without the opt-in (its static
    shared memory counted), recorded into a plan (a programmatic dependent launch on sm_90) and replayed."""
    B = 2
    logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    u = rng.random(B)
    tokens, plan = ga.to_gpu(np.full(B, -1, np.int32)), K.Plan()
    K.sample(tokens, ga.to_gpu(logits), ga.to_gpu(u), 0.8, 50, 0.9, stream=plan)
    assert plan[0][4] == 4 * V  # staged
    K.replay(plan, None, "test")
    np.testing.assert_array_equal(tokens.get(), choose(logits, 0.8, 50, 0.9, u))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_k_sample_writes_its_tokens_into_mapped_host_memory_too(ga, rng, temperature):
    """mirror in page-locked host memory mapped into the device: the host reads the tokens there, no copy, once
    the stream is synchronized; on a replayed plan too, each replay's tokens."""
    B, V = 3, 8449
    mirror, stream = K.engine().mapped_empty(B, np.int32), K.engine().cuda.Stream()
    tokens, logits_d, u_d = ga.to_gpu(np.full(B, -1, np.int32)), ga.empty((B, V), np.float32), ga.empty(B, np.float64)
    plan = K.Plan()
    K.sample(tokens, logits_d, u_d, temperature, 40, 0.9, mirror=mirror, stream=plan)
    for _ in range(3):
        logits, u = (rng.standard_normal((B, V)) * 2).astype(np.float32), rng.random(B)
        logits_d.set(logits)
        u_d.set(u)
        mirror.host[:] = -1
        K.replay(plan, stream, "test")
        stream.synchronize()
        want = choose(logits, temperature, 40, 0.9, u)
        np.testing.assert_array_equal(mirror.host, want)
        np.testing.assert_array_equal(tokens.get(), want)


@pytest.mark.parametrize("V", [7, 97, 1000, 50257])
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_repeated_logits_tie_as_on_the_host(ga, rng, V, temperature):
    """Logits of a few values, so that ties sit at the argmax and at every top-k and top-p boundary; signed
    zeros among them (-0.0 == 0.0)."""
    B = 8
    values = np.array([-2.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.0, 3.0], np.float32)
    logits = rng.choice(values, size=(B, V))
    logits[:, rng.integers(V, size=3)] = 3.0  # the largest value, several times in every row
    for top_k in [None] + sorted({1, 2, 3, min(V, 10), V}):
        for top_p in TOP_PS + [0.2, 0.7]:
            same_as_host(ga, logits, rng.random(B), temperature, top_k, top_p)


def sweep(ga, rng, logits, temperature, top_k=None, top_p=None, rows=64):
    """The tokens chosen from one row of logits over `rows` draws (as many rows, the same logits), one draw in each
    1 / rows of [0, 1): every token of probability 2 / rows or more is drawn (independent draws missed one of four
    tokens of 0.15 each in 64 about once in 8,000 runs, and did at seed 1207835766)."""
    many = np.repeat(np.asarray(logits, np.float32)[None], rows, axis=0)
    u = (np.arange(rows) + rng.random(rows)) / rows
    return set(same_as_host(ga, many, u, temperature, top_k, top_p).tolist())


def test_tied_tokens_at_the_top_p_boundary_are_kept_or_dropped_together(ga, rng):
    """Probabilities 0.3, 0.2, 0.2, 0.15, 0.15 in any order: the mass above a 0.2 is 0.3, above a 0.15 it is
    0.7, so both of a pair are kept (or both dropped) whatever their token ids."""
    probs = np.array([0.3, 0.2, 0.2, 0.15, 0.15])
    for _ in range(6):
        order = rng.permutation(5)
        logits = np.log(probs[order]).astype(np.float32)
        ids = {i: int(np.nonzero(order == i)[0][0]) for i in range(5)}  # index into probs -> token id
        for top_p, kept in [(0.25, {0}), (0.4, {0, 1, 2}), (0.65, {0, 1, 2}), (0.75, {0, 1, 2, 3, 4})]:
            assert sweep(ga, rng, logits, 1.0, top_p=top_p) == {ids[i] for i in kept}, (order, top_p)


def test_tied_tokens_at_the_top_k_boundary_are_all_kept(ga, rng):
    logits = rng.permutation(np.array([5.0, 4.0, 4.0, 4.0, 3.0, 2.0] + [1.0] * 30, np.float32))
    fours = set(np.nonzero(logits == 4.0)[0].tolist())
    top = int(np.nonzero(logits == 5.0)[0][0])
    assert sweep(ga, rng, logits, 2.5, top_k=2) == fours | {top}
    assert sweep(ga, rng, logits, 2.5, top_k=4, top_p=0.9) == fours | {top}
    zeros = np.array([1.0, 0.0, -0.0, -1.0, 0.0, -0.0], np.float32)  # -0.0 ties with 0.0
    assert sweep(ga, rng, zeros, 1.0, top_k=2) == {0, 1, 2, 4, 5}


def test_the_greedy_token_is_the_first_of_the_largest(ga, rng):
    logits = rng.standard_normal((6, 1000)).astype(np.float32)
    first = rng.integers(0, 990, size=6)
    for b, f in enumerate(first):
        logits[b, [f, f + 3, f + 9]] = 7.0
    np.testing.assert_array_equal(on_gpu(ga, logits, None, 0.0), first)
    np.testing.assert_array_equal(on_gpu(ga, logits, None, 0.0), logits.argmax(-1))


@pytest.mark.parametrize("V", [1, 3, 512, 4099, 50257])
def test_equal_logits(ga, rng, V):
    """Every token alike: no cut removes any, and the draw picks the token floor(u * V)."""
    B = 8
    logits = np.full((B, V), 0.37, np.float32)
    assert (on_gpu(ga, logits, None, 0.0) == 0).all()
    for temperature in TEMPERATURES[1:]:
        for top_k in top_ks(V):
            for top_p in TOP_PS:
                u = rng.random(B)
                got = same_as_host(ga, logits, u, temperature, top_k, top_p)
                np.testing.assert_array_equal(got, np.floor(u * V).astype(np.int32))


def test_two_launches_give_the_same_ids(ga, rng):
    B, V = 8, 50257
    logits = ga.to_gpu((rng.standard_normal((B, V)) * 2).astype(np.float32))
    u = ga.to_gpu(rng.random(B))
    for temperature, top_k, top_p in [(1.0, None, None), (0.8, 40, 0.95), (1.3, None, 0.9), (0.0, None, None)]:
        runs = []
        for _ in range(3):
            tokens = ga.to_gpu(np.full(B, -1, np.int32))
            K.sample(tokens, logits, u, temperature, top_k, top_p)
            runs.append(tokens.get())
        assert (runs[0] >= 0).all()
        np.testing.assert_array_equal(runs[0], runs[1])
        np.testing.assert_array_equal(runs[0], runs[2])


def test_bad_arguments_are_refused_by_name_before_a_launch(ga, rng):
    B, V = 3, 20
    tokens = ga.to_gpu(np.full(B, -1, np.int32))
    logits = ga.to_gpu(rng.standard_normal((B, V)).astype(np.float32))
    u = ga.to_gpu(rng.random(B))
    cases = [
        (dict(u=None), ValueError, r"u must be a float64 device array of shape \(3,\)"),
        (dict(u=ga.to_gpu(rng.random(B).astype(np.float32))), TypeError, "u must be float64, got float32"),
        (dict(u=ga.to_gpu(rng.random(B + 1))), ValueError, r"u must have shape \(3,\)"),
        (dict(u=rng.random(B)), TypeError, "u must be a device array"),
        (dict(tokens=ga.to_gpu(np.zeros(B, np.int64))), TypeError, "tokens must be int32, got int64"),
        (dict(tokens=ga.to_gpu(np.zeros((B, 1), np.int32))), ValueError, r"tokens must have shape \(3,\)"),
        (dict(logits=ga.to_gpu(np.zeros((B, V)))), TypeError, "logits must be float32, got float64"),
        (dict(logits=ga.to_gpu(np.zeros((B, 1, V), np.float32))), ValueError, "logits must have 2 dimensions"),
        (dict(top_k=0), ValueError, r"top_k must be None or an int in \[1, vocab_size=20\], got 0"),
        (dict(top_k=V + 1), ValueError, r"top_k must be None or an int in \[1, vocab_size=20\], got 21"),
        (dict(top_k=2.0), ValueError, "top_k must be None or an int"),
        (dict(top_p=0.0), ValueError, r"top_p must be None or a number in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), ValueError, r"top_p must be None or a number in \(0, 1\], got 1.5"),
        (dict(temperature=-0.5), ValueError, "temperature must be >= 0, got -0.5"),
        (dict(temperature=float("nan")), ValueError, "temperature must be >= 0"),
    ]
    plan = K.Plan()
    for change, error, match in cases:
        args = dict(tokens=tokens, logits=logits, u=u, temperature=0.8, top_k=None, top_p=None) | change
        with pytest.raises(error, match=match):
            K.sample(args.pop("tokens"), args.pop("logits"), args.pop("u"), **args, stream=plan)
    assert plan == []  # nothing was launched
    assert (tokens.get() == -1).all()
    K.sample(tokens, logits, None, 0.0)  # u may be left out where nothing is drawn
    np.testing.assert_array_equal(tokens.get(), logits.get().argmax(-1))
