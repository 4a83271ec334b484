"""The op table: every op of the engine declared once.

    OPS["layernorm_fwd"].reference      # NumPy, called as the launchers are (microgpt.reference_ops)
    OPS["layernorm_fwd"].kernels        # variant -> its CUDA launcher (microgpt.kernels)
    ops = select("tc"); ops.matmul_fwd(out, x, w, b)    # one variant's launchers by op name
    launcher("softmax_fwd", "reference")

An op is one direction of a layer (`layernorm_fwd`, `layernorm_bwd`) or one fused step (`matmul_layernorm_bwd`).
Every op has a reference launcher, the readable kernels of its header; a variant without a launcher of its own
for an op runs its base variant's (tc's base is fast, fast's is reference). `variant=` on GPT,
MultiHeadAttention, the cuda backend and the tools is checked here (resolve), and nowhere else.
docs/adding-an-op.md says how an entry is added.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from . import reference_ops as ref
from .kernels import (attention, crossentropy, decode, embed, embed_fast, flash_attention, heads_fast,
                      layernorm, layernorm_fast, matmul, matmul_attention_tc, matmul_gelu_tc, pointwise,
                      pointwise_fast, rows_fast, sampling)
from .kernels import products
from .kernels.adamw import adamw, global_norm
from .kernels.runtime import Plan


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
# the SIMT SGEMM's on every shape measured (docs/performance.md, Precision); before sm_80 fast's SGEMM.
DEFAULT_VARIANT = "tc"


@dataclass(frozen=True)
class Arg:
    """One argument of an op as its tests and plans make it: a device array (role "in", "out" written, "inout" added
    into or partly written, "scratch" passed but not compared) of `shape` (expressions of the case's sizes B, T, C,
    NH, D = d_k, V, M = a cache's length), dtype and `kind` (how a test draws it: normal, ids, order, pos, ...);
    or a value (role "value": `shape` holds its expression). pitched: every launcher also takes it as rows at a
    pitch wider than its last dimension (kernels.checks.rows_ptr: the model's logits, padded to 16-byte rows)."""
    name: str
    role: str
    shape: tuple[str, ...]
    dtype: str = "float32"
    kind: str = "normal"
    keyword: bool = False
    pitched: bool = False

    def size(self, sizes: dict) -> tuple[int, ...]:
        return tuple(int(_eval(e, sizes)) for e in self.shape)

    def value(self, sizes: dict):
        """A value argument's value at these sizes."""
        return _eval(self.shape[0], sizes)


def _eval(expr: str, sizes: dict):
    """An expression of this table (`4*C`, `V//2`, `True`) at a case's sizes."""
    return eval(expr, {}, sizes)  # noqa: S307 (the expressions are this module's own)


_ROLES = {":": "in", ">": "out", "+": "inout", "~": "scratch", "=": "value"}
_DTYPES = {"ids": "int32", "order": "int32", "pos": "int32", "i32": "int32", "f64": "float64", "sumsq": "float64",
           "unit": "float64", "mask": "uint8"}


def parse_args(spec: str) -> tuple[Arg, ...]:
    """'out>B,T,[C] x:B,T,C n_head=NH | accumulate=True' -> Args: name, role mark (: > + ~ =), shape (its last
    dimension in brackets: pitched), and a kind after a second ':' (its dtype follows from it); those after '|' are
    keywords."""
    out, keyword = [], False
    for token in spec.split():
        if token == "|":
            keyword = True
            continue
        at = min(i for i, ch in enumerate(token) if ch in _ROLES)
        name, role, rest = token[:at], _ROLES[token[at]], token[at + 1:]
        if role == "value":
            out.append(Arg(name, role, (rest,), keyword=keyword))
            continue
        dims, _, kind = rest.partition(":")
        *lead, last = dims.split(",")
        pitched = last.startswith("[") and last.endswith("]")
        out.append(Arg(name, role, (*lead, last[1:-1] if pitched else last), _DTYPES.get(kind, "float32"),
                       kind or "normal", keyword, pitched))
    return tuple(out)


@dataclass(frozen=True)
class Op:
    """One op: what its launchers compute (reference), where their reference kernels are (header), its launcher in
    each variant that has one of its own, and what its tests and profile cases make of it (args, tolerance, flops)."""
    name: str
    header: str                  # cuda/<header> holds its reference kernels
    kernels: dict[str, Callable]  # variant -> launcher; "reference" always
    args: tuple[Arg, ...]        # its launchers' arguments, as the tests and the plans' checks make them
    tolerance: float = 1e-5      # a kernel's worst relative error against the float64 reference, on those
    flops: str = "0"             # the work of one call in the case's sizes (profile cases; multiply-add = 2)
    reference: Callable = field(init=False)  # reference_ops.<name>

    def __post_init__(self):
        object.__setattr__(self, "reference", getattr(ref, self.name))

    def work(self, sizes: dict) -> int:
        """The FLOPs of one call at these sizes."""
        return int(_eval(self.flops, sizes))


def _op(name, header, args, reference, tolerance=1e-5, flops="0", **faster):
    return Op(name, header, {"reference": reference, **faster}, parse_args(args), tolerance, flops)


# the decode step's fused products (layernorm_matmul_fwd, matmul_residual_fwd) over each variant's matmul_fwd
_FUSED = {"fast": decode.fused(products.matmul_fwd_fast, "fast"), "tc": decode.fused(products.matmul_fwd_tc, "tc")}
H = "B,NH,T,D"  # one array a head
S = "B,NH,T,T"  # scores a head
OPS: dict[str, Op] = {op.name: op for op in (
    _op("embed_fwd", "embed.cuh", "x>B,T,C idx:B,T:ids wte:V,C wpe:T,C", embed.embed_fwd,
        fast=rows_fast.embed_fwd_fast),
    _op("embed_bwd", "embed.cuh", "dwte+V,C dwpe+T,C dx:B,T,C idx:B,T:ids order:B,T:order", embed.embed_bwd,
        fast=embed_fast.embed_bwd_fast),
    _op("layernorm_fwd", "layernorm.cuh", "out>B,T,C mean>B,T rstd>B,T x:B,T,C w:C b:C", layernorm.layernorm_fwd,
        fast=layernorm_fast.layernorm_fwd_fast),
    _op("layernorm_bwd", "layernorm.cuh", "dx+B,T,C dw+C db+C dout:B,T,C x:B,T,C w:C mean:B,T rstd:B,T:rstd | "
        "accumulate=True", layernorm.layernorm_bwd, fast=layernorm_fast.layernorm_bwd_fast),
    _op("residual_layernorm_fwd", "layernorm.cuh", "x>B,T,C out>B,T,C mean>B,T rstd>B,T resid:B,T,C branch:B,T,C "
        "w:C b:C", layernorm.residual_layernorm_fwd, fast=layernorm_fast.residual_layernorm_fwd_fast),
    _op("matmul_fwd", "matmul.cuh", "out>B,T,[4*C] inp:B,T,C weight:4*C,C bias:4*C", matmul.matmul_fwd,
        fast=products.matmul_fwd_fast, tc=products.matmul_fwd_tc),
    _op("matmul_bwd", "matmul.cuh", "dinp>B,T,C dweight+4*C,C dbias+4*C dout:B,T,[4*C] inp:B,T,C weight:4*C,C",
        matmul.matmul_bwd, fast=products.matmul_bwd_fast, tc=products.matmul_bwd_tc),
    _op("matmul_layernorm_bwd", "layernorm.cuh", "dx+B,T,C dw+C db+C dweight+4*C,C dbias+4*C dout:B,T,[4*C] "
        "inp:B,T,C weight:4*C,C x:B,T,C w:C mean:B,T rstd:B,T:rstd | dinp~B,T,C accumulate=True",
        layernorm.matmul_layernorm_bwd, fast=layernorm_fast.matmul_layernorm_bwd_fast,
        tc=layernorm_fast.matmul_layernorm_bwd_tc),
    _op("split_heads_fwd", "attention.cuh", f"q>{H} k>{H} v>{H} qkv:B,T,3*C n_head=NH", attention.split_heads_fwd,
        fast=heads_fast.split_heads_fwd_fast),
    _op("split_heads_bwd", "attention.cuh", f"dqkv>B,T,3*C dq:{H} dk:{H} dv:{H}", attention.split_heads_bwd,
        fast=heads_fast.split_heads_bwd_fast),
    _op("attn_scores_fwd", "attention.cuh", f"scores>{S} q:{H} k:{H}", attention.attn_scores_fwd),
    _op("attn_scores_bwd", "attention.cuh", f"dq>{H} dk>{H} dscores:{S} q:{H} k:{H}", attention.attn_scores_bwd),
    _op("causal_mask_fwd", "attention.cuh", f"out>{S}:masked scores:{S}", attention.causal_mask_fwd),
    _op("causal_mask_bwd", "attention.cuh", f"dscores>{S} dout:{S}", attention.causal_mask_bwd),
    _op("causal_scores_fwd", "attention.cuh", f"masked>{S}:masked q:{H} k:{H}", attention.causal_scores_fwd,
        fast=products.causal_scores_fwd_fast, tc=products.causal_scores_fwd_tc),
    _op("causal_scores_bwd", "attention.cuh", f"dq>{H} dk>{H} dscores:{S}:causal q:{H} k:{H}",
        attention.causal_scores_bwd, fast=products.causal_scores_bwd_fast, tc=products.causal_scores_bwd_tc),
    _op("softmax_fwd", "attention.cuh", f"probs>{S} x:{S}:masked | causal=True", attention.softmax_fwd,
        fast=rows_fast.softmax_fwd_fast),
    _op("softmax_bwd", "attention.cuh", f"dx>{S} dprobs:{S} probs:{S}:probs | causal=True", attention.softmax_bwd,
        fast=rows_fast.softmax_bwd_fast),
    _op("attn_values_fwd", "attention.cuh", f"out>{H} probs:{S}:probs v:{H}", attention.attn_values_fwd,
        fast=products.attn_values_fwd_fast, tc=products.attn_values_fwd_tc),
    _op("attn_values_bwd", "attention.cuh", f"dprobs>{S}:lower dv>{H} dout:{H} probs:{S}:probs v:{H}",
        attention.attn_values_bwd, fast=products.attn_values_bwd_fast, tc=products.attn_values_bwd_tc),
    _op("fused_attention_fwd", "attention.cuh", "y>B,T,C lse>B,NH,T qkv:B,T,3*C n_head=NH",
        attention.fused_attention_fwd, tc=flash_attention.fused_attention_fwd_tc),
    _op("fused_attention_bwd", "attention.cuh", "dqkv>B,T,3*C dy:B,T,C qkv:B,T,3*C y:B,T,C:attn_y "
        "lse:B,NH,T:attn_lse n_head=NH", attention.fused_attention_bwd, tc=flash_attention.fused_attention_bwd_tc),
    _op("matmul_attention_bwd", "attention.cuh", "dqkv>B,T,3*C dweight+C,C dbias+C dout:B,T,C y:B,T,C:attn_y "
        "weight:C,C qkv:B,T,3*C lse:B,NH,T:attn_lse n_head=NH | dy>B,T,C", attention.matmul_attention_bwd,
        tc=matmul_attention_tc.matmul_attention_bwd_tc),
    _op("merge_heads_fwd", "attention.cuh", f"y>B,T,C heads:{H}", attention.merge_heads_fwd,
        fast=heads_fast.merge_heads_fwd_fast),
    _op("merge_heads_bwd", "attention.cuh", f"dheads>{H} dy:B,T,C n_head=NH", attention.merge_heads_bwd,
        fast=heads_fast.merge_heads_bwd_fast),
    _op("gelu_fwd", "pointwise.cuh", "out>B,T,4*C x:B,T,4*C", pointwise.gelu_fwd, 1e-6, "40*B*T*C",
        fast=pointwise_fast.gelu_fwd_fast),
    _op("gelu_bwd", "pointwise.cuh", "dx>B,T,4*C dout:B,T,4*C x:B,T,4*C", pointwise.gelu_bwd, 1e-6, "64*B*T*C",
        fast=pointwise_fast.gelu_bwd_fast),
    _op("matmul_gelu_bwd", "pointwise.cuh", "dpre>B,T,4*C dweight+C,4*C dbias+C dout:B,T,C act:B,T,4*C "
        "pre:B,T,4*C weight:C,4*C", pointwise.matmul_gelu_bwd, fast=pointwise_fast.matmul_gelu_bwd_fast,
        tc=matmul_gelu_tc.matmul_gelu_bwd_tc),
    _op("residual_fwd", "pointwise.cuh", "out>B,T,C a:B,T,C b:B,T,C", pointwise.residual_fwd, 1e-6, "B*T*C"),
    _op("residual_bwd", "pointwise.cuh", "da>B,T,C db>B,T,C dout:B,T,C", pointwise.residual_bwd, 1e-6),
    _op("crossentropy_fwd", "crossentropy.cuh", "losses>B,T probs>B,T,[V] logits:B,T,[V] targets:B,T:ids",
        crossentropy.crossentropy_fwd, 1e-5, "4*B*T*V", fast=rows_fast.crossentropy_fwd_fast),
    _op("crossentropy_bwd", "crossentropy.cuh", "dlogits>B,T,[V] probs:B,T,[V]:softmax targets:B,T:ids "
        "dlosses:B,T", crossentropy.crossentropy_bwd, 1e-6, "2*B*T*V", fast=rows_fast.crossentropy_bwd_fast),
    _op("embed_decode", "decode.cuh", "x>B,1,C tokens:B,1:ids wte:V,C wpe:T,C pos:1:pos", decode.embed_decode, 1e-6),
    _op("layernorm_matmul_fwd", "matmul.cuh", "out>B,1,3*C x:B,1,C w:C b:C weight:3*C,C bias:3*C | gelu=False",
        decode.layernorm_matmul_fwd, fast=_FUSED["fast"][0], tc=_FUSED["tc"][0]),
    _op("matmul_residual_fwd", "matmul.cuh", "x+B,1,C inp:B,1,4*C weight:C,4*C bias:C", decode.matmul_residual_fwd,
        fast=_FUSED["fast"][1], tc=_FUSED["tc"][1]),
    _op("kv_store", "decode.cuh", "cache+B,NH,M,D src:B,NH,T,D", decode.kv_store, 1e-6),
    _op("attention_decode", "decode.cuh", "y>B,1,C k_cache+B,NH,M,D v_cache+B,NH,M,D qkv:B,1,3*C pos:1:pos",
        decode.attention_decode),
    _op("sample", "sampling.cuh", "tokens>B:i32 logits:B,V u:B:unit temperature=0.8 top_k=V//2 top_p=0.9 | "
        "mirror>B:i32",
        sampling.sample, 0.0),
    _op("global_norm", "adamw.cuh", "sumsq>1:f64 g:B,T,C", global_norm),
    _op("adamw", "adamw.cuh", "params+B,T,C grads+B,T,C m+B,T,C v+B,T,C:positive | lr=1e-3 beta1=0.9 beta2=0.95 "
        "eps=1e-8 weight_decay=0.1 step=3 decay_mask:B,T,C:mask sumsq:1:sumsq max_norm=1.0", adamw),
)}


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
        raise ValueError(f"op must be one of the table's ops ({', '.join(OPS)}), got {op!r}")
    kernels = OPS[op].kernels
    while name not in kernels:
        name = VARIANTS[name].base
    return kernels[name]


class Kernels:
    """One variant's launchers by op name (ops.matmul_fwd, ...), and the variant itself (ops.variant). Bound to a
    target (on(): a stream, or a runtime.Plan to record into), each call goes there, and a recorded launch notes
    its op and the variant whose launcher made it."""

    def __init__(self, variant: str | None = None, target=None):
        self.variant, self.target = VARIANTS[resolve(variant)], target
        for op in OPS:
            fn = launcher(op, self.variant.name)
            setattr(self, op, fn if target is None else _bound(op, fn, target))

    def on(self, target) -> "Kernels":
        """These launchers, each call queued on `target` (a stream) or recorded into it (a runtime.Plan)."""
        return Kernels(self.variant.name, target)

    def __repr__(self) -> str:
        return f"Kernels({self.variant.name!r})"


def _bound(op: str, fn: Callable, target) -> Callable:
    via = next(v for v, f in OPS[op].kernels.items() if f is fn)

    def call(*args, **kw):
        if isinstance(target, Plan):
            target.op = op if via == "reference" else f"{op} ({via})"
        return fn(*args, stream=target, **kw)
    call.__name__ = call.__qualname__ = fn.__name__
    return call


def select(variant: str | None = None) -> Kernels:
    return Kernels(variant)
