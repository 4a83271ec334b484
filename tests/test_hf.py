"""Hugging Face GPT-2 in and out, against transformers itself on the CPU: a GPT2LMHeadModel saved with
save_pretrained loads through GPT.from_hf with the same logits and loss; GPT.save_hf loads in transformers
with the same logits; a round trip is bit-exact; what microgpt cannot compute is refused by name."""
import json

import numpy as np
import pytest

from microgpt import GPT, GPTConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

CFG = GPTConfig(n_layer=2, n_head=4, d_model=32, block_size=16, vocab_size=50)


def hf_model(cfg=CFG, seed=0, **overrides):
    torch.manual_seed(seed)
    kw = dict(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_model, n_layer=cfg.n_layer,
              n_head=cfg.n_head, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
              bos_token_id=None, eos_token_id=None) | overrides
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw)).eval()
    with torch.no_grad():  # GPT-2 starts its biases and layernorms at constants: make every tensor count
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def hf_logits(model, idx, targets=None):
    with torch.no_grad():
        out = model(torch.from_numpy(idx).long(), labels=None)
    logits = out.logits.double().numpy()
    if targets is None:
        return logits
    lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    return logits, float(-np.take_along_axis(lp, targets[..., None], -1).mean())


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_a_transformers_gpt2_loads_with_the_same_logits_and_loss(tmp_path, rng):
    ref = hf_model()
    ref.save_pretrained(tmp_path / "hf")
    model = GPT.from_hf(tmp_path / "hf")
    assert model.config == CFG and model.step_count == 0
    idx = rng.integers(0, CFG.vocab_size, size=(3, CFG.block_size))
    tgt = rng.integers(0, CFG.vocab_size, size=(3, CFG.block_size))
    logits, loss = model.forward(idx, tgt)
    ref_logits, ref_loss = hf_logits(ref, idx, tgt)
    assert rel(logits, ref_logits) <= 1e-5 and abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)


def test_save_hf_loads_in_transformers_with_the_same_logits(tmp_path, rng):
    model = GPT(CFG, seed=7)
    model.save_hf(tmp_path / "out")
    ref = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    idx = rng.integers(0, CFG.vocab_size, size=(2, 11))
    logits, _ = model.forward(idx)
    assert rel(logits, hf_logits(ref, idx)) <= 1e-5
    assert ref.lm_head.weight.data_ptr() == ref.transformer.wte.weight.data_ptr()  # tied, as in microgpt


def test_a_round_trip_is_bit_exact(tmp_path):
    model = GPT(CFG, seed=3)
    model.save_hf(tmp_path / "a")
    back = GPT.from_hf(tmp_path / "a")
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    back.save_hf(tmp_path / "b")
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("overrides, match", [
    (dict(activation_function="relu"), "activation_function must be GPT-2's tanh GELU"),
    (dict(n_inner=64), "n_inner must be null or 4 \\* n_embd"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings must be true"),
    (dict(layer_norm_epsilon=1e-6), "layer_norm_epsilon must be 1e-05"),
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx must be false"),
])
def test_a_config_microgpt_cannot_compute_is_refused_by_name(tmp_path, overrides, match):
    hf_model(**overrides).save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match=match):
        GPT.from_hf(tmp_path / "hf")


def test_missing_or_extra_tensors_and_other_models_are_refused(tmp_path):
    from safetensors.numpy import load_file, save_file
    hf_model().save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(weights)
    save_file({k: v for k, v in tensors.items() if k != "transformer.h.1.mlp.c_fc.bias"}, weights)
    with pytest.raises(ValueError, match=r"h.1.mlp.c_fc.bias is missing \(microgpt's h.1.mlp.fc.b\)"):
        GPT.from_hf(tmp_path / "hf")
    save_file(tensors | {"transformer.h.0.attn.extra": np.zeros(3, np.float32)}, weights)
    with pytest.raises(ValueError, match="no place for: h.0.attn.extra"):
        GPT.from_hf(tmp_path / "hf")
    save_file(tensors | {"lm_head.weight": tensors["transformer.wte.weight"] + 1}, weights)
    with pytest.raises(ValueError, match="lm_head.weight differs from wte: an untied head"):
        GPT.from_hf(tmp_path / "hf")
    save_file(tensors | {"lm_head.weight": tensors["transformer.wte.weight"]}, weights)  # tied, stored: fine
    assert GPT.from_hf(tmp_path / "hf").config == CFG
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg | {"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type must be 'gpt2', got 'llama'"):
        GPT.from_hf(tmp_path / "hf")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        GPT.from_hf(tmp_path / "nowhere")


def test_convert_to_hugging_face_and_back(tmp_path, rng, capsys):
    from microgpt import checkpoint
    from microgpt.cli import main
    model = GPT(CFG, seed=5)
    idx = rng.integers(0, CFG.vocab_size, size=(2, 9))
    model.forward(idx, idx)
    model.backward()
    model.step(1e-3)  # moments and a step to keep, or to drop
    model.save(tmp_path / "a.ckpt", extra={"note": 1})
    weights = model.state_dict()

    assert main(["convert", str(tmp_path / "a.ckpt"), str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert "the Adam moments and the step (1) are not part of a Hugging Face checkpoint: dropped" in err
    hf = GPT.from_hf(tmp_path / "hf")
    assert all(np.array_equal(hf.state_dict()[k], weights[k]) for k in weights)

    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "b.ckpt")]) == 0
    back = checkpoint.read(tmp_path / "b.ckpt")
    assert back.step == 0 and not back.m.any() and np.array_equal(back.weights, checkpoint.read(tmp_path / "a.ckpt").weights)

    assert main(["convert", str(tmp_path / "a.ckpt"), str(tmp_path / "c.ckpt")]) == 0  # ANDREA to ANDREA
    a, c = checkpoint.read(tmp_path / "a.ckpt"), checkpoint.read(tmp_path / "c.ckpt")
    assert c.step == 1 and c.extra == {"note": 1}
    assert all(np.array_equal(getattr(a, f), getattr(c, f)) for f in ("weights", "m", "v"))
    capsys.readouterr()


@pytest.mark.parametrize("src, dst, message", [
    ("nope.ckpt", "out", "nope.ckpt' does not exist (no such file)"),
    ("a.ckpt", "a.ckpt.json", "DST 'TMP/a.ckpt.json' is a file: a Hugging Face checkpoint is a directory"),
    ("a.ckpt", "sub/", None),  # fine: a new directory
    ("empty", "x.ckpt", "no config.json"),
])
def test_convert_errors_are_one_line(tmp_path, capsys, src, dst, message):
    from microgpt.cli import main
    GPT(CFG).save(tmp_path / "a.ckpt")
    (tmp_path / "empty").mkdir()
    rc = main(["convert", str(tmp_path / src), str(tmp_path / dst)])
    out = capsys.readouterr()
    if message is None:
        assert rc == 0 and (tmp_path / "sub" / "config.json").exists()
        return
    line = out.err.strip()
    assert rc == 2 and len(line.splitlines()) == 1 and line.startswith("microgpt: error: ")
    assert message.replace("TMP", str(tmp_path)) in line, line
