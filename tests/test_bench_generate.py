"""tools/bench_generate.py's memory-bandwidth limit, on the CPU: the bytes a decode step must read, the positions
its decode steps run at, and the percentage of the limit its rows report."""
import json

import numpy as np
import pytest

from microgpt import GPT, GPTConfig

from helpers import import_tools, run_tool as run


@pytest.fixture
def bench(monkeypatch):
    return import_tools(monkeypatch, "bench_generate")


def test_quick_json_holds_each_row_to_the_bandwidth_limit():
    """--quick (n_layer 2, d_model 32, block_size 64, vocab 257; prompt 4, 16 new tokens): 15 decode steps at
    positions 4..18; a step reads every weight once (wpe one row) and the keys and values 0..pos."""
    res = run("bench_generate.py", "--quick", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["copy_gbs"] > 0 and "np.copyto" in out["copy"]
    L, C, V = 2, 32, 257
    weights = V * C + C + L * (12 * C * C + 13 * C) + 2 * C  # wte, wpe's row, the layers, lnf
    for r in out["rows"]:
        B = r["B"]
        assert r["decode_steps"] == 15 and not r["windowed"]
        cache = np.mean([2 * L * B * (pos + 1) * C for pos in range(4, 19)])
        assert r["bytes_per_step"] == pytest.approx(4 * (weights + cache), rel=1e-12)
        assert r["limit_tok_s"] == pytest.approx(out["copy_gbs"] * 1e9 / r["bytes_per_step"] * B)
        assert r["decode_tok_s"] == pytest.approx(B * r["decode_steps"] / r["decode_s"])
        assert 0 < r["pct_of_limit"] == pytest.approx(r["decode_tok_s"] / r["limit_tok_s"] * 100)
        assert r["decode_s"] < r["microgpt_s"]  # the prefill is left out


def test_the_table_shows_the_limit_columns():
    res = run("bench_generate.py", "--quick")
    assert res.returncode == 0, res.stderr
    head, *rows = res.stdout.splitlines()[1:]
    assert all(h in head for h in ("decode tok/s", "MB/step", "limit tok/s", "% limit"))
    assert len(rows) == 2 and all(r.split()[-1].endswith("%") for r in rows)
    assert "GB/s" in res.stdout.splitlines()[0]


@pytest.mark.parametrize("prompt_len,new", [(4, 16), (4, 1), (60, 4), (60, 5), (60, 9), (64, 3), (70, 3)])
def test_decode_positions_are_those_generate_decodes_at(bench, prompt_len, new):
    """The cache fills to block_size (64) one position a token; past that each token re-runs the window."""
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, block_size=64, vocab_size=31)
    model = GPT(cfg, backend="numpy")
    seen, decode = [], model.backend.decode
    model.backend.decode = lambda tokens, pos, choose=None: seen.append(pos) or decode(tokens, pos, choose)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(1, prompt_len))
    model.generate(prompt, new, temperature=0)
    assert bench.decode_positions(cfg, prompt_len, new) == seen


def test_a_decode_step_reads_every_weight_once_and_the_cache(bench):
    from timing import decode_reads
    from microgpt.params import num_params
    cfg = GPTConfig.preset("andrea-120m")
    reads = decode_reads(cfg, 8, 511)
    assert reads["attention_decode"] == 4 * 2 * 12 * 8 * 512 * 768
    assert sum(reads.values()) - reads["attention_decode"] == 4 * (num_params(cfg) - 1023 * 768)
    assert round(sum(decode_reads(cfg, 1, 0).values()) / 1e6) == 366  # the figure
    assert bench.step_bytes(cfg, 2, [3, 5]) == sum(decode_reads(cfg, 2, 4).values())  # linear in pos
