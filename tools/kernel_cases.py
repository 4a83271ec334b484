"""One ready launch of every kernel at a chosen model shape, with the bytes and FLOPs it must move and do.

Shared by tools/sanitize_kernels.py (one launch each under compute-sanitizer), tools/profile_kernels.py (timed
launches against the GPU's measured ceilings) and tools/ncu_kernel.py (one case under Nsight Compute). The byte
counts are the fewest a kernel can move (every input read once, every output written once, accumulated outputs
read and written); FLOPs count multiply-adds as two and each exp/tanh as one.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from case_builder import Builder, Case, Shape
from product_cases import add_product_cases
from microgpt import kernels as K
from microgpt import ops as O
from microgpt.reference import MASK_VALUE

__all__ = ["Case", "Shape", "build_cases", "model_params"]

F = 4  # bytes per float32 / int32


def build_cases(shape: Shape, seed: int = 0, n_params: int | None = None, sets: int = 1,
                variants=tuple(O.VARIANTS), wanted: Callable[[str], bool] | None = None) -> list[Case]:
    """One Case per kernel and variant, in the order of a training step, with its inputs (random, `sets` copies
    of the large read-only ones). A reference case is named after its kernel (`k_matmul_fwd`); a fast variant's
    after its launcher (`matmul_fwd_fast`), which may run several.

    wanted: a predicate on case names: only the cases it accepts are built, and only their inputs made (None:
    every case); making every input takes most of a minute at andrea-120m's shapes. Inputs that several cases
    share come from getters (@drawn, or @functools.cache where they are computed) that make them when a wanted
    case first asks; a case's own are made in its branch. A name bound to a getter's or a buf's array holds that
    one array wherever it is bound, so launchers close over it; what a loop changes is a default argument (fwd=fwd).
    """
    builder = Builder(seed, sets, variants, wanted)
    ga, want, own, add, buf, drawn, draws_for, empty = (builder.ga, builder.want, builder.own, builder.add,
                                                        builder.buf, builder.drawn, builder.draws, builder.empty)
    B, T, C, NH, V, N, d_k, BH = shape.B, shape.T, shape.C, shape.NH, shape.V, shape.N, shape.d_k, shape.BH

    @drawn
    def token_ids(r):
        return [(r.ints(V, B, T),) for _ in range(sets)]

    @drawn
    def embeddings(r):  # wte, wpe: the embedding's, and the decode step's
        return r.randn(V, C, scale=0.02), r.randn(T, C, scale=0.02)

    def with_outputs(*input_sets, outputs):  # each set's inputs, then its own outputs of these shapes (as each layer
        # writes its own): with one output array for every launch timed, the 50 MB L2 kept it from launch to launch
        # and its writes never reached memory
        return [sum(inputs, ()) + tuple(empty(*shape) for shape in outputs) for inputs in zip(*input_sets)]

    for case, fwd in own("embed_fwd"):
        wte, wpe = embeddings()
        add(case, lambda s, i, x, fwd=fwd: fwd(x, i, wte, wpe, check_token_ids=False, stream=s),
            F * (N + 2 * N * C + T * C), N * C, with_outputs(token_ids(), outputs=[(B, T, C)]))

    @drawn
    def embed_grads(r):  # dwte, dwpe, and each set's (dx, token ids, their order)
        return r.randn(V, C), r.randn(T, C), [(r.randn(B, T, C), i, ga.to_gpu(K.token_order(i.get())))
                                              for (i,) in token_ids()]

    for case, bwd in own("embed_bwd"):
        dwte, dwpe, dx_in = embed_grads()
        add(case, lambda s, d, i, o, bwd=bwd: bwd(dwte, dwpe, d, i, o, check_token_ids=False, stream=s),
            F * (N + N * C + 2 * N * C + 2 * T * C), N * C + T * C * B, dx_in)

    @drawn
    def xs(r):  # the residual stream: the layernorms' inputs, and the residual adds'
        return [(r.randn(B, T, C),) for _ in range(sets)]

    @drawn
    def ln_params(r):  # w, b
        return r.randn(C), r.randn(C)

    @drawn
    def ln_douts(r):  # the layernorms' output gradients; the residual + layernorm's other input
        return [(r.randn(B, T, C),) for _ in range(sets)]

    for case, fwd in own("layernorm_fwd"):
        w, b = ln_params()
        add(case, lambda s, xi, ln, mean, rstd, fwd=fwd: fwd(ln, mean, rstd, xi, w, b, stream=s),
            F * (2 * N * C + 2 * C + 2 * N), 8 * N * C,
            with_outputs(xs(), outputs=[(B, T, C), (B, T), (B, T)]))

    @drawn
    def ln_grads(r):  # dw, db, and each set's residual-stream gradient, which the accumulating backward adds into
        return r.randn(C), r.randn(C), [r.randn(B, T, C) for _ in range(sets)]

    @functools.cache
    def ln_bwd_sets():  # each set's (dout, x, mean and rstd of x's forward, dx): every large array the backward
        # reads or writes is the set's own, as each layer's are (with one x and one dx for all the sets, the 50 MB
        # L2 kept them from launch to launch, and the accumulating backward measured 87% of the copy bandwidth
        # where the model's would not)
        (w, b), ln = ln_params(), empty(B, T, C)  # the forwards' outputs, not read
        out = []
        for (d,), (x,) in zip(ln_douts(), xs()):
            mean, rstd = empty(B, T), empty(B, T)
            K.layernorm_fwd(ln, mean, rstd, x, w, b)
            out.append((d, x, mean, rstd, empty(B, T, C)))
        return out

    for case, bwd in own("layernorm_bwd", also=[" (accumulate)"]):
        (w, _), (dw, db, dx_sums) = ln_params(), ln_grads()
        if want(case):
            add(case, lambda s, d, x, mean, rstd, dx, bwd=bwd: bwd(dx, dw, db, d, x, w, mean, rstd, stream=s),
                F * (3 * N * C + 5 * C + 2 * N), 14 * N * C, ln_bwd_sets())
        if want(f"{case} (accumulate)"):  # as training calls it twice a layer: adding into the residual stream's
            add(f"{case} (accumulate)",   # gradient (read and written)
                lambda s, d, x, mean, rstd, dx, bwd=bwd: bwd(dx, dw, db, d, x, w, mean, rstd, accumulate=True,
                                                             stream=s),
                F * (4 * N * C + 5 * C + 2 * N), 15 * N * C,
                [(*inputs[:4], dx_sum) for inputs, dx_sum in zip(ln_bwd_sets(), dx_sums)])
    if "fast" in variants and want("layernorm_bwd_fast (wide rows)"):
        # T rows wider than a block of the fast backward spans (k_layernorm_bwd_fast_wide)
        r, W = draws_for("layernorm_bwd_fast (wide rows)"), 4 * K.layernorm_fast.bwd_launch()[1] + 4
        x_w, w_w, ln_w, mean_w, rstd_w = r.randn(T, W), r.randn(W), empty(T, W), empty(T), empty(T)
        dx_w, dw_w, db_w = empty(T, W), r.randn(W), r.randn(W)
        K.layernorm_fwd(ln_w, mean_w, rstd_w, x_w, w_w, w_w)
        add("layernorm_bwd_fast (wide rows)",
            lambda s, d: K.layernorm_bwd_fast(dx_w, dw_w, db_w, d, x_w, w_w, mean_w, rstd_w, stream=s),
            F * (3 * T * W + 5 * W + 2 * T), 14 * T * W, [(r.randn(T, W),) for _ in range(sets)])
    if "fast" in variants and want("layernorm_fwd_fast (wide rows)"):  # rows wider than the staged forward takes
        r, W = draws_for("layernorm_fwd_fast (wide rows)"), K.int_constants()["LN_STAGED_MAX_C"] + 4
        add("layernorm_fwd_fast (wide rows)", lambda s, xi, ln, mean, rstd, wb=(r.randn(W), r.randn(W)):
            K.layernorm_fwd_fast(ln, mean, rstd, xi, *wb, stream=s), F * (2 * T * W + 2 * W + 2 * T), 8 * T * W,
            [(r.randn(T, W), empty(T, W), empty(T), empty(T)) for _ in range(sets)])
    # the residual add fused with the layernorm after it (the reference runs k_residual_fwd, k_layernorm_fwd)
    for case, fwd in own("residual_layernorm_fwd", with_reference=False):
        w, b = ln_params()
        add(case, lambda s, ri, d, x_sum, ln, mean, rstd, fwd=fwd: fwd(x_sum, ln, mean, rstd, ri, d, w, b, stream=s),
            F * (4 * N * C + 2 * C + 2 * N), 9 * N * C,
            with_outputs(xs(), ln_douts(), outputs=[(B, T, C), (B, T, C), (B, T), (B, T)]))

    add_product_cases(builder, shape)

    @drawn
    def qkvs(r):  # the attention's input: split into heads, and read by the fused attention
        return [(r.randn(B, T, 3 * C),) for _ in range(sets)]

    @functools.cache
    def heads_of_qkv():  # q, k, v split from the first set of qkvs: the attention stages read them
        q, k, v = (buf(name, B, NH, T, d_k) for name in "qkv")
        K.split_heads_fwd(q, k, v, qkvs()[0][0], NH)
        return q, k, v

    @drawn
    def head_grads(r):  # dq, dk, dv
        return tuple(r.randn(B, NH, T, d_k) for _ in range(3))


    att = BH * T * T
    causal = BH * T * (T + 1) // 2  # the entries on and below the diagonals

    @drawn
    def qks(r):
        return [(r.randn(B, NH, T, d_k), r.randn(B, NH, T, d_k)) for _ in range(sets)]

    @drawn
    def dss(r):  # scores, and their gradients
        return [(r.randn(B, NH, T, T),) for _ in range(sets)]

    @drawn
    def ps(r):
        return [(r.probs_like(B, NH, T, T),) for _ in range(sets)]

    @functools.cache
    def causal_ps():  # as the attention pipeline's causal rows: zero above the diagonal
        return [(ga.to_gpu(np.tril(p.get())),) for (p,) in ps()]

    @functools.cache
    def masked_ss():  # scores as the causal softmax reads them: the mask's constant above the diagonal
        lower = np.tril(np.ones((T, T), bool))
        return [(ga.to_gpu(np.where(lower, d.get(), np.float32(MASK_VALUE))),) for (d,) in dss()]

    reference = "reference" in variants  # the readable stages that only the reference variant runs
    if reference and want("k_attn_scores_fwd"):
        scores = buf("scores", B, NH, T, T)
        add("k_attn_scores_fwd", lambda s, qi, ki: K.attn_scores_fwd(scores, qi, ki, stream=s),
            F * (att + 2 * BH * T * d_k), 2 * att * d_k, qks())
    if reference and want("k_attn_scores_bwd"):
        (q, k, v), (dq, dk, dv) = heads_of_qkv(), head_grads()
        add("k_attn_scores_bwd", lambda s, d: K.attn_scores_bwd(dq, dk, d, q, k, stream=s),
            F * (att + 4 * BH * T * d_k), 4 * att * d_k, dss())
    if reference and want("k_causal_mask_fwd"):
        masked = buf("masked", B, NH, T, T)
        add("k_causal_mask_fwd", lambda s, sc: K.causal_mask_fwd(masked, sc, stream=s), F * 2 * att, 0, dss())
    if reference and want("k_causal_mask_bwd"):
        masked = buf("masked", B, NH, T, T)
        add("k_causal_mask_bwd", lambda s, d: K.causal_mask_bwd(masked, d, stream=s), F * 2 * att, 0, dss())
    for case, fwd in own("softmax_fwd"):
        add(case, lambda s, sc, probs, fwd=fwd: fwd(probs, sc, stream=s), F * 2 * att, 5 * att,
            with_outputs(dss(), outputs=[(B, NH, T, T)]))
    for case, bwd in own("softmax_bwd"):
        add(case, lambda s, p, d, dscores, bwd=bwd: bwd(dscores, d, p, stream=s), F * 3 * att, 4 * att,
            with_outputs(ps(), dss(), outputs=[(B, NH, T, T)]))
    # as the attention pipeline runs them: causal rows, of which the fast kernels read the lower triangle
    # (the bytes counted) and write every entry
    for case, fwd in own("softmax_fwd", " (causal)", with_reference=False):
        add(case, lambda s, sc, probs, fwd=fwd: fwd(probs, sc, causal=True, stream=s), F * (causal + att),
            5 * causal, with_outputs(masked_ss(), outputs=[(B, NH, T, T)]))
    for case, bwd in own("softmax_bwd", " (causal)", with_reference=False):
        add(case, lambda s, p, d, dscores, bwd=bwd: bwd(dscores, d, p, causal=True, stream=s),
            F * (2 * causal + att), 4 * causal,
            with_outputs(causal_ps(), dss(), outputs=[(B, NH, T, T)]))
    if reference and want("k_attn_values_fwd"):
        heads, (q, k, v) = buf("heads", B, NH, T, d_k), heads_of_qkv()
        add("k_attn_values_fwd", lambda s, p: K.attn_values_fwd(heads, p, v, stream=s),
            F * (att + 2 * BH * T * d_k), 2 * att * d_k, ps())
    if reference and want("k_attn_values_bwd"):
        dprobs, (q, k, v), (dq, dk, dv) = buf("dprobs", B, NH, T, T), heads_of_qkv(), head_grads()
        add("k_attn_values_bwd", lambda s, p: K.attn_values_bwd(dprobs, dv, dq, p, v, stream=s),
            F * (2 * att + 4 * BH * T * d_k), 4 * att * d_k, ps())
    # the fast variants' causal products (the reference ones are the stages above): half the scores
    # are the mask's constants, and not computed
    for case, fwd in own("causal_scores_fwd", with_reference=False):
        scores = buf("scores", B, NH, T, T)
        add(case, lambda s, qi, ki, fwd=fwd: fwd(scores, qi, ki, stream=s), F * (att + 2 * BH * T * d_k),
            2 * causal * d_k, qks())
    for case, fwd in own("attn_values_fwd", with_reference=False):
        heads, (q, k, v) = buf("heads", B, NH, T, d_k), heads_of_qkv()
        add(case, lambda s, p, fwd=fwd: fwd(heads, p, v, stream=s), F * (att + 2 * BH * T * d_k), 2 * causal * d_k,
            causal_ps())
    for case, bwd in own("attn_values_bwd", with_reference=False):
        dprobs, (q, k, v), (dq, dk, dv) = buf("dprobs", B, NH, T, T), heads_of_qkv(), head_grads()
        add(case, lambda s, p, bwd=bwd: bwd(dprobs, dv, dq, p, v, stream=s), F * (2 * att + 4 * BH * T * d_k),
            4 * causal * d_k, causal_ps())
    for case, bwd in own("causal_scores_bwd", with_reference=False):
        (q, k, v), (dq, dk, dv) = heads_of_qkv(), head_grads()
        add(case, lambda s, p, bwd=bwd: bwd(dq, dk, p, q, k, stream=s), F * (att + 4 * BH * T * d_k),
            4 * causal * d_k, causal_ps())

    # the attention fused (flash attention in the tc variant): the lower triangle's products (the forward's two, the
    # backward's five: S and dP recomputed, dV, dK, dQ), reading qkv and writing y, and back
    @functools.cache
    def fused_forward():  # a forward's y and lse, which the backward reads
        y_fused, lse = buf("y_fused", B, T, C), buf("lse", B, NH, T)
        K.fused_attention_fwd_tc(y_fused, lse, qkvs()[0][0], NH)
        return y_fused, lse

    @drawn
    def dys(r):
        return [(r.randn(B, T, C),) for _ in range(sets)]

    for case, fwd in own("fused_attention_fwd"):
        y_out, lse_out = buf("y_out", B, T, C), buf("lse_out", B, NH, T)  # the backward's stay a forward's
        add(case, lambda s, qkv, fwd=fwd: fwd(y_out, lse_out, qkv, NH, stream=s), F * (4 * N * C + BH * T),
            4 * causal * d_k, qkvs())
    for case, bwd in own("fused_attention_bwd"):
        (y_fused, lse), dqkv_fused = fused_forward(), buf("dqkv_fused", B, T, 3 * C)
        add(case, lambda s, dy, bwd=bwd, qkv=qkvs()[0][0]: bwd(dqkv_fused, dy, qkv, y_fused, lse, NH, stream=s),
            F * (8 * N * C + BH * T), 10 * causal * d_k, dys())
    flash = K.flash_attention_supported(d_k, T, K.engine())
    at_d_k = {K.flash_attention.width(d_k)} if flash else set()  # flash at the model
    widths = sorted({32, 64, 128} - at_d_k) if "tc" in variants else []  # its other widths, C rounded to fit
    for width in widths:
        fwd_case, bwd_case = f"fused_attention_fwd_tc (d_k {width})", f"fused_attention_bwd_tc (d_k {width})"
        if not (want(fwd_case) or want(bwd_case)):
            continue
        nh = max(1, C // width)
        cw = nh * width
        qkv_w, y_w = draws_for(fwd_case).randn(B, T, 3 * cw), empty(B, T, cw)
        lse_w, dqkv_w = empty(B, nh, T), empty(B, T, 3 * cw)
        K.fused_attention_fwd_tc(y_w, lse_w, qkv_w, nh)
        if want(fwd_case):
            add(fwd_case,
                lambda s, qkv_w=qkv_w, y_w=y_w, lse_w=lse_w, nh=nh: K.fused_attention_fwd_tc(y_w, lse_w, qkv_w, nh,
                                                                                          stream=s),
                F * (4 * N * cw + B * nh * T), 4 * B * nh * T * (T + 1) // 2 * width)
        if want(bwd_case):
            add(bwd_case,
                lambda s, qkv_w=qkv_w, y_w=y_w, lse_w=lse_w, nh=nh, dqkv_w=dqkv_w: K.fused_attention_bwd_tc(
                    dqkv_w, y_w, qkv_w, y_w, lse_w, nh, stream=s),
                F * (8 * N * cw + B * nh * T), 10 * B * nh * T * (T + 1) // 2 * width)
    # where the wgmma kernels take the width of 64, the mma.sync ones beside them
    fwd_mma, bwd_mma = "fused_attention_fwd_tc (d_k 64, mma.sync)", "fused_attention_bwd_tc (d_k 64, mma.sync)"
    if "tc" in variants and K.flash_attention.on_wgmma(64, K.engine()) and (want(fwd_mma) or want(bwd_mma)):
        nh = max(1, C // 64)
        qkv_m, y_m, lse_m = draws_for(fwd_mma).randn(B, T, 3 * nh * 64), empty(B, T, nh * 64), empty(B, nh, T)
        if want(fwd_mma):
            add(fwd_mma,
                lambda s, qkv_m=qkv_m, y_m=y_m, lse_m=lse_m, nh=nh: K.flash_attention.forward(y_m, lse_m, qkv_m, nh,
                                                                                           s, wgmma=False),
                F * (4 * N * nh * 64 + B * nh * T), 4 * B * nh * T * (T + 1) // 2 * 64)
        if want(bwd_mma):
            dqkv_m = empty(B, T, 3 * nh * 64)
            K.flash_attention.forward(y_m, lse_m, qkv_m, nh, None)  # a softmax's lse, so the backward's p <= 1
            add(bwd_mma,
                lambda s, qkv_m=qkv_m, y_m=y_m, lse_m=lse_m, nh=nh, dqkv_m=dqkv_m: K.flash_attention.backward(
                    dqkv_m, y_m, qkv_m, y_m, lse_m, nh, s, wgmma=False),
                F * (8 * N * nh * 64 + B * nh * T), 10 * B * nh * T * (T + 1) // 2 * 64)


    # sampling: one new position a sequence, against caches of T positions (the new one the last)
    @drawn
    def kv_caches(r):
        return r.randn(B, NH, T, d_k), r.randn(B, NH, T, d_k)

    @functools.cache
    def last():
        return ga.to_gpu(np.array([T - 1], np.int32))

    if want("k_embed_decode"):
        (wte, wpe), y_row, tokens = embeddings(), buf("y_row", B, 1, C), draws_for("k_embed_decode").ints(V, B, 1)
        add("k_embed_decode",
            lambda s, pos=last(): K.embed_decode(y_row, tokens, wte, wpe, pos, check_token_ids=False, stream=s),
            F * (B + 3 * B * C), B * C)
    if want("k_kv_store"):
        k_cache, kv_src = kv_caches()[0], draws_for("k_kv_store").randn(B, NH, T, d_k)
        add("k_kv_store", lambda s: K.kv_store(k_cache, kv_src, stream=s), F * 2 * BH * T * d_k, 0)
    if want("k_attention_decode"):
        (k_cache, v_cache), y_row = kv_caches(), buf("y_row", B, 1, C)
        qkv_row = draws_for("k_attention_decode").randn(B, 1, 3 * C)
        add("k_attention_decode",
            lambda s, pos=last(): K.attention_decode(y_row, k_cache, v_cache, qkv_row, pos, stream=s),
            F * (2 * BH * T * d_k + 6 * B * C), 4 * BH * T * d_k)
    # choosing the next token from the last position's logits: top-k and top-p read the row 8 times each (a
    # radix search, 4 bits a pass), the draw twice; an exp for each token weighed (at least every token once)
    if want("k_sample"):
        r = draws_for("k_sample")
        next_logits, next_ids, draws = r.randn(B, V, scale=2.0), ga.empty(B, np.int32), r.uniform(B)
        add("k_sample",
            lambda s: K.sample(next_ids, next_logits, draws, 0.8, top_k=min(40, V), top_p=0.9, stream=s),
            F * (B * V + B) + 8 * B, 2 * B * V)
    for rows in (1, 2, 4, 8):  # the decode step's mlp.fc at 1 .. 8 sequences, its layernorm and GELU inside
        if want(f"k_matvec_{rows}"):
            r = draws_for(f"k_matvec_{rows}")
            x_rows, ln_w, ln_b, act_rows = r.randn(rows, 1, C), r.randn(C), r.randn(C), empty(rows, 1, 4 * C)
            fc_w, fc_b = r.randn(4 * C, C), r.randn(4 * C)
            add(f"k_matvec_{rows}", lambda s, a=(act_rows, x_rows, ln_w, ln_b, fc_w, fc_b):
                O.select("fast").layernorm_matmul_fwd(*a, gelu=True, stream=s),
                F * (4 * C * C + 4 * C + 2 * C + rows * 5 * C), 2 * rows * 4 * C * C)

    # the bias gradient of every fast variant's product, here mlp.fc's (B * T rows of 4C)
    if want("colsum (mlp.fc)"):
        r = draws_for("colsum (mlp.fc)")
        bias_grad = r.randn(4 * C)
        add("colsum (mlp.fc)", lambda s, d: K.colsum(bias_grad, d, stream=s), F * (N * 4 * C + 2 * 4 * C),
            N * 4 * C, [(r.randn(B, T, 4 * C),) for _ in range(sets)])

    P = n_params or (V * C + T * C + 12 * C * C + 13 * C)

    @drawn
    def gradients(r):  # and the square of their norm, which AdamW's clipping reads
        grads, sumsq = r.randn(P, scale=1e-3), ga.empty(1, np.float64)
        K.global_norm(sumsq, grads)
        return grads, sumsq

    if want("k_global_norm"):
        grads, sumsq = gradients()
        # accumulate: the kernel alone, without the memset of sumsq that a step puts before it
        add("k_global_norm", lambda s: K.global_norm(sumsq, grads, accumulate=True, stream=s), F * P, 2 * P)
    if want("k_adamw"):
        (grads, sumsq), r = gradients(), draws_for("k_adamw")
        params, m = r.randn(P, scale=0.02), r.randn(P, scale=1e-4)
        vv = ga.to_gpu(np.abs(r.normal(P, scale=1e-4)))  # Adam's v is never negative
        add("k_adamw", lambda s: K.adamw(params, grads, m, vv, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                                          weight_decay=0.1, step=1, sumsq=sumsq, max_norm=1.0, stream=s),
            F * 8 * P, 14 * P)
    builder.declared(shape)  # an op without a case written here: one from its declaration in microgpt.ops
    return builder.cases


def model_params(shape: Shape, n_layer: int) -> int:
    C, V, T = shape.C, shape.V, shape.T
    return V * C + T * C + n_layer * (12 * C * C + 13 * C) + 2 * C
