"""Kernel choice made explicit, without a GPU: the cuda backend's plans recorded on a described device are values
(equal when made alike, printable a line a launch), and `microgpt info --explain` prints every launch of a step
with its op, kernel, grid, block and the reason for it."""
import shutil

import pytest

from microgpt import GPTConfig, model
from microgpt.cli import main
from microgpt.info import explain, step_plans
from microgpt.ops import OPS

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the formats come from it)")

SMALL = GPTConfig(n_layer=2, n_head=4, d_model=128, block_size=256, vocab_size=97)
# every op microgpt.model's training step runs, and the optimizer's
STEP_OPS = {"embed_fwd", "layernorm_fwd", "matmul_fwd", "residual_layernorm_fwd", "gelu_fwd", "crossentropy_fwd",
            "crossentropy_bwd", "matmul_layernorm_bwd", "matmul_gelu_bwd", "embed_bwd", "global_norm", "adamw"}


def ops_of(plan):
    return {e.op.split(" (")[0] for e in plan}


def test_a_plan_is_a_value_equal_where_made_alike():
    a, b = step_plans(SMALL, "tc", 2, 256), step_plans(SMALL, "tc", 2, 256)
    assert a == b and list(a) == ["forward", "backward", "optimizer"]
    assert step_plans(SMALL, "fast", 2, 256) != a
    assert step_plans(SMALL, "tc", 2, 256, device="a100") != a
    text = str(a["forward"])
    assert len(text.splitlines()) == len(a["forward"]) + 1 and text.startswith("op ")


@pytest.mark.parametrize("variant", ["reference", "fast", "tc"])
def test_every_launch_of_a_step_names_its_op_and_says_why(variant):
    plans = step_plans(SMALL, variant, 2, 256)
    launched = set().union(*(ops_of(p) for p in plans.values()))
    attention = {"fused_attention_fwd", "matmul_attention_bwd"} if variant == "tc" else \
        {"split_heads_fwd", "causal_scores_fwd", "softmax_fwd", "attn_values_fwd", "merge_heads_fwd",
         "merge_heads_bwd", "attn_values_bwd", "softmax_bwd", "causal_scores_bwd", "split_heads_bwd", "matmul_bwd"}
    assert launched - {"weight splits"} == STEP_OPS | attention
    assert launched <= set(OPS) | {"weight splits"}
    for plan in plans.values():
        for e in plan:
            assert e.op and e[0].startswith(("k_", "memset")), e
            assert e.op.endswith(")") == (variant != "reference" and e.op.split(" (")[0] in OPS
                                          and OPS[e.op.split(" (")[0]].kernels.keys() != {"reference"}), e.op


def test_explain_says_why_on_hopper_and_on_ampere():
    hopper = explain(GPTConfig.preset("andrea-120m"), "tc", 8, 1024)
    assert "attention: flash attention" in hopper
    for kernel, why in [("k_gemm_wg_split_delta", "sums flash attention's delta"),
                        ("k_flash_fwd_wg_d64", "d_k 64 in [20, 128], T 1024 >= 128; on wgmma"),
                        ("k_flash_bwd_wg_d64", "the query tiles down to the diagonal; on wgmma"),
                        ("k_flash_bwd_delta_wg_d64", "on wgmma, as the backward recomputes them"),
                        ("k_gemm_wg_areg_tn", "6 parts of K = 8192, added into C in order"),
                        ("k_tf32_split_batch", "split once into TF32 hi and lo"),
                        ("k_layernorm_fwd_staged", "staged through shared memory")]:
        assert any(kernel in line and why in line for line in hopper.splitlines()), (kernel, why)
    ampere = explain(GPTConfig.preset("andrea-120m"), "tc", 8, 1024, device="a100")
    assert "k_gemm_wg" not in ampere and "3xTF32 mma.sync (no wgmma before sm_90a)" in ampere
    assert "_wg_d64" not in ampere
    short = explain(SMALL, "tc", 2, 64)
    assert "attention: the reference kernels: T = 64 < 128" in short and "split_heads_fwd (fast)" in short
    assert "K = 32 < TC_MIN_K = 128" in short  # the scores' product: d_k too short for the tensor cores


def test_explain_a_decode_step():
    text = explain(GPTConfig.preset("andrea-12m"), "tc", 1, 1024, decode=True)
    assert "decode: " in text and "k_matvec_1" in text and "1 rows <= MATVEC_ROWS" in text
    assert "attention: one position against the cached keys and values" in text
    assert "k_attention_decode" in text and "k_gemm" not in text


def test_the_forward_plan_follows_the_model(monkeypatch):
    """The plan is microgpt.model's sequence: one more layer is one more layer's launches."""
    counts = [len(step_plans(GPTConfig(n, 4, 128, 256, 97), "tc", 2, 256)["forward"]) for n in (1, 2, 3)]
    assert counts[2] - counts[1] == counts[1] - counts[0] > 0
    assert model.forward.__module__ == "microgpt.model"


def test_info_explain_on_the_command_line(capsys):
    assert main(["info", "--explain", "--preset", "andrea-12m", "--variant", "fast", "-B", "2", "-T", "128"]) == 0
    out = capsys.readouterr().out
    assert "a training step at B=2, T=128" in out and "variant fast" in out and "k_sgemm_" in out
    for argv, named in [(["-T", "5000"], "-T 5000 is above the model's block_size 1024"),
                        (["-B", "0"], "argument -B: must be an integer >= 1, got '0'"),
                        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'")]:
        assert main(["info", "--explain", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("microgpt: error: ") and named in err and err.count("\n") == 1, err


def test_a_few_row_product_gives_each_warp_one_unit_or_whole_groups():
    """matvec.plan(): a block's units (groups of columns x parts of K) are one for each of its 4 warps, or whole
    groups in one part of K; never 3 groups, which would be 12 units, 3 a warp one after the other."""
    from microgpt.kernels import matvec
    c = matvec.matvec_launch()
    seen = set()
    for M in range(1, c["ROWS"] + 1):
        for K in (54, 384, 768, 1536, 3072):
            for N in (1, 5, 6, 97, 384, 768, 1152, 1536, 2304, 3072, 8449):
                R, cols, parts, shared = matvec.plan(M, K, N, layernorm=True)
                group = c["GROUP_FEW"] if R <= 2 else c["GROUP"]
                groups = -(-cols // group)
                assert groups * parts == 4 or (parts == 1 and groups % 4 == 0), (M, K, N, cols, parts)
                assert 1 <= cols <= N and cols * 4 * K <= max(c["CHUNK"], 4 * K)
                seen.add(groups * parts)
    assert seen >= {4, 8}
    assert matvec.plan(1, 384, 1152, True)[1:3] == (4, 2)  # andrea-12m's qkv: 2 groups of 2 columns, K in 2 parts


@pytest.fixture
def hopper_ptx(hopper_build):
    """The engine's PTX for sm_90a, kernel by kernel (conftest.py's one build a session)."""
    assert hopper_build.result.returncode == 0, hopper_build.result.stderr[-3000:]
    return hopper_build.ptx


@pytest.mark.parametrize("B", [1, 8, 16])
def test_a_dependent_launch_is_a_kernel_that_waits(hopper_ptx, B):
    """A launch recorded as a programmatic dependent may start while the launch before it runs, so its kernel must
    wait for that launch (pdl_wait(), cuda/common.cuh: griddepcontrol.wait in its PTX). On Hopper a decode step of a
    few rows launches every kernel after the embedding so; on Ampere none is."""
    config = GPTConfig.preset("andrea-120m")
    plan = step_plans(config, "tc", B, 1024, decode=True)["decode"]
    dependent = ["programmatic dependent" in e.why for e in plan]
    for e, d in zip(plan, dependent):
        assert not d or "griddepcontrol.wait" in hopper_ptx[e[0]], e[0]
    if B <= 8:
        assert dependent == [False] + [True] * (len(plan) - 1)
    ampere = step_plans(config, "tc", B, 1024, device="a100", decode=True)["decode"]
    assert not any("programmatic dependent" in e.why for e in ampere)
