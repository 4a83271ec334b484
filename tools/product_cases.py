"""The matrix products' cases of kernel_cases.build_cases: each linear layer's forward and backward, the backward
into the layernorm before it, mlp.proj's into GELU's, the attention's output projection's fused with flash
attention's, and the generic products in every layout (the tensor cores' on each path)."""
from __future__ import annotations

import itertools

from case_builder import Builder, Shape
from microgpt import kernels as K
from microgpt.model import padded_rows

F = 4  # bytes per float32
PADDED = "lm_head, padded rows"  # the lm_head's products on the model's logits (model.padded_rows)


def add_product_cases(builder: Builder, shape: Shape) -> None:
    """builder's cases of the products, at shape, in builder's variants (see kernel_cases.build_cases)."""
    variants, sets, want, own, add, buf, draws_for, empty = (builder.variants, builder.sets, builder.want, builder.own,
                                                             builder.add, builder.buf, builder.draws, builder.empty)
    B, T, C, V, N, d_k = shape.B, shape.T, shape.C, shape.V, shape.N, shape.d_k
    # each linear layer's (IN, OUT), and the tied lm_head's (its weight wte): with rows of V floats (V = 261 in the
    # sanitizer: rows not 16-byte aligned), and as the model lays out the logits and their gradient (padded_rows)
    layers = {"qkv": (C, 3 * C), "attn.proj": (C, C), "mlp.fc": (C, 4 * C), "mlp.proj": (4 * C, C), "lm_head": (C, V),
              PADDED: (C, V)}
    block_layers = {layer: io for layer, io in layers.items() if not layer.startswith("lm_head")}  # in every block
    weights = {layer: io for layer, io in layers.items() if layer != PADDED}  # one of each

    for layer, (IN, OUT) in layers.items():
        fwds, bwds = own("matmul_fwd", f" ({layer})"), own("matmul_bwd", f" ({layer})")
        if not (fwds or bwds):
            continue
        r = draws_for(f"matmul ({layer})")  # the backward's draws come after these, whether the forward is wanted
        bias = None if layer.startswith("lm_head") else r.randn(OUT)
        wts = [(r.randn(OUT, IN, scale=0.02), r.randn(B, T, IN)) for _ in range(sets)]
        rows_of = padded_rows if layer == PADDED else (lambda new, *s: new(*s))
        for case, fwd in fwds:
            out = rows_of(lambda *s: buf(f"out ({layer})", *s), B, T, OUT)
            add(case, lambda s, wt, inp, out=out, bias=bias, fwd=fwd: fwd(out, inp, wt, bias, stream=s),
                F * (N * IN + OUT * IN + N * OUT + OUT), 2 * N * IN * OUT, wts)
        if bwds:
            dinp, dwt = buf(f"dinp ({layer})", B, T, IN), r.randn(OUT, IN)
            dbias = None if bias is None else r.randn(OUT)
            douts = [(rows_of(r.randn, B, T, OUT), wt, inp) for (wt, inp) in wts]
        for case, bwd in bwds:
            add(case,
                lambda s, d, wt, inp, dinp=dinp, dwt=dwt, dbias=dbias, bwd=bwd: bwd(dinp, dwt, dbias, d, inp, wt,
                                                                                    stream=s),
                F * (N * OUT + N * IN + OUT * IN + N * IN + 2 * OUT * IN + 2 * OUT), 4 * N * IN * OUT + N * OUT,
                douts)

    # a linear layer's backward into the layernorm that made its input, adding into the residual stream's gradient
    # as training does (where the shape is a small one, the sanitizer's, at least 130 rows of 128 columns: enough
    # for the wgmma kernel)
    W, R = max(C, 128), max(N, 130)
    for layer, OUT in (("qkv", 3 * W), ("mlp.fc", 4 * W)):
        cases = [(case, fn) for case, fn in own("matmul_layernorm_bwd", f" ({layer})", with_reference=False)
                 if want(case)]
        if not cases:
            continue
        r = draws_for(f"matmul_layernorm_bwd ({layer})")
        w_ln, b_ln, dw, db, dinp = r.randn(W), r.randn(W), r.randn(W), r.randn(W), empty(R, W)
        wt, dwt, dbias = r.randn(OUT, W, scale=0.02), r.randn(OUT, W), r.randn(OUT)
        ins = []  # each set's dout, the layernorm's output, its input x, mean and rstd, and dx to add into
        for _ in range(sets):
            x, inp, mean, rstd = r.randn(R, W), empty(R, W), empty(R), empty(R)
            K.layernorm_fwd(inp, mean, rstd, x, w_ln, b_ln)
            ins.append((r.randn(R, OUT), inp, x, mean, rstd, r.randn(R, W)))
        for case, fn in cases:
            add(case, lambda s, d, inp, x, mean, rstd, dx, fn=fn, wt=wt, dwt=dwt, dbias=dbias, w_ln=w_ln, dw=dw, db=db,
                dinp=dinp: fn(dx, dw, db, dwt, dbias, d, inp, wt, x, w_ln, mean, rstd, dinp=dinp, accumulate=True,
                              stream=s),
                F * (R * OUT + 2 * R * W + OUT * W + 2 * R + 2 * R * W + 2 * OUT * W + 2 * OUT + 5 * W),
                4 * R * W * OUT + R * OUT + 15 * R * W, ins)

    # mlp.proj's backward into GELU's: on Hopper tc's dX product times gelu'(pre), and the same ops unfused beside
    # it (C of at least 256: K long enough for the wgmma kernel; R rows as above)
    Wg = max(C, 256)
    cases = own("matmul_gelu_bwd", " (mlp.proj)", with_reference=False)
    if "tc" in variants and K.warpgroup_mma(K.engine()):
        cases.append(("matmul_gelu_bwd_tc unfused (mlp.proj)", K.matmul_gelu_tc.unfused))
    cases = [(case, fn) for case, fn in cases if want(case)]
    if cases:
        r = draws_for("matmul_gelu_bwd (mlp.proj)")
        wt, dwt, dbias = r.randn(Wg, 4 * Wg, scale=0.02), r.randn(Wg, 4 * Wg), r.randn(Wg)
        ins = [(r.randn(R, Wg), r.randn(R, 4 * Wg), r.randn(R, 4 * Wg), empty(R, 4 * Wg)) for _ in range(sets)]
        for case, fn in cases:  # each set's dout, act, pre, and dpre written
            add(case, lambda s, d, act, pre, dpre, fn=fn, wt=wt, dwt=dwt, dbias=dbias: fn(dpre, dwt, dbias, d, act, pre,
                                                                                           wt, stream=s),
                F * (R * Wg + 3 * R * 4 * Wg + 12 * Wg * Wg + 2 * Wg), 16 * R * Wg * Wg + R * Wg + 64 * R * Wg, ins)

    # the attention's output projection's backward into flash attention's: on Hopper tc's dX product summing delta,
    # and the same ops unfused beside it, at heads of d_k 64 where the shape's are not whole in 128 columns, C of at
    # least 256 (K long enough for the wgmma kernel) and T of at least 200
    dk = d_k if d_k in K.matmul_attention_tc.D_K else 64
    Wa, Ta = -(-max(C, 256) // dk) * dk, max(T, 200)  # T past the pass kernel's rows, tiles across batch rows
    nh, Na = Wa // dk, B * Ta
    cases = own("matmul_attention_bwd", " (attn.proj)", with_reference=False)
    if "tc" in variants and K.warpgroup_mma(K.engine()):
        cases.append(("matmul_attention_bwd_tc unfused (attn.proj)", K.matmul_attention_tc.unfused))
    cases = [(case, fn) for case, fn in cases if want(case) and K.flash_attention.runs(B, nh, dk, Ta, K.engine())]
    if cases:
        r = draws_for("matmul_attention_bwd (attn.proj)")
        wt, dwt, dbias, dqkv, dy = r.randn(Wa, Wa, scale=0.02), r.randn(Wa, Wa), r.randn(Wa), empty(B, Ta, 3 * Wa), \
            empty(B, Ta, Wa)
        ins = []  # each set's dout, and a forward's qkv, y and lse
        for _ in range(sets):
            qkv, y, lse = r.randn(B, Ta, 3 * Wa), empty(B, Ta, Wa), empty(B, nh, Ta)
            K.fused_attention_fwd_tc(y, lse, qkv, nh)
            ins.append((r.randn(B, Ta, Wa), y, qkv, lse))
        causal = B * nh * Ta * (Ta + 1) // 2
        for case, fn in cases:
            add(case, lambda s, d, y, qkv, lse, fn=fn, wt=wt, dwt=dwt, dbias=dbias, dqkv=dqkv, dy=dy, nh=nh: fn(
                dqkv, dwt, dbias, d, y, wt, qkv, lse, nh, dy=dy, stream=s),
                F * (4 * Na * Wa + Wa * Wa + 2 * Na * Wa + 2 * Wa * Wa + 2 * Wa + 8 * Na * Wa + B * nh * Ta),
                4 * Na * Wa * Wa + 10 * causal * dk, ins)

    # the split passes on their own, which on sm_90a go before each product of A stored M x K (the tensor cores'
    # operands in TF32 hi and lo, padded to whole tiles): an activation (the dX product's dout), a weight as the
    # forward reads it, and as the dX product reads it (transposed on the way)
    if "tc" in variants:
        for layer, (IN, OUT) in block_layers.items():
            for what, rows, K_, transposed in (("dout", N, OUT, False), ("weight", OUT, IN, False),
                                               ("weight", IN, OUT, True)):
                case = f"k_tf32_split{'_t' * transposed} ({layer} {what})"
                if not want(case):
                    continue
                r = draws_for(case)
                rows_pad, K_pad = K.tf32_split.split_padding(rows, K_)
                n = rows_pad * K_pad  # floats of the hi, and of the lo
                ins = [(r.randn(K_, rows) if transposed else r.randn(rows, K_), empty(2 * n)) for _ in range(sets)]
                add(case, lambda s, src, out, rows=rows, K_=K_, K_pad=K_pad, n=n, transposed=transposed:
                    K.tf32_split.tf32_split(int(out.gpudata), int(out.gpudata) + 4 * n, int(src.gpudata), rows, K_,
                                           rows if transposed else K_, K_pad, s, transposed=transposed),
                    F * (rows * K_ + 2 * n), 3 * rows * K_, ins)

    # the weights split once a pass (tf32_split.SplitOperands: one launch), as the forward reads them and, transposed,
    # as the dX products do: one layer's four and lm_head's
    if "tc" in variants:
        for transposed in (False, True):
            case = f"k_tf32_split_batch (weights{', transposed' * transposed})"
            if not want(case):
                continue
            r, sets_of = draws_for(case), []
            for _ in range(sets):
                ws = [r.randn(OUT, IN, scale=0.02) for IN, OUT in weights.values()]
                splits = K.weight_splits(ws, transposed)
                for operand in sorted(splits.candidates):  # each found, as the products would find them
                    splits.find(*operand)
                sets_of.append((splits, ws))
            add(case, lambda s, splits, ws: splits.split(s),
                sum(F * (rows * K_ + buf.size) for (_, rows, K_, _, _), buf in splits.found.items()),
                3 * sum(IN * OUT for IN, OUT in weights.values()), sets_of)

    # split-K's reduction after the dW products, adding the slices and their bias-gradient sums into the gradients
    # (beta = 1, as training), in the slices the wgmma kernel takes on Hopper
    for layer, (IN, OUT) in block_layers.items():
        case = f"k_splitk_reduce ({layer} dW)"
        if not (("tc" in variants or "fast" in variants) and want(case)):
            continue
        g = K.Gemm.dense(OUT, IN, N, trans_a=True, beta=1.0)
        splits = max(2, g.splits(K.runtime.engine().sm_count, 1 if "tc" in variants else 2))
        r, MN = draws_for(case), OUT * IN
        c_out, sums = r.randn(OUT, IN), r.randn(OUT)
        add(case, lambda s, p, c_out=c_out, sums=sums, splits=splits, MN=MN, M=OUT: K.matmul_fast.splitk_reduce(
                int(c_out.gpudata), int(p.gpudata), splits, MN, 1.0, int(sums.gpudata), M, s),
            F * (splits * (MN + OUT) + 2 * MN + 2 * OUT), splits * (MN + OUT), [(r.randn(splits * (MN + OUT)),)
                                                                                 for _ in range(sets)])

    # the generic product with both operands transposed, which no layer runs (tests and tools call it)
    for label, OUT in (("tt", 4 * C), ("tt, narrow", d_k)):
        if "fast" in variants and want(f"sgemm ({label})"):
            r = draws_for(f"sgemm ({label})")
            a_t, b_t, c_out = r.randn(C, N), r.randn(OUT, C), empty(N, OUT)
            add(f"sgemm ({label})", lambda s, a_t=a_t, b_t=b_t, c_out=c_out: K.sgemm(c_out, a_t, b_t, trans_a=True,
                                                                                     trans_b=True, stream=s),
                F * (N * C + OUT * C + N * OUT), 2 * N * C * OUT)
    # the tensor-core products in each layout at mlp.fc's shape with K and N swapped (K = 4 C is long enough
    # for them at any width: matmul_tc.TC_MIN_K, WG_MIN_K; at least WG_MIN_K + 5 where C is tiny), on the
    # 128 x 128 tile and, d_k wide, the 128 x 64 one: the device's kernel (wgmma on Hopper) and the mma.sync one
    if "tc" in variants:
        H = max(4 * C, K.matmul_tc.WG_MIN_K + 5)  # small shapes (the sanitizer's) still reach both kernels
        # wgmma=True: the sanitizer's products are too small for the device's own choice of it (mma.sync elsewhere);
        # " wgmma": Hopper's wgmma kernel where a product of A stored M x K takes split operands (not ta, not narrow)
        paths = [("", True, None), (" mma.sync", False, None)] if K.warpgroup_mma(K.engine()) else [("", None, None)]
        wgmma_itself = [(" wgmma", True, False)] if K.warpgroup_mma(K.engine()) else []
        for ta, tb, (width, label) in itertools.product((False, True), (False, True), ((H, ""), (d_k, ", narrow"))):
            layout = f"{'t' if ta else 'n'}{'t' if tb else 'n'}{label}"
            chosen = [p for p in paths + ([] if ta or label else wgmma_itself) if want(f"sgemm_tc{p[0]} ({layout})")]
            if not chosen:
                continue
            r = draws_for(f"sgemm_tc ({layout})")
            a_op = r.randn(H, N) if ta else r.randn(N, H)
            b_op, c_out = (r.randn(width, H) if tb else r.randn(H, width)), empty(N, width)
            for path, wgmma, split in chosen:
                add(f"sgemm_tc{path} ({layout})",
                    lambda s, a_op=a_op, b_op=b_op, c_out=c_out, ta=ta, tb=tb, wgmma=wgmma, split=split: K.sgemm(
                        c_out, a_op, b_op, trans_a=ta, trans_b=tb, stream=s, wgmma=wgmma, split=split, units="tc"),
                    F * (N * H + H * width + N * width), 2 * N * H * width)
