"""The Python API on the GPU: MultiHeadAttention and the whole GPT on the cuda backend agree with the
numpy backend (the reference engine) on the same weights and inputs."""
import re
import subprocess
import sys

import numpy as np
import pytest

from microgpt import GPT, GPTConfig, MultiHeadAttention, checkpoint
from microgpt.attention import fused
from microgpt.cli import main
from microgpt.data import BatchSampler, load_tokens, split
from microgpt.model import product_weights
from microgpt import kernels as K
from microgpt.ops import VARIANTS
from microgpt import reference as R
from microgpt.params import decays

from helpers import record, rel_err

pytestmark = pytest.mark.gpu

SMALL = GPTConfig(n_layer=2, n_head=4, d_model=64, block_size=19, vocab_size=97)
ANDREA_12M = GPTConfig.preset("andrea-12m")  # 6 layers, d_model 384, 12 heads, T 1024, byte vocab


def close(what, got, want, tol):
    err = rel_err(got, want)
    record("cuda vs numpy backend", what, err)
    assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"


VARIANT = pytest.mark.parametrize("variant", list(VARIANTS))


def twins(config, seed, variant="fast"):
    """A numpy and a cuda model holding the same weights (LN gains and biases perturbed off 1 and 0)."""
    ref = GPT(config, backend="numpy", seed=seed)
    rng = np.random.default_rng(seed)
    sd = ref.state_dict()
    for k in sd:
        if sd[k].ndim == 1:
            sd[k] = sd[k] + rng.normal(0, 0.1, sd[k].shape).astype(np.float32)
    ref.load_state_dict(sd)
    gpu = GPT(config, backend="cuda", seed=seed + 1, variant=variant)
    gpu.load_state_dict(sd)
    return ref, gpu


# ---------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("B,T,C,NH", [(1, 1, 20, 4), (2, 7, 64, 4), (1, 1024, 384, 12)],
                         ids=["B1-T1", "B2-T7", "andrea-12m-T1024"])
@VARIANT
def test_multi_head_attention_matches_numpy(rng, B, T, C, NH, variant):
    ref = MultiHeadAttention(C, NH, backend="numpy", seed=int(rng.integers(1 << 30)))
    sd = ref.state_dict()
    sd["qkv.b"] = rng.normal(0, 0.1, sd["qkv.b"].shape).astype(np.float32)
    sd["proj.b"] = rng.normal(0, 0.1, sd["proj.b"].shape).astype(np.float32)
    sd["qkv.w"] *= 10  # scores of order 1, so the softmax is not uniform
    ref.load_state_dict(sd)
    gpu = MultiHeadAttention(C, NH, backend="cuda", variant=variant)
    gpu.load_state_dict(sd)
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    out_r, inter_r = ref.forward(x, return_intermediates=True)
    out_g, inter_g = gpu.forward(x, return_intermediates=True)
    close("attention out", out_g, out_r, 1e-5)
    if fused(gpu.backend.ops, C // NH, T, K.engine()):  # flash attention: its output and log-sum-exp, no per-head stage
        assert set(inter_g) == {"y", "lse"}
    else:
        assert set(inter_g) == set(inter_r) - {"lse"} - (set() if VARIANTS[variant].keeps_scores else {"scores"})
        np.testing.assert_allclose(inter_g["probs"].sum(-1), 1.0, atol=1e-5)
        assert inter_g["probs"][..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]].max(initial=0) == 0
    for k in inter_g:
        assert inter_g[k].shape == inter_r[k].shape, k
        close(f"attention {k}", inter_g[k], inter_r[k], 1e-5)

    dout = rng.standard_normal((B, T, C)).astype(np.float32)
    close("attention dx", gpu.backward(dout), ref.backward(dout), 1e-4)
    for k in ref.grads:
        close(f"attention d{k}", gpu.grads[k], ref.grads[k], 1e-4)


# ---------------------------------------------------------------------------------------------- the whole GPT
@pytest.mark.parametrize("config,B,T", [(SMALL, 3, 19), (SMALL, 1, 1), (ANDREA_12M, 1, 1024)],
                         ids=["small", "small-T1", "andrea-12m-T1024"])
@VARIANT
def test_gpt_matches_numpy(rng, config, B, T, variant):
    ref, gpu = twins(config, seed=int(rng.integers(1 << 30)), variant=variant)
    idx = rng.integers(0, config.vocab_size, size=(B, T))
    tgt = rng.integers(0, config.vocab_size, size=(B, T))
    lr, lg = ref.forward(idx, tgt)
    gl, gg = gpu.forward(idx, tgt)
    assert gl.dtype == np.float32 and gl.shape == (B, T, config.vocab_size)
    close("logits", gl, lr, 1e-4)
    close("loss", gg, lg, 1e-5)
    for m in (ref, gpu):
        m.zero_grad()
        m.backward()
    gr, gd = ref.grad_dict(), gpu.grad_dict()
    for k in gr:
        close("gradients", gd[k], gr[k], 1e-3)


def adamw_replay(start, grads, shape, name, lr, betas, eps, weight_decay):
    """numpy's AdamW (float64, microgpt.reference.adamw) from `start` over each step's clipped gradients."""
    w, m, v = start.astype(np.float64), 0.0, 0.0
    wd = weight_decay if decays(name, shape) else 0.0
    for t, g in enumerate(grads, 1):
        w, m, v = R.adamw(w, g.astype(np.float64), m, v, t, lr, *betas, eps, wd)
    return w


# The GPU's weights after two steps are held to numpy's AdamW replayed on the GPU's own clipped gradients (the
# optimizer alone, to FP32 rounding), and those gradients to the numpy twin's at each step. Against the twin's
# weights no tolerance tighter than the steps' size holds for every input: Adam divides each gradient by its own
# size, so a component whose gradient is small beside the two backends' rounding differences (1e-3 and below of
# the largest) can move by up to lr a step (seed 2398555781: 1.13e-4 from the twin on the reference variant, whose
# gradients are the least accurate); so every component within the steps' size of the twin's, and the twins'
# error recorded.
@VARIANT
def test_two_adamw_steps_with_clipping_match_numpy(rng, variant):
    ref, gpu = twins(SMALL, seed=5, variant=variant)
    start = {k: w.copy() for k, w in gpu.state_dict().items()}
    idx = rng.integers(0, SMALL.vocab_size, size=(4, 19))
    tgt = rng.integers(0, SMALL.vocab_size, size=(4, 19))
    lr, betas, eps, weight_decay, ref_grads, gpu_grads = 3e-3, (0.9, 0.95), 1e-8, 0.1, [], []
    for _ in range(2):
        for m in (ref, gpu):
            m.zero_grad()
            m.forward(idx, tgt)
            m.backward()
            m.step(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, grad_clip=0.3)
        ref_grads.append(ref.grad_dict())  # clipped, as the step used them (and as torch leaves them)
        gpu_grads.append(gpu.grad_dict())
        assert ref.last_grad_norm > 0.3  # the clipping was active
        close("grad norm", gpu.last_grad_norm, ref.last_grad_norm, 1e-5)
        for k in ref_grads[-1]:
            close("clipped gradients", gpu_grads[-1][k], ref_grads[-1][k], 1e-3)
    sr, sg = ref.state_dict(), gpu.state_dict()
    for k in sr:
        replayed = adamw_replay(start[k], [g[k] for g in gpu_grads], sr[k].shape, k, lr, betas, eps, weight_decay)
        err = rel_err(sg[k], replayed)
        record("cuda vs numpy backend", "weights after 2 steps, numpy's AdamW on the GPU's gradients", err)
        assert err < 1e-6, f"{k} after 2 AdamW steps: {err:.2e} from numpy's AdamW on the GPU's gradients"
        moved = np.abs(sg[k].astype(np.float64) - sr[k])
        assert np.all(moved <= 2 * 2 * lr * len(gpu_grads)), f"{k}: a component moved past the steps' size"
        record("cuda vs numpy backend", "weights after 2 steps", rel_err(sg[k], sr[k]))


def two_training_steps(gpu, idx, tgt):
    """Each step's logits, loss and gradients, then the weights after both (AdamW, clipped): what a run repeats."""
    out = []
    for _ in range(2):
        gpu.zero_grad()
        logits, loss = gpu.forward(idx, tgt)
        gpu.backward()
        out += [logits, np.float32(loss), *gpu.grad_dict().values()]
        gpu.step(lr=3e-3, grad_clip=1.0)
    return out + list(gpu.state_dict().values())


@pytest.mark.parametrize("variant", ["fast", "tc"])
def test_the_training_passes_as_cuda_graphs_give_the_bits_of_their_launches(rng, monkeypatch, variant):
    """Forward and backward run as one CUDA graph each (captured at their first run): two steps of them give
    every bit of the same plans replayed launch by launch (where no graph can be captured)."""
    idx = rng.integers(0, SMALL.vocab_size, size=(3, 19))
    tgt = rng.integers(0, SMALL.vocab_size, size=(3, 19))
    runs = []
    for graph in (True, False):
        if not graph:
            def refuse(plan, stream, phase):
                raise K.GraphUnavailable("replayed for the test")
            monkeypatch.setattr(K.graph, "Graph", refuse)
        gpu = GPT(SMALL, backend="cuda", seed=7, variant=variant)
        out = two_training_steps(gpu, idx, tgt)
        passes = gpu.backend._passes.values()
        assert {p.phase for p in passes} == {"forward", "backward"}
        assert all((p.graph is not None) == graph for p in passes), [p.unavailable for p in passes]
        runs.append(out)
    for with_graphs, replayed in zip(*runs):
        np.testing.assert_array_equal(with_graphs, replayed)


def test_the_tc_passes_split_each_weight_once_and_keep_the_bits(rng, monkeypatch):
    """On sm_90a the tc forward and backward split the weights their products read from split operands in one launch
    each, at the pass's start (K.weight_splits), in place of one split pass a product: two training steps give every
    bit of the passes that split them product by product. A dX product that cuts K into slices (few tiles: 260 rows
    here) reads W as it lies, so the backward splits only the weights whose dX products keep K whole."""
    if not K.warpgroup_mma(K.engine()):
        pytest.skip(f"{K.device_summary()}: split operands are the wgmma path's (sm_90a)")
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=256, block_size=130, vocab_size=300)  # K >= 256: the wgmma kernel
    idx, tgt = rng.integers(0, cfg.vocab_size, size=(2, 2, 130))
    runs, splits_launched = [], []
    for batched in (True, False):
        if not batched:
            monkeypatch.setattr(K, "weight_splits", lambda weights, transposed, new=None: K.SplitOperands([]))
        gpu = GPT(cfg, backend="cuda", seed=5, variant="tc")
        runs.append(two_training_steps(gpu, idx, tgt))
        b, passes = gpu.backend._bufs, gpu.backend._passes
        plans = {"forward": passes[("forward", True)].plan, "backward": passes["backward"].plan}
        splits = {"forward": b.fwd_splits, "backward": b.bwd_splits}
        for phase, plan in plans.items():
            names = [name for name, *_ in plan]
            assert (names[0] == "k_tf32_split_batch") == batched and names.count("k_tf32_split_batch") == batched
            splits_launched.append((phase, len(splits[phase]), sum(n.startswith("k_tf32_split_") or
                                                                   n == "k_tf32_split" for n in names) - batched))
    (_, n_fwd, with_fwd), (_, n_bwd, with_bwd), (_, _, own_fwd), (_, _, own_bwd) = splits_launched
    weights = product_weights(gpu.backend.P, cfg)  # OUT x IN: the forward's K is IN, the dX product's OUT
    whole_k = [w for w in weights if K.Gemm.dense(2 * 130, w.shape[1], w.shape[0], units="tc").splits(
        K.engine().sm_count, 1) == 1]
    assert n_fwd == len(weights) == 2 * 4 + 1, splits_launched  # each layer's four weights and wte, read once a pass
    assert 0 < n_bwd == len(whole_k) < n_fwd, (splits_launched, [w.shape for w in whole_k])
    assert (own_fwd - with_fwd, own_bwd - with_bwd) == (n_fwd, n_bwd), splits_launched  # a pass less for each
    for batched, own in zip(*runs):
        np.testing.assert_array_equal(batched, own)


def test_shapes_change_between_calls(rng):
    ref, gpu = twins(SMALL, seed=2)
    for B, T in [(2, 5), (3, 19), (2, 5), (1, 1)]:
        idx = rng.integers(0, SMALL.vocab_size, size=(B, T))
        close("logits", gpu.forward(idx)[0], ref.forward(idx)[0], 1e-4)


def test_bad_calls_are_refused_before_any_kernel(rng):
    gpu = GPT(SMALL, backend="cuda")
    with pytest.raises(ValueError, match="idx holds token id 97"):
        gpu.forward(np.full((1, 3), 97))
    with pytest.raises(ValueError, match="above block_size=19"):
        gpu.forward(np.zeros((1, 20), dtype=np.int64))
    with pytest.raises(RuntimeError, match="backward"):
        gpu.backward()
    with pytest.raises(ValueError, match="float32 only"):
        GPT(SMALL, backend="cuda", dtype=np.float64)


def test_a_hugging_face_gpt2_on_the_gpu_has_the_numpy_backends_logits(tmp_path, rng):
    """GPT.from_hf on the cuda backend: the logits of the numpy backend (which tests/test_hf.py holds to
    transformers' own) within the usual tolerance; save_hf from the GPU writes the same weights."""
    pytest.importorskip("safetensors")
    GPT(SMALL, seed=12).save_hf(tmp_path / "hf")
    idx, targets = rng.integers(0, SMALL.vocab_size, size=(2, 2, SMALL.block_size))
    gpu, cpu = GPT.from_hf(tmp_path / "hf", backend="cuda"), GPT.from_hf(tmp_path / "hf")
    (logits, loss), (cpu_logits, cpu_loss) = gpu.forward(idx, targets), cpu.forward(idx, targets)
    err = rel_err(logits, cpu_logits.astype(np.float64))
    record("cuda vs numpy backend", "logits of a Hugging Face GPT-2", err)
    assert err < 1e-5
    assert abs(loss - cpu_loss) <= 1e-5 * abs(cpu_loss), (loss, cpu_loss)
    gpu.save_hf(tmp_path / "back")
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()


def test_generate_on_the_gpu(rng):
    gpu = GPT(SMALL, backend="cuda", seed=3)
    prompt = rng.integers(0, SMALL.vocab_size, size=(2, 4))
    out = gpu.generate(prompt, 25, temperature=0.9, top_k=10, seed=11)  # runs past block_size
    assert out.shape == (2, 29) and out.min() >= 0 and out.max() < SMALL.vocab_size
    np.testing.assert_array_equal(out, gpu.generate(prompt, 25, temperature=0.9, top_k=10, seed=11))


@VARIANT
def test_the_model_runs_its_variants_kernels_and_only_kernels_of_the_registry(rng, variant):
    gpu = GPT(SMALL, backend="cuda", variant=variant)
    idx = rng.integers(0, SMALL.vocab_size, size=(2, 19))  # T = 19: the tc variant's attention is the pipeline
    gpu.forward(idx, idx)
    gpu.backward()
    launched = {name for p in gpu.backend._passes.values() for name, *_ in p.plan}
    assert launched <= set(K.kernel_names())
    simt = {n for n in launched if n.startswith("k_sgemm")}
    tensor_cores = {n for n in launched if n.startswith(("k_gemm_tc", "k_gemm_wg"))}
    if variant == "reference":  # the readable kernels only
        assert not simt and not tensor_cores and "k_attn_scores_fwd" in launched
    else:
        assert "k_matmul_fwd" not in launched and "k_attn_scores_fwd" not in launched  # mask fused into scores
        # at T = 19 the tc variant's attention is the pipeline too (below flash attention's MIN_T: the next test)
        assert not fused(gpu.backend.ops, SMALL.d_model // SMALL.n_head, 19, K.engine())
        memory_bound = {"gelu_fwd", "gelu_bwd", "split_heads_fwd", "split_heads_bwd", "merge_heads_fwd",
                        "merge_heads_bwd", "crossentropy_bwd", "embed_fwd"}  # fast's, which tc runs too
        assert {f"k_{op}_fast" for op in memory_bound} <= launched
        assert not {f"k_{op}" for op in memory_bound} & launched
        if variant == "tc" and K.tensor_cores(K.engine()):
            # at d_model 64 the dX of qkv and mlp.fc (K = 3C, 4C) are long enough for the tensor cores, on the
            # 128 x 64 tile (N = C), mma.sync on any device (too few outputs for wgmma: WG_MIN_OUTPUTS); the
            # forward (K = C) and the weight gradients (K = B*T = 38) are too short for them (TC_MIN_K)
            assert "k_gemm_tc_nn_n64" in tensor_cores and {"k_sgemm_nt", "k_sgemm_tn"} <= simt
        else:
            assert {"k_sgemm_nt", "k_sgemm_nn", "k_sgemm_tn", "k_sgemm_nt_n64"} <= simt and not tensor_cores


def test_the_tc_model_at_flash_attentions_lengths_runs_it_and_no_head_split_merge_or_softmax(rng):
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=64, block_size=130, vocab_size=97)  # d_k 32
    if not K.flash_attention_supported(cfg.d_model // cfg.n_head, cfg.block_size, K.engine()):
        pytest.skip("flash attention does not run on this device")
    gpu = GPT(cfg, backend="cuda", variant="tc")
    idx = rng.integers(0, cfg.vocab_size, size=(2, cfg.block_size))
    gpu.forward(idx, idx)
    gpu.backward()
    launched = {name for p in gpu.backend._passes.values() for name, *_ in p.plan}
    assert {n for n in launched if n.startswith("k_flash_")} == {"k_flash_fwd_d32", "k_flash_bwd_delta_d32",
                                                                 "k_flash_bwd_delta_rows", "k_flash_bwd_d32"}
    heads = {"split_heads_fwd", "split_heads_bwd", "merge_heads_fwd", "merge_heads_bwd", "softmax_fwd", "softmax_bwd"}
    assert not {f"k_{op}_fast" for op in heads} & launched and not {f"k_{op}" for op in heads} & launched


# ---------------------------------------------------------------------------------------------- training
def test_training_on_the_builtin_corpus_lowers_the_validation_loss():
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=128, block_size=64, vocab_size=257)
    train, val = split(load_tokens())
    model = GPT(cfg, backend="cuda", seed=0)
    tr, va = BatchSampler(train, 16, 64, seed=0), BatchSampler(val, 16, 64, seed=1)
    val_batches = [va.next() for _ in range(4)]

    def val_loss():
        return np.mean([model.forward(b[:, :-1], b[:, 1:], return_logits=False)[1] for b in val_batches])
    before = val_loss()
    for _ in range(150):
        b = tr.next()
        model.zero_grad()
        model.forward(b[:, :-1], b[:, 1:], return_logits=False)
        model.backward()
        model.step(lr=3e-3, weight_decay=0.1, grad_clip=1.0)
    after = val_loss()
    print(f"\nval loss {before:.3f} -> {after:.3f}")
    assert before > 5.0 and after < 3.0


def test_save_load_continue_equals_not_stopping(tmp_path, rng):
    idx = rng.integers(0, SMALL.vocab_size, size=(4, 19))
    tgt = rng.integers(0, SMALL.vocab_size, size=(4, 19))

    def train(model, steps):
        for _ in range(steps):
            model.zero_grad()
            model.forward(idx, tgt)
            model.backward()
            model.step(lr=1e-2, weight_decay=0.1, grad_clip=1.0)

    straight = GPT(SMALL, backend="cuda", seed=4)
    train(straight, 4)
    stopped = GPT(SMALL, backend="cuda", seed=4)
    train(stopped, 2)
    stopped.save(tmp_path / "run.ckpt")
    resumed = GPT.load(tmp_path / "run.ckpt", backend="cuda")
    assert resumed.step_count == 2
    train(resumed, 2)
    assert resumed.step_count == straight.step_count == 4
    for which in ("params", "m", "v"):
        np.testing.assert_array_equal(resumed.backend.pull(which), straight.backend.pull(which), err_msg=which)


# ---------------------------------------------------------------------------------------------- the command
def test_the_command_trains_on_the_gpu_and_resumes_exactly(tmp_path, capsys):
    small = ["--n-layer", "2", "--n-head", "4", "--d-model", "128", "--block-size", "64", "--batch-size", "16",
             "--eval-every", "25", "--ckpt-every", "25", "--no-progress", "--sample-tokens", "20"]
    assert main(["train", *small, "--steps", "100", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "on cuda" in out  # auto picked the GPU
    val = [float(v) for v in re.findall(r"val loss (\d+\.\d+)", out)]
    assert val[-1] < val[0] - 2.0, out
    assert main(["train", *small, "--steps", "100", "--stop-after", "50", "--out", str(tmp_path / "b")]) == 0
    assert main(["train", *small, "--steps", "100", "--out", str(tmp_path / "b"), "--resume"]) == 0
    a, b = checkpoint.read(tmp_path / "a" / "model.ckpt"), checkpoint.read(tmp_path / "b" / "model.ckpt")
    assert a.step == b.step == 100
    for x, y in ((a.weights, b.weights), (a.m, b.m), (a.v, b.v)):
        np.testing.assert_array_equal(x, y)  # the kernels are deterministic: stopping changes nothing


# ---------------------------------------------------------------------------------------------- the end of a process
ALIVE_AT_EXIT = {
    "model": """
import numpy as np
from microgpt import GPT, GPTConfig
model = GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, block_size=16, vocab_size=97), backend="cuda")
idx = np.arange(32).reshape(2, 16) % 97
for _ in range(2):
    model.zero_grad(); model.forward(idx, idx); model.backward(); model.step(1e-3, grad_clip=1.0)
print("loss", model.forward(idx, idx)[1])
""",
    "attention": """
import numpy as np
from microgpt import MultiHeadAttention
mha = MultiHeadAttention(64, 4, backend="cuda")
out = mha.forward(np.ones((2, 9, 64), np.float32))
print("dx", mha.backward(out).shape)
""",
    "launch layer": """
import numpy as np
from microgpt import kernels as K
ga = K.engine().ga
x = ga.to_gpu(np.ones((300, 64), np.float32)); w = ga.to_gpu(np.ones((64, 64), np.float32))
dx, dw, db = ga.empty_like(x), ga.zeros_like(w), ga.zeros(64, np.float32)
plan = K.Plan()  # a plan that holds scratch buffers, alive to the end
K.matmul_bwd_fast(dx, dw, db, x, x, w, stream=plan)
sumsq = ga.zeros(1, np.float64); K.global_norm(sumsq, x)
print("norm", sumsq.get()[0])
""",
}


@pytest.mark.parametrize("kind", list(ALIVE_AT_EXIT))
def test_a_script_that_holds_device_memory_to_the_end_exits_cleanly(kind):
    res = subprocess.run([sys.executable, "-c", ALIVE_AT_EXIT[kind]], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stderr == "", (res.returncode, res.stderr[-2000:])
    assert res.stdout.strip()  # and it printed its results
