"""Launchers of cuda/matmul_tc.cuh: one launch of a product (microgpt.kernels.products plans it) on the tensor cores at
FP32 accuracy (3xTF32), and the choice of its kernel.

tc_kernel chooses: the wgmma kernel on sm_90a for products long and large enough, mma.sync elsewhere from sm_80,
and None (the SIMT SGEMM) before sm_80 or for K < TC_MIN_K, so that the tc variant runs everywhere and never less
accurately than 1.5x the SIMT kernel. On sm_90a the wgmma kernels of 128 x 128 tiles split A in registers as they
read it: a single product of A stored M x K reads B split into TF32 hi and lo beforehand (split_operands,
areg_launch: k_gemm_wg_areg), a dW product (A stored K x M, B stored K x N) has its producer split B
(k_gemm_wg_areg_tn, tn_launch: on a block an SM, one product's K cut into parts added in order); the wgmma kernel
sums a linear layer's bias gradient from the dout its dW product reads.
"""
from __future__ import annotations

import math

from .matmul_fast import Causal
from .runtime import BLOCK, counters, device_of, launch, sm_version, tensor_map
from .source import int_constant

# Below this K the split's rounding and the tensor cores' truncating sums outweigh the FP32 sum's rounding, and
# the error can pass 1.5x the SIMT kernel's: such products run on SIMT (docs/kernels/matmul_tc.md).
TC_MIN_K = 128
# The wgmma kernel sums 32 of K in the tensor cores before each FP32 add (mma.sync: 8), which shows on short, small
# products: it takes those of at least WG_MIN_K of K and WG_MIN_OUTPUTS outputs (a 128 x 128 tile's), mma.sync the rest.
WG_MIN_K = 256
WG_MIN_OUTPUTS = 128 * 128
# Products of A stored K x M and B stored K x N run on a block an SM; one product's tiles have their K cut into parts
# that the blocks take in turn and add into C in order (tn_parts), a part costing about this many slices of K (32)
# more than its own, for its store and the next part's start (docs/kernels/matmul_tc.md fits it from the dev bench).
TN = "k_gemm_wg_areg_tn"
TN_STORE_SLICES = 4

def tensor_cores(device) -> bool:
    """Whether `device` (an engine) runs mma.sync TF32 (compute capability 8.0 on: sm_80, sm_90a, sm_100, ...)."""
    return sm_version(device) >= 80


def warpgroup_mma(device) -> bool:
    """Whether `device`'s module is built for sm_90a, whose wgmma path (k_gemm_wg_*) is the faster one."""
    return device.arch == "sm_90a"


def tc_kernel(g, device, wgmma: bool | None = None) -> tuple[str, int, int] | None:
    """The kernel that runs g on `device` (an engine), its shared memory and its threads a block; None where the SIMT
    SGEMM runs it (no tensor cores, or K too short for them to be as accurate). On sm_90a the wgmma one for
    products of at least WG_MIN_K and WG_MIN_OUTPUTS (wgmma=False asks for the mma.sync one, which tests and
    tools also check there; wgmma=True for the wgmma one at any size, to measure it), the mma.sync one
    otherwise; either for the 128 x 128 tile or the 128 x 64 one (_n64); for A stored K x M and B stored K x N on the
    128 x 128 tile, the wgmma kernel that splits A in registers (k_gemm_wg_areg_tn)."""
    if g.K < TC_MIN_K or not tensor_cores(device):
        return None
    ops = ("t" if g.trans_a else "n") + ("t" if g.trans_b else "n") + ("_n64" if g.tile_n == 64 else "")
    large = g.K >= WG_MIN_K and g.M * g.N * g.batch >= WG_MIN_OUTPUTS
    if warpgroup_mma(device) and (wgmma or (wgmma is None and large)):
        if ops == "tn":  # a dW product (or attention's dK, dV at d_k 128): A split in registers, B by the producer
            return TN, int_constant("TC_AREG_TN_SMEM_BYTES"), int_constant("TC_WG_THREADS")
        return f"k_gemm_wg_{ops}", int_constant("TC_WG_SMEM_BYTES"), int_constant("TC_WG_THREADS")
    return f"k_gemm_tc_{ops}", int_constant("TC_SMEM_BYTES"), BLOCK


def tc_reason(g, kernel: tuple[str, int, int] | None, device) -> str:
    """Why tc_kernel chose `kernel` for g on `device`."""
    if kernel is None:
        return (f"SIMT: K = {g.K} < TC_MIN_K = {TC_MIN_K}, too short for 3xTF32 to keep the SIMT error"
                if tensor_cores(device) else "SIMT: no TF32 tensor cores before sm_80")
    if kernel[0] == TN:
        return "3xTF32 wgmma, A split in registers, B by the producer (sm_90a)"
    if kernel[0].startswith("k_gemm_wg"):
        return "3xTF32 wgmma (sm_90a)"
    small = (f"K = {g.K} < WG_MIN_K = {WG_MIN_K}" if g.K < WG_MIN_K else
             f"{g.M * g.N * g.batch} outputs < WG_MIN_OUTPUTS" if g.M * g.N * g.batch < WG_MIN_OUTPUTS else "asked for")
    return f"3xTF32 mma.sync ({small if warpgroup_mma(device) else 'no wgmma before sm_90a'})"


def split_operands(g, kernel: tuple[str, int, int] | None) -> bool:
    """Whether g, where tc_kernel chose the wgmma kernel, runs with B split beforehand instead (areg_launch): one
    product (no batch, no causal skipping) of A stored M x K, on the 128 x 128 tile. The dW products (A
    transposed: k_gemm_wg_areg_tn, which sums their bias gradients) and attention's batches keep tc_kernel's
    choice."""
    return (kernel is not None and kernel[0].startswith("k_gemm_wg") and g.batch == 1 and not g.trans_a
            and g.causal == Causal.NONE and g.tile_n == 128 and math.ceil(g.N / 128) * 4 <= 65535)  # split_t's grid


def a_tensor_map(g, a: int, stream) -> int:
    """For a kernel on wg_areg_tiles: a tensor map over g's A at address a (M x K, lda) in boxes of one raw slice, by
    which the TMA copies A's slices; 0 where it cannot read A so (the kernel's threads then copy them by cp.async)."""
    return tensor_map(a, g.M, g.K, g.lda, int_constant("TC_A_BOX_COLS"), int_constant("TC_A_BOX_ROWS"), stream)


def areg_launch(g, c: int, a: int, b_split: int, bias: int, K_pad: int, grid, stream) -> None:
    """g (a products.Gemm) from A as it lies and B split into TF32 hi and lo (products.split_b_into_workspace), by
    k_gemm_wg_areg, whose consumers split A in registers: the wgmma kernel's bits with no pass splitting A. Its
    grid's tiles (grid: 128 x 128 tiles across, down) go to min(tiles, sm_count) blocks, each taking every
    blocks-th tile, so that a block copies its next tile's first slices while it stores the last one's; which block
    takes a tile changes no bit."""
    tiles = grid[0] * grid[1]
    blocks = min(tiles, device_of(stream).sm_count)
    a_map = a_tensor_map(g, a, stream)
    copies = "by the TMA" if a_map else "by cp.async (unaligned, or smaller than a box)"
    launch("k_gemm_wg_areg", [c, a, a_map, b_split, bias, g.M, g.N, g.K, g.lda, K_pad, g.ldc, float(g.alpha),
                              float(g.beta)],
           blocks, stream, why=f"3xTF32 wgmma, A split in registers, B beforehand (one product of A stored M x K, "
                               f"sm_90a); A {copies}; {tiles} tiles over {blocks} blocks",
           shared=int_constant("TC_AREG_STORE_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"))


def tc_launch(g, kernel: tuple[str, int, int], c: int, a: int, b: int, bias: int, sums: int, stream, device) -> None:
    """One unsplit launch of g on `kernel` (tc_kernel's choice for `device`); sums: where the wgmma kernel adds op(A)'s
    row sums, or 0; the tile and grid are the SGEMM's."""
    name, shared, threads = kernel
    launch(name, g.args(c, a, b, bias, sums), g.grid, stream, shared=shared, block=threads,
           why=tc_reason(g, kernel, device) + (", the bias gradient summed from the dout it reads" if sums else ""))


def tn_parts(g, sm_count: int) -> int:
    """How many parts k_gemm_wg_areg_tn cuts each tile's K into: one for batches and causal products; for one
    product, of 1 .. ceil(K / 32) / 8 (parts of 256 of K at least), the count whose busiest block ends soonest,
    sm_count blocks taking the tiles' parts in turn, a part costing its slices of 32 and TN_STORE_SLICES more; the
    fewest where that ties."""
    if g.batch != 1 or g.causal != Causal.NONE:
        return 1
    tiles = math.ceil(g.M / 128) * math.ceil(g.N / 128)
    slices = math.ceil(g.K / 32)

    def busiest(parts):
        return math.ceil(tiles * parts / sm_count) * (math.ceil(slices / parts) + TN_STORE_SLICES)
    return min(range(1, max(1, slices // 8) + 1), key=lambda parts: (busiest(parts), parts))


def tn_launch(g, c: int, a: int, b: int, bias: int, sums: int, stream) -> None:
    """g (A stored K x M, B stored K x N) on k_gemm_wg_areg_tn: its products' tiles (each K in tn_parts parts) taken in
    turn by a block an SM (at most), each part added into C (and sums, op(A)'s row sums, where not 0) after the one
    before it, so that the bits repeat for a given count of SMs; its flags zeroed once, the kernel leaving them
    zero."""
    sm_count = device_of(stream).sm_count
    tiles = math.ceil(g.M / 128) * math.ceil(g.N / 128) * g.batch
    parts = tn_parts(g, sm_count)
    blocks = min(tiles * parts, sm_count)
    flags = counters(2 * tiles, stream) if parts > 1 else None  # held by the plan, or until queued
    launch(TN, g.args(c, a, b, bias, sums) + [g.batch, parts, 0 if flags is None else flags.gpudata], blocks, stream,
           shared=int_constant("TC_AREG_TN_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"),
           why=f"{tc_reason(g, (TN,), device_of(stream))}; {tiles} tiles"
               + (f" x {parts} parts of K = {g.K}, added into C in order," if parts > 1 else "")
               + f" over {blocks} blocks" + (", the bias gradient summed from the dout it reads" if sums else ""))
