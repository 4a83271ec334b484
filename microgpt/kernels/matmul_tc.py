"""Launchers of cuda/matmul_tc.cuh: the model's matrix products on the tensor cores at FP32 accuracy (3xTF32).

The same products as matmul_fast (MatrixProducts over a gemm), through the same Gemm description, causal
tile skipping and deterministic split-K; only the unsplit launch differs, and, on sm_90a, where a linear
layer's bias gradient is summed: in its dW product, by the wgmma kernel from the dout it reads (split-K's reduce
adding the slices' sums), not by a column-sum pass of its own. On sm_90a a single product of A stored M x K (the
linear layers' forwards and dX products) runs from operands split into TF32 hi and lo by a pass before it
(split_product), the same bits faster. Where the device has no TF32 tensor cores (before sm_80), and for
products with K < TC_MIN_K, the launch is the SIMT SGEMM's: the variant runs everywhere, and never less
accurately than 1.5x the SIMT kernel.
"""
from __future__ import annotations

import functools
import math

from .matmul_fast import Causal, Gemm, MatrixProducts, gemm, sgemm, sgemm_product
from .runtime import BLOCK, engine, launch, noting, sm_version, workspace
from .source import int_constant
from .tf32_split import SplitOperands, find_split, split_padding, tf32_split

# Below this K the split's rounding and the tensor cores' truncating sum within a slice outweigh the FP32
# sum's rounding, and their error can pass 1.5x the SIMT kernel's (dev/NOTES.md: mma.sync's ratio is 3.3 at
# K = 1, 1.3 at 16, 1.0 at 32; shapes of a few outputs at K = 32 failed the bar on the wgmma and mma.sync
# kernels alike): such products run on SIMT (attention's scores, K = d_k, take the same time either way).
TC_MIN_K = 128
# The wgmma kernel sums four k8 steps (32 of K) in the tensor cores before each FP32 add, the mma.sync one
# one. Over 40 fresh inputs (H200, 2026-11-30, dev/matmul_tc.py --wg-short-k) its worst error over the SIMT
# kernel's was 1.28 at K = 128 and 0.91 at 256 for 64 x 130 outputs, but 1.6 to 2.4 up to K = 512 for 5 x 3
# (mma.sync: 1.08 at most): on few outputs the longer tensor-core sums show. So the wgmma kernel takes the
# products of at least WG_MIN_K of K and WG_MIN_OUTPUTS outputs (a 128 x 128 tile's), mma.sync the rest.
WG_MIN_K = 256
WG_MIN_OUTPUTS = 128 * 128

def tensor_cores() -> bool:
    """Whether this device runs mma.sync TF32 (compute capability 8.0 and later: sm_80, sm_90a, sm_100, ...)."""
    return sm_version() >= 80


def warpgroup_mma() -> bool:
    """Whether the module is built for sm_90a, whose wgmma path (k_gemm_wg_*) is the faster one."""
    return engine().arch == "sm_90a"


def tc_kernel(g: Gemm, wgmma: bool | None = None) -> tuple[str, int, int] | None:
    """The kernel that runs g on this device, its shared memory and its threads a block; None where the SIMT
    SGEMM runs it (no tensor cores, or K too short for them to be as accurate). On sm_90a the wgmma one for
    products of at least WG_MIN_K and WG_MIN_OUTPUTS (wgmma=False asks for the mma.sync one, which tests and
    tools also check there; wgmma=True for the wgmma one at any size, to measure it), the mma.sync one
    otherwise; either for the 128 x 128 tile or the 128 x 64 one (_n64)."""
    if g.K < TC_MIN_K or not tensor_cores():
        return None
    ops = ("t" if g.trans_a else "n") + ("t" if g.trans_b else "n") + ("_n64" if g.tile_n == 64 else "")
    large = g.K >= WG_MIN_K and g.M * g.N * g.batch >= WG_MIN_OUTPUTS
    if warpgroup_mma() and (wgmma or (wgmma is None and large)):
        return f"k_gemm_wg_{ops}", int_constant("TC_WG_SMEM_BYTES"), int_constant("TC_WG_THREADS")
    return f"k_gemm_tc_{ops}", int_constant("TC_SMEM_BYTES"), BLOCK


def tc_reason(g: Gemm, kernel: tuple[str, int, int] | None) -> str:
    """Why tc_kernel chose `kernel` for g."""
    if kernel is None:
        return (f"SIMT: K = {g.K} < TC_MIN_K = {TC_MIN_K}, too short for 3xTF32 to keep the SIMT error"
                if tensor_cores() else "SIMT: no TF32 tensor cores before sm_80")
    if kernel[0].startswith("k_gemm_wg"):
        return "3xTF32 wgmma (sm_90a)"
    small = (f"K = {g.K} < WG_MIN_K = {WG_MIN_K}" if g.K < WG_MIN_K else
             f"{g.M * g.N * g.batch} outputs < WG_MIN_OUTPUTS" if g.M * g.N * g.batch < WG_MIN_OUTPUTS else "asked for")
    return f"3xTF32 mma.sync ({small if warpgroup_mma() else 'no wgmma before sm_90a'})"


def split_operands(g: Gemm, kernel: tuple[str, int, int] | None) -> bool:
    """Whether g, where tc_kernel chose the wgmma kernel, runs from split operands instead (split_product): one
    product (no batch, no causal skipping) of A stored M x K, on the 128 x 128 tile. The dW products (A
    transposed; the wgmma kernel's producer sums their bias gradients) and attention's batches keep the wgmma
    kernel."""
    return (kernel is not None and kernel[0].startswith("k_gemm_wg") and g.batch == 1 and not g.trans_a
            and g.causal == Causal.NONE and g.tile_n == 128 and math.ceil(g.N / 128) * 4 <= 65535)  # split_t's grid


def split_into_workspace(g: Gemm, a: int, b: int, stream):
    """op(A) and op(B)^T of g split into TF32 hi and lo (tf32_split; B stored K x N transposed on the way) in the
    plan's workspace, or op(B)^T's found split already (a weight, tf32_split.SplitOperands.reading): (the workspace,
    which the caller holds until its product is queued, a_split, b_split, K_pad, the grid of 128 x 128 tiles)."""
    (M_pad, K_pad), (N_pad, _) = split_padding(g.M, g.K), split_padding(g.N, g.K)
    a_n, b_n = M_pad * K_pad, N_pad * K_pad  # floats of each operand's hi (and of its lo)
    b_split = find_split(stream, b, g.N, g.K, g.ldb, not g.trans_b)
    ws = workspace(2 * (a_n + (b_n if b_split is None else 0)), stream)
    a_split = int(ws.gpudata)
    tf32_split(a_split, a_split + 4 * a_n, a, g.M, g.K, g.lda, K_pad, stream, why="A into TF32 hi and lo")
    if b_split is None:
        b_split = a_split + 8 * a_n
        tf32_split(b_split, b_split + 4 * b_n, b, g.N, g.K, g.ldb, K_pad, stream, transposed=not g.trans_b,
                   why="B into TF32 hi and lo")
    rows = int_constant("TC_SPLIT_ROWS")
    return ws, a_split, b_split, K_pad, (N_pad // rows, M_pad // rows)


def weight_splits(weights, transposed: bool, new=None) -> SplitOperands:
    """The weights (device arrays, each OUT x IN as a linear layer's) as the products from split operands may read
    them once split (tf32_split.SplitOperands): as the forward does (out = inp @ W^T) or, transposed, as the dX
    product does (dinp = dout @ W). Only those the products recorded inside reading(plan) find are split."""
    return SplitOperands([(int(w.gpudata), w.shape[1], w.shape[0], w.shape[1], True) if transposed else
                          (int(w.gpudata), w.shape[0], w.shape[1], w.shape[1], False) for w in weights], new)


def split_product(g: Gemm, c: int, a: int, b: int, bias: int, stream) -> None:
    """g from split operands (split_into_workspace), by k_gemm_wg_split, which only copies them: the wgmma
    kernel's bits."""
    ws, a_split, b_split, K_pad, grid = split_into_workspace(g, a, b, stream)  # noqa: F841 (held until queued)
    launch("k_gemm_wg_split", [c, a_split, b_split, bias, g.M, g.N, K_pad, g.ldc, float(g.alpha), float(g.beta)],
           grid, stream, why="3xTF32 wgmma from split operands (one product of A stored M x K, sm_90a)", shared=int_constant("TC_SPLIT_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"))


def tc_product(g: Gemm, c: int, a: int, b: int, bias: int, stream, wgmma: bool | None = None, sums: int = 0,
               split: bool | None = None) -> None:
    """One unsplit launch of g on the kernel tc_kernel chooses, from split operands where split_operands allows
    (split=False: never, to measure or check the wgmma kernel); the tile and grid are the SGEMM's. sums: where the
    wgmma kernel adds op(A)'s row sums (A transposed; gemm_tc gives them to no other kernel)."""
    kernel = tc_kernel(g, wgmma)
    if sums and (kernel is None or not kernel[0].startswith("k_gemm_wg") or not g.trans_a):
        raise ValueError(f"sums: only the wgmma kernel with A transposed takes row sums, not {kernel} for {g}")
    if kernel is None:
        with noting(stream, tc_reason(g, kernel)):
            sgemm_product(g, c, a, b, bias, stream)
        return
    if split is not False and split_operands(g, kernel):
        split_product(g, c, a, b, bias, stream)
        return
    name, shared, threads = kernel
    launch(name, g.args(c, a, b, bias, sums), g.grid, stream, shared=shared, block=threads,
           why=tc_reason(g, kernel) + (", the bias gradient summed from the dout it reads" if sums else ""))


def gemm_tc(g: Gemm, c: int, a: int, b: int, bias: int = 0, stream=None, *, sums: int = 0,
            wgmma: bool | None = None, split: bool | None = None) -> None:
    """As matmul_fast.gemm, on the tensor cores (wgmma: as tc_kernel; split: as tc_product). The wgmma kernels hold
    one block per SM, which split-K counts, and the wgmma kernel sums a transposed A's rows as it splits them (a
    dW product's bias gradient: no pass over dout of its own); its split-K slices' sums stay on the wgmma kernel,
    as K / splits >= WG_MIN_K."""
    kernel = tc_kernel(g, wgmma)
    wg = kernel is not None and kernel[0].startswith("k_gemm_wg")
    gemm(g, c, a, b, bias, stream, sums=sums, product=functools.partial(tc_product, wgmma=wgmma, split=split),
         per_sm=1 if wg else 2, product_sums=wg)


def sgemm_tc(c, a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias=None, stream=None, wgmma=None,
             split=None):
    """As matmul_fast.sgemm, on the tensor cores: c = alpha * op(a) @ op(b) + bias + beta * c (wgmma: as
    tc_kernel; split: as tc_product)."""
    sgemm(c, a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, bias=bias, stream=stream,
          gemm=functools.partial(gemm_tc, wgmma=wgmma, split=split))


(matmul_fwd_tc, matmul_bwd_tc, causal_scores_fwd_tc, causal_scores_bwd_tc, attn_values_fwd_tc,
 attn_values_bwd_tc) = MatrixProducts(gemm_tc).launchers("tc", __name__)
