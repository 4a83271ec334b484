"""Hugging Face GPT-2 in and out: a `save_pretrained` directory (config.json + model.safetensors) read into
microgpt's weights, and microgpt's weights written as one that `GPT2LMHeadModel.from_pretrained` loads.

    model = GPT.from_hf("gpt2-dir", backend="cuda")   # read_hf, then load_state_dict
    model.save_hf("out-dir")                           # write_hf

The two layouts hold the same numbers: GPT-2's Conv1D weights are stored (in, out), microgpt's linear weights
(out, in), so those four a layer are transposed (exactly); its fused c_attn is microgpt's qkv (Q, K, V rows in
the same order); ln_1, ln_2, ln_f are ln1, ln2, lnf; wte and wpe are wte and wpe; the LM head is tied to wte.
A config that computes something else is refused by name: another activation than GPT-2's tanh GELU
(gelu_new), an untied head, missing biases, an MLP other than 4 * n_embd wide, another layernorm epsilon,
cross-attention, or attention scaled other than by 1 / sqrt(d_k). Reading and writing need the safetensors
package (numpy API; no torch): pip install 'microgpt[hf]'.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .checkpoint import replace_file
from .config import GPTConfig
from .params import param_table
from .reference import LN_EPS

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")  # both the tanh approximation microgpt computes
_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers older GPT-2 checkpoints carry
# microgpt's per-layer names -> GPT-2's, and whether the tensor is a Conv1D weight (stored transposed)
_LAYER = {"ln1.w": ("ln_1.weight", False), "ln1.b": ("ln_1.bias", False),
          "attn.qkv.w": ("attn.c_attn.weight", True), "attn.qkv.b": ("attn.c_attn.bias", False),
          "attn.proj.w": ("attn.c_proj.weight", True), "attn.proj.b": ("attn.c_proj.bias", False),
          "ln2.w": ("ln_2.weight", False), "ln2.b": ("ln_2.bias", False),
          "mlp.fc.w": ("mlp.c_fc.weight", True), "mlp.fc.b": ("mlp.c_fc.bias", False),
          "mlp.proj.w": ("mlp.c_proj.weight", True), "mlp.proj.b": ("mlp.c_proj.bias", False)}
_TOP = {"wte": "wte.weight", "wpe": "wpe.weight", "lnf.w": "ln_f.weight", "lnf.b": "ln_f.bias"}


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError("reading and writing Hugging Face checkpoints needs the safetensors package: "
                          "pip install 'microgpt[hf]'") from None
    return safetensors.numpy


def hf_name(name: str) -> tuple[str, bool]:
    """GPT-2's name of a microgpt tensor (without the 'transformer.' prefix) and whether it is transposed."""
    if name in _TOP:
        return _TOP[name], False
    _, layer, rest = name.split(".", 2)  # h.{l}.{rest}
    hf, transposed = _LAYER[rest]
    return f"h.{layer}.{hf}", transposed


def config_from_hf(hf: dict, where: str = CONFIG_FILE) -> GPTConfig:
    """microgpt's GPTConfig of a GPT-2 config.json; ValueError naming the field microgpt cannot compute."""
    if not isinstance(hf, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(hf).__name__}")
    for name in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        if type(hf.get(name)) is not int:
            raise ValueError(f"{where}: {name} must be an integer, got {hf.get(name)!r}")
    if hf.get("model_type") != "gpt2":
        raise ValueError(f"{where}: model_type must be 'gpt2', got {hf.get('model_type')!r}")
    checks = [
        ("activation_function", hf.get("activation_function", "gelu_new") in TANH_GELU,
         f"GPT-2's tanh GELU ({' or '.join(TANH_GELU)})"),
        ("n_inner", hf.get("n_inner") in (None, 4 * hf.get("n_embd", 0)), "null or 4 * n_embd"),
        ("tie_word_embeddings", hf.get("tie_word_embeddings", True) is True, "true (the LM head is wte)"),
        ("layer_norm_epsilon", hf.get("layer_norm_epsilon", LN_EPS) == LN_EPS, f"{LN_EPS}"),
        ("scale_attn_weights", hf.get("scale_attn_weights", True) is True, "true (scores / sqrt(d_k))"),
        ("scale_attn_by_inverse_layer_idx", hf.get("scale_attn_by_inverse_layer_idx", False) is False, "false"),
        ("add_cross_attention", hf.get("add_cross_attention", False) is False, "false"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise ValueError(f"{where}: {name} must be {expected} for microgpt, got {hf.get(name)!r}")
    try:
        return GPTConfig(n_layer=hf.get("n_layer"), n_head=hf.get("n_head"), d_model=hf.get("n_embd"),
                         block_size=hf.get("n_positions"), vocab_size=hf.get("vocab_size"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def config_to_hf(config: GPTConfig) -> dict:
    """The config.json of microgpt's model as GPT2LMHeadModel: no dropout, tied head, GPT-2's tanh GELU."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
            "n_positions": config.block_size, "n_embd": config.d_model, "n_layer": config.n_layer,
            "n_head": config.n_head, "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "attn_pdrop": 0.0, "layer_norm_epsilon": LN_EPS, "initializer_range": 0.02,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": True, "use_cache": True, "bos_token_id": None, "eos_token_id": None,
            "dtype": "float32"}


def read_hf(path) -> tuple[GPTConfig, dict]:
    """(config, microgpt's name -> float32 array) of a GPT-2 save_pretrained directory. Every tensor the
    model needs must be there, and nothing else (the causal-mask buffers and an LM head equal to wte aside)."""
    path = os.fspath(path)
    cfg_file, weights_file = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    for f in (cfg_file, weights_file):
        if not os.path.isfile(f):
            raise FileNotFoundError(f"{path}: no {os.path.basename(f)} (a Hugging Face save_pretrained directory "
                                    f"holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    with open(cfg_file, "rb") as fh:
        try:
            hf = json.loads(fh.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{cfg_file}: not JSON ({e})") from None
    config = config_from_hf(hf, cfg_file)
    try:
        tensors = _safetensors().load_file(weights_file)
    except Exception as e:  # a truncated or foreign file; bfloat16, which NumPy has no type for
        raise ValueError(f"{weights_file}: cannot read it as safetensors ({e})") from None
    tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    head = tensors.pop("lm_head.weight", None)
    for k in [k for k in tensors if k.endswith(_BUFFERS)]:
        del tensors[k]
    state = {}
    for spec in param_table(config):
        name, transposed = hf_name(spec.name)
        if name not in tensors:
            raise ValueError(f"{weights_file}: {name} is missing (microgpt's {spec.name})")
        a = tensors.pop(name)
        if a.dtype.kind != "f":
            raise ValueError(f"{weights_file}: {name} must be floating point, got {a.dtype}")
        a = a.T if transposed else a
        if a.shape != spec.shape:
            raise ValueError(f"{weights_file}: {name} has shape {a.T.shape if transposed else a.shape}, expected "
                             f"{spec.shape[::-1] if transposed else spec.shape} for this config")
        state[spec.name] = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(state[spec.name]).all():
            raise ValueError(f"{weights_file}: {name} holds non-finite values (NaN or inf)")
    if tensors:
        raise ValueError(f"{weights_file}: tensors microgpt's GPT-2 has no place for: {', '.join(sorted(tensors))}")
    if head is not None and not np.array_equal(np.asarray(head, np.float32), state["wte"]):
        raise ValueError(f"{weights_file}: lm_head.weight differs from wte: an untied head, which microgpt's "
                         f"model (its head is wte) cannot hold")
    return config, state


def write_hf(path, config: GPTConfig, state: dict) -> None:
    """A directory that GPT2LMHeadModel.from_pretrained loads: config.json and model.safetensors (float32,
    the head tied to wte and not stored, as save_pretrained writes it). Each file is replaced in one rename
    (checkpoint.replace_file)."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} exists and is not a directory")
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for spec in param_table(config):
        name, transposed = hf_name(spec.name)
        a = np.asarray(state[spec.name], dtype=np.float32)
        tensors[f"transformer.{name}"] = np.ascontiguousarray(a.T if transposed else a)
    weights = _safetensors().save(tensors, metadata={"format": "pt"})
    replace_file(os.path.join(path, WEIGHTS_FILE), weights)
    replace_file(os.path.join(path, CONFIG_FILE), (json.dumps(config_to_hf(config), indent=2) + "\n").encode())
