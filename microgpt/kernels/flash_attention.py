"""Launchers of cuda/flash_attention.cuh: the tc variant's fused attention, flash attention on the tensor cores
at FP32 accuracy. The heads are read from the QKV projection's output and written where W_O reads them; the
saved state is y and one log-sum-exp a row. Where it cannot run as accurately or at all (d_k below 16 or above
128, T below 128, no TF32 tensor cores, too little shared memory for the kernels of that width, or more than
65535 heads or batch rows for its grid) the launch is the reference kernels', and the model's attention is the
fast pipeline."""
from __future__ import annotations

import functools
import math

from .attention import fused_attention_bwd, fused_attention_fwd, qkv_dims
from .checks import ptr
from .matmul_tc import tensor_cores, warpgroup_mma
from .runtime import blocks, device_of, launch, noting, scratch
from .source import int_constants

MAX_D_K = 128
# The shortest heads and sequences flash attention keeps within 1.5x the SIMT pipeline's error: its products over
# d_k (the scores) and over T (dQ, dK) are too short for 3xTF32 below them (docs/kernels/flash_attention.md)
MIN_D_K = 20
MIN_T = 128
GRID_YZ = 65535  # CUDA's limit on a grid's y and z: heads and batch rows, in these kernels' grids


def width(d_k: int) -> int:
    """d_k padded to the kernels' widths: 32, 64 or 128."""
    return 32 if d_k <= 32 else 64 if d_k <= 64 else 128


@functools.cache
def _sizes(D: int) -> dict:
    """Warps a block, the backward's key tiles a block and shared-memory bytes of the kernels of width D (enum
    FlashLaunch)."""
    c = int_constants()
    return dict(fwd_warps=c[f"FA_FWD_W{D}"], delta_warps=c["FA_DELTA_W"], bwd_warps=c[f"FA_BWD_W{D}"],
                bwd_tiles=c[f"FA_BWD_KT{D}"], keys=c["FA_KEYS_A_TILE"], pass_tiles=c["FA_PASS_TILES"],
                fwd=c[f"FA_FWD_BYTES{D}"], delta=c[f"FA_DELTA_BYTES{D}"], bwd=c[f"FA_BWD_BYTES{D}"],
                wg_rows=c["FA_FWD_WG_ROWS"], wg_threads=c["TC_WG_THREADS"], fwd_wg=c["FA_FWD_WG_BYTES"],
                bwd_wg=c["FA_BWD_WG_BYTES"], delta_wg=c["FA_DELTA_WG_BYTES"],
                delta_wg_threads=c["FA_DELTA_WG_BLOCK"])


def supported(d_k: int, T: int, device) -> bool:
    """Whether flash attention runs T positions of heads of d_k on `device` (an engine) within the accuracy bar."""
    if not MIN_D_K <= d_k <= MAX_D_K or T < MIN_T or not tensor_cores(device):
        return False
    s = _sizes(width(d_k))
    return max(s["fwd"], s["delta"], s["bwd"]) <= device.max_shared


def runs(B: int, n_head: int, d_k: int, T: int, device) -> bool:
    """Whether flash attention takes this launch on `device`: supported, and B and n_head within its grid's y and z."""
    return supported(d_k, T, device) and max(B, n_head) <= GRID_YZ


def reason(B: int, n_head: int, d_k: int, T: int, device) -> str:
    """Why flash attention does or does not take this launch on `device`."""
    if not tensor_cores(device):
        return "the reference kernels: no TF32 tensor cores before sm_80"
    if not MIN_D_K <= d_k <= MAX_D_K:
        return f"the reference kernels: d_k = {d_k} outside [{MIN_D_K}, {MAX_D_K}] (accuracy, shared memory)"
    if T < MIN_T:
        return f"the reference kernels: T = {T} < {MIN_T}, too short for 3xTF32 to keep the pipeline's error"
    if not runs(B, n_head, d_k, T, device):
        return "the reference kernels: too little shared memory, or more heads or rows than a grid holds"
    return f"flash attention, 3xTF32, d_k {d_k} in [{MIN_D_K}, {MAX_D_K}], T {T} >= {MIN_T}"


def fused_attention_fwd_tc(y, lse, qkv, n_head, *, stream=None):
    """fused_attention_fwd's y and lse, by flash attention: a block of query rows streams the key tiles up to the
    diagonal with an online softmax."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    device = device_of(stream)
    if not runs(B, n_head, d_k, T, device):
        with noting(stream, reason(B, n_head, d_k, T, device)):
            return fused_attention_fwd(y, lse, qkv, n_head, stream=stream)
    forward(y, lse, qkv, n_head, stream)


def forward(y, lse, qkv, n_head, stream, wgmma: bool | None = None):
    """fused_attention_fwd_tc's launch, where runs(): the wgmma kernel where on_wgmma(), elsewhere the mma.sync one,
    which wgmma=False asks for there too (tests and tools check both)."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    device = device_of(stream)
    D = width(d_k)
    s = _sizes(D)
    p_qkv = ptr("qkv", qkv, (B, T, 3 * C))
    args = [ptr("y", y, (B, T, C)), ptr("lse", lse, (B, n_head, T)), p_qkv, p_qkv + 4 * C, p_qkv + 8 * C, T, d_k,
            3 * C, C]
    why = reason(B, n_head, d_k, T, device)
    if on_wgmma(d_k, device) and wgmma is not False:
        launch("k_flash_fwd_wg_d64", args, (math.ceil(T / s["wg_rows"]), n_head, B), stream, shared=s["fwd_wg"],
               block=s["wg_threads"], why=f"{why}; on wgmma (sm_90a, d_k <= 64)")
    else:
        launch(f"k_flash_fwd_d{D}", args, (math.ceil(T / (16 * s["fwd_warps"])), n_head, B), stream,
               shared=s["fwd"], block=32 * s["fwd_warps"], why=why)


def on_wgmma(d_k: int, device) -> bool:
    """Whether flash attention of heads of d_k takes its wgmma kernels on `device`, where it runs: sm_90a, the width
    of 64 (the forward, the backward's pass over P and dP, and its kernel of dQ, dK and dV)."""
    s = _sizes(64)
    return warpgroup_mma(device) and width(d_k) == 64 and max(s["fwd_wg"], s["bwd_wg"],
                                                               s["delta_wg"]) <= device.max_shared


def fused_attention_bwd_tc(dqkv, dy, qkv, y, lse, n_head, *, stream=None):
    """fused_attention_bwd's dqkv, by flash attention: the delta kernels (a row's sum of p dp: by a pass over P and
    dP for the first query tiles, from dO * O for the rest; they also zero the counters and the ticket), then one
    kernel for dQ, dK and dV (a block of 64 keys for each 4 warps, from the ticket, against the query tiles from
    the last down to the diagonal, adding into dQ in the order of the key tiles behind a counter a query tile)."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    device = device_of(stream)
    with noting(stream, reason(B, n_head, d_k, T, device)):
        if not runs(B, n_head, d_k, T, device):
            return fused_attention_bwd(dqkv, dy, qkv, y, lse, n_head, stream=stream)
        backward(dqkv, dy, qkv, y, lse, n_head, stream)


def backward(dqkv, dy, qkv, y, lse, n_head, stream, delta_rows=None, wgmma: bool | None = None):
    """fused_attention_bwd_tc's launches, where runs(): delta_rows(p_delta, p_sync) first, which queues what writes
    delta of the rows past the pass kernel's query tiles and zeroes their counters (None: k_flash_bwd_delta_rows,
    a warp a (b, t) row, all heads; matmul_attention_tc has the product that makes dy do it), then the pass kernel
    (which reads dy) and the kernel of dQ, dK and dV: both on wgmma where on_wgmma(), unless wgmma=False."""
    B, T, C, d_k = qkv_dims(qkv, n_head)
    D = width(d_k)
    s = _sizes(D)
    p_dqkv, p_dy = ptr("dqkv", dqkv, (B, T, 3 * C)), ptr("dy", dy, (B, T, C))
    p_qkv, p_y, p_lse = ptr("qkv", qkv, (B, T, 3 * C)), ptr("y", y, (B, T, C)), ptr("lse", lse, (B, n_head, T))
    tiles = math.ceil(T / s["keys"])  # query tiles, and key tiles: a backward block takes bwd_tiles of them
    # held here until the launches are queued. sync: int32 in a float32 scratch of the same size, a counter for
    # each (b, h, query tile) and the ticket; uninitialised, as the delta kernels zero it before each backward
    delta, sync = scratch(B * n_head * T, stream), scratch(B * n_head * tiles + 1, stream)
    block = 32 * s["delta_warps"]
    q, k, v, dq, dk, dv = p_qkv, p_qkv + 4 * C, p_qkv + 8 * C, p_dqkv, p_dqkv + 4 * C, p_dqkv + 8 * C
    p_delta, p_sync = int(delta.gpudata), int(sync.gpudata)
    pass_tiles = min(tiles, s["pass_tiles"])  # delta from a pass over P and dP; the rows past them from dO * O
    rows = B * (T - pass_tiles * s["keys"])
    if delta_rows is not None:
        delta_rows(p_delta, p_sync)
    elif rows > 0:  # a warp each, all heads
        launch("k_flash_bwd_delta_rows", [p_delta, p_sync, p_y, p_dy, B, n_head, T, d_k, C], blocks(32 * rows), stream,
               why="delta of the rows past the pass's query tiles, from dO * O")
    args = [p_delta, p_sync, q, k, v, p_dy, p_lse, T, d_k, 3 * C, C]
    why = f"delta of the first {pass_tiles} query tiles, by a pass over P and dP"
    wg = on_wgmma(d_k, device_of(stream)) and wgmma is not False
    if wg:  # p and dp as the wgmma kernel recomputes them: a block the pass's query rows of a head
        launch("k_flash_bwd_delta_wg_d64", args, (1, n_head, B), stream, shared=s["delta_wg"],
               block=s["delta_wg_threads"], why=f"{why}; on wgmma, as the backward recomputes them")
    else:
        launch(f"k_flash_bwd_delta_d{D}", args, (pass_tiles, n_head, B), stream, shared=s["delta"], block=block,
               why=why)
    args = [dq, dk, dv, p_sync, q, k, v, p_dy, p_lse, p_delta, T, d_k, 3 * C, C]
    grid = (math.ceil(tiles / s["bwd_tiles"]), n_head, B)  # the wgmma kernel's blocks take as many key tiles
    why = "dQ, dK and dV: a block of key tiles against the query tiles down to the diagonal"
    if wg:
        launch("k_flash_bwd_wg_d64", args, grid, stream, shared=s["bwd_wg"], block=s["wg_threads"],
               why=f"{why}; on wgmma (sm_90a, d_k <= 64)")
    else:
        launch(f"k_flash_bwd_d{D}", args, grid, stream, shared=s["bwd"], block=32 * s["bwd_warps"], why=why)
