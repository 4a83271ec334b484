"""The GPT, written once: its forward, backward, prefill and decode as a sequence of named ops (microgpt.ops).

    x = wte[idx] + wpe[:T]
    for each layer:  x = x + proj(attention(qkv(ln1(x))));  x = x + proj(gelu(fc(ln2(x))))
    logits = lnf(x) @ wte^T;  loss = crossentropy(logits, targets)

decode() runs the same layers for one new position a sequence, attending to the keys and values cached for the
positions before it.

A backend gives `ops`, one implementation of the op table (the numpy one, or one variant's launchers, recorded into
a plan), and the buffers, made here by its `new(*shape)` (the logits' rows padded: padded_rows). Each op writes its
outputs into the buffers it is handed (outputs first, as the kernels take them), so a pass is a fixed sequence of
calls over fixed buffers: the cuda backend records it once per (B, T) and replays it as one CUDA graph. Each
residual add runs with the layernorm that reads its sum, and each layernorm's backward with the product that makes
its output's gradient, since a variant may fuse them (the numpy ops run them one after the other). Parameter names
are spelled here and in microgpt.params only.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from . import attention
from .config import GPTConfig


def _layer(tensors, l):
    """h(name) -> tensors["h.{l}.name"]: one layer's weights or gradients."""
    return lambda name: tensors[f"h.{l}.{name}"]


def _attn(tensors, l):
    """The attention sublayer's tensors of layer l by its own names (qkv.w, qkv.b, proj.w, proj.b)."""
    return {k: tensors[f"h.{l}.attn.{k}"] for k in attention.WEIGHTS}


def product_weights(P, cfg: GPTConfig) -> list:
    """The weights the passes multiply by: every linear layer's, and wte (the tied output projection)."""
    names = ("attn.qkv.w", "attn.proj.w", "mlp.fc.w", "mlp.proj.w")
    return [P[f"h.{l}.{n}"] for l in range(cfg.n_layer) for n in names] + [P["wte"]]


# ---------------------------------------------------------------------------------------------- buffers
def padded_rows(new, *shape):
    """A (..., n) view of new(..., n rounded up to 4): rows 16 bytes apart, which the products need to copy a row of
    the logits or their gradient whole (16-byte copies, the TMA). The ops that take them accept such rows
    (microgpt.ops: a pitched argument)."""
    n = shape[-1]
    return new(*shape[:-1], -(-n // 4) * 4)[..., :n]


def activations(cfg: GPTConfig, B: int, T: int, new, attention_state) -> SimpleNamespace:
    """What a forward writes and its backward reads at (B, T): the residual stream entering each layer (and out),
    each layer's layernorms, MLP and attention state (attention_state(out): its buffers, writing out), the final
    layernorm, logits, probabilities and losses. The backend adds the batch: idx, tgt (int32 (B, T)), order (the
    embedding backward's, or None) and dlosses (B, T)."""
    C, L, V = cfg.d_model, cfg.n_layer, cfg.vocab_size
    a = SimpleNamespace(shape=(B, T), resid=[new(B, T, C) for _ in range(L + 1)])
    a.out, a.mlp = new(B, T, C), new(B, T, C)  # the two branches before their residual adds, shared by the layers
    a.layers = [SimpleNamespace(ln1=new(B, T, C), mean1=new(B, T), rstd1=new(B, T), x1=new(B, T, C),
                                ln2=new(B, T, C), mean2=new(B, T), rstd2=new(B, T), fc=new(B, T, 4 * C),
                                act=new(B, T, 4 * C), att=attention_state(a.out)) for _ in range(L)]
    a.lnf, a.meanf, a.rstdf = new(B, T, C), new(B, T), new(B, T)
    a.logits, a.probs, a.losses = padded_rows(new, B, T, V), padded_rows(new, B, T, V), new(B, T)
    return a


def gradients(cfg: GPTConfig, B: int, T: int, new, attention_grads) -> SimpleNamespace:
    """The backward's buffers at (B, T): the residual stream's gradient (d.resid, added into layer by layer), a
    layernorm output's, the MLP's, the logits', and the attention's (attention_grads(): dy, dqkv, dx, ...)."""
    C = cfg.d_model
    d = attention_grads()
    d.resid, d.ln, d.fc = new(B, T, C), new(B, T, C), new(B, T, 4 * C)
    d.logits = padded_rows(new, B, T, cfg.vocab_size)
    return d


def footprint(cfg: GPTConfig, B: int, T: int, fused: bool, backward: bool = True) -> int:
    """The numbers a forward's buffers (and with backward, its gradients') hold at (B, T), attention fused or not:
    a lower bound of what a backend allocates beside its flat vectors."""
    count = [0]

    def new(*shape):
        count[0] += math.prod(shape)
        return np.broadcast_to(np.float32(0), shape)  # a stand-in of that shape, holding no memory
    activations(cfg, B, T, new, attention.states(new, B, T, cfg.d_model, cfg.n_head, fused=fused))
    if backward:
        gradients(cfg, B, T, new, lambda: attention.grad_buffers(new, B, T, cfg.d_model, cfg.n_head, fused=fused))
    return count[0]


def kv_cache(cfg: GPTConfig, B: int, new) -> SimpleNamespace:
    """Every layer's keys and values, (B, NH, block_size, d_k) each."""
    shape = (B, cfg.n_head, cfg.block_size, cfg.d_k)
    return SimpleNamespace(k=[new(*shape) for _ in range(cfg.n_layer)], v=[new(*shape) for _ in range(cfg.n_layer)])


def decode_activations(cfg: GPTConfig, cache, tokens, pos, new) -> SimpleNamespace:
    """decode()'s buffers for one new position a sequence (tokens (B, 1) int32 at position pos[0]), its attention
    against `cache`: the residual stream x, and one set of the rest shared by all layers, as each layer's are read
    only by the next op."""
    B, C = tokens.shape[0], cfg.d_model
    return SimpleNamespace(shape=(B, 1), idx=tokens, pos=pos, cache=cache, x=new(B, 1, C), qkv=new(B, 1, 3 * C),
                           y=new(B, 1, C), act=new(B, 1, 4 * C), logits=new(B, 1, cfg.vocab_size))


# ---------------------------------------------------------------------------------------------- the passes
def forward(ops, P, cfg: GPTConfig, a, targets: bool = False) -> None:
    """a.logits (and with targets a.losses, a.probs) of a.idx; everything backward reads kept in a."""
    NH, L = cfg.n_head, cfg.n_layer

    def ln_of(l):
        """(out, mean, rstd, w, b) of the layernorm that reads resid[l]: layer l's ln1, or lnf after the last."""
        if l == L:
            return a.lnf, a.meanf, a.rstdf, P["lnf.w"], P["lnf.b"]
        s = a.layers[l]
        return s.ln1, s.mean1, s.rstd1, P[f"h.{l}.ln1.w"], P[f"h.{l}.ln1.b"]

    ops.embed_fwd(a.resid[0], a.idx, P["wte"], P["wpe"], check_token_ids=False)  # ids checked by GPT
    out, mean, rstd, w, b = ln_of(0)
    ops.layernorm_fwd(out, mean, rstd, a.resid[0], w, b)
    for l, s in enumerate(a.layers):
        h = _layer(P, l)
        attention.forward(ops, s.ln1, _attn(P, l), s.att, NH)  # s.att.out = attn(ln1(x))
        # x1 = x + attn, and ln2(x1) ...
        ops.residual_layernorm_fwd(s.x1, s.ln2, s.mean2, s.rstd2, a.resid[l], s.att.out, h("ln2.w"), h("ln2.b"))
        ops.matmul_fwd(s.fc, s.ln2, h("mlp.fc.w"), h("mlp.fc.b"))
        ops.gelu_fwd(s.act, s.fc)
        ops.matmul_fwd(a.mlp, s.act, h("mlp.proj.w"), h("mlp.proj.b"))
        # ... x = x1 + mlp, and the next layer's ln1 (or lnf) of it
        out, mean, rstd, w, b = ln_of(l + 1)
        ops.residual_layernorm_fwd(a.resid[l + 1], out, mean, rstd, s.x1, a.mlp, w, b)
    ops.matmul_fwd(a.logits, a.lnf, P["wte"], None)  # the output projection, tied to the token embedding
    if targets:
        ops.crossentropy_fwd(a.losses, a.probs, a.logits, a.tgt, check_token_ids=False)


def decode(ops, P, cfg: GPTConfig, a) -> None:
    """a.logits of one new position a sequence (a: decode_activations), its keys and values added to a.cache:
    forward()'s layers, as a step of a few rows runs them, each layernorm inside the product that reads it and each
    residual add inside the product that makes its branch."""
    x = a.x
    ops.embed_decode(x, a.idx, P["wte"], P["wpe"], a.pos, check_token_ids=False)
    for l in range(cfg.n_layer):
        h = _layer(P, l)
        ops.layernorm_matmul_fwd(a.qkv, x, h("ln1.w"), h("ln1.b"), h("attn.qkv.w"), h("attn.qkv.b"))
        ops.attention_decode(a.y, a.cache.k[l], a.cache.v[l], a.qkv, a.pos)
        ops.matmul_residual_fwd(x, a.y, h("attn.proj.w"), h("attn.proj.b"))  # x = x + proj(attention)
        ops.layernorm_matmul_fwd(a.act, x, h("ln2.w"), h("ln2.b"), h("mlp.fc.w"), h("mlp.fc.b"), gelu=True)
        ops.matmul_residual_fwd(x, a.act, h("mlp.proj.w"), h("mlp.proj.b"))  # x = x + proj(gelu(fc(ln2(x))))
    ops.layernorm_matmul_fwd(a.logits, x, P["lnf.w"], P["lnf.b"], P["wte"], None)  # tied to the token embedding


def backward(ops, P, G, cfg: GPTConfig, a, d) -> None:
    """The gradients of the mean loss of the forward that filled `a` (its dlosses: 1 / (B T) each), added into G.
    d: gradients()."""
    NH, L = cfg.n_head, cfg.n_layer
    ops.crossentropy_bwd(d.logits, a.probs, a.tgt, a.dlosses, check_token_ids=False)
    # logits = lnf(x) @ wte^T: the product's backward with lnf's (d.ln: lnf's output's gradient on the way)
    ops.matmul_layernorm_bwd(d.resid, G["lnf.w"], G["lnf.b"], G["wte"], None, d.logits, a.lnf, P["wte"], a.resid[L],
                             P["lnf.w"], a.meanf, a.rstdf, dinp=d.ln)
    for l in reversed(range(L)):
        s, h, g = a.layers[l], _layer(P, l), _layer(G, l)
        # x = x1 + proj(gelu(fc(ln2(x1)))): d.resid is the gradient of x, then of x1
        ops.matmul_gelu_bwd(d.fc, g("mlp.proj.w"), g("mlp.proj.b"), d.resid, s.act, s.fc, h("mlp.proj.w"))
        ops.matmul_layernorm_bwd(d.resid, g("ln2.w"), g("ln2.b"), g("mlp.fc.w"), g("mlp.fc.b"), d.fc, s.ln2,
                                 h("mlp.fc.w"), s.x1, h("ln2.w"), s.mean2, s.rstd2, dinp=d.ln, accumulate=True)
        # x1 = x + proj(attention(qkv(ln1(x)))): then of x
        attention.backward_to_qkv(ops, d.resid, _attn(P, l), _attn(G, l), s.att, d, NH)
        ops.matmul_layernorm_bwd(d.resid, g("ln1.w"), g("ln1.b"), g("attn.qkv.w"), g("attn.qkv.b"), d.dqkv, s.ln1,
                                 h("attn.qkv.w"), a.resid[l], h("ln1.w"), s.mean1, s.rstd1, dinp=d.dx, accumulate=True)
    ops.embed_bwd(G["wte"], G["wpe"], d.resid, a.idx, a.order, check_token_ids=False)


def fill_cache(ops, cfg: GPTConfig, a, cache, heads) -> None:
    """After a forward over a prompt of T positions: every layer's keys and values at positions 0 .. T-1 of the cache.
    heads: three (B, NH, T, d_k) buffers, where a layer kept its qkv and not its heads (fused attention)."""
    for l, s in enumerate(a.layers):
        k, v = s.att.k, s.att.v
        if k is None:  # fused attention keeps them in qkv
            q, k, v = heads
            ops.split_heads_fwd(q, k, v, s.att.qkv, cfg.n_head)
        ops.kv_store(cache.k[l], k)
        ops.kv_store(cache.v[l], v)
