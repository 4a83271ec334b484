"""One ready launch of every kernel at a chosen model shape, with the bytes and FLOPs it must move and do.

Shared by tools/sanitize_kernels.py (one launch each under compute-sanitizer) and
tools/profile_kernels.py (timed launches against the GPU's measured ceilings). The byte counts are the
fewest a kernel can move (every input read once, every output written once, accumulated outputs read
and written); FLOPs count multiply-adds as two and each exp/tanh as one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from microgpt import kernels as K
from microgpt.reference import MASK_VALUE

F = 4  # bytes per float32 / int32


@dataclass
class Case:
    kernel: str           # the CUDA kernel's name
    launch: Callable      # launches it once (synchronously unless given a stream)
    bytes: int
    flops: int
    rotate: Callable = None  # switches to another set of inputs, so repeated timing is not a cache test
    sets: int = 1            # the sets of inputs rotate() cycles through


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    C: int
    NH: int
    V: int

    @property
    def N(self):
        return self.B * self.T

    @property
    def d_k(self):
        return self.C // self.NH

    @property
    def BH(self):
        return self.B * self.NH


def build_cases(shape: Shape, seed: int = 0, n_params: int | None = None, sets: int = 1,
                variants=tuple(K.VARIANTS)) -> list[Case]:
    """Allocates inputs (random, `sets` copies of the large read-only ones) and returns one Case per
    kernel and variant, in the order of a training step. A reference case is named after its kernel
    (`k_matmul_fwd`); a fast variant's after its launcher (`matmul_fwd_fast`), which may run several."""
    ga = K.engine().ga  # compiles the module and makes the primary context current before any allocation
    rng = np.random.default_rng(seed)
    B, T, C, NH, V, N, d_k, BH = shape.B, shape.T, shape.C, shape.NH, shape.V, shape.N, shape.d_k, shape.BH

    def randn(*s, scale=1.0):  # drawn in float32, scaled in place: at andrea-120m's shapes the draws in float64
        x = rng.standard_normal(s, dtype=np.float32)  # and their casts took most of the cases' setup time
        if scale != 1.0:
            x *= np.float32(scale)
        return ga.to_gpu(x)

    def ints(high, *s):
        return ga.to_gpu(rng.integers(0, high, size=s).astype(np.int32))

    def empty(*s, dtype=np.float32):
        return ga.empty(s, dtype)

    def probs_like(*s):
        x = rng.standard_normal(s, dtype=np.float32)
        x -= x.max(-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(-1, keepdims=True)
        return ga.to_gpu(x)

    cases: list[Case] = []

    def own(op, with_reference=True):
        """(case name, launcher) of op in each variant that has a launcher of its own."""
        reference, seen, out = K.launcher(op, "reference"), set(), []
        for var in variants:
            fn = K.launcher(op, var)
            if fn not in seen and (with_reference or fn is not reference):
                seen.add(fn)
                out.append((f"k_{op}" if fn is reference else fn.__name__, fn))
        return out

    def add(kernel, launch, nbytes, flops, inputs=None):
        """inputs: a list of `sets` tuples of arrays; rotate() makes launch use the next tuple."""
        state = {"i": 0}
        if inputs is None:
            cases.append(Case(kernel, lambda stream=None: launch(stream), int(nbytes), int(flops)))
            return

        def run(stream=None):
            launch(stream, *inputs[state["i"]])

        def rotate():
            state["i"] = (state["i"] + 1) % len(inputs)
        cases.append(Case(kernel, run, int(nbytes), int(flops), rotate, len(inputs)))

    idx = [(ints(V, B, T),) for _ in range(sets)]
    wte, wpe = randn(V, C, scale=0.02), randn(T, C, scale=0.02)
    x, dx = empty(B, T, C), empty(B, T, C)
    for case, fwd in own("embed_fwd"):
        add(case, lambda s, i, fwd=fwd: fwd(x, i, wte, wpe, check_token_ids=False, stream=s),
            F * (N + 2 * N * C + T * C), N * C, idx)
    dwte, dwpe = randn(V, C), randn(T, C)
    dx_in = [(randn(B, T, C), i, ga.to_gpu(K.token_order(i.get()))) for (i,) in idx]
    for case, bwd in own("embed_bwd"):
        add(case, lambda s, d, i, o, bwd=bwd: bwd(dwte, dwpe, d, i, o, check_token_ids=False, stream=s),
            F * (N + N * C + 2 * N * C + 2 * T * C), N * C + T * C * B, dx_in)

    xs = [(randn(B, T, C),) for _ in range(sets)]
    w, b = randn(C), randn(C)
    ln, mean, rstd = empty(B, T, C), empty(B, T), empty(B, T)
    K.layernorm_fwd(ln, mean, rstd, xs[0][0], w, b)
    dw, db = randn(C), randn(C)
    douts = [(randn(B, T, C),) for _ in range(sets)]
    for case, fwd in own("layernorm_fwd"):
        add(case, lambda s, xi, fwd=fwd: fwd(ln, mean, rstd, xi, w, b, stream=s), F * (2 * N * C + 2 * C + 2 * N),
            8 * N * C, xs)
    dx_sum = randn(B, T, C)
    for case, bwd in own("layernorm_bwd"):
        add(case, lambda s, d, bwd=bwd: bwd(dx, dw, db, d, xs[0][0], w, mean, rstd, stream=s),
            F * (3 * N * C + 5 * C + 2 * N), 14 * N * C, douts)
        # as training calls it twice a layer: adding into the residual stream's gradient (read and written)
        add(f"{case} (accumulate)",
            lambda s, d, bwd=bwd: bwd(dx_sum, dw, db, d, xs[0][0], w, mean, rstd, accumulate=True, stream=s),
            F * (4 * N * C + 5 * C + 2 * N), 15 * N * C, douts)
    if "fast" in variants:  # T rows wider than a block of the fast backward spans (k_layernorm_bwd_fast_wide)
        W = 4 * K.layernorm_fast.bwd_launch()[1] + 4
        x_w, w_w, ln_w, mean_w, rstd_w, dx_w = randn(T, W), randn(W), empty(T, W), empty(T), empty(T), empty(T, W)
        K.layernorm_fwd(ln_w, mean_w, rstd_w, x_w, w_w, w_w)
        dw_w, db_w = randn(W), randn(W)
        add("layernorm_bwd_fast (wide rows)",
            lambda s, d: K.layernorm_bwd_fast(dx_w, dw_w, db_w, d, x_w, w_w, mean_w, rstd_w, stream=s),
            F * (3 * T * W + 5 * W + 2 * T), 14 * T * W, [(randn(T, W),) for _ in range(sets)])
    # the residual add fused with the layernorm after it (the reference runs k_residual_fwd, k_layernorm_fwd)
    x_sum = empty(B, T, C)
    for case, fwd in own("residual_layernorm_fwd", with_reference=False):
        add(case, lambda s, r, d, fwd=fwd: fwd(x_sum, ln, mean, rstd, r, d, w, b, stream=s),
            F * (4 * N * C + 2 * C + 2 * N), 9 * N * C, [(xs[i][0], douts[i][0]) for i in range(sets)])

    for layer, (IN, OUT) in {"qkv": (C, 3 * C), "attn.proj": (C, C), "mlp.fc": (C, 4 * C),
                             "mlp.proj": (4 * C, C), "lm_head": (C, V)}.items():
        bias = None if layer == "lm_head" else randn(OUT)
        wts = [(randn(OUT, IN, scale=0.02), randn(B, T, IN)) for _ in range(sets)]
        out = empty(B, T, OUT)
        dinp, dwt = empty(B, T, IN), randn(OUT, IN)
        dbias = None if bias is None else randn(OUT)
        douts = [(randn(B, T, OUT), wt, inp) for (wt, inp) in wts]
        for case, fwd in own("matmul_fwd"):
            add(f"{case} ({layer})", lambda s, wt, inp, out=out, bias=bias, fwd=fwd: fwd(out, inp, wt, bias, stream=s),
                F * (N * IN + OUT * IN + N * OUT + OUT), 2 * N * IN * OUT, wts)
        for case, bwd in own("matmul_bwd"):
            add(f"{case} ({layer})",
                lambda s, d, wt, inp, dinp=dinp, dwt=dwt, dbias=dbias, bwd=bwd: bwd(dinp, dwt, dbias, d, inp, wt,
                                                                                    stream=s),
                F * (N * OUT + N * IN + OUT * IN + N * IN + 2 * OUT * IN + 2 * OUT), 4 * N * IN * OUT + N * OUT,
                douts)

    # the generic product with both operands transposed, which no layer runs (tests and tools call it)
    if "fast" in variants:
        for label, OUT in (("tt", 4 * C), ("tt, narrow", d_k)):
            a_t, b_t, c_out = randn(C, N), randn(OUT, C), empty(N, OUT)
            add(f"sgemm ({label})", lambda s, a_t=a_t, b_t=b_t, c_out=c_out: K.sgemm(c_out, a_t, b_t, trans_a=True,
                                                                                     trans_b=True, stream=s),
                F * (N * C + OUT * C + N * OUT), 2 * N * C * OUT)
    # the tensor-core products in each layout at mlp.fc's shape with K and N swapped (K = 4 C is long enough
    # for them at any width: matmul_tc.TC_MIN_K, WG_MIN_K; at least WG_MIN_K + 5 where C is tiny), on the
    # 128 x 128 tile and, d_k wide, the 128 x 64 one: the device's kernel (wgmma on Hopper) and the mma.sync one
    if "tc" in variants:
        H = max(4 * C, K.matmul_tc.WG_MIN_K + 5)  # small shapes (the sanitizer's) still reach both kernels
        for ta in (False, True):
            for tb in (False, True):
                for width, label in ((H, ""), (d_k, ", narrow")):
                    a_op = randn(H, N) if ta else randn(N, H)
                    b_op, c_out = (randn(width, H) if tb else randn(H, width)), empty(N, width)
                    # wgmma=True: the sanitizer's products are too small for the device's own choice of it
                    for path, wgmma in (("", True if K.warpgroup_mma() else None), (" mma.sync", False)):
                        if wgmma is False and not K.warpgroup_mma():
                            continue  # the device's kernel is the mma.sync one
                        add(f"sgemm_tc{path} ({'t' if ta else 'n'}{'t' if tb else 'n'}{label})",
                            lambda s, a_op=a_op, b_op=b_op, c_out=c_out, ta=ta, tb=tb, wgmma=wgmma: K.sgemm_tc(
                                c_out, a_op, b_op, trans_a=ta, trans_b=tb, stream=s, wgmma=wgmma),
                            F * (N * H + H * width + N * width), 2 * N * H * width)

    qkvs = [(randn(B, T, 3 * C),) for _ in range(sets)]
    q, k, v = (empty(B, NH, T, d_k) for _ in range(3))
    for case, fwd in own("split_heads_fwd"):
        add(case, lambda s, qkv, fwd=fwd: fwd(q, k, v, qkv, NH, stream=s), F * 6 * N * C, 0, qkvs)
    K.split_heads_fwd(q, k, v, qkvs[0][0], NH)
    dqkv = empty(B, T, 3 * C)
    dq, dk, dv = (randn(B, NH, T, d_k) for _ in range(3))
    for case, bwd in own("split_heads_bwd"):
        add(case, lambda s, bwd=bwd: bwd(dqkv, dq, dk, dv, stream=s), F * 6 * N * C, 0)

    att = BH * T * T
    scores = empty(B, NH, T, T)
    qks = [(randn(B, NH, T, d_k), randn(B, NH, T, d_k)) for _ in range(sets)]
    dss = [(randn(B, NH, T, T),) for _ in range(sets)]
    masked = empty(B, NH, T, T)
    reference = "reference" in variants  # the readable stages that only the reference variant runs
    if reference:
        add("k_attn_scores_fwd", lambda s, qi, ki: K.attn_scores_fwd(scores, qi, ki, stream=s),
            F * (att + 2 * BH * T * d_k), 2 * att * d_k, qks)
        add("k_attn_scores_bwd", lambda s, d: K.attn_scores_bwd(dq, dk, d, q, k, stream=s),
            F * (att + 4 * BH * T * d_k), 4 * att * d_k, dss)
        add("k_causal_mask_fwd", lambda s, sc: K.causal_mask_fwd(masked, sc, stream=s), F * 2 * att, 0, dss)
        add("k_causal_mask_bwd", lambda s, d: K.causal_mask_bwd(masked, d, stream=s), F * 2 * att, 0, dss)
    probs = empty(B, NH, T, T)
    ps = [(probs_like(B, NH, T, T),) for _ in range(sets)]
    dscores = empty(B, NH, T, T)
    for case, fwd in own("softmax_fwd"):
        add(case, lambda s, sc, fwd=fwd: fwd(probs, sc, stream=s), F * 2 * att, 5 * att, dss)
    for case, bwd in own("softmax_bwd"):
        add(case, lambda s, p, bwd=bwd: bwd(dscores, dss[0][0], p, stream=s), F * 3 * att, 4 * att, ps)
    causal_ps = [(ga.to_gpu(np.tril(p.get())),) for (p,) in ps]
    # as the attention pipeline runs them: causal rows, of which the fast kernels read the lower triangle
    # (the bytes counted) and write every entry
    causal = BH * T * (T + 1) // 2  # the entries on and below the diagonals
    lower = np.tril(np.ones((T, T), bool))
    masked_ss = [(ga.to_gpu(np.where(lower, d.get(), np.float32(MASK_VALUE))),) for (d,) in dss]
    for case, fwd in own("softmax_fwd", with_reference=False):
        add(f"{case} (causal)", lambda s, sc, fwd=fwd: fwd(probs, sc, causal=True, stream=s), F * (causal + att),
            5 * causal, masked_ss)
    for case, bwd in own("softmax_bwd", with_reference=False):
        add(f"{case} (causal)", lambda s, p, bwd=bwd: bwd(dscores, dss[0][0], p, causal=True, stream=s),
            F * (2 * causal + att), 4 * causal, causal_ps)
    heads = empty(B, NH, T, d_k)
    dprobs = empty(B, NH, T, T)
    if reference:
        add("k_attn_values_fwd", lambda s, p: K.attn_values_fwd(heads, p, v, stream=s),
            F * (att + 2 * BH * T * d_k), 2 * att * d_k, ps)
        add("k_attn_values_bwd", lambda s, p: K.attn_values_bwd(dprobs, dv, dq, p, v, stream=s),
            F * (2 * att + 4 * BH * T * d_k), 4 * att * d_k, ps)
    # the fast variants' causal products (the reference ones are the stages above): half the scores
    # are the mask's constants, and not computed
    for case, fwd in own("causal_scores_fwd", with_reference=False):
        add(case, lambda s, qi, ki, fwd=fwd: fwd(scores, qi, ki, stream=s), F * (att + 2 * BH * T * d_k),
            2 * causal * d_k, qks)
    for case, fwd in own("attn_values_fwd", with_reference=False):
        add(case, lambda s, p, fwd=fwd: fwd(heads, p, v, stream=s), F * (att + 2 * BH * T * d_k), 2 * causal * d_k,
            causal_ps)
    for case, bwd in own("attn_values_bwd", with_reference=False):
        add(case, lambda s, p, bwd=bwd: bwd(dprobs, dv, dq, p, v, stream=s), F * (2 * att + 4 * BH * T * d_k),
            4 * causal * d_k, causal_ps)
    for case, bwd in own("causal_scores_bwd", with_reference=False):
        add(case, lambda s, p, bwd=bwd: bwd(dq, dk, p, q, k, stream=s), F * (att + 4 * BH * T * d_k),
            4 * causal * d_k, causal_ps)
    # the attention fused (flash attention in the tc variant): the products of the lower triangle (the forward's
    # two, the backward's five: S and dP recomputed, dV, dK, dQ), reading qkv and writing y, and back
    lse, y_fused, dqkv_fused = empty(B, NH, T), empty(B, T, C), empty(B, T, 3 * C)
    lse_out, y_out = empty(B, NH, T), empty(B, T, C)  # the forward cases' own: the backward's stay a forward's
    dys = [(randn(B, T, C),) for _ in range(sets)]
    for case, fwd in own("fused_attention_fwd"):
        add(case, lambda s, qkv, fwd=fwd: fwd(y_out, lse_out, qkv, NH, stream=s), F * (4 * N * C + BH * T),
            4 * causal * d_k, qkvs)
    K.fused_attention_fwd_tc(y_fused, lse, qkvs[0][0], NH)  # a forward's y and lse, which the backward reads
    for case, bwd in own("fused_attention_bwd"):
        add(case, lambda s, dy, bwd=bwd: bwd(dqkv_fused, dy, qkvs[0][0], y_fused, lse, NH, stream=s),
            F * (8 * N * C + BH * T), 10 * causal * d_k, dys)
    if "tc" in variants:  # flash attention's other widths (d_k padded to 32, 64, 128), C rounded to fit them
        for width in sorted({32, 64, 128} - {K.flash_attention.width(d_k)}):
            nh = max(1, C // width)
            cw = nh * width
            qkv_w, y_w, lse_w, dqkv_w = randn(B, T, 3 * cw), empty(B, T, cw), empty(B, nh, T), empty(B, T, 3 * cw)
            K.fused_attention_fwd_tc(y_w, lse_w, qkv_w, nh)
            add(f"fused_attention_fwd_tc (d_k {width})",
                lambda s, qkv_w=qkv_w, y_w=y_w, lse_w=lse_w, nh=nh: K.fused_attention_fwd_tc(y_w, lse_w, qkv_w, nh,
                                                                                          stream=s),
                F * (4 * N * cw + B * nh * T), 4 * B * nh * T * (T + 1) // 2 * width)
            add(f"fused_attention_bwd_tc (d_k {width})",
                lambda s, qkv_w=qkv_w, y_w=y_w, lse_w=lse_w, nh=nh, dqkv_w=dqkv_w: K.fused_attention_bwd_tc(
                    dqkv_w, y_w, qkv_w, y_w, lse_w, nh, stream=s),
                F * (8 * N * cw + B * nh * T), 10 * B * nh * T * (T + 1) // 2 * width)
    y = empty(B, T, C)
    for case, fwd in own("merge_heads_fwd"):
        add(case, lambda s, fwd=fwd: fwd(y, heads, stream=s), F * 2 * N * C, 0)
    for case, bwd in own("merge_heads_bwd"):
        add(case, lambda s, bwd=bwd: bwd(heads, y, NH, stream=s), F * 2 * N * C, 0)

    hs = [(randn(B, T, 4 * C),) for _ in range(sets)]
    h_out = empty(B, T, 4 * C)
    for case, fwd in own("gelu_fwd"):
        add(case, lambda s, h, fwd=fwd: fwd(h_out, h, stream=s), F * 8 * N * C, 10 * 4 * N * C, hs)
    for case, bwd in own("gelu_bwd"):
        add(case, lambda s, h, bwd=bwd: bwd(h_out, hs[0][0], h, stream=s), F * 12 * N * C, 16 * 4 * N * C, hs)
    res = empty(B, T, C)
    add("k_residual_fwd", lambda s, xi: K.residual_fwd(res, xi, x, stream=s), F * 3 * N * C, N * C, xs)
    add("k_residual_bwd", lambda s, xi: K.residual_bwd(res, dx, xi, stream=s), F * 3 * N * C, 0, xs)

    logits = [(randn(B, T, V, scale=2.0), ints(V, B, T)) for _ in range(sets)]
    losses, lprobs = empty(B, T), empty(B, T, V)
    for case, fwd in own("crossentropy_fwd"):
        add(case, lambda s, lg, tg, fwd=fwd: fwd(losses, lprobs, lg, tg, check_token_ids=False, stream=s),
            F * (2 * N * V + 2 * N), 4 * N * V, logits)
    dlosses = ga.to_gpu(np.full((B, T), 1.0 / N, np.float32))
    dlogits = empty(B, T, V)
    for case, bwd in own("crossentropy_bwd"):
        add(case, lambda s, lg, tg, bwd=bwd: bwd(dlogits, lg, tg, dlosses, check_token_ids=False, stream=s),
            F * (2 * N * V + 2 * N), 2 * N * V, logits)

    # sampling: one new position a sequence, against caches of T positions (the new one the last)
    k_cache, v_cache, kv_src = randn(B, NH, T, d_k), randn(B, NH, T, d_k), randn(B, NH, T, d_k)
    qkv_row, y_row, tokens = randn(B, 1, 3 * C), empty(B, 1, C), ints(V, B, 1)
    last = ga.to_gpu(np.array([T - 1], np.int32))
    add("k_embed_decode", lambda s: K.embed_decode(y_row, tokens, wte, wpe, last, check_token_ids=False, stream=s),
        F * (B + 3 * B * C), B * C)
    add("k_kv_store", lambda s: K.kv_store(k_cache, kv_src, stream=s), F * 2 * BH * T * d_k, 0)
    add("k_attention_decode", lambda s: K.attention_decode(y_row, k_cache, v_cache, qkv_row, last, stream=s),
        F * (2 * BH * T * d_k + 6 * B * C), 4 * BH * T * d_k)
    # choosing the next token from the last position's logits: top-k and top-p read the row 8 times each (a
    # radix search, 4 bits a pass), the draw twice; an exp for each token weighed (at least every token once)
    next_logits, next_ids = randn(B, V, scale=2.0), ga.empty(B, np.int32)
    draws = ga.to_gpu(rng.random(B))
    add("k_sample", lambda s: K.sample(next_ids, next_logits, draws, 0.8, top_k=min(40, V), top_p=0.9, stream=s),
        F * (B * V + B) + 8 * B, 2 * B * V)
    logits_row = empty(B, 1, V)  # the decode step's tied output projection: B rows, so k_matvec
    add("k_matvec", lambda s: K.select("fast").matmul_fwd(logits_row, y_row, wte, None, stream=s),
        F * (V * C + B * C + B * V), 2 * B * V * C)

    # the bias gradient of every fast variant's product, here mlp.fc's (B * T rows of 4C)
    bias_grad = randn(4 * C)
    add("colsum (mlp.fc)", lambda s, d: K.colsum(bias_grad, d, stream=s), F * (N * 4 * C + 2 * 4 * C), N * 4 * C,
        [(randn(B, T, 4 * C),) for _ in range(sets)])

    P = n_params or (V * C + T * C + 12 * C * C + 13 * C)
    params, grads, m = randn(P, scale=0.02), randn(P, scale=1e-3), randn(P, scale=1e-4)
    vv = ga.to_gpu(np.abs(rng.standard_normal(P) * 1e-4).astype(np.float32))  # Adam's v is never negative
    sumsq = ga.empty(1, np.float64)
    add("k_global_norm", lambda s: K.global_norm(sumsq, grads, stream=s), F * P, 2 * P)
    K.global_norm(sumsq, grads)
    add("k_adamw", lambda s: K.adamw(params, grads, m, vv, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                                      weight_decay=0.1, step=1, sumsq=sumsq, max_norm=1.0, stream=s),
        F * 8 * P, 14 * P)
    return cases


def model_params(shape: Shape, n_layer: int) -> int:
    C, V, T = shape.C, shape.V, shape.T
    return V * C + T * C + n_layer * (12 * C * C + 13 * C) + 2 * C
