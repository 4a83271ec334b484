"""The launch layer without a GPU: every launcher checks and records its launches against a stand-in engine
(tests/helpers.FakeEngine), so CI sees that every kernel of cuda/ is reachable from the registry, that each
kernel is launched from the module named after its header, and that every launch passes the arguments its
kernel's format asks for."""
import importlib
import itertools
import math
import inspect
import os
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from microgpt import kernels as K
from microgpt import ops as O
from microgpt import ops as registry
from microgpt.kernels import runtime
from microgpt.kernels.layernorm_fast import BWD_BLOCKS, bwd_launch, bwd_rows_per_block

from helpers import FakeArray, FakeEngine, op_call, op_sizes, stand_in

ROOT_CUDA = K.cuda_source_dir()

adamw_module = importlib.import_module("microgpt.kernels.adamw")  # the package's `adamw` is the function

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the formats come from it)")

# large enough for every path of the launchers: split-K (K = B*T = 1024), the 128 x 64 tile (d_k = 16)
B, T, C, NH, V = 2, 512, 64, 4, 97
d_k = C // NH


def f32(*shape):
    return FakeArray(shape)


def i32(*shape):
    return FakeArray(shape, np.int32)


SIZES = op_sizes(B, T, C, NH, V)


def _fake_call(op, pad=0):
    """One call of op at SIZES, from its arguments in microgpt.ops: FakeArrays (with pad, the pitched ones' rows
    padded by it), ids zeros (in the vocabulary)."""
    def array(a):
        return FakeArray.padded(a.size(SIZES), pad, a.dtype) if a.pitched and pad else FakeArray(a.size(SIZES), a.dtype)
    vals = {a.name: a.value(SIZES) if a.role == "value" else array(a) for a in op.args}
    args, kw = op_call(op, vals)
    return tuple(args), kw | ({"check_token_ids": False} if op.name == "embed_bwd" else {})


# op -> the arguments of one call, as microgpt.ops declares them
CALLS = {name: (lambda op=op: _fake_call(op)) for name, op in O.OPS.items()}
FORMAT_TYPES = {"P": int, "i": int, "I": int, "q": int, "f": float, "d": float}


class CallerRecordingEngine(FakeEngine):
    """Also notes, per kernel, the module whose function called launch()."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.callers = {}

    def function(self, name, shared=0):
        caller = inspect.stack()[2].frame.f_globals["__name__"]  # [0] here, [1] launch(), [2] its caller
        self.callers.setdefault(name, set()).add(caller)
        return super().function(name, shared)


@pytest.fixture
def fake(monkeypatch):
    """The described device the tests' plans are for (Plan(fake)), and this process's engine besides (stand_in), for
    what has no plan: an allocation's default, tools/kernel_cases' launches now."""
    e = stand_in(monkeypatch, CallerRecordingEngine(K.kernel_signatures()))
    monkeypatch.setattr(runtime, "_persistent", [])  # nor freed at exit as if it were real
    return e


def run_every_launcher(fake, sm_80=True):
    """Every op of the registry in every variant, and the generic product in its four transposes; on
    Hopper (sm_90a, wgmma) and, with sm_80, again on an sm_80 device (mma.sync)."""
    plan = _run_every_launcher(fake)
    if sm_80:
        fake.arch = "sm_80"
        plan += _run_every_launcher(fake)
        fake.arch = "sm_90a"
    return plan


def _run_every_launcher(fake):
    plan = K.Plan(fake)
    for variant in O.VARIANTS:
        ops = O.select(variant)
        for op, call in CALLS.items():
            args, kw = call()
            getattr(ops, op)(*args, **kw, stream=plan)
        # a decode step's few rows, in each of k_matvec's row counts, and past them
        ops.matmul_fwd(f32(B, 1, 4 * C), f32(B, 1, C), f32(4 * C, C), f32(4 * C), stream=plan)
        for rows in (1, 3, 8, 9):
            ops.layernorm_matmul_fwd(f32(rows, 1, 4 * C), f32(rows, 1, C), f32(C), f32(C), f32(4 * C, C), f32(4 * C),
                                     gelu=True, stream=plan)
            ops.matmul_residual_fwd(f32(rows, 1, C), f32(rows, 1, 4 * C), f32(C, 4 * C), f32(C), stream=plan)
        # rows of C % 4 != 0: the fast layernorm forward that is not staged
        ops.layernorm_fwd(f32(B, 3, 6), f32(B, 3), f32(B, 3), f32(B, 3, 6), f32(6), f32(6), stream=plan)
        # mlp.fc's backward: dW of 4C x C outputs, enough for tc's wgmma kernel, which takes dbias in it
        ops.matmul_bwd(f32(B, T, C), f32(4 * C, C), f32(4 * C), f32(B, T, 4 * C), f32(B, T, C), f32(4 * C, C),
                       stream=plan)
        for n_head in (2, 1):  # flash attention's kernels: d_k 32, 64 (CALLS' 16 runs the reference's)
            ops.fused_attention_fwd(f32(B, T, C), f32(B, n_head, T), f32(B, T, 3 * C), n_head, stream=plan)
            ops.fused_attention_bwd(f32(B, T, 3 * C), f32(B, T, C), f32(B, T, 3 * C), f32(B, T, C),
                                    f32(B, n_head, T), n_head, stream=plan)
        wide = 128  # and 128
        ops.fused_attention_fwd(f32(B, T, wide), f32(B, 1, T), f32(B, T, 3 * wide), 1, stream=plan)
        ops.fused_attention_bwd(f32(B, T, 3 * wide), f32(B, T, wide), f32(B, T, 3 * wide), f32(B, T, wide),
                                f32(B, 1, T), 1, stream=plan)
        # the attention's output projection into it at d_k 64 and K = C = 256: tc's product summing delta
        ops.matmul_attention_bwd(*_matmul_attention_bwd_args(B, T, 256, 4), dy=f32(B, T, 256), stream=plan)
        # mlp.proj's backward into GELU's at K = 4 C: tc's dX product times gelu'(pre), pre's tile copied in ahead
        wide = (B, T, 4 * C)
        ops.matmul_gelu_bwd(f32(*wide), f32(4 * C, 4 * C), f32(4 * C), f32(B, T, 4 * C), f32(*wide), f32(*wide),
                            f32(4 * C, 4 * C), stream=plan)
        # a layernorm of rows of 2 C under a product of K = 4 C: tc's dX product on wgmma, then the layernorm backward
        args, dinp = _matmul_layernorm_bwd_args(B * T, 2 * C, 4 * C)
        ops.matmul_layernorm_bwd(*args, dinp=dinp, accumulate=True, stream=plan)
        W = 4100  # rows wider than a block of the fast layernorm backward spans
        ops.layernorm_bwd(f32(3, W), f32(W), f32(W), f32(3, W), f32(3, W), f32(W), f32(3), f32(3), stream=plan)
    # a linear layer's forward and dX product reading its weight split once, by the batch split first in the plan
    w = f32(4 * C, 4 * C)  # K = 4 C: long enough for the wgmma kernel
    with K.weight_splits([w], False).reading(plan), K.weight_splits([w], True).reading(plan):
        O.select("tc").matmul_fwd(f32(B, T, 4 * C), f32(B, T, 4 * C), w, f32(4 * C), stream=plan)
        K.sgemm(f32(B * T, 4 * C), f32(B * T, 4 * C), w, stream=plan, units="tc")
    for ta in (False, True):
        for tb in (False, True):
            for N in (4 * C, d_k):  # K = 4 C: long enough for the tensor cores (matmul_tc.TC_MIN_K)
                a = f32(4 * C, B * T) if ta else f32(B * T, 4 * C)
                b = f32(N, 4 * C) if tb else f32(4 * C, N)
                K.sgemm(f32(B * T, N), a, b, trans_a=ta, trans_b=tb, stream=plan)
                K.sgemm(f32(B * T, N), a, b, trans_a=ta, trans_b=tb, stream=plan, units="tc")
                # the wgmma kernel itself where the default takes split operands (split-K's slices,
                # batched products and causal ones run on it)
                K.sgemm(f32(B * T, N), a, b, trans_a=ta, trans_b=tb, split=False, stream=plan, units="tc")
    return plan


def test_the_calls_cover_the_registry():
    assert set(CALLS) == set(O.OPS)


def test_every_op_has_a_numpy_reference_taking_its_launchers_arguments():
    for op, spec in O.OPS.items():
        assert spec.reference.__module__ == "microgpt.reference_ops" and spec.reference.__name__ == op, op
        takes = [p for p, v in inspect.signature(spec.reference).parameters.items() if v.kind != v.VAR_KEYWORD]
        launcher = [p for p in inspect.signature(spec.kernels["reference"]).parameters
                    if p not in ("stream", "check_token_ids")]
        assert takes == launcher, (op, takes, launcher)


def test_every_op_launches_kernels_of_the_header_it_names(fake):
    headers = K.kernel_headers()
    for op, spec in O.OPS.items():
        assert (ROOT_CUDA / spec.header).is_file(), (op, spec.header)
        plan = K.Plan(fake)
        args, kw = CALLS[op]()
        spec.kernels["reference"](*args, **kw, stream=plan)
        launched = {headers[name] for name, *_ in plan if name != "memset"}
        assert spec.header in launched, (op, spec.header, launched)


def test_every_kernel_is_reachable_from_the_registry(fake):
    run_every_launcher(fake)
    missing = set(K.kernel_names()) - set(fake.callers)
    assert not missing, f"kernels no launcher of the registry launches: {sorted(missing)}"


def test_each_kernel_is_launched_from_the_module_named_after_its_header(fake):
    run_every_launcher(fake)
    headers = K.kernel_headers()
    for name, callers in fake.callers.items():
        assert callers == {"microgpt.kernels." + headers[name].removesuffix(".cuh")}, (name, headers[name], callers)


def test_every_launch_passes_what_its_kernels_format_asks_for(fake):
    plan = run_every_launcher(fake, sm_80=False)
    assert len(plan) > len(K.kernel_names())
    for name, _, grid, args, shared, block in plan:
        if name == "memset":  # global_norm's zeroing of sumsq: a pointer and a count of words
            assert len(args) == 2 and all(isinstance(a, int) for a in args), args
            continue
        fmt = fake.signatures[name]
        assert block % 32 == 0 and 32 <= block <= 1024 and shared >= 0, (name, block, shared)
        assert len(args) == len(fmt), (name, fmt, args)
        for code, arg in zip(fmt, args):
            assert type(arg) is FORMAT_TYPES[code] or (code in "Pi" and isinstance(arg, (int, np.integer))), \
                (name, fmt, args)
        assert all(isinstance(g, int) and g >= 1 for g in grid) and 2 <= len(grid) <= 3, (name, grid)


def test_the_variants_run_their_own_launchers(fake):
    plan = K.Plan(fake)
    O.select("reference").matmul_fwd(*CALLS["matmul_fwd"]()[0], stream=plan)
    O.select("fast").matmul_fwd(*CALLS["matmul_fwd"]()[0], stream=plan)
    O.select("fast").causal_scores_fwd(*CALLS["causal_scores_fwd"]()[0], stream=plan)
    O.select("reference").causal_scores_fwd(*CALLS["causal_scores_fwd"]()[0], stream=plan)
    assert [name for name, *_ in plan] == ["k_matmul_fwd", "k_sgemm_nt", "k_sgemm_nt", "k_attn_scores_fwd",
                                            "k_causal_mask_fwd"]


def test_split_k_cuts_a_weight_gradient_and_reduces_it_in_order(fake):
    plan = K.Plan(fake)
    O.select("fast").matmul_bwd(*CALLS["matmul_bwd"]()[0], stream=plan)
    names = [name for name, *_ in plan]
    assert names == ["k_sgemm_nn_n64", "k_sgemm_tn_n64", "k_splitk_reduce", "k_colsum_partial", "k_colsum_reduce"]
    _, _, grid, args, _, _ = plan[1]
    assert grid[2] == 8 and args[6] == B * T // 8  # 8 slices of K = B*T, each a batch entry
    assert len(plan.keep) == 2  # the partial sums live as long as the plan


def test_the_fast_layernorm_backward_is_one_launch_set_by_n_alone(fake):
    """dx, each block's partial row of dw and db, and their sums into dw and db, in one launch over the rows (the
    last blocks to finish add the partials). Which rows a block takes is a function of N alone (a multiple of the
    rows a block takes at once, at most BWD_BLOCKS blocks), never of the GPU: another SM count or shared-memory
    size changes only how many blocks add the partials, which never changes a column's order. A block spans a row
    (a thread per 4 columns, rounded up to a warp) up to 4096 columns; wider rows take the wide kernel's blocks of
    1024 threads."""
    def launches(N, C):
        plan = K.Plan(fake)
        K.layernorm_bwd_fast(f32(N, C), f32(C), f32(C), f32(N, C), f32(N, C), f32(C), f32(N), f32(N),
                             accumulate=True, stream=plan)
        (kernel, _, grid, args, shared, threads), = plan
        # kernel, grid, (N, C, rows a block, accumulate), reducers, threads, shared bytes, scratch buffers
        return kernel, grid, args[10:14], args[14], threads, shared, len(plan.keep)

    fast, at_once = "k_layernorm_bwd_fast", bwd_launch()[0]
    per_block = at_once * -(-8192 // (BWD_BLOCKS * at_once))
    # 2 * 768 columns in strips of 16: 96 reducers, within a quarter of the 5 x 132 blocks of 192 threads (64
    # registers) an H200 holds at once; partials and counters kept
    assert launches(8192, 768) == (fast, (8192 // per_block, 1), [8192, 768, per_block, 1], 96, 192, 192 * 32, 2)
    # 768 threads a block: one an SM, so a quarter of the 132 SMs wait (375 strips)
    assert launches(8192, 3000)[:4] == (fast, (8192 // per_block, 1), [8192, 3000, per_block, 1], 33)
    # short: blocks of the rows taken at once, as many reducers as blocks at most
    small = -(-7 // at_once), -(-5 // at_once)
    assert launches(7, 3) == (fast, (small[0], 1), [7, 3, at_once, 1], 1, 32, 32 * 32, 2)
    assert launches(5, 4096)[:6] == (fast, (small[1], 1), [5, 4096, at_once, 1], small[1], 1024, 1024 * 32)
    assert launches(5, 4097)[:6] == (fast + "_wide", (small[1], 1), [5, 4097, at_once, 1], small[1], 1024,
                                     1024 * 16)
    for N in (1, 3, 4, 9, 2048, 2049, 8192, 8197, 100_000):
        _, (blocks, _), (_, _, rows_per_block, _), reducers, *_ = launches(N, 36)
        assert rows_per_block == bwd_rows_per_block(N) and rows_per_block % at_once == 0, N
        assert (blocks - 1) * rows_per_block < N <= blocks * rows_per_block and blocks <= BWD_BLOCKS, N
        assert 1 <= reducers <= min(blocks, 5), N  # 72 columns: 5 strips
    shapes = [(8197, 768), (8197, 1024), (3, 5000)]
    on_h200 = [launches(N, C) for N, C in shapes]
    fake.sm_count, fake.max_shared = 40, 0
    on_40_sms = [launches(N, C) for N, C in shapes]
    def but_reducers(launch):
        return launch[:3] + launch[4:]
    assert [but_reducers(la) for la in on_40_sms] == [but_reducers(la) for la in on_h200]
    # a quarter of 40 SMs x 5 blocks of 192 threads, of 40 x 4 of 256; N = 3: as many as its blocks
    assert [la[3] for la in on_40_sms] == [50, 40, -(-3 // at_once)]


def test_the_profile_cases_launch_every_kernel(fake):
    """tools/kernel_cases.py feeds profile_kernels, ncu_kernel and sanitize_kernels: a kernel without a case
    is never timed nor sanitized."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    try:
        from kernel_cases import Shape, build_cases
    finally:
        sys.path.pop(0)
    plan = K.Plan(fake)
    for case in build_cases(Shape(B=2, T=512, C=64, NH=4, V=97)):
        case.launch(plan)
    missing = set(K.kernel_names()) - {name for name, *_ in plan}
    assert not missing, f"kernels without a case in tools/kernel_cases.py: {sorted(missing)}"


# ---------------------------------------------------------------------------------------------- the registry
def test_variant_is_checked_in_one_place_and_named():
    assert O.resolve(None) == O.DEFAULT_VARIANT in O.VARIANTS
    for bad in ("fastest", "", None.__class__, 3):
        with pytest.raises(ValueError, match="variant must be one of"):
            O.resolve(bad)
    with pytest.raises(ValueError, match="variant must be one of"):
        O.select("Fast")
    with pytest.raises(ValueError, match="op must be one of"):
        O.launcher("matmul", "fast")


def test_every_op_has_a_reference_launcher_and_fast_ones_follow_the_naming():
    for op, spec in O.OPS.items():
        impls = spec.kernels
        assert spec.name == op and set(impls) <= set(O.VARIANTS) and "reference" in impls, op
        assert impls["reference"].__name__ == op, op
        for variant, fn in impls.items():
            if variant != "reference":
                assert fn.__name__ == f"{op}_{variant}", (op, variant, fn.__name__)
                ref_params = list(inspect.signature(impls["reference"]).parameters)
                assert list(inspect.signature(fn).parameters) == ref_params, op  # the same arguments


def test_select_gives_every_op_and_falls_back_to_the_reference():
    ops = O.select("fast")
    assert ops.variant is O.VARIANTS["fast"]
    assert ops.attn_scores_fwd is K.attn_scores_fwd and ops.matmul_fwd is K.matmul_fwd_fast
    assert all(callable(getattr(ops, op)) for op in O.OPS)
    assert registry.launcher("residual_fwd", "fast") is K.residual_fwd
    assert registry.launcher("gelu_fwd", "tc") is K.gelu_fwd_fast  # tc has none of its own: fast's


# ---------------------------------------------------------------------------------------------- argument checks
def test_bad_arguments_are_refused_naming_them(fake):
    x, w = f32(2, 3, 8), f32(8)
    out, mean, rstd = f32(2, 3, 8), f32(2, 3), f32(2, 3)
    plan = K.Plan(fake)
    with pytest.raises(TypeError, match="b must be float32, got float64"):
        K.layernorm_fwd(out, mean, rstd, x, w, FakeArray((8,), np.float64), stream=plan)
    with pytest.raises(ValueError, match=r"w must have shape \(8,\), got \(7,\)"):
        K.layernorm_fwd(out, mean, rstd, x, f32(7), w, stream=plan)
    with pytest.raises(ValueError, match=r"mean must have shape \(2, 3\)"):
        K.layernorm_fwd(out, f32(3, 2), rstd, x, w, w, stream=plan)
    for variant in O.VARIANTS:
        with pytest.raises(TypeError, match="accumulate must be True or False, got 1"):
            O.launcher("layernorm_bwd", variant)(out, w, w, x, x, w, mean, rstd, accumulate=1, stream=plan)
        with pytest.raises(ValueError, match=r"branch must have shape \(2, 3, 8\)"):
            O.launcher("residual_layernorm_fwd", variant)(out, out, mean, rstd, x, f32(2, 8), w, w, stream=plan)
        with pytest.raises(ValueError, match=r"x must be square matrices \(\.\.\., T, T\) where causal=True"):
            O.launcher("softmax_fwd", variant)(x, x, causal=True, stream=plan)
        with pytest.raises(ValueError, match=r"probs must be square matrices"):
            O.launcher("softmax_bwd", variant)(x, x, x, causal=True, stream=plan)
        with pytest.raises(TypeError, match="causal must be True or False, got 'yes'"):
            O.launcher("softmax_fwd", variant)(f32(2, 8, 8), f32(2, 8, 8), causal="yes", stream=plan)
    for variant in O.VARIANTS:  # the fast elementwise launchers check as the reference ones
        with pytest.raises(ValueError, match="out must be C-contiguous"):
            O.launcher("gelu_fwd", variant)(FakeArray((3, 8), strides=(4, 12)), f32(3, 8), stream=plan)
        with pytest.raises(ValueError, match="x must not be empty"):
            O.launcher("gelu_fwd", variant)(f32(0, 8), f32(0, 8), stream=plan)
        with pytest.raises(ValueError, match=r"dout must have shape \(3, 8\)"):
            O.launcher("gelu_bwd", variant)(f32(3, 8), f32(8, 3), f32(3, 8), stream=plan)
        with pytest.raises(ValueError, match="qkv's last dimension 24 must be 3 \\* C with n_head=3"):
            O.launcher("split_heads_fwd", variant)(f32(1, 3, 2, 2), f32(1, 3, 2, 2), f32(1, 3, 2, 2),
                                                   f32(1, 2, 24), 3, stream=plan)
        with pytest.raises(ValueError, match="n_head=5 must divide dy's last dimension 8"):
            O.launcher("merge_heads_bwd", variant)(f32(1, 5, 2, 1), f32(1, 2, 8), 5, stream=plan)
        with pytest.raises(ValueError, match=r"dlosses must have shape \(2, 3\)"):
            O.launcher("crossentropy_bwd", variant)(f32(2, 3, 9), f32(2, 3, 9), i32(2, 3), f32(3, 2),
                                                    check_token_ids=False, stream=plan)
        with pytest.raises(ValueError, match="idx has T=5 positions, above wpe's 4"):
            O.launcher("embed_fwd", variant)(f32(1, 5, 8), i32(1, 5), f32(10, 8), f32(4, 8), stream=plan)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        K.sgemm(f32(4, 5), f32(4, 3), f32(2, 5), stream=plan)
    with pytest.raises(ValueError, match="step must be an int >= 1"):
        K.adamw(w, w, w, w, lr=1e-3, beta1=0.9, beta2=0.9, eps=1e-8, weight_decay=0, step=0, stream=plan)
    assert plan == []  # nothing was launched


PITCHED = [(op, variant) for op, spec in O.OPS.items() if any(a.pitched for a in spec.args) for variant in spec.kernels]


@pytest.mark.parametrize("pad", [3, 4])
@pytest.mark.parametrize("op,variant", PITCHED, ids=[f"{op}-{v}" for op, v in PITCHED])
def test_a_pitched_argument_is_taken_with_padded_rows_and_its_pitch_passed_on(fake, op, variant, pad):
    spec = O.OPS[op]
    args, kw = _fake_call(spec, pad)
    plan = K.Plan(fake)
    spec.kernels[variant](*args, **kw, stream=plan)
    pitches = {a.size(SIZES)[-1] + pad for a in spec.args if a.pitched}
    assert all(any(p in launch[3] for launch in plan) for p in pitches), [launch[0] for launch in plan]


def test_rows_ptr_takes_rows_at_an_even_pitch_and_refuses_other_layouts_by_name():
    from microgpt.kernels.checks import ptr, rows_ptr
    padded = FakeArray.padded((2, 3, 5), 3)
    assert rows_ptr("logits", padded, (2, 3, 5)) == (padded.gpudata, 8)
    assert rows_ptr("logits", f32(2, 3, 5), (2, 3, 5))[1] == 5
    assert rows_ptr("one", FakeArray.padded((1, 1, 5), 7), (1, 1, 5))[1] == 5  # a single row never steps
    with pytest.raises(ValueError, match="logits must be C-contiguous"):
        ptr("logits", padded, (2, 3, 5))  # where the launcher takes no pitch
    for strides in ((60, 4, 20), (64, 24, 4), (96, 32, 8), (32, 8, 4)):  # transposed; rows of 6 then 8; a step of 2;
        bad = FakeArray((2, 3, 5), strides=strides)                         # rows overlapping
        with pytest.raises(ValueError, match=r"probs must be C-contiguous, or rows of 5 contiguous elements"):
            rows_ptr("probs", bad, (2, 3, 5))


def test_token_ids_outside_the_vocabulary_are_refused(fake, monkeypatch):
    monkeypatch.setattr(fake.cuda, "memcpy_dtoh", lambda host, p: host.fill(10))
    plan = K.Plan(fake)
    for variant in O.VARIANTS:
        with pytest.raises(ValueError, match=r"idx holds token id 10, outside \[0, 10\)"):
            O.launcher("embed_fwd", variant)(f32(2, 3, 4), i32(2, 3), f32(10, 4), f32(3, 4), stream=plan)
        with pytest.raises(ValueError, match=r"targets holds token id 10, outside \[0, 9\)"):
            O.launcher("crossentropy_bwd", variant)(f32(2, 3, 9), f32(2, 3, 9), i32(2, 3), f32(2, 3), stream=plan)
    assert plan == []


def test_the_sampling_launcher_refuses_bad_arguments_by_name(fake):
    tokens, logits, u = i32(3), f32(3, 20), FakeArray((3,), np.float64)
    plan = K.Plan(fake)
    with pytest.raises(ValueError, match=r"u must be a float64 device array of shape \(3,\)"):
        K.sample(tokens, logits, None, 0.8, stream=plan)
    with pytest.raises(TypeError, match="u must be float64, got float32"):
        K.sample(tokens, logits, f32(3), 0.8, stream=plan)
    with pytest.raises(ValueError, match=r"tokens must have shape \(3,\)"):
        K.sample(i32(3, 1), logits, u, 0.8, stream=plan)
    with pytest.raises(ValueError, match=r"top_k must be None or an int in \[1, vocab_size=20\], got 21"):
        K.sample(tokens, logits, u, 0.8, top_k=21, stream=plan)
    with pytest.raises(ValueError, match=r"top_p must be None or a number in \(0, 1\], got 0"):
        K.sample(tokens, logits, u, 0.8, top_p=0, stream=plan)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        K.sample(tokens, logits, u, -1, stream=plan)
    assert plan == []
    plan = K.Plan(fake)
    K.sample(tokens, logits, None, 0, stream=plan)  # greedy draws nothing: u may be None
    K.sample(tokens, logits, u, 0.5, stream=plan)
    # top_k and top_p left out become "no cut": V and 1.0; one block of SAMPLE_THREADS a row; the row staged in
    # shared memory where it is read more than once (temperature > 0)
    assert [(p[0], p[2], p[3][4:], p[4], p[5]) for p in plan] == [
        ("k_sample", (3, 1), [20, 0.0, 20, 1.0, 0], 0, K.int_constants()["SAMPLE_THREADS"]),
        ("k_sample", (3, 1), [20, 0.5, 20, 1.0, 1], 4 * 20, K.int_constants()["SAMPLE_THREADS"])]
    assert plan[0][3][3] == 0 and plan[0][3][1] == 0  # null pointers for u and for the mirror left out
    with pytest.raises(ValueError, match=r"mirror must have shape \(3,\)"):
        K.sample(tokens, logits, u, 0.5, mirror=i32(4), stream=plan)
    with pytest.raises(TypeError, match="mirror must be int32, got float32"):
        K.sample(tokens, logits, u, 0.5, mirror=f32(3), stream=plan)
    mirror = i32(3)
    K.sample(tokens, logits, u, 0.5, mirror=mirror, stream=plan)
    assert plan[-1][3][1] == K.ptr("mirror", mirror, (3,), np.int32) != plan[-1][3][0]


def test_size_one_axes_may_have_any_stride():
    # PyTorch gives axes of length 1 arbitrary strides; they never step, so the array is contiguous
    assert K.ptr("x", FakeArray((1, 3, 8), strides=(7, 32, 4)), (1, 3, 8)) > 0


def test_the_dw_kernel_cuts_k_into_the_parts_that_end_its_busiest_block_soonest():
    """k_gemm_wg_areg_tn (a block an SM) cuts one product's K into parts of 256 or more: the count whose busiest block,
    taking every sm_count-th part, has the fewest slices of 32 to multiply, TN_STORE_SLICES more a part; one part for
    batches and causal products, and where K is too short to cut."""
    def busiest(g, parts, sms):
        tiles = math.ceil(g.M / 128) * math.ceil(g.N / 128)
        return math.ceil(tiles * parts / sms) * (math.ceil(g.K / 32 / parts) + K.matmul_tc.TN_STORE_SLICES)

    for sms in (132, 114, 78):
        for OUT, IN in [(2304, 768), (768, 768), (3072, 768), (768, 3072), (8449, 768), (50257, 768)]:
            g = K.Gemm.dense(OUT, IN, 8192, trans_a=True, beta=1.0)
            parts = K.matmul_tc.tn_parts(g, sms)
            assert 1 <= parts <= 8192 // 256 and busiest(g, parts, sms) == min(busiest(g, p, sms) for p in range(1, 33))
            assert parts == min(p for p in range(1, 33) if busiest(g, p, sms) == busiest(g, parts, sms))
    assert [K.matmul_tc.tn_parts(K.Gemm.dense(2304, 768, 8192, trans_a=True), 132) for _ in range(2)] == [6, 6]
    assert K.matmul_tc.tn_parts(K.Gemm.dense(768, 768, 255, trans_a=True), 132) == 1  # 8 slices: too few to cut
    assert K.matmul_tc.tn_parts(K.Gemm.dense(768, 768, 256, trans_a=True), 132) == 1
    assert K.matmul_tc.tn_parts(K.Gemm.dense(768, 768, 512, trans_a=True), 132) == 2
    assert K.matmul_tc.tn_parts(K.Gemm.dense(768, 768, 8192, trans_a=True, batch=2), 132) == 1
    assert K.matmul_tc.tn_parts(K.Gemm.dense(768, 768, 8192, trans_a=True, causal=K.Causal.A_UPPER), 132) == 1


def test_split_k_for_one_block_per_sm_fills_the_last_wave():
    """The wgmma kernel holds one block per SM: split-K picks the slice count whose last wave is fullest
    (fewer slices where that ties), never one that leaves a slice shorter than 256 or K uneven."""
    def waves(g, s, sms=132):
        tiles = g.grid[0] * g.grid[1] * s
        return tiles / sms, math.ceil(tiles / sms)

    for OUT, IN in [(2304, 768), (768, 768), (3072, 768), (768, 3072), (8449, 768)]:  # andrea-120m's dW
        g = K.Gemm.dense(OUT, IN, 8192, trans_a=True, beta=1.0)
        s = g.splits(132, per_sm=1)
        assert s in (1, 2, 4, 8)
        full, rounds = waves(g, s)
        assert full / rounds >= max(waves(g, t)[0] / waves(g, t)[1] for t in (1, 2, 4, 8)) - 0.07, (OUT, IN, s)
    assert K.Gemm.dense(768, 768, 8191, trans_a=True).splits(132, per_sm=1) == 1  # K odd: no even slices
    assert K.Gemm.dense(768, 768, 1024, trans_a=True).splits(132, per_sm=1) <= 4  # slices of 256 at least
    assert K.Gemm.dense(768, 768, 1024, trans_a=True).splits(132) == 8  # the SGEMM's rule is unchanged


def test_the_wgmma_weight_gradient_takes_the_bias_gradient_in_its_pass_over_dout(fake):
    """On sm_90a the tc variant's dW = dout^T @ inp runs on the wgmma kernel that splits dout in registers
    (k_gemm_wg_areg_tn), whose consumers sum dout's columns as they split them: no column-sum kernel reads dout
    again, and no split-K reduction: the kernel cuts each tile's K into tn_parts parts, taken by a block an SM and
    added into dW and dbias in order, with 2 flags a tile that the plan keeps. Where the dW product is another
    kernel's (mma.sync on sm_80), split-K and the column-sum pass stay."""
    def launches(N, OUT, IN):
        db = f32(OUT)
        plan = K.Plan(fake)
        K.matmul_bwd_tc(f32(N, IN), f32(OUT, IN), db, f32(N, OUT), f32(N, IN), f32(OUT, IN), stream=plan)
        return db.gpudata, [name for name, *_ in plan], plan

    for N, OUT, IN in [(8192, 2304, 768), (8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (4099, 130, 772),
                       (8192, 8449, 768)]:  # andrea-120m's linear layers and lm_head, and K odd
        db, names, plan = launches(N, OUT, IN)
        assert names[-1] == "k_gemm_wg_areg_tn" and not [n for n in names if n.startswith(("k_colsum", "k_splitk"))]
        if OUT >= 256:  # dX = dout @ W, dout split in registers and W beforehand (stored K x N: transposed as split)
            assert names[:-1] == ["k_tf32_split_t", "k_gemm_wg_areg"], names
        _, _, grid, args, _, _ = plan[-1]
        g = K.Gemm.dense(OUT, IN, N, trans_a=True, beta=1.0)
        tiles, parts = math.ceil(OUT / 128) * math.ceil(IN / 128), K.matmul_tc.tn_parts(g, fake.sm_count)
        assert parts > 1 and grid[0] == min(tiles * parts, fake.sm_count), (grid, parts)
        assert args[-4:] == [db, 1, parts, plan.keep[-1].gpudata], args
        assert plan.keep[-1].size == 2 * tiles and f"{tiles} tiles x {parts} parts of K = {N}" in plan[-1].why
    fake.arch = "sm_80"
    db, names, plan = launches(8192, 768, 768)
    assert names[:3] == ["k_gemm_tc_nn", "k_gemm_tc_tn", "k_splitk_reduce"] and names[-1].startswith("k_colsum")
    assert plan[1][3][-1] == 0 and plan[2][3][-2:] == [0, 0]  # the products and the reduce sum no rows
    for units in ("simt", "tc"):  # row sums of an A stored M x K would need threads to exchange them
        with pytest.raises(ValueError, match="sums: the row sums of op"):
            K.gemm(K.Gemm.dense(300, 200, 256, units=units), 1, 1, 1, sums=1)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_every_product_kernel_chosen_is_one_the_source_defines(fake, arch):
    """tc_kernel's choice, for every layout, tile width, causal mode and size on either tensor-core path, names a
    kernel of the compiled source, with the shared memory its header gives it."""
    fake.arch = arch
    defined, sizes = set(K.kernel_names()), K.int_constants()
    for ta, tb, N, causal, K_ in itertools.product((False, True), (False, True), (64, 200), list(K.Causal),
                                                   (128, 300)):
        g = K.Gemm.dense(300, N, K_, trans_a=ta, trans_b=tb, causal=causal, units="tc")
        for wgmma in (None, True, False):
            name, shared, _ = K.matmul_tc.tc_kernel(g, fake, wgmma)
            assert name in defined, (name, g)
            assert shared == sizes[{"k_gemm_wg_areg_tn": "TC_AREG_TN_SMEM_BYTES"}.get(
                name, "TC_WG_SMEM_BYTES" if name.startswith("k_gemm_wg") else "TC_SMEM_BYTES")], (name, shared)


@pytest.mark.parametrize("arch,tc,wg", [("sm_75", False, False), ("sm_80", True, False), ("sm_89", True, False),
                                        ("sm_90a", True, True), ("sm_100", True, False), ("sm_120", True, False)])
def test_the_tensor_core_paths_follow_the_architecture(fake, arch, tc, wg):
    fake.arch = arch
    assert K.tensor_cores(fake) == tc and K.warpgroup_mma(fake) == wg
    plan = K.Plan(fake)
    K.sgemm(f32(300, 200), f32(300, 256), f32(256, 200), split=False, stream=plan, units="tc")
    K.sgemm(f32(300, 200), f32(300, 255), f32(255, 200), stream=plan, units="tc")  # K below WG_MIN_K: mma.sync there too
    K.sgemm(f32(100, 100), f32(100, 256), f32(256, 100), stream=plan, units="tc")  # fewer outputs than WG_MIN_OUTPUTS: so too
    K.sgemm(f32(300, 200), f32(300, 256), f32(256, 200), stream=plan, units="tc")  # on sm_90a: B split beforehand
    kernel, _, _, _, shared, block = plan[0]
    assert kernel == ("k_gemm_wg_nn" if wg else "k_gemm_tc_nn" if tc else "k_sgemm_nn"), kernel
    assert [p[0] for p in plan[1:3]] == 2 * ["k_gemm_tc_nn" if tc else "k_sgemm_nn"], plan
    # the wgmma kernels' three warpgroups and their shared memory come from the header's enum TcLaunch
    sizes = K.int_constants()
    assert (block, shared) == ((sizes["TC_WG_THREADS"], sizes["TC_WG_SMEM_BYTES"]) if wg else
                               (K.BLOCK, sizes["TC_SMEM_BYTES"]) if tc else (K.BLOCK, 0)), (kernel, block, shared)
    split = [p[0] for p in plan[3:]]
    assert split == (["k_tf32_split_t", "k_gemm_wg_areg"] if wg else [kernel]), split
    if wg:
        assert plan[-1][4:] == (sizes["TC_AREG_STORE_SMEM_BYTES"], sizes["TC_WG_THREADS"]), plan[-1]


def test_a_tensor_map_is_made_once_for_a_matrix_and_only_where_the_tma_reads_it(fake):
    """The kernels on wg_areg_tiles copy A by the TMA through a tensor map in device memory: one a matrix (its
    address, shape, row stride and box), made at its first product and kept by the engine, so that a later plan, or
    a product again, finds the same; where A or its rows are not 16-byte aligned, none (0), A copied by cp.async."""
    a, b, c = f32(1000, 300), f32(300, 384), f32(1000, 384)
    plan = K.Plan(fake)
    K.sgemm(c, a, b, stream=plan, units="tc")
    K.sgemm(c, a, b, stream=plan, units="tc")
    maps = [p[3][2] for p in plan if p[0] == "k_gemm_wg_areg"]
    assert len(maps) == 2 and maps[0] == maps[1] == int(fake.tensor_maps[(a.gpudata, 1000, 300, 300, 36, 128)])
    assert "A by the TMA" in plan[1].why, plan[1]
    odd = f32(1000, 301)  # rows of 301 floats: not 16-byte aligned
    plan = K.Plan(fake)
    K.sgemm(c, odd, f32(301, 384), stream=plan, units="tc")
    (product,) = [p for p in plan if p[0] == "k_gemm_wg_areg"]
    assert product[3][2] == 0 and "A by cp.async" in product.why, product
    assert not any(key[0] == odd.gpudata for key in fake.tensor_maps)


def test_a_tensor_map_is_encoded_columns_first_and_its_failure_named(monkeypatch):
    """driver.encode_tensor_map asks cuTensorMapEncodeTiled for a 2-D FP32 map, its dimensions and box innermost
    (columns) first and its row stride in bytes, with no interleave or swizzle, 256-byte L2 promotion and zeros past
    the edges, written at a 64-byte aligned address, and returns the 128 bytes the driver wrote; a refusal, or a
    driver without the call, raises KernelError naming the matrix."""
    import ctypes
    from microgpt.kernels import driver as D
    calls = []
    written = np.arange(100, 116, dtype=np.uint64)

    def encode(out, dtype, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2, oob):
        calls.append((out % 64, dtype, rank, address, list(dims._obj), list(strides._obj), list(box._obj),
                      list(element_strides._obj), interleave, swizzle, l2, oob))
        ctypes.memmove(out, written.ctypes.data, 128)
        return 0 if dims._obj[0] > 1 else 1  # CUDA_ERROR_INVALID_VALUE

    def error_name(rc, name):
        name._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    monkeypatch.setattr(D, "driver", lambda: SimpleNamespace(cuTensorMapEncodeTiled=encode,
                                                             cuGetErrorName=error_name))
    assert D.encode_tensor_map(1 << 20, 1000, 300, 304, 36, 128) == written.tobytes()
    assert calls == [(0, 7, 2, 1 << 20, [300, 1000], [304 * 4], [36, 128], [1, 1], 0, 0, 3, 0)]
    with pytest.raises(K.KernelError, match=r"tensor map over 5 x 1 floats .*CUDA_ERROR_INVALID_VALUE"):
        D.encode_tensor_map(1 << 20, 5, 1, 4, 36, 128)
    monkeypatch.setattr(D, "driver", lambda: SimpleNamespace(cuGetErrorName=error_name))  # a driver before 12.0
    with pytest.raises(K.KernelError, match=r"tensor map over 1000 x 300 .*no cuTensorMapEncodeTiled"):
        D.encode_tensor_map(1 << 20, 1000, 300, 304, 36, 128)


def test_a_matrix_smaller_than_a_box_or_a_refused_map_leaves_no_map(fake, monkeypatch):
    """No map where the matrix is smaller than a box (fewer rows than a tile: a short prefill's products), so that
    A is copied by cp.async there; and a map the driver refuses raises and leaves nothing in the engine's maps, so
    that a second try cannot find an unwritten one."""
    assert K.runtime.tensor_map(1 << 20, 127, 768, 768, 36, 128, K.Plan(fake)) == 0
    assert K.runtime.tensor_map(1 << 20, 1000, 35, 36, 36, 128, K.Plan(fake)) == 0
    plan = K.Plan(fake)
    K.matmul_fwd_tc(f32(1, 50, 2304), f32(1, 50, 768), f32(2304, 768), f32(2304), stream=plan)  # a prefill's
    (product,) = [p for p in plan if p[0] == "k_gemm_wg_areg"]
    assert product[3][2] == 0 and "A by cp.async" in product.why, product

    def refuse(*_):
        raise K.KernelError("refused")
    monkeypatch.setattr(fake, "encode_tensor_map", refuse)
    for _ in range(2):
        with pytest.raises(K.KernelError, match="refused"):
            K.runtime.tensor_map(1 << 20, 1000, 300, 300, 36, 128, K.Plan(fake))
    assert (1 << 20, 1000, 300, 300, 36, 128) not in fake.tensor_maps


def test_split_operands_share_the_plans_workspace(fake):
    """On sm_90a one product of A stored M x K that takes the wgmma kernel reads A as it lies, split in its
    registers, and B split beforehand: B's hi then lo (N_pad x K_pad each, rows padded to 128 and K to 32,
    transposed on the way where B is stored K x N) in the plan's workspace, then k_gemm_wg_areg on a grid of whole
    128 x 128 tiles. Later products of the plan reuse the workspace and a larger one takes its place; batched and
    causal products and products split over K keep the wgmma kernel, and A transposed (the dW products) takes
    k_gemm_wg_areg_tn, which cuts K itself."""
    sizes = K.int_constants()
    assert (sizes["TC_SPLIT_ROWS"], sizes["TC_SPLIT_K"]) == (128, 32)
    a1, b1, c1, bias1 = f32(1000, 300), f32(300, 333), f32(1000, 333), f32(333)
    plan = K.Plan(fake)
    K.sgemm(c1, a1, b1, bias=bias1, alpha=0.5, beta=2.0, stream=plan, units="tc")
    K.sgemm(f32(300, 200), f32(300, 256), f32(200, 256), trans_b=True, bias=f32(200), stream=plan, units="tc")  # fits: the same
    # larger: a workspace of its own
    K.sgemm(f32(2000, 400), f32(2000, 512), f32(512, 400), bias=f32(400), stream=plan, units="tc")
    names = [p[0] for p in plan]
    assert names == ["k_tf32_split_t", "k_gemm_wg_areg", "k_tf32_split", "k_gemm_wg_areg", "k_tf32_split_t",
                     "k_gemm_wg_areg"], names
    (_, _, g_b, split_b, _, _), (_, _, g_c, product, shared, block) = plan[:2]
    b_n = 384 * 320  # floats of B's hi
    ws = split_b[0]
    assert split_b == [ws, ws + 4 * b_n, b1.gpudata, 333, 300, 333, 320] and g_b[:2] == (10, 12)
    a_map = int(fake.tensor_maps[(a1.gpudata, 1000, 300, 300, 36, 128)])  # A by the TMA, a box a raw slice
    assert product == [c1.gpudata, a1.gpudata, a_map, ws, bias1.gpudata, 1000, 333, 300, 300, 320, 333, 0.5, 2.0]
    assert g_c[:2] == (3 * 8, 1) and (shared, block) == (sizes["TC_AREG_STORE_SMEM_BYTES"], sizes["TC_WG_THREADS"])
    assert plan[2][3][0] == ws and plan[3][3][3] == ws  # the second product: the same workspace
    assert plan[4][3][0] != ws and plan[4][3][0] == plan.workspace.gpudata
    assert plan.workspace.size == 2 * 512 * 512
    # a block an SM at most, each taking every sm_count-th of the grid's tiles (the third product: 4 x 16 of them)
    assert plan[5][2][:2] == (min(4 * 16, fake.sm_count), 1) and "64 tiles over" in plan[5].why, plan[5]
    sms, fake.sm_count = fake.sm_count, 40
    plan = K.Plan(fake)
    K.sgemm(f32(2000, 400), f32(2000, 512), f32(512, 400), stream=plan, units="tc")
    assert plan[-1][2][:2] == (40, 1) and "64 tiles over 40 blocks" in plan[-1].why, plan[-1]
    fake.sm_count = sms
    plan = K.Plan(fake)
    K.sgemm(f32(3, 300, 200), f32(3, 300, 256), f32(3, 256, 200), stream=plan, units="tc")  # a batch
    K.sgemm(f32(300, 200), f32(256, 300), f32(256, 200), trans_a=True, stream=plan, units="tc")  # A transposed
    K.sgemm(f32(4099, 130), f32(4099, 772), f32(772, 130), stream=plan, units="tc")  # plain, few tiles: split over K
    K.matmul_fwd_tc(f32(2, 300, 200), f32(2, 300, 256), f32(200, 256), f32(200), stream=plan)  # a linear layer: split
    assert [p[0] for p in plan] == ["k_gemm_wg_nn", "k_gemm_wg_areg_tn", "k_gemm_wg_nn", "k_splitk_reduce",
                                    "k_tf32_split", "k_gemm_wg_areg"], plan
    assert plan[1][3][-3:] == [1, 1, 0], plan[1]  # one product, one part of K (2 x 3 tiles of 256), no flags
    assert plan[1][4] == sizes["TC_AREG_TN_SMEM_BYTES"], plan[1]
    assert plan[2][2][2] > 1  # the split-K slices, a batch of the wgmma kernel
    for N, split in ((16383 * 128, True), (16383 * 128 + 1, False)):  # k_tf32_split_t's grid: N_pad / 32 <= 65535
        g = K.Gemm.dense(256, N, 256)
        assert K.matmul_tc.split_operands(g, K.matmul_tc.tc_kernel(g, fake)) == split, N


def test_the_forward_and_backward_splits_share_one_arena_the_size_of_the_larger(fake):
    """A SplitArena lays each set's splits out from its start: the forward's and the backward's weights (each split at
    its own pass's start) take one allocation, made at the first split found, as large as the larger set, not the
    sum; a set that asks for more than it holds is refused."""
    weights = [f32(300, 257), f32(1000, 333)]
    sizes = [K.split_floats(K.weight_splits(weights, t).candidates) for t in (False, True)]
    assert sizes == [2 * (384 * 288 + 1024 * 352), 2 * (384 * 320 + 384 * 1024)]  # rows to 128, K to 32
    made = []
    arena = K.SplitArena(max(sizes), lambda n: made.append(f32(n)) or made[-1])
    fwd, bwd = (K.weight_splits(weights, t, arena.allocator()) for t in (False, True))
    assert not made  # nothing found, nothing allocated
    at = {name: [s.find(*op) for op in sorted(s.candidates)] for name, s in (("fwd", fwd), ("bwd", bwd))}
    assert len(made) == 1 and made[0].size == max(sizes)
    base = made[0].gpudata
    for name, pointers in at.items():  # each set from the arena's start, one after the other, within it
        splits = {"fwd": fwd, "bwd": bwd}[name]
        assert sorted(pointers)[0] == base and max(int(b.gpudata) + 4 * b.size for b in splits.found.values()) \
            <= base + 4 * max(sizes)
    with pytest.raises(RuntimeError, match="SplitArena"):
        arena.allocator()(max(sizes) + 1)


def test_weights_split_once_go_first_in_the_plan_and_replace_the_products_own_splits(fake):
    """Products recorded inside weight_splits(...).reading(plan) on sm_90a read a weight's split (hi then lo, rows_pad x
    K_pad each) from the set rather than splitting it in the plan's workspace; on leaving, one k_tf32_split_batch
    launch that splits what they found, and only that, goes first: its table a row of fields (enum SplitJob) an
    operand, their 64 x 64 tiles numbered one after another, the grid all of them."""
    sizes = K.int_constants()
    assert sizes["SPLIT_TILE"] == 64 and sizes["SPLIT_JOB_FIELDS"] == 10
    w1, w2, unused = f32(300, 257), f32(1000, 333), f32(512, 512)
    inp1, dout2 = f32(600, 257), f32(600, 1000)
    fwd, bwd = K.weight_splits([w1, w2, unused], False), K.weight_splits([w1, w2, unused], True)
    plan = K.Plan(fake)
    with fwd.reading(plan), bwd.reading(plan):
        O.select("tc").matmul_fwd(f32(600, 300), inp1, w1, f32(300), stream=plan)   # out = inp @ w1^T: w1 as it is
        # dinp = dout @ w2: w2 transposed (a bias: not split-K)
        K.sgemm(f32(600, 333), dout2, w2, bias=f32(333), stream=plan, units="tc")
        K.sgemm(f32(600, 333), dout2, w2, bias=f32(333), stream=plan, units="tc")   # again: the same split
        # no candidate: its own
        O.select("tc").matmul_fwd(f32(600, 200), f32(600, 512), f32(200, 512), f32(200), stream=plan)
    names = [p[0] for p in plan]
    assert names == ["k_tf32_split_batch", "k_tf32_split_batch", "k_gemm_wg_areg", "k_gemm_wg_areg",
                     "k_gemm_wg_areg", "k_tf32_split", "k_gemm_wg_areg"], names
    assert (len(fwd), len(bwd)) == (1, 1)
    (w1_hi, w1_buf), = [(int(b.gpudata), b) for b in fwd.found.values()]
    (w2_hi, w2_buf), = [(int(b.gpudata), b) for b in bwd.found.values()]
    assert w1_buf.size == 2 * 384 * 288 and w2_buf.size == 2 * 384 * 1024  # rows to 128, K to 32
    assert plan[2][3][3] == w1_hi and plan[3][3][3] == w2_hi and plan[4][3][3] == w2_hi
    assert plan[6][3][3] == plan[5][3][0] != w1_hi  # the last product's B split in the workspace, by its own pass
    rows = {(f, tuple(t.shape)) for f, t in [(0, fwd.tables[-1][1]), (1, bwd.tables[-1][1])]}
    assert rows == {(0, (1, 10)), (1, (1, 10))}
    field = {name: sizes[name] for name in sizes if name.startswith("JOB_")}
    for splits, (src, rows_, K_, ld, transposed), hi, rows_pad, K_pad in (
            (fwd, (w1.gpudata, 300, 257, 257, 0), w1_hi, 384, 288),
            (bwd, (w2.gpudata, 333, 1000, 333, 1), w2_hi, 384, 1024)):
        row = splits._jobs()[0][0]
        want = dict(JOB_SRC=src, JOB_HI=hi, JOB_LO=hi + 4 * rows_pad * K_pad, JOB_ROWS=rows_, JOB_K=K_, JOB_LD=ld,
                    JOB_K_PAD=K_pad, JOB_TRANSPOSED=transposed, JOB_FIRST_TILE=0, JOB_TILES_K=-(-K_pad // 64))
        assert {name: int(row[i]) for name, i in field.items()} == want
    batch = {id(s): p for s, p in zip((fwd, bwd), plan[:2])}  # the set left last (the outer one) goes first
    for splits, rows_pad, K_pad in ((fwd, 384, 288), (bwd, 384, 1024)):
        _, _, grid, args, _, block = batch[id(splits)]
        assert args == [int(splits.tables[-1][1].gpudata), 1] and block == sizes["SPLIT_THREADS"]
        assert grid[0] == rows_pad // 64 * -(-K_pad // 64)
    # two operands: the second's tiles follow the first's
    both = K.SplitOperands([(w1.gpudata, 300, 257, 257, False), (w2.gpudata, 333, 1000, 333, True)])
    both.find(w1.gpudata, 300, 257, 257, False), both.find(w2.gpudata, 333, 1000, 333, True)
    table, tiles = both._jobs()
    assert [int(r[field["JOB_FIRST_TILE"]]) for r in table] == [0, 6 * 5] and tiles == 6 * 5 + 6 * 16
    with pytest.raises(TypeError, match="plan must be a runtime.Plan"):
        with both.reading(None):
            pass
    fake.arch = "sm_80"  # no split operands: nothing found, nothing launched
    sm80 = K.weight_splits([w1], False)
    plan = K.Plan(fake)
    with sm80.reading(plan):
        O.select("tc").matmul_fwd(f32(600, 300), inp1, w1, f32(300), stream=plan)
    assert len(sm80) == 0 and [p[0] for p in plan] == ["k_gemm_tc_nt"]


def _matmul_layernorm_bwd_args(N, C, OUT):
    """matmul_layernorm_bwd's positional arguments, (dx, dw, db, dweight, dbias, dout, inp, weight, x, w, mean,
    rstd), and its dinp."""
    return [f32(N, C), f32(C), f32(C), f32(OUT, C), f32(OUT), f32(N, OUT), f32(N, C), f32(OUT, C), f32(N, C), f32(C),
            f32(N), f32(N)], f32(N, C)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_tc_runs_the_layernorm_backward_after_the_dx_product(fake, arch):
    """tc's matmul_layernorm_bwd is its matmul_bwd into dinp (the dX product on the tensor cores), then
    layernorm_bwd_fast of dinp into dx, dw and db: the dX product writes dinp, which the layernorm's pass reads."""
    N, C, OUT = 8192, 768, 3072
    args, dinp = _matmul_layernorm_bwd_args(N, C, OUT)
    fake.arch = arch
    plan = K.Plan(fake)
    O.select("tc").matmul_layernorm_bwd(*args, dinp=dinp, accumulate=True, stream=plan)
    names = [p[0] for p in plan]
    assert names[-1] == "k_layernorm_bwd_fast" and not any("ln_bwd" in n for n in names[:-1]), names
    dx_product = "k_gemm_wg_areg" if arch == "sm_90a" else "k_gemm_tc_nn"
    assert dx_product in names, names
    assert plan[names.index(dx_product)][3][0] == dinp.gpudata, plan[names.index(dx_product)]
    assert plan[-1][3][:3] == [a.gpudata for a in args[:3]] and dinp.gpudata in plan[-1][3], plan[-1]  # dinp read


@pytest.mark.parametrize("variant", list(O.VARIANTS))
@pytest.mark.parametrize("at,bad,error,named", [
    (10, f32(301), ValueError, "mean"), (7, f32(512, 769), ValueError, "weight"), (0, f32(300, 769), ValueError, "dx"),
    (4, f32(511), ValueError, "dbias"), (None, None, TypeError, "accumulate"), (-1, f32(300, 767), ValueError, "dinp")])
def test_matmul_layernorm_bwd_refuses_bad_arguments_before_any_launch(fake, variant, at, bad, error, named):
    """Every argument is checked, by name, before the first of its launches (its product's) in every variant."""
    args, dinp = _matmul_layernorm_bwd_args(300, 768, 512)
    kw = {"accumulate": 1} if at is None else {}
    if at == -1:
        dinp = bad
    elif at is not None:
        args[at] = bad
    plan = K.Plan(fake)
    with pytest.raises(error, match=named):
        O.select(variant).matmul_layernorm_bwd(*args, dinp=dinp, **kw, stream=plan)
    assert not plan


def _matmul_attention_bwd_args(B, T, C, NH):
    """matmul_attention_bwd's positional arguments, (dqkv, dweight, dbias, dout, y, weight, qkv, lse, n_head)."""
    return [f32(B, T, 3 * C), f32(C, C), f32(C), f32(B, T, C), f32(B, T, C), f32(C, C), f32(B, T, 3 * C),
            f32(B, NH, T), NH]


def _flash_bwd_kernels(d_k, device):
    """Flash attention's pass over P and dP, and its kernel of dQ, dK and dV, for heads of d_k on `device`."""
    D = K.flash_attention.width(d_k)
    if K.flash_attention.on_wgmma(d_k, device):
        return ["k_flash_bwd_delta_wg_d64", "k_flash_bwd_wg_d64"]
    return [f"k_flash_bwd_delta_d{D}", f"k_flash_bwd_d{D}"]


@pytest.mark.parametrize("arch,B,T,C,NH,fused", [
    ("sm_90a", 8, 1024, 768, 12, True), ("sm_90a", 3, 200, 256, 8, True), ("sm_90a", 1, 300, 512, 4, True),
    ("sm_90a", 2, 128, 384, 3, True),    # T = 128: no rows past the pass kernel's, the kernel writes no delta
    ("sm_90a", 8, 1024, 768, 16, False),  # d_k 48: heads across the product's 128-column tiles
    ("sm_90a", 2, 512, 64, 2, False),     # K = C too short for the wgmma kernel
    ("sm_90a", 2, 100, 256, 4, False),    # T below flash attention's
    ("sm_80", 8, 1024, 768, 12, False)])  # no wgmma
def test_tc_sums_flash_attentions_delta_in_the_dx_product_where_it_can(fake, arch, B, T, C, NH, fused):
    """On sm_90a, where the output projection's dX product runs with B split beforehand and its tiles hold whole
    heads, tc's matmul_attention_bwd queues the weight's split and k_gemm_wg_split_delta (dout read as it lies; dy,
    delta and the counters of the rows past the pass kernel's), then the pass kernel, flash attention's backward and
    the dW product, and no k_flash_bwd_delta_rows; elsewhere its matmul_bwd, then its fused_attention_bwd."""
    args, dy = _matmul_attention_bwd_args(B, T, C, NH), f32(B, T, C)
    fake.arch = arch
    plan = K.Plan(fake)
    O.select("tc").matmul_attention_bwd(*args, dy=dy, stream=plan)
    names = [p[0] for p in plan]
    if not fused:
        assert "k_gemm_wg_split_delta" not in names, names
        flash = K.flash_attention.runs(B, NH, C // NH, T, fake)
        assert ("k_flash_bwd_delta_rows" in names) == flash and names[-1] == (
            _flash_bwd_kernels(C // NH, fake)[1] if flash else "k_fused_attention_bwd_dkdv"), names
        return
    D = C // NH
    at = names.index("k_gemm_wg_split_delta")
    assert names[at - 1] == "k_tf32_split_t" and "k_flash_bwd_delta_rows" not in names, names
    assert names[at + 1:at + 3] == _flash_bwd_kernels(D, fake) \
        and names[at + 3] == "k_gemm_wg_areg_tn", names  # then the dW product
    _, _, grid, kargs, shared, block = plan[at]
    delta, sync = plan[at + 1][3][:2]  # the pass kernel's, which the backward reads
    assert grid[:2] == (math.ceil(C / 128), math.ceil(B * T / 128)), grid
    assert kargs[:3] == [dy.gpudata, delta, sync] and kargs[7] == args[4].gpudata, kargs  # y
    assert kargs[3:7] == [args[3].gpudata, C, int(fake.tensor_maps[(args[3].gpudata, B * T, C, C, 36, 128)]),
                          plan[at - 1][3][0]], kargs  # dout as it lies (and by the TMA), W_O split
    assert kargs[-6:] == [B * T, C, C, 32 * math.ceil(C / 32), T, D], kargs
    assert plan[at + 2][3][-5] == delta, plan[at + 2]  # the backward reads the delta the product wrote


@pytest.mark.parametrize("variant", list(O.VARIANTS))
@pytest.mark.parametrize("at,bad,error,named", [
    (0, f32(2, 200, 767), ValueError, "dqkv"), (2, f32(255), ValueError, "dbias"), (4, f32(2, 201, 256), ValueError,
                                                                                    "y"),
    (7, f32(2, 4, 199), ValueError, "lse"), (8, 3, ValueError, "n_head"), (-1, f32(2, 200, 255), ValueError, "dy")])
def test_matmul_attention_bwd_refuses_bad_arguments_before_any_launch(fake, variant, at, bad, error, named):
    """Every argument is checked, by name, before the first of its launches in every variant."""
    args, dy = _matmul_attention_bwd_args(2, 200, 256, 4), f32(2, 200, 256)
    if at == -1:
        dy = bad
    else:
        args[at] = bad
    plan = K.Plan(fake)
    with pytest.raises(error, match=named):
        O.select(variant).matmul_attention_bwd(*args, dy=dy, stream=plan)
    assert not plan


def _misaligned(a, floats=1):
    """a, its address `floats` floats past the 16-byte boundary it had."""
    a.gpudata += 4 * floats
    a.__cuda_array_interface__["data"] = (a.gpudata, False)
    return a


@pytest.mark.parametrize("arch,C,misaligned,staged", [
    ("sm_90a", 768, None, True), ("sm_80", 1024, None, True), ("sm_90a", 4, None, True),
    ("sm_75", 768, None, False),  # no cp.async
    ("sm_90a", 1028, None, False), ("sm_90a", 770, None, False),  # past the register path's rows; C % 4 != 0
    ("sm_90a", 768, 0, False), ("sm_90a", 768, 3, False), ("sm_90a", 768, 4, False), ("sm_90a", 768, 5, False)])
def test_the_layernorm_forward_is_staged_where_its_rows_allow(fake, arch, C, misaligned, staged):
    """k_layernorm_fwd_staged takes rows of 16-byte chunks up to LN_STAGED_MAX_C columns on sm_80 and later, a
    warp a row, LN_STAGED_WARPS rows a block with a row of shared memory each; the rest k_layernorm_fwd_fast.
    misaligned: which of (out, mean, rstd, x, w, b) starts a float past a 16-byte boundary (mean and rstd, read a
    float at a time, may)."""
    fake.arch = arch
    N = 37
    arrays = [f32(N, C), f32(N), f32(N), f32(N, C), f32(C), f32(C)]
    if misaligned is not None:
        _misaligned(arrays[misaligned])
    plan = K.Plan(fake)
    O.launcher("layernorm_fwd", "fast")(*arrays, stream=plan)
    warps, max_c = K.int_constants()["LN_STAGED_WARPS"], K.int_constants()["LN_STAGED_MAX_C"]
    assert max_c == 1024
    (kernel, _, grid, args, shared, block), = plan
    assert args == [a.gpudata for a in arrays] + [N, C]
    staged = staged and misaligned not in (0, 3, 4, 5)
    if staged:
        assert kernel == "k_layernorm_fwd_staged"
        assert (grid, block, shared) == ((math.ceil(N / warps), 1), 32 * warps, 4 * C * warps), (grid, block, shared)
    else:
        assert kernel == "k_layernorm_fwd_fast" and shared == 0, kernel


def test_empty_products_launch_nothing_and_oversized_grids_are_refused(fake):
    for units in ("simt", "tc"):  # empty arrays are refused by name before anything
        with pytest.raises(ValueError, match="a must not be empty"):
            K.sgemm(f32(0, 200), f32(0, 256), f32(256, 200), units=units)
    plan = K.Plan(fake)  # an empty Gemm given to gemm directly: no zero-sized grid
    for units in ("simt", "tc"):
        K.gemm(K.Gemm.dense(0, 200, 256, units=units), 1, 1, 1, stream=plan)
        K.gemm(K.Gemm.dense(300, 0, 256, units=units), 1, 1, 1, stream=plan)
    assert len(plan) == 0
    with pytest.raises(ValueError, match="batch = 70000"):
        K.sgemm(f32(70000, 2, 2), f32(70000, 2, 2), f32(70000, 2, 2))
    # flash attention's grid is (tiles, NH, B): past 65535 batch rows (or heads) the reference kernels run it
    plan = K.Plan(fake)
    K.fused_attention_fwd_tc(f32(70000, 130, 64), f32(70000, 2, 130), f32(70000, 130, 192), 2, stream=plan)
    K.fused_attention_bwd_tc(f32(70000, 130, 192), f32(70000, 130, 64), f32(70000, 130, 192),
                             f32(70000, 130, 64), f32(70000, 2, 130), 2, stream=plan)
    K.fused_attention_fwd_tc(f32(2, 130, 64), f32(2, 2, 130), f32(2, 130, 192), 2, stream=plan)
    assert [name for name, *_ in plan] == ["k_fused_attention_fwd", "k_fused_attention_bwd_dq",
                                           "k_fused_attention_bwd_dkdv", "k_flash_fwd_d32"]


def test_the_opt_in_counts_a_kernels_static_shared_memory():
    """A block takes 48 KB of shared memory without the opt-in, its static shared memory among them: a kernel of 1 KB
    static is opted in for dynamic sizes past 47 KB (its launch would fail without it), once for each larger size."""
    raised = []

    class Function:
        shared_size_bytes = 1024

        def prepare(self, fmt):
            pass

        def set_attribute(self, attribute, value):
            raised.append((attribute, value))

    e = object.__new__(runtime._Engine)  # the engine's bookkeeping alone, no device
    e.module, e.signatures = SimpleNamespace(get_function=lambda name: Function()), {"k_static": "P"}
    e.functions, e._shared_limit = {}, {}
    e.cuda = SimpleNamespace(function_attribute=SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="max dynamic"))
    e.function("k_static", 47 * 1024)
    assert raised == []
    e.function("k_static", 47 * 1024 + 4)
    e.function("k_static", 40 * 1024)
    e.function("k_static", 100 * 1024)
    assert raised == [("max dynamic", 47 * 1024 + 4), ("max dynamic", 100 * 1024)]
