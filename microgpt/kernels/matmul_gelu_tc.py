"""Launchers of cuda/matmul_gelu_tc.cuh: mlp.proj's backward into GELU's on the tensor cores (sm_90a), the dX product
writing the pre-activation's gradient (dout @ W) * gelu'(pre) itself: the GELU output's gradient is never stored or
read back, and the GELU backward has no pass of its own. The same bits as the tc variant's matmul_bwd, then the fast
GELU backward, which run where the kernel does not apply."""
from __future__ import annotations

import dataclasses

from .matmul_tc import a_tensor_map, split_operands, tc_kernel
from .pointwise import matmul_gelu_bwd_args, matmul_then_gelu_bwd
from .pointwise_fast import gelu_bwd_fast
from .products import Gemm, gemm, matmul_bwd_tc
from .runtime import device_of, launch, noting
from .source import int_constant

# the same ops unfused: where the kernel does not apply, and beside it in the profile
unfused = matmul_then_gelu_bwd(matmul_bwd_tc, gelu_bwd_fast, "matmul_gelu_bwd_tc_unfused")


def fuses(g: Gemm, device, dpre: int, pre: int) -> bool:
    """Whether the dX product g (N x IN, K = OUT) runs with the GELU backward in its epilogue on `device` (an engine):
    where the product apart would run with B split beforehand and K whole (split_operands: sm_90a, a product the
    wgmma kernel takes; no split-K, whose slices' sum would round otherwise), and the bulk copies can read pre's rows
    and write dpre's (16-byte aligned, IN a multiple of 4)."""
    return (split_operands(g, tc_kernel(g, device)) and g.splits(device.sm_count, 1) == 1 and g.N % 4 == 0
            and g.ldc % 4 == 0 and dpre % 16 == 0 and pre % 16 == 0)


def matmul_gelu_bwd_tc(dpre, dweight, dbias, dout, act, pre, weight, *, stream=None):
    """As matmul_gelu_bwd: where fuses(), dpre = (dout @ weight) * gelu'(pre) by k_gemm_wg_areg_gelu_bwd (dout split
    in registers, the weight beforehand) on k_gemm_wg_areg's grid; then the dW product (its bias gradient summed by
    the wgmma kernel) as in matmul_bwd. Otherwise the two ops one after the other."""
    N, IN, OUT, p = matmul_gelu_bwd_args(dpre, dweight, dbias, dout, act, pre, weight)
    g, device = Gemm.dense(N, IN, OUT, units="tc"), device_of(stream)
    if not fuses(g, device, p["dpre"], p["pre"]):
        with noting(stream, "unfused: not a product the wgmma kernel takes with B split beforehand and K whole, or "
                            "rows the bulk copies cannot read and write"):
            unfused(dpre, dweight, dbias, dout, act, pre, weight, stream=stream)
        return

    def gelu_epilogue(a, b_split, K_pad, grid):
        tiles = grid[0] * grid[1]
        blocks = min(tiles, device.sm_count)
        launch("k_gemm_wg_areg_gelu_bwd", [p["dpre"], a, a_tensor_map(g, a, stream), b_split, p["pre"], g.M, g.N, g.K,
                                           g.lda, K_pad, g.ldc],
               blocks, stream, shared=int_constant("TC_AREG_GELU_SMEM_BYTES"), block=int_constant("TC_WG_THREADS"),
               why=f"fused: the dX product times gelu'(pre), pre's tile copied in while the tile's products run; "
                   f"{tiles} tiles over {blocks} blocks")
    gemm(dataclasses.replace(g, epilogue=gelu_epilogue), 0, p["dout"], p["weight"], stream=stream)
    gemm(Gemm.dense(OUT, IN, N, trans_a=True, beta=1.0, units="tc"), p["dweight"], p["dout"], p["act"], stream=stream,
         sums=p["dbias"])
