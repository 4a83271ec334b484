"""tools/profile_decode.py's breakdown by op, on a described GPU (microgpt.info's plans; nothing runs): the ops
it groups a decode step's launches by, and the bytes of tools/timing.py decode_reads it gives them."""
import shutil

import pytest

from microgpt import GPTConfig
from microgpt.info import step_plans
from microgpt.ops import VARIANTS

from helpers import import_tools

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the formats come from it)")


@pytest.fixture
def tools(monkeypatch):
    return import_tools(monkeypatch, "profile_decode", "timing")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("B", [1, 8])
def test_each_op_that_reads_weights_or_the_cache_is_an_op_of_the_decode_step(tools, variant, B):
    """Every op decode_reads names launches in the step, so that the step's reads are all given to its ops;
    the groups by op and by kernel hold every launch once, the products' k_matvec under the fused products."""
    P, timing = tools
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64, block_size=128, vocab_size=257)
    plan = step_plans(cfg, variant, B, 1, decode=True)["decode"]
    by_op, by_kernel = P.grouped(plan, lambda e: e.op), P.grouped(plan, lambda e: e[0])
    assert sum(map(len, by_op.values())) == sum(map(len, by_kernel.values())) == len(plan)
    assert set(timing.decode_reads(cfg, B, 5)) <= {op.split(" (")[0] for op in by_op}
    products = [e for op, entries in by_op.items() for e in entries if e[0] in ("k_matmul_fwd", "k_gemm_simt")
                or e[0].startswith("k_matvec")]
    assert len(products) == 4 * cfg.n_layer + 1  # qkv, proj, fc, proj a layer, and the lm_head
    matvec = [e for name, entries in by_kernel.items() if name.startswith("k_matvec") for e in entries]
    assert all(e.op.split(" (")[0] in ("layernorm_matmul_fwd", "matmul_residual_fwd") for e in matvec)
    if variant != "reference":  # one k_matvec a product, each layernorm, GELU and residual add inside one
        assert len(matvec) == 4 * cfg.n_layer + 1 and len(plan) == 5 * cfg.n_layer + 2


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_step_without_a_group_keeps_every_other_launch_in_order(tools, variant):
    """What a group adds to the step is timed on the step less that group: every other launch, in the step's order,
    and none of the group's."""
    P, _ = tools
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64, block_size=128, vocab_size=257)
    plan = list(step_plans(cfg, variant, 1, 1, decode=True)["decode"])
    for by in (lambda e: e.op, lambda e: e[0]):
        for key, entries in P.grouped(plan, by).items():
            rest = P.without(plan, by, key)
            assert len(rest) + len(entries) == len(plan) and all(by(e) != key for e in rest)
            it = iter(plan)  # a subsequence of the step: each launch found after the one before
            assert all(any(e is f for f in it) for e in rest)
