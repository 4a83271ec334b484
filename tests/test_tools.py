"""The tools in tools/: each answers --help anywhere, and without a GPU stops with a one-line reason; the
kernel cases they time are built on a stand-in engine."""
import hashlib
import json
import os
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from microgpt import GPTConfig
from microgpt import kernels as K
from microgpt.kernels import runtime
from microgpt import ops as O
from microgpt import reference_ops

from helpers import GPU_REASON, TOOLS, FakeEngine, import_tools, run_tool as run, stand_in

GPU_TOOLS = ["profile_kernels.py", "bench_attention.py", "bench_train.py", "ncu_kernel.py", "sanitize_kernels.py",
             "bench_generate.py", "profile_step.py", "profile_decode.py", "bench_compare.py"]


@pytest.mark.parametrize("script", GPU_TOOLS)
def test_help(script):
    res = run(script, "--help")
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is here: the tools run instead of stopping")
@pytest.mark.parametrize("script,args", [("profile_kernels.py", ["--quick"]), ("bench_attention.py", ["--quick"]),
                                         ("bench_train.py", []), ("ncu_kernel.py", ["k_gelu_fwd"]),
                                         ("bench_generate.py", []), ("profile_step.py", ["--quick"]),
                                         ("profile_decode.py", ["--quick"])])
def test_without_a_gpu_one_line_and_no_traceback(script, args):
    res = run(script, *args)
    assert res.returncode == 2
    out = (res.stdout + res.stderr).strip()
    assert len(out.splitlines()) == 1 and "Traceback" not in out and "no CUDA GPU" in out, out


def _profile_kernels():
    import importlib
    import sys
    from helpers import TOOLS
    sys.path.insert(0, TOOLS)
    try:
        return importlib.import_module("profile_kernels")
    finally:
        sys.path.remove(TOOLS)


def test_profile_rows_find_their_pytorch_peer_and_their_ceiling():
    P = _profile_kernels()
    for case in ("k_matmul_fwd (qkv)", "matmul_fwd_fast (qkv)", "matmul_fwd_tc (qkv)"):
        assert P.op_of(case) == "matmul_fwd (qkv)"
    assert P.op_of("causal_scores_bwd_tc") == "causal_scores_bwd" and P.op_of("k_adamw") == "adamw"
    assert P.on_tensor_cores("matmul_bwd_tc (lm_head)") and P.on_tensor_cores("sgemm_tc mma.sync (nn)")
    assert not P.on_tensor_cores("matmul_fwd_fast (qkv)") and not P.on_tensor_cores("sgemm (tt)")
    assert {"matmul_fwd", "causal_scores_fwd", "attn_values_bwd"} <= set(P.PRODUCTS)


def test_the_roofline_draws_the_tensor_core_ceilings(tmp_path):
    pytest.importorskip("matplotlib")
    P = _profile_kernels()
    rows = [dict(kernel="matmul_fwd_tc (qkv)", flops=2e10, bytes=1e8, tflops=55.0),
            dict(kernel="matmul_fwd_fast (qkv)", flops=2e10, bytes=1e8, tflops=31.0),
            dict(kernel="k_adamw", flops=1e8, bytes=1e9, tflops=0.3)]
    without, with_tc = tmp_path / "a.png", tmp_path / "b.png"
    assert P.roofline(rows, 4200.0, 51.0, without, "t") is None
    assert P.roofline(rows, 4200.0, 51.0, with_tc, "t", rate_tf32=310.0) is None
    assert with_tc.stat().st_size > without.stat().st_size > 10_000  # two more ceilings and their labels


def _bench_train(monkeypatch, ceiling=100.0):
    """tools/bench_train as on a GPU: each variant's step 0.2 s (fast) or 0.1 s (tc), PyTorch's 0.125 s, the
    3xTF32 ceiling `ceiling` TFLOP/s; (the module, what was timed, PyTorch's calls, the ceiling's models)."""
    bench = import_tools(monkeypatch, "bench_train")
    timed, torch_calls, ceilings = [], [], []
    monkeypatch.setattr(bench, "gpu_or_exit", lambda tool: "a GPU")
    monkeypatch.setattr(bench, "time_microgpt", lambda cfg, B, T, steps, warmup, variant, backend: (
        timed.append((cfg.vocab_size, variant, backend)) or {"fast": 0.2, "tc": 0.1}[variant], [3.0, 2.5]))
    monkeypatch.setattr(bench, "time_torch", lambda *a: (torch_calls.append(a) or 0.125, "PyTorch x"))
    monkeypatch.setattr(bench, "ceiling_of", lambda models: ceilings.append(models) or dict(
        tflops=ceiling, source="measured: a stand-in", measured=True, shapes=[]))
    monkeypatch.setattr("sys.argv", ["bench_train.py"])
    return bench, timed, torch_calls, ceilings


def test_bench_train_times_each_variant_against_one_pytorch_measurement(monkeypatch, capsys):
    bench, timed, torch_calls, _ = _bench_train(monkeypatch)
    monkeypatch.setattr("sys.argv", ["bench_train.py", "--preset", "andrea-120m", "--variant", "fast", "tc", "fast",
                                     "--json"])
    assert bench.main() == 0
    r = json.loads(capsys.readouterr().out)
    assert timed == [(8449, "fast", "cuda"), (8449, "tc", "cuda")] and len(torch_calls) == 1  # each once
    assert r["variant"] == "fast" and r["ratio_vs_torch"] == pytest.approx(0.125 / 0.2)  # the first variant's
    assert r["variants"]["tc"]["ratio_vs_torch"] == pytest.approx(0.125 / 0.1) and r["variants"]["tc"]["losses_finite"]


def test_bench_train_reports_the_model_flops_and_the_mfu_of_both_presets(monkeypatch, capsys):
    """By default andrea-120m and gpt2-124m, each against its own PyTorch measurement; the FLOPs a step are the
    training log's (runlog.flops_per_token), the MFU their rate over the ceiling measured at both models' shapes."""
    from microgpt.runlog import flops_per_token
    bench, timed, torch_calls, ceilings = _bench_train(monkeypatch)
    monkeypatch.setattr("sys.argv", ["bench_train.py", "--json"])
    assert bench.main() == 0
    r = json.loads(capsys.readouterr().out)
    assert [t[:2] for t in timed] == [(8449, "tc"), (50257, "tc")] and len(torch_calls) == 2
    assert [(cfg.vocab_size, B, T) for cfg, B, T in ceilings[0]] == [(8449, 8, 1024), (50257, 8, 1024)]
    assert r["ceiling_tflops"] == 100.0 and r["ceiling_source"] == "measured: a stand-in"
    for row, preset in zip(r["rows"], ["andrea-120m", "gpt2-124m"]):
        flops = flops_per_token(GPTConfig.preset(preset), 1024) * 8 * 1024
        assert row["preset"] == preset and row["model_flops_per_step"] == flops
        assert row["tflops"] == pytest.approx(flops / 0.1 / 1e12) and row["mfu"] == pytest.approx(row["tflops"] / 100)
        assert row["torch_tflops"] == pytest.approx(flops / 0.125 / 1e12)
        assert row["torch_mfu"] == pytest.approx(row["torch_tflops"] / 100)
    assert r["mfu"] == r["rows"][0]["mfu"] and r["microgpt_tflops"] == r["rows"][0]["tflops"]  # the first row's
    monkeypatch.setattr("sys.argv", ["bench_train.py"])
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "3xTF32 ceiling: 100.0 TFLOP/s (measured: a stand-in)" in out
    for preset in ("andrea-120m", "gpt2-124m"):
        lines = [line for line in out.splitlines() if line.startswith(preset)]
        assert len(lines) == 2 and "microgpt (tc)" in lines[0] and "PyTorch (SDPA, fused)" in lines[1]
        assert re.search(r"\d+\.\d%\s+1\.25x$", lines[0]), lines[0]  # the MFU, the ratio


@pytest.mark.skipif(GPU_REASON is None, reason="a GPU is here: --quick runs the cuda backend (test_gpu_tools)")
def test_bench_train_quick_runs_on_the_cpu_without_an_mfu():
    from microgpt.runlog import flops_per_token
    res = run("bench_train.py", "--quick", "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["backend"] == "numpy" and r["losses_finite"] and r["torch_step_ms"] is None
    flops = flops_per_token(GPTConfig(n_layer=2, n_head=2, d_model=32, block_size=64, vocab_size=257), 64) * 4 * 64
    assert r["model_flops_per_step"] == flops
    assert r["microgpt_tflops"] == pytest.approx(flops / r["microgpt_step_ms"] / 1e9)
    assert r["mfu"] is None and r["ceiling_tflops"] is None and "numpy" in r["ceiling_source"]
    table = run("bench_train.py", "--quick")
    assert table.returncode == 0 and re.search(r"microgpt \(numpy\).* -\s+-$", table.stdout, re.M), table.stdout


@pytest.mark.parametrize("script", ["bench_train.py", "profile_step.py"])
def test_the_help_says_how_the_ceiling_is_measured(script):
    text = " ".join(run(script, "--help").stdout.split())
    for words in ("3xTF32 ceiling measured in the same run", "sgemm(units='tc')", "8192^3", "best of 5",
                  "CUDA events", "the lm_head's forward, dX and dW", "microgpt.runlog.flops_per_token",
                  "Only where that measurement cannot run"):
        assert words in text, words


def test_bench_generate_quick_runs_on_the_cpu_and_counts_the_tokens():
    """--quick: a small model on the numpy backend (no peer): tokens/s = B * new / the time of one call."""
    import json
    res = run("bench_generate.py", "--quick", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["backend"] == "numpy" and [r["B"] for r in out["rows"]] == [1, 2]
    for r in out["rows"]:
        assert r["microgpt_tok_s"] == pytest.approx(r["B"] * out["new"] / r["microgpt_s"]) and "ratio" not in r
    bad = run("bench_generate.py", "--quick", "-B", "0")
    assert bad.returncode == 2 and "-B must be >= 1, got 0" in bad.stderr


# ---------------------------------------------------------------------------------------------- kernel_cases
@pytest.fixture
def build(monkeypatch):
    """tools/kernel_cases.build_cases(wanted) on the stand-in engine at a small shape, each case launched once:
    (the cases, the launches recorded, what was made: arrays, elements, checksums of those copied to the device)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH (the kernels' formats come from it)")
    engine = FakeEngine(K.kernel_signatures())
    empty = engine.ga.empty
    made = SimpleNamespace()

    def counted_to_gpu(a):
        if np.asarray(a).dtype != np.int64:  # int64: a kernel's table of device addresses (the batch split's), no draw
            made.drawn.append(hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest())
        return counted_empty(np.shape(a), np.asarray(a).dtype)

    def counted_empty(shape, dtype=np.float32):
        made.arrays, made.elements = made.arrays + 1, made.elements + int(np.prod(shape))
        return empty(shape, dtype)
    monkeypatch.setattr(engine.ga, "to_gpu", counted_to_gpu)
    monkeypatch.setattr(engine.ga, "empty", counted_empty)
    stand_in(monkeypatch, engine)
    monkeypatch.setattr(runtime, "_persistent", [])
    kc = import_tools(monkeypatch, "kernel_cases")

    def build(wanted=None):
        made.arrays, made.elements, made.drawn = 0, 0, []
        plan = K.Plan(engine)
        cases = kc.build_cases(kc.Shape(B=2, T=512, C=64, NH=4, V=97), sets=2, wanted=wanted)
        for case in cases:
            case.launch(plan)
        return [(c.kernel, c.bytes, c.flops, c.sets) for c in cases], plan, SimpleNamespace(**vars(made))
    return build


def test_building_every_case_is_the_default(build):
    every, _, made = build()
    also_every, _, made_too = build(lambda name: True)
    assert every == also_every and len(every) > 100
    assert made == made_too  # the same inputs, drawn from the same streams


def test_a_filtered_build_makes_only_the_wanted_cases_and_their_inputs(build):
    every, _, made_all = build()
    for terms, launched in (("layernorm_bwd_fast (accumulate)|colsum", {"k_layernorm_bwd_fast", "k_colsum_partial"}),
                            ("crossentropy_fwd", {"k_crossentropy_fwd", "k_crossentropy_fwd_fast"})):
        cases, plan, made = build(_profile_kernels().name_filter(terms))
        assert cases == [c for c in every if any(t in c[0] for t in terms.split("|"))] != []
        assert {name for name, *_ in plan} >= launched
        assert made.arrays < made_all.arrays / 5, terms
        assert set(made.drawn) <= set(made_all.drawn)  # a case's inputs do not depend on which others are built
    # no attention, logits or AdamW state: only the cross-entropy's logits, targets and outputs
    assert made.elements < made_all.elements / 100


def test_each_case_built_alone_is_as_in_the_whole_build(build):
    """As ncu_kernel builds its one case: the same name, bytes and FLOPs, inputs drawn from the same streams."""
    every, _, made_all = build()
    for case in every:
        cases, plan, made = build(lambda name: name == case[0])
        assert cases == [case] and plan, case[0]
        assert set(made.drawn) <= set(made_all.drawn) and made.arrays < made_all.arrays, case[0]


def test_a_filter_that_matches_nothing_builds_nothing(build):
    cases, plan, made = build(_profile_kernels().name_filter("no such kernel"))
    assert cases == [] and plan == [] and made.arrays == 0
    assert _profile_kernels().name_filter("") is None  # no --filter: every case


def test_an_op_without_a_written_case_gets_one_from_its_declaration(build, monkeypatch):
    """A new op of microgpt.ops is profiled as declared: its launchers' cases built from op.args, its bytes every
    array once, without an edit of tools/kernel_cases.py."""
    gelu = O.OPS["gelu_fwd"]
    monkeypatch.setattr(reference_ops, "gelu2_fwd", gelu.reference, raising=False)
    new = O.Op("gelu2_fwd", gelu.header, {"reference": gelu.kernels["reference"]}, gelu.args, gelu.tolerance)
    monkeypatch.setitem(O.OPS, "gelu2_fwd", new)
    cases, plan, _ = build(lambda name: "gelu" in name)
    assert [c for c in cases if "gelu2" in c[0]] == [("k_gelu2_fwd", 2 * 4 * 2 * 512 * 4 * 64, 0, 2)]
    assert [name for name, *_ in plan].count("k_gelu_fwd") == 2  # its case and the written one of gelu_fwd


def test_bench_compare_matches_the_rows_of_two_trees_and_skips_what_cannot_run():
    """This tree against itself: every bench_generate --quick row found on both sides, a positive ratio (and
    bench_train's, on the numpy backend without a GPU); the GPU benchmarks skipped with their one-line reason
    where there is no GPU; a --base that is no tree refused."""
    root = os.path.dirname(TOOLS)
    res = run("bench_compare.py", "--base", root, "--bench", "generate", "train", "attention", "--quick", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    generate = [r for r in rows if r["bench"] == "generate"]
    assert [r["row"] for r in generate] == ["quick B=1 prompt=4", "quick B=2 prompt=4"]
    assert all(r["before"] > 0 and r["after"] > 0 and r["ratio"] > 0 for r in generate)
    if GPU_REASON is not None:
        train = [r for r in rows if r["bench"] == "train"]
        assert [r["row"] for r in train] == ["step numpy"] and train[0]["ratio"] > 0
        attention = [r for r in rows if r["bench"] == "attention"]
        assert attention == [dict(bench="attention", base=root, row=None, skipped=attention[0]["skipped"])]
        assert "no CUDA GPU" in attention[0]["skipped"]
    bad = run("bench_compare.py", "--base", os.path.join(root, "nowhere"))
    assert bad.returncode == 2 and "--base" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_bench_compare_takes_several_bases_and_a_benchmarks_own_arguments():
    """Two bases (this tree twice, named apart): each compared with this tree, row for row, in the order given;
    --args reaches the benchmark (bench_generate's --preset, -B and --prompt make its one row); a --base among them
    that is no tree or given twice, or --args a shell cannot split, refused in one line."""
    root = os.path.dirname(TOOLS)
    other = os.path.join(root, "tools", "..")
    res = run("bench_compare.py", "--base", root, other, "--bench", "generate", "--json",
              "--args=--backend numpy --preset andrea-12m -B 1 --prompt 4 --new 2")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["bases"] == [root, other] and out["base"] == root
    by_base = {b: [r for r in out["rows"] if r["base"] == b] for b in out["bases"]}
    assert [r["row"] for r in by_base[root]] == [r["row"] for r in by_base[out["bases"][1]]]
    assert [r["row"] for r in by_base[root]] == ["andrea-12m B=1 prompt=4"]
    assert all(r["before"] > 0 and r["after"] > 0 and r["ratio"] > 0 for r in out["rows"])
    bad = run("bench_compare.py", "--base", root, os.path.join(root, "nowhere"))
    assert bad.returncode == 2 and "nowhere" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad = run("bench_compare.py", "--base", root, "--args=--preset 'andrea-12m")
    assert bad.returncode == 2 and "--args" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad = run("bench_compare.py", "--base", root, root)
    assert bad.returncode == 2 and "given twice" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------- MFU and ceilings
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the plans' formats come from it)")
@pytest.mark.parametrize("variant", ["reference", "fast", "tc"])
def test_profile_step_counts_each_ops_flops_and_bytes(monkeypatch, variant):
    """Every op of the recorded plans has its work counted (microgpt.info.step_plans: the plans on a described
    H200): the products' FLOPs are 6 a weight that multiplies a token, and 12 a causal (query, key) pair a layer
    times d_model, whichever kernels run them; the declared FLOPs of the rest (GELU's forward) at their arguments'
    sizes."""
    from microgpt.info import step_plans
    P = import_tools(monkeypatch, "profile_step")
    L, NH, C, B, T, V = 2, 4, 128, 2, 256, 97
    with P.counting_work() as work:
        plans = step_plans(GPTConfig(n_layer=L, n_head=NH, d_model=C, block_size=T, vocab_size=V), variant, B, T)
    products = set(P.PRODUCT_FLOPS)
    flops = {"products": 0, "gelu": 0}
    for plan in plans.values():
        counted = work[id(plan)]
        assert set(counted) == {e.op for e in plan}, variant  # each op of the plan, and nothing else
        assert all(nbytes > 0 for _, nbytes in counted.values()), counted
        for op, (f, _) in counted.items():
            name = op.split(" (")[0]
            flops["products"] += f if name in products else 0
            flops["gelu"] += f if name.startswith("gelu") else 0
    weights = L * 12 * C * C + V * C  # the linear layers' and the tied lm_head's
    assert flops["products"] == 6 * B * T * weights + L * 12 * B * T * (T + 1) // 2 * C
    assert flops["gelu"] == L * 40 * B * T * C  # ops.OPS' declaration of gelu_fwd's (the backward's is a product op's)
    assert ("weight splits" in work[id(plans["forward"])]) == (variant == "tc")


def test_profile_step_rows_are_slowest_first_against_their_ceiling(monkeypatch):
    P = import_tools(monkeypatch, "profile_step")
    rows = P.op_rows({("backward", "matmul_bwd (tc)"): [3, 2.0, 100e9, 1e8],  # 50 TFLOP/s
                      ("forward", "gelu_fwd (fast)"): [1, 0.5, 1e6, 2e9],    # 4,000 GB/s
                      ("forward", "weight splits"): [1, 0.0, 0, 0]}, step_ms=10.0, tflops=100.0, gbs=5000.0)
    assert [r["op"] for r in rows] == ["matmul_bwd (tc)", "gelu_fwd (fast)", "weight splits"]
    assert rows[0]["bound"] == "flops" and rows[0]["of_ceiling"] == pytest.approx(0.5)
    assert rows[0]["tflops"] == pytest.approx(50.0) and rows[0]["share"] == pytest.approx(0.2)
    assert rows[1]["bound"] == "bytes" and rows[1]["of_ceiling"] == pytest.approx(0.8)
    assert rows[2]["of_ceiling"] is None and rows[2]["bound"] is None  # no time, no work: no share
    no_ceiling = P.op_rows({("backward", "matmul_bwd (tc)"): [3, 2.0, 100e9, 1e8]}, 10.0, None, 5000.0)
    assert no_ceiling[0]["bound"] == "bytes"  # without a FLOP ceiling only the bytes bound it


@pytest.fixture
def fake_engine(monkeypatch):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH (the kernels' formats come from it)")
    stand_in(monkeypatch, FakeEngine(K.kernel_signatures()))


def test_the_ceiling_is_the_best_measured_product_rate(monkeypatch, fake_engine):
    timing = import_tools(monkeypatch, "timing")
    gpt2, measured = GPTConfig.preset("gpt2-124m"), []

    def measure(M, N, K_, trans_a, trans_b, stream):
        measured.append((M, N, K_, trans_a, trans_b))
        return (170.0 if M == N == K_ == 8192 else 150.0), ["k_gemm_wg_areg"]
    c = timing.product_ceiling([(gpt2, 8, 1024)], None, measure)
    N, V, C = 8 * 1024, 50257, 768
    assert measured == [(8192, 8192, 8192, False, True), (N, V, C, False, True), (N, C, V, False, False),
                        (V, C, N, True, False), (N, 4 * C, C, False, True)]
    assert c["measured"] and c["tflops"] == 170.0 and c["source"].startswith("measured") and "8192^3" in c["source"]
    assert [r["tflops"] for r in c["shapes"]] == [170.0, 150.0, 150.0, 150.0, 150.0]


def test_the_described_peak_stands_in_only_where_the_measurement_fails(monkeypatch, fake_engine):
    timing = import_tools(monkeypatch, "timing")

    def measure(*shape):
        raise MemoryError("out of memory")
    c = timing.product_ceiling([(GPTConfig.preset("andrea-12m"), 4, 256)], None, measure)
    assert not c["measured"] and c["tflops"] == 165.0  # microgpt.kernels.virtual's H200
    assert c["source"].startswith("described, not measured") and "MemoryError: out of memory" in c["source"]


def test_bench_compare_matches_bench_trains_rows_with_an_older_trees(monkeypatch):
    """A tree from before bench_train timed several presets reported the first one's variants alone: its rows are
    named as the first preset's rows are now, and the other presets' rows are named after their preset."""
    compare = import_tools(monkeypatch, "bench_compare")
    older = {"preset": "andrea-120m", "variants": {"tc": {"step_ms": 80.0}}}
    newer = {"preset": "andrea-120m", "variants": {"tc": {"step_ms": 79.0}},
             "rows": [{"preset": "andrea-120m", "variant": "tc", "step_ms": 79.0},
                      {"preset": "gpt2-124m", "variant": "tc", "step_ms": 101.0}]}
    assert compare.figures("train", older) == {"step tc": 80.0}
    assert compare.figures("train", newer) == {"step tc": 79.0, "gpt2-124m step tc": 101.0}
