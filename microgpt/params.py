"""The parameter layout: where every tensor lives in the flat float32 vector.

This table is the one definition of the order: of weights, gradients, Adam m and v, and so of each vector of
the ANDREA checkpoint (microgpt.checkpoint holds its format):

    wte                       (V, C)      token embedding, also the tied output projection
    wpe                       (T, C)      position embedding (T = block_size)
    for l in 0 .. n_layer-1:
      h.{l}.ln1.w, .b         (C,)
      h.{l}.attn.qkv.w, .b    (3C, C), (3C,)   rows 0:C are Q, C:2C K, 2C:3C V
      h.{l}.attn.proj.w, .b   (C, C), (C,)
      h.{l}.ln2.w, .b         (C,)
      h.{l}.mlp.fc.w, .b      (4C, C), (4C,)
      h.{l}.mlp.proj.w, .b    (C, 4C), (C,)
    lnf.w, lnf.b              (C,)

Linear weights are (out, in), as torch.nn.Linear: y = x @ W^T + b.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .config import GPTConfig


class ParamSpec(NamedTuple):
    name: str
    shape: tuple
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def layer_shapes(l: int, C: int) -> list[tuple[str, tuple]]:
    return [
        (f"h.{l}.ln1.w", (C,)), (f"h.{l}.ln1.b", (C,)),
        (f"h.{l}.attn.qkv.w", (3 * C, C)), (f"h.{l}.attn.qkv.b", (3 * C,)),
        (f"h.{l}.attn.proj.w", (C, C)), (f"h.{l}.attn.proj.b", (C,)),
        (f"h.{l}.ln2.w", (C,)), (f"h.{l}.ln2.b", (C,)),
        (f"h.{l}.mlp.fc.w", (4 * C, C)), (f"h.{l}.mlp.fc.b", (4 * C,)),
        (f"h.{l}.mlp.proj.w", (C, 4 * C)), (f"h.{l}.mlp.proj.b", (C,)),
    ]


def param_table(config: GPTConfig) -> list[ParamSpec]:
    """The ordered (name, shape, offset) of every tensor in the flat vector."""
    C = config.d_model
    shapes = [("wte", (config.vocab_size, C)), ("wpe", (config.block_size, C))]
    for l in range(config.n_layer):
        shapes += layer_shapes(l, C)
    shapes += [("lnf.w", (C,)), ("lnf.b", (C,))]
    table, offset = [], 0
    for name, shape in shapes:
        table.append(ParamSpec(name, shape, offset))
        offset += math.prod(shape)
    return table


def num_params(config: GPTConfig) -> int:
    last = param_table(config)[-1]
    return last.offset + last.size


def decays(name: str, shape: tuple) -> bool:
    """AdamW weight decay applies to the 2-D tensors only (matrices and embeddings)."""
    return len(shape) == 2


def init_params(config: GPTConfig, flat: np.ndarray, seed: int) -> None:
    """GPT-2 initialisation into `flat`: N(0, 0.02) matrices, residual projections scaled by
    1/sqrt(2 n_layer) (they add into the residual stream twice per layer), zero biases, unit LN gains."""
    rng = np.random.default_rng(seed)
    for spec in param_table(config):
        view = flat[spec.offset:spec.offset + spec.size].reshape(spec.shape)
        if spec.name.endswith(".w") and len(spec.shape) == 1:
            view[...] = 1.0
        elif len(spec.shape) == 1:
            view[...] = 0.0
        else:
            std = 0.02
            if spec.name.endswith("attn.proj.w") or spec.name.endswith("mlp.proj.w"):
                std /= math.sqrt(2 * config.n_layer)
            view[...] = rng.normal(0.0, std, size=spec.shape)


def views(table: list[ParamSpec], flat: np.ndarray) -> dict[str, np.ndarray]:
    """Zero-copy named views into a flat vector laid out by `table`."""
    return {s.name: flat[s.offset:s.offset + s.size].reshape(s.shape) for s in table}
