"""The tools in tools/ on a GPU: each runs its quick form and reports what it measured."""
import json
import math
import shutil

import pytest

from helpers import import_tools, run_tool as run

pytestmark = pytest.mark.gpu


def test_profile_kernels_quick(tmp_path):
    out, png = tmp_path / "p.json", tmp_path / "roofline.png"
    res = run("profile_kernels.py", "--quick", "--json", str(out), "--plot", str(png))
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(out.read_text())
    names = {row["kernel"] for row in r["rows"]}
    assert {"k_attn_scores_fwd", "causal_scores_fwd_fast", "k_adamw", "matmul_fwd_fast (qkv)"} <= names
    assert r["copy_gbs"] > 100 and r["matmul_tflops"] > 1
    for row in r["rows"]:
        assert row["ms"] > 0 and row["gbs"] >= 0 and 0 < row["pct_of_floor"] <= 150, row
    assert "k_layernorm_fwd" in res.stdout  # the table
    short = [row for row in r["rows"] if row["batch"] > 1]  # at --quick's shapes, most kernels
    assert len(short) > len(r["rows"]) // 2 and all(row["graph"] for row in short if row["kernel"].startswith("k_"))
    assert "in one CUDA graph" in res.stdout
    try:
        import matplotlib  # noqa: F401
        assert png.stat().st_size > 10_000
    except ImportError:
        assert r["plot"] is None and "matplotlib" in r["plot_note"]


def test_bench_attention_quick():
    res = run("bench_attention.py", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    rows = {row["who"]: row for row in r["rows"]}
    assert set(rows) == {"microgpt reference", "microgpt fast", "microgpt tc", "PyTorch SDPA"}
    for who in ("microgpt reference", "microgpt fast", "microgpt tc"):
        assert rows[who]["T"] == 256 and 0 < rows[who]["fwd_ms"] <= rows[who]["fwd_bwd_ms"]
    # flash attention keeps a log-sum-exp a row (and delta): no T x T buffer, unlike the pipeline
    assert rows["microgpt tc"]["mb"] < rows["microgpt fast"]["mb"] / 10
    assert (rows["PyTorch SDPA"]["fwd_ms"] is None) == (rows["PyTorch SDPA"]["note"] is not None)


def test_bench_train_quick():
    """The step timed, and its MFU over the 3xTF32 ceiling measured in the run (the square product's and the
    model's; at --quick's small shapes the square one is the best)."""
    from microgpt import GPTConfig
    from microgpt.runlog import flops_per_token
    res = run("bench_train.py", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    assert r["backend"] == "cuda" and r["microgpt_tokens_per_s"] > 0 and r["losses_finite"]
    assert (r["ratio_vs_torch"] is None) == (r["torch_tokens_per_s"] is None)
    assert r["model_flops_per_step"] == flops_per_token(GPTConfig.preset("andrea-12m"), 256) * 4 * 256
    assert r["ceiling"]["measured"] and len(r["ceiling"]["shapes"]) == 5, r["ceiling"]
    assert r["ceiling_tflops"] == max(s["tflops"] for s in r["ceiling"]["shapes"]) > 1
    assert 0 < r["mfu"] < 1 and r["mfu"] == pytest.approx(r["microgpt_tflops"] / r["ceiling_tflops"])


def test_profile_step_quick():
    """Every launch of the step's plans is timed: the kernels' times add up to the plans', within the step."""
    res = run("profile_step.py", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    names = {row["kernel"] for row in r["kernels"]}
    assert {"k_adamw"}.isdisjoint(names)  # the plans hold no optimizer
    assert any(n.startswith("k_crossentropy_bwd") for n in names)  # and the loss's gradient (any variant's)
    assert set(r["phases_ms"]) == {"forward", "backward"}
    for phase, total in r["phases_ms"].items():
        assert sum(row["ms"] for row in r["kernels"] if row["phase"] == phase) == pytest.approx(total)
        assert 0 < total < r["step_ms"]
    assert all(row["ms"] >= 0 and row["launches"] >= 1 for row in r["kernels"])
    # the same time by op, each with its work and its share of the ceilings measured in the run
    for phase, total in r["phases_ms"].items():
        assert sum(row["ms"] for row in r["ops"] if row["phase"] == phase) == pytest.approx(total)
    assert r["ceiling_shapes"] and r["ceiling_tflops"] > 1 and r["copy_gbs"] > 100 and 0 < r["mfu"] < 1
    assert [row["ms"] for row in r["ops"]] == sorted((row["ms"] for row in r["ops"]), reverse=True)
    for row in r["ops"]:
        assert row["bytes"] > 0 and 0 < row["of_ceiling"] <= 1.5, row
    bound = {row["op"].split(" (")[0]: row["bound"] for row in r["ops"]}
    assert bound["matmul_fwd"] == "flops" and bound["layernorm_fwd"] == "bytes"
    assert "of ceiling" in run("profile_step.py", "--quick").stdout  # the table


def test_profile_decode_quick(monkeypatch):
    """A decode step's ops and kernels each timed, the graph's GPU time against its reads' limit, and k_sample
    for each way of choosing."""
    profile_decode, timing = import_tools(monkeypatch, "profile_decode", "timing")
    res = run("profile_decode.py", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    (r,) = json.loads(res.stdout)["rows"]
    names = {k["kernel"] for k in r["kernels"]}
    assert {"k_attention_decode", "k_matvec_1", "k_embed_decode"} <= names
    assert sum(k["launches"] for k in r["kernels"]) == r["launches"]
    assert r["graph"] and 0 < r["graph_ms"] and r["step_ms"] > 0 and r["tokens_per_s"] > 0
    assert all(k["us"] > 0 for k in r["kernels"]) and len(r["sample"]) == 5 and all(c["us"] > 0 for c in r["sample"])
    # by op: every launch once; the reads of the ops that read weights or the cache add up to the step's
    assert sum(o["launches"] for o in r["ops"]) == r["launches"] and all(o["us"] > 0 for o in r["ops"])
    assert sum(o["bytes"] for o in r["ops"] if o["bytes"]) == r["reads_bytes"]
    # every time is of the step at the position the graph replays, past the prompt, and so are the reads
    assert r["position"] >= r["prompt"]
    assert r["reads_bytes"] == sum(timing.decode_reads(profile_decode.QUICK, 1, r["position"]).values())
    assert any(o["op"].startswith(("layernorm_matmul_fwd", "matmul_residual_fwd")) and o["gbs"] > 0
               for o in r["ops"])
    assert r["pct_of_limit"] == pytest.approx(100 * r["limit_ms"] / r["graph_ms"]) and r["pct_of_limit"] > 0
    # what each group adds: the step less the step without it, below the step (the other launches take time); the
    # products, most of the step's launches, add to it
    assert r["step_us"] > 0 and all(math.isfinite(g["adds_us"]) and g["adds_us"] < r["step_us"]
                                    for g in r["ops"] + r["kernels"])
    assert next(k["adds_us"] for k in r["kernels"] if k["kernel"] == "k_matvec_1") > 0


def test_ncu_kernel_quick():
    if shutil.which("ncu") is None:
        pytest.skip("ncu is not on PATH")
    res = run("ncu_kernel.py", "k_softmax_fwd", "--quick", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    assert r["launches"] and r["launches"][0]["kernel"].startswith("k_softmax_fwd")
    assert r["launches"][0]["time_us"] > 0


def test_the_benchmarks_take_a_variant():
    res = run("bench_train.py", "--quick", "--variant", "reference", "--no-torch", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    r = json.loads(res.stdout)
    assert r["variant"] == "reference" and r["microgpt_tokens_per_s"] > 0 and r["losses_finite"]
    res = run("bench_attention.py", "--quick", "--variant", "fast", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    whose = [row["who"] for row in json.loads(res.stdout)["rows"]]
    assert whose == ["microgpt fast", "PyTorch SDPA"]
