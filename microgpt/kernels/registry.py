"""The kernel variants, in one place: which launcher each op of the model runs in each variant.

    ops = kernels.select("fast")                 # select() or select(None): the default variant
    ops.matmul_fwd(out, x, w, b)                 # the tiled SGEMM
    kernels.launcher("softmax_fwd", "reference") # one op's launcher

Every op has a reference launcher, the readable kernels; a variant without a launcher of its own for an
op runs its base variant's (tc's base is fast, fast's is reference). `variant=` on GPT, MultiHeadAttention,
the cuda backend and the tools is checked here (resolve), and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import (attention, crossentropy, decode, embed, embed_fast, flash_attention, heads_fast, layernorm,
               layernorm_fast, matmul, matmul_attention_tc, matmul_fast, matmul_layernorm_tc, matmul_tc, pointwise,
               pointwise_fast, rows_fast, sampling)
from .adamw import adamw, global_norm


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    keeps_scores: bool  # its causal_scores_fwd can keep the scores before the mask (scores=...)
    base: str | None    # the variant whose launcher an op without one of its own here runs
    fused_attention: bool = False  # the model's attention is fused_attention_fwd/bwd (where the device runs it)


VARIANTS = {v.name: v for v in (
    Variant("reference", "the readable kernels, one stage a kernel, the literal scores line among them", True,
            None),
    Variant("fast", "tiled SGEMM (the mask fused into the scores, causal tile skipping, deterministic "
                    "split-K), warp-per-row softmax and layernorm, block-per-row cross-entropy, GELU, head "
                    "split/merge and embedding (forward; backward a warp per run of a token) in 16-byte loads",
            False, "reference"),
    Variant("tc", "fast, with every matrix product on the tensor cores at FP32 accuracy (3xTF32, the running "
                  "sum in FP32 registers; the SIMT SGEMM before sm_80), and the attention fused: flash attention, "
                  "no T x T buffer (d_k 20 to 128, T from 128, sm_80 and later; the fast pipeline elsewhere)",
            False, "fast", fused_attention=True),
)}
# The fastest variant within the accuracy bar: its products' worst relative error against float64 is below
# the SIMT SGEMM's on every shape measured (README, "Precision"); before sm_80 it runs fast's SGEMM.
DEFAULT_VARIANT = "tc"

OPS: dict[str, dict[str, Callable]] = {
    "embed_fwd": {"reference": embed.embed_fwd, "fast": rows_fast.embed_fwd_fast},
    "embed_bwd": {"reference": embed.embed_bwd, "fast": embed_fast.embed_bwd_fast},
    "layernorm_fwd": {"reference": layernorm.layernorm_fwd, "fast": layernorm_fast.layernorm_fwd_fast},
    "layernorm_bwd": {"reference": layernorm.layernorm_bwd, "fast": layernorm_fast.layernorm_bwd_fast},
    "residual_layernorm_fwd": {"reference": layernorm.residual_layernorm_fwd,
                               "fast": layernorm_fast.residual_layernorm_fwd_fast},
    "matmul_fwd": {"reference": matmul.matmul_fwd, "fast": matmul_fast.matmul_fwd_fast, "tc": matmul_tc.matmul_fwd_tc},
    "matmul_bwd": {"reference": matmul.matmul_bwd, "fast": matmul_fast.matmul_bwd_fast, "tc": matmul_tc.matmul_bwd_tc},
    "matmul_layernorm_bwd": {"reference": layernorm.matmul_layernorm_bwd,
                             "fast": layernorm_fast.matmul_layernorm_bwd_fast,
                             "tc": matmul_layernorm_tc.matmul_layernorm_bwd_tc},
    "split_heads_fwd": {"reference": attention.split_heads_fwd, "fast": heads_fast.split_heads_fwd_fast},
    "split_heads_bwd": {"reference": attention.split_heads_bwd, "fast": heads_fast.split_heads_bwd_fast},
    "attn_scores_fwd": {"reference": attention.attn_scores_fwd},
    "attn_scores_bwd": {"reference": attention.attn_scores_bwd},
    "causal_mask_fwd": {"reference": attention.causal_mask_fwd},
    "causal_mask_bwd": {"reference": attention.causal_mask_bwd},
    "causal_scores_fwd": {"reference": attention.causal_scores_fwd, "fast": matmul_fast.causal_scores_fwd_fast,
                          "tc": matmul_tc.causal_scores_fwd_tc},
    "causal_scores_bwd": {"reference": attention.causal_scores_bwd, "fast": matmul_fast.causal_scores_bwd_fast,
                          "tc": matmul_tc.causal_scores_bwd_tc},
    "softmax_fwd": {"reference": attention.softmax_fwd, "fast": rows_fast.softmax_fwd_fast},
    "softmax_bwd": {"reference": attention.softmax_bwd, "fast": rows_fast.softmax_bwd_fast},
    "attn_values_fwd": {"reference": attention.attn_values_fwd, "fast": matmul_fast.attn_values_fwd_fast,
                        "tc": matmul_tc.attn_values_fwd_tc},
    "attn_values_bwd": {"reference": attention.attn_values_bwd, "fast": matmul_fast.attn_values_bwd_fast,
                        "tc": matmul_tc.attn_values_bwd_tc},
    "fused_attention_fwd": {"reference": attention.fused_attention_fwd,
                            "tc": flash_attention.fused_attention_fwd_tc},
    "fused_attention_bwd": {"reference": attention.fused_attention_bwd,
                            "tc": flash_attention.fused_attention_bwd_tc},
    "matmul_attention_bwd": {"reference": attention.matmul_attention_bwd,
                             "tc": matmul_attention_tc.matmul_attention_bwd_tc},
    "merge_heads_fwd": {"reference": attention.merge_heads_fwd, "fast": heads_fast.merge_heads_fwd_fast},
    "merge_heads_bwd": {"reference": attention.merge_heads_bwd, "fast": heads_fast.merge_heads_bwd_fast},
    "gelu_fwd": {"reference": pointwise.gelu_fwd, "fast": pointwise_fast.gelu_fwd_fast},
    "gelu_bwd": {"reference": pointwise.gelu_bwd, "fast": pointwise_fast.gelu_bwd_fast},
    "residual_fwd": {"reference": pointwise.residual_fwd},
    "residual_bwd": {"reference": pointwise.residual_bwd},
    "crossentropy_fwd": {"reference": crossentropy.crossentropy_fwd, "fast": rows_fast.crossentropy_fwd_fast},
    "crossentropy_bwd": {"reference": crossentropy.crossentropy_bwd, "fast": rows_fast.crossentropy_bwd_fast},
    "embed_decode": {"reference": decode.embed_decode},
    "kv_store": {"reference": decode.kv_store},
    "attention_decode": {"reference": decode.attention_decode},
    "sample": {"reference": sampling.sample},
    "global_norm": {"reference": global_norm},
    "adamw": {"reference": adamw},
}


def resolve(variant: str | None = None) -> str:
    """The variant's name, DEFAULT_VARIANT for None; ValueError naming `variant` for anything else."""
    if variant is None:
        return DEFAULT_VARIANT
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValueError(f"variant must be one of {tuple(VARIANTS)}, got {variant!r}")
    return variant


def launcher(op: str, variant: str | None = None) -> Callable:
    """The launch function of `op` ('matmul_fwd', ...) in `variant`."""
    name = resolve(variant)
    if op not in OPS:
        raise ValueError(f"op must be one of the registry's ops ({', '.join(OPS)}), got {op!r}")
    while name not in OPS[op]:
        name = VARIANTS[name].base
    return OPS[op][name]


class Kernels:
    """One variant's launchers by op name (ops.matmul_fwd, ...), and the variant itself (ops.variant)."""

    def __init__(self, variant: str | None = None):
        self.variant = VARIANTS[resolve(variant)]
        for op in OPS:
            setattr(self, op, launcher(op, self.variant.name))

    def __repr__(self) -> str:
        return f"Kernels({self.variant.name!r})"


def select(variant: str | None = None) -> Kernels:
    return Kernels(variant)
