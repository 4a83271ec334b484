"""The matrix products: each described once (Gemm: shapes, transposes, batch, causal skipping, the units that run it,
an epilogue), and planned and launched by one function, gemm(), for every variant.

    g = Gemm.dense(N, OUT, IN, trans_b=True, units="tc")     # out = inp @ W^T on the tensor cores
    gemm(g, out, inp, w, bias, stream)                       # pointers already checked
    sgemm(c, a, b, trans_b=True, units="tc")                  # the same on device arrays, checked

gemm() cuts K into slices where a product has too few tiles to fill the GPU (split-K: each slice its partial
product, k_splitk_reduce adding them in slice order; the wgmma kernel of A stored K x M cuts K itself, matmul_tc.
tn_launch), runs each on the units' kernel (the SIMT SGEMM; on "tc" the
kernel matmul_tc.tc_kernel chooses, from B split once into TF32 hi and lo where the wgmma kernel takes a product of
A stored M x K, and the SIMT SGEMM where the tensor cores would not be as accurate), and adds a linear layer's bias
gradient (the row sums of op(A)) in the wgmma kernel or by a column-sum pass. An epilogue is a fused kernel reading
A and the split B in place of the product's own (matmul_attention_tc).
MatrixProducts writes the model's products once over gemm(); its launchers are the fast and tc variants'.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable

from ..reference import MASK_VALUE, attn_scale
from .checks import head_dims, opt_ptr, ptr, rows, rows_ptr, shape_of
from .colsum import add_column_sums
from .matmul_fast import GEMM_TILE, Causal, sgemm_launch, splitk_reduce
from .matmul_tc import TN, areg_launch, split_operands, tc_kernel, tc_launch, tc_reason, tn_launch
from .matvec import fits, matvec
from .runtime import device_of, noting, scratch, workspace
from .source import int_constant
from .tf32_split import find_split, split_padding, tf32_split


@dataclass(frozen=True)
class Gemm:
    """One product: C[z] (M x N, ldc) = alpha * op(A[z]) @ op(B[z]) + bias + beta * C[z] for z < batch, op(X) = X^T
    where trans_x. A is stored M x K (lda), or K x M transposed; B K x N (ldb), or N x K. units: "simt" or "tc";
    wgmma and split: on "tc", force the wgmma (True) or mma.sync (False) kernel, or (split=False) never split
    operands, to measure or check them; epilogue(a, b_split, K_pad, grid): launches a fused kernel on A (as it lies,
    lda) and the split B in place of the product's own."""
    M: int
    N: int
    K: int
    lda: int
    ldb: int
    ldc: int
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    alpha: float = 1.0
    beta: float = 0.0
    causal: Causal = Causal.NONE
    fill: float = 0.0
    units: str = "simt"
    wgmma: bool | None = None
    split: bool | None = None
    epilogue: Callable | None = None

    @classmethod
    def dense(cls, M, N, K, *, trans_a=False, trans_b=False, batch=1, **kw) -> "Gemm":
        """A product of contiguous matrices, `batch` of them back to back."""
        return cls(M, N, K, lda=M if trans_a else K, ldb=K if trans_b else N, ldc=N, trans_a=trans_a,
                   trans_b=trans_b, batch=batch, stride_a=M * K, stride_b=K * N, stride_c=M * N, **kw)

    @property
    def tile_n(self) -> int:
        return 64 if self.N <= 64 else 128

    @property
    def kernel(self) -> str:
        ops = ("t" if self.trans_a else "n") + ("t" if self.trans_b else "n")
        return f"k_sgemm_{ops}" + ("_n64" if self.tile_n == 64 else "")

    @property
    def grid(self) -> tuple[int, int, int]:
        return math.ceil(self.N / self.tile_n), math.ceil(self.M / GEMM_TILE), self.batch

    def args(self, c: int, a: int, b: int, bias: int, sums: int = 0) -> list:
        """The product kernels' arguments; sums: where the wgmma kernel adds op(A)'s row sums (0: nowhere)."""
        return [c, a, b, bias, self.M, self.N, self.K, self.lda, self.ldb, self.ldc, self.stride_a,
                self.stride_b, self.stride_c, float(self.alpha), float(self.beta), int(self.causal),
                float(self.fill), sums]

    def splits(self, sm_count: int, per_sm: int = 2) -> int:
        """How many slices to cut K into so that a product of few tiles (a weight gradient: M x N small,
        K = B*T large) still fills the GPU. Two blocks per SM (the SGEMM): the fewest of 2, 4, 8 that give
        two blocks per SM. One (the wgmma kernel): the count of 1, 2, 4, 8 whose last wave is fullest, as
        the blocks run in waves of sm_count; fewer slices where that ties, each costing a pass of partials."""
        tiles = self.grid[0] * self.grid[1]
        if per_sm == 1:
            def fill(s):  # the share of the waves' slots that hold a block
                return tiles * s / (math.ceil(tiles * s / sm_count) * sm_count)
            ok = [1] + [s for s in (2, 4, 8) if self.K % s == 0 and self.K // s >= 256]
            return max(ok, key=lambda s: (round(fill(s) - 0.02 * math.log2(s), 6), -s))
        for splits in (1, 2, 4, 8):
            if tiles * splits >= 2 * sm_count or splits == 8:
                return splits if self.K % splits == 0 and self.K // splits >= 128 else 1
        return 1

    def tc(self, device) -> tuple[str, int, int] | None:
        """The tensor-core kernel (name, shared bytes, threads) that runs it on `device`, or None: the SIMT SGEMM."""
        return tc_kernel(self, device, self.wgmma) if self.units == "tc" else None


def gemm(g: Gemm, c: int, a: int, b: int, bias: int = 0, stream=None, *, sums: int = 0) -> None:
    """Plans and launches g on checked pointers: split-K where it pays (one plain product, no bias, no causal
    mode, no epilogue), each launch on its units' kernel (_product). sums (M,) += the row sums of op(A), for one
    product of A stored K x M: a linear layer's bias gradient, the column sums of dout, beside its dW = dout^T @
    inp; the wgmma kernel takes them from the dout it reads (split, k_splitk_reduce adds the slices' sums too),
    otherwise a column-sum pass over A after the product does."""
    if sums and not (g.trans_a and g.batch == 1 and g.causal == Causal.NONE):
        raise ValueError(f"sums: the row sums of op(A) are taken for one plain product of A stored K x M, not {g}")
    kernel = g.tc(device_of(stream))
    wg = kernel is not None and kernel[0].startswith("k_gemm_wg")
    if g.M == 0 or g.N == 0 or g.batch == 0:
        wg = False  # an empty product: nothing to write, and no pass over A to sum it in
    else:
        _split_k(g, kernel, c, a, b, bias, stream, sums if wg else 0, per_sm=1 if wg else 2)
    if sums and not wg and g.M > 0 and g.K > 0:
        with noting(stream, "the bias gradient: a column-sum pass over dout"):
            add_column_sums(sums, a, g.K, g.M, stream, g.lda)


def _split_k(g: Gemm, kernel, c: int, a: int, b: int, bias: int, stream, sums: int, per_sm: int) -> None:
    """gemm's product launches (kernel: g.tc's choice), split where it pays; sums: where the product adds op(A)'s
    row sums, or 0."""
    if max(g.grid[1:]) > 65535:  # CUDA's limit on a grid's y and z
        raise ValueError(f"M = {g.M} (at most {65535 * GEMM_TILE}) and batch = {g.batch} (at most 65535) must fit "
                         f"one grid")
    # (the wgmma kernel of A stored K x M cuts K itself, its parts added into C in order)
    plain = (g.batch == 1 and not bias and g.causal == Causal.NONE and g.ldc == g.N and g.epilogue is None
             and (kernel is None or kernel[0] != TN))
    sm_count = device_of(stream).sm_count
    splits = g.splits(sm_count, per_sm) if plain else 1
    if splits == 1:
        _product(g, c, a, b, bias, stream, sums)
        return
    k_slice = g.K // splits  # a slice of K is a block of A's and B's rows (or columns, transposed)
    sliced = dataclasses.replace(g, K=k_slice, batch=splits, beta=0.0,
                                 stride_a=k_slice * (g.lda if g.trans_a else 1),
                                 stride_b=k_slice * (1 if g.trans_b else g.ldb), stride_c=g.M * g.N)
    M_sums = g.M if sums else 0  # the slices' row sums follow their partial products: [splits][M]
    partials = scratch(splits * (g.M * g.N + M_sums), stream)
    p = int(partials.gpudata)
    tiles = g.grid[0] * g.grid[1]
    with noting(stream, f"split-K, {splits} slices of K = {g.K}: {tiles} tiles for {sm_count} SMs"):
        _product(sliced, p, a, b, 0, stream, p + 4 * splits * g.M * g.N if sums else 0)
        splitk_reduce(c, p, splits, g.M * g.N, g.beta, sums, M_sums, stream)


def _product(g: Gemm, c: int, a: int, b: int, bias: int, stream, sums: int = 0) -> None:
    """One unsplit launch of g (or its epilogue) on the kernel its units choose; sums: where the wgmma kernel adds
    op(A)'s row sums (A transposed), or 0."""
    device = device_of(stream)
    kernel = g.tc(device)
    if sums and (kernel is None or not kernel[0].startswith("k_gemm_wg") or not g.trans_a):
        raise ValueError(f"sums: only the wgmma kernel with A transposed takes row sums, not {kernel} for {g}")
    from_splits = kernel is not None and g.split is not False and split_operands(g, kernel)
    if g.epilogue is not None and not from_splits:
        raise ValueError(f"an epilogue reads a split B, which the wgmma kernel takes for a product of A stored M x K "
                         f"on sm_90a only, not {g}")
    if kernel is None:
        with noting(stream, tc_reason(g, kernel, device) if g.units == "tc" else ""):
            sgemm_launch(g, c, a, b, bias, stream)
    elif from_splits:
        ws, b_split, K_pad, grid = split_b_into_workspace(g, b, stream)  # noqa: F841 (held until queued)
        if g.epilogue is not None:
            g.epilogue(a, b_split, K_pad, grid)
        else:
            areg_launch(g, c, a, b_split, bias, K_pad, grid, stream)
    elif kernel[0] == TN:
        tn_launch(g, c, a, b, bias, sums, stream)
    else:
        tc_launch(g, kernel, c, a, b, bias, sums, stream, device)


def split_b_into_workspace(g: Gemm, b: int, stream):
    """op(B)^T of g split into TF32 hi and lo (tf32_split; B stored K x N transposed on the way) in the plan's
    workspace, or found split already (a weight, tf32_split.SplitOperands.reading); A is read as it lies and split in
    the product's registers: (the workspace, which the caller holds until its product is queued, or None, b_split,
    K_pad, the grid of 128 x 128 tiles)."""
    (M_pad, K_pad), (N_pad, _) = split_padding(g.M, g.K), split_padding(g.N, g.K)
    b_n = N_pad * K_pad  # floats of B's hi (and of its lo)
    ws, b_split = None, find_split(stream, b, g.N, g.K, g.ldb, not g.trans_b)
    if b_split is None:
        ws = workspace(2 * b_n, stream)
        b_split = int(ws.gpudata)
        tf32_split(b_split, b_split + 4 * b_n, b, g.N, g.K, g.ldb, K_pad, stream, transposed=not g.trans_b,
                   why="B into TF32 hi and lo")
    rows = int_constant("TC_SPLIT_ROWS")
    return ws, b_split, K_pad, (N_pad // rows, M_pad // rows)


def sgemm(c, a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias=None, stream=None, units="simt",
          wgmma=None, split=None):
    """c = alpha * op(a) @ op(b) + bias + beta * c, op(x) = x.T (the last two axes) where trans_x, on `units`
    (wgmma, split: as Gemm's). a, b, c are 2-D, or 3-D with a leading batch axis (all three)."""
    sa, sb = shape_of("a", a), shape_of("b", b)
    if len(sa) != len(sb) or len(sa) not in (2, 3):
        raise ValueError(f"a and b must both be 2-D or both 3-D (batched), got shapes {sa} and {sb}")
    batch = sa[0] if len(sa) == 3 else 1
    if len(sa) == 3 and sb[0] != batch:
        raise ValueError(f"b must have a's batch size {batch}, got {sb[0]}")
    M, K = (sa[-1], sa[-2]) if trans_a else (sa[-2], sa[-1])
    Kb, N = (sb[-1], sb[-2]) if trans_b else (sb[-2], sb[-1])
    if Kb != K:
        raise ValueError(f"op(a) is {M}x{K} but op(b) is {Kb}x{N}: inner dimensions differ")
    lead = (batch,) if len(sa) == 3 else ()
    g = Gemm.dense(M, N, K, trans_a=trans_a, trans_b=trans_b, batch=batch, alpha=alpha, beta=beta, units=units,
                   wgmma=wgmma, split=split)
    gemm(g, ptr("c", c, lead + (M, N)), ptr("a", a, sa), ptr("b", b, sb), opt_ptr("bias", bias, (N,)), stream)


def gemm_tc(g: Gemm, *args, **kw) -> None:
    """gemm() of g on the tensor cores: the name it had before the units were part of the description."""
    gemm(dataclasses.replace(g, units="tc"), *args, **kw)


def sgemm_tc(c, a, b, **kw) -> None:
    """sgemm() on the tensor cores (units="tc"): the name it had before."""
    sgemm(c, a, b, units="tc", **kw)


def _attn_dims(name, a):
    B, NH, T, d_k = head_dims(name, a)
    return B, NH, T, d_k, float(attn_scale(d_k, "float32"))  # 1.0f / sqrtf(d_k), as the literal kernel


class MatrixProducts:
    """The model's matrix products, the linear layers and attention's, on one units' gemm (a bias gradient being
    its dW product's sums): "simt" for the fast variant, "tc" for the tc variant. The attention products skip what
    the causal mask makes constant; they compute the reference stages for causal inputs (probs and the scores'
    gradient zero above the diagonal, as the pipeline makes them)."""

    OPS = ("matmul_fwd", "matmul_bwd", "causal_scores_fwd", "causal_scores_bwd", "attn_values_fwd",
           "attn_values_bwd")

    def __init__(self, units: str):
        self.units = units

    def dense(self, M, N, K, **kw) -> Gemm:
        return Gemm.dense(M, N, K, units=self.units, **kw)

    def launchers(self, variant: str) -> tuple:
        """The launchers of OPS as plain functions named <op>_<variant>, as the op table names a variant's."""
        out = []
        for op in self.OPS:
            method = getattr(self, op)

            def launcher(*args, method=method, **kw):
                return method(*args, **kw)
            functools.update_wrapper(launcher, method)
            launcher.__name__ = launcher.__qualname__ = f"{op}_{variant}"
            out.append(launcher)
        return tuple(out)

    def matmul_fwd(self, out, inp, weight, bias=None, *, stream=None):
        """As matmul_fwd: out = inp @ weight^T + bias; out's rows may be padded (checks.rows_ptr)."""
        shape = shape_of("inp", inp)
        N, IN = rows(shape)
        OUT = shape_of("weight", weight, 2)[0]
        (p_out, ldc), p_inp = rows_ptr("out", out, shape[:-1] + (OUT,)), ptr("inp", inp, shape)
        p_w, p_b = ptr("weight", weight, (OUT, IN)), opt_ptr("bias", bias, (OUT,))
        if ldc == OUT and fits(N, IN, OUT, False, stream):  # a few positions (a decode step): one pass over W
            matvec(p_out, p_inp, p_w, p_b, N, IN, OUT, stream)
        else:
            gemm(dataclasses.replace(self.dense(N, OUT, IN, trans_b=True), ldc=ldc), p_out, p_inp, p_w, p_b, stream)

    def matmul_bwd(self, dinp, dweight, dbias, dout, inp, weight, *, stream=None):
        """As matmul_bwd: dinp = dout @ W (written), dW += dout^T @ inp, dbias += column sums of dout (summed
        by the dW product from the dout it reads where its kernel can: the wgmma one); dout's rows may be padded."""
        shape = shape_of("inp", inp)
        N, IN = rows(shape)
        OUT = shape_of("weight", weight, 2)[0]
        p_dinp, p_dw = ptr("dinp", dinp, shape), ptr("dweight", dweight, (OUT, IN))
        p_db, (p_dout, lda) = opt_ptr("dbias", dbias, (OUT,)), rows_ptr("dout", dout, shape[:-1] + (OUT,))
        p_inp, p_w = ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN))
        gemm(dataclasses.replace(self.dense(N, IN, OUT), lda=lda), p_dinp, p_dout, p_w, stream=stream)
        gemm(dataclasses.replace(self.dense(OUT, IN, N, trans_a=True, beta=1.0), lda=lda), p_dw, p_dout, p_inp,
             stream=stream, sums=p_db)

    def causal_scores_fwd(self, masked, q, k, *, scores=None, stream=None):
        """As causal_scores_fwd, in one pass: masked[i][j] = dot(Q[i], K[j]) * (1/sqrt(d_k)) for j <= i and
        MASK_VALUE above the diagonal, whose tiles are never computed (so there are no scores to keep)."""
        if scores is not None:
            raise ValueError("scores: the fast variants write the masked scores directly and have no scores "
                             "before the mask to keep; pass scores=None")
        B, NH, T, d_k, scale = _attn_dims("q", q)
        hs = (B, NH, T, d_k)
        g = self.dense(T, T, d_k, trans_b=True, batch=B * NH, alpha=scale, causal=Causal.OUT_LOWER, fill=MASK_VALUE)
        gemm(g, ptr("masked", masked, (B, NH, T, T)), ptr("q", q, hs), ptr("k", k, hs), stream=stream)

    def causal_scores_bwd(self, dq, dk, dscores, q, k, *, stream=None):
        """As causal_scores_bwd, for a causal dscores (zero above the diagonal, as the softmax backward leaves
        it): dQ = dS @ K and dK = dS^T @ Q, both scaled, skipping the zero half."""
        B, NH, T, d_k, scale = _attn_dims("q", q)
        hs = (B, NH, T, d_k)
        p_ds = ptr("dscores", dscores, (B, NH, T, T))
        gemm(self.dense(T, d_k, T, batch=B * NH, alpha=scale, causal=Causal.A_LOWER), ptr("dq", dq, hs), p_ds,
             ptr("k", k, hs), stream=stream)
        gemm(self.dense(T, d_k, T, trans_a=True, batch=B * NH, alpha=scale, causal=Causal.A_UPPER),
             ptr("dk", dk, hs), p_ds, ptr("q", q, hs), stream=stream)

    def attn_values_fwd(self, out, probs, v, *, stream=None):
        """As attn_values_fwd, for causal probs: row i stops at j = i."""
        B, NH, T, d_k, _ = _attn_dims("v", v)
        hs = (B, NH, T, d_k)
        gemm(self.dense(T, d_k, T, batch=B * NH, causal=Causal.A_LOWER), ptr("out", out, hs),
             ptr("probs", probs, (B, NH, T, T)), ptr("v", v, hs), stream=stream)

    def attn_values_bwd(self, dprobs, dv, dout, probs, v, *, stream=None):
        """As attn_values_bwd for causal probs; dprobs is written 0 above the diagonal, where the softmax
        backward multiplies it by a probability of 0 anyway."""
        B, NH, T, d_k, _ = _attn_dims("v", v)
        hs = (B, NH, T, d_k)
        p_do, p_probs = ptr("dout", dout, hs), ptr("probs", probs, (B, NH, T, T))
        gemm(self.dense(T, T, d_k, trans_b=True, batch=B * NH, causal=Causal.OUT_LOWER, fill=0.0),
             ptr("dprobs", dprobs, (B, NH, T, T)), p_do, ptr("v", v, hs), stream=stream)
        gemm(self.dense(T, d_k, T, trans_a=True, batch=B * NH, causal=Causal.A_UPPER), ptr("dv", dv, hs),
             p_probs, p_do, stream=stream)


(matmul_fwd_fast, matmul_bwd_fast, causal_scores_fwd_fast, causal_scores_bwd_fast, attn_values_fwd_fast,
 attn_values_bwd_fast) = MatrixProducts("simt").launchers("fast")
(matmul_fwd_tc, matmul_bwd_tc, causal_scores_fwd_tc, causal_scores_bwd_tc, attn_values_fwd_tc,
 attn_values_bwd_tc) = MatrixProducts("tc").launchers("tc")
