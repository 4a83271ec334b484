"""Launchers of cuda/flash_attention.cuh: the tc variant's fused attention, flash attention on the tensor cores
at FP32 accuracy. The heads are read from the QKV projection's output and written where W_O reads them; the
saved state is y and one log-sum-exp a row. Where it cannot run as accurately or at all (d_k below 16 or above
128, no TF32 tensor cores, too little shared memory for the kernels of that width) the launch is the reference
kernels', and the model's attention is the fast pipeline."""
from __future__ import annotations

import functools
import math

from .attention import fused_attention_args, fused_attention_bwd, fused_attention_fwd
from .checks import ptr
from .matmul_tc import tensor_cores
from .runtime import engine, launch, scratch
from .source import int_constants

MAX_D_K = 128
# Below this the product of the scores is too short for 3xTF32 to keep within 1.5x the SIMT pipeline's error (as
# matmul_tc.TC_MIN_K for the products): at d_k 5 and T = 77, dQ came out at 1.52x on the H200 (2026-12-01)
MIN_D_K = 16


def width(d_k: int) -> int:
    """d_k padded to the kernels' widths: 32, 64 or 128."""
    return 32 if d_k <= 32 else 64 if d_k <= 64 else 128


@functools.cache
def _sizes(D: int) -> dict:
    """Warps a block and shared-memory bytes of the kernels of width D (enum FlashLaunch)."""
    c = int_constants()
    return dict(fwd_warps=c[f"FA_FWD_W{D}"], bwd_warps=c["FA_BWD_W"], fwd=c[f"FA_FWD_BYTES{D}"],
                dq=c[f"FA_DQ_BYTES{D}"], dkdv=c[f"FA_DKDV_BYTES{D}"])


def supported(d_k: int) -> bool:
    """Whether flash attention runs heads of d_k on this device."""
    if not MIN_D_K <= d_k <= MAX_D_K or not tensor_cores():
        return False
    s = _sizes(width(d_k))
    return max(s["fwd"], s["dq"], s["dkdv"]) <= engine().max_shared


def fused_attention_fwd_tc(y, lse, qkv, n_head, *, stream=None):
    """fused_attention_fwd's y and lse, by flash attention: a block of query rows streams the key tiles up to the
    diagonal with an online softmax."""
    B, T, C, d_k = fused_attention_args(qkv, n_head)
    if not supported(d_k):
        return fused_attention_fwd(y, lse, qkv, n_head, stream=stream)
    D = width(d_k)
    s = _sizes(D)
    p_qkv = ptr("qkv", qkv, (B, T, 3 * C))
    args = [ptr("y", y, (B, T, C)), ptr("lse", lse, (B, n_head, T)), p_qkv, p_qkv + 4 * C, p_qkv + 8 * C, T, d_k,
            3 * C, C]
    launch(f"k_flash_fwd_d{D}", args, (math.ceil(T / (16 * s["fwd_warps"])), n_head, B), stream, shared=s["fwd"],
           block=32 * s["fwd_warps"])


def fused_attention_bwd_tc(dqkv, dy, qkv, y, lse, n_head, *, stream=None):
    """fused_attention_bwd's dqkv, by flash attention: dQ's kernel (a block of query rows against the key tiles,
    writing delta) then dK/dV's (a block of keys against the query tiles from the diagonal on)."""
    B, T, C, d_k = fused_attention_args(qkv, n_head)
    if not supported(d_k):
        return fused_attention_bwd(dqkv, dy, qkv, y, lse, n_head, stream=stream)
    D = width(d_k)
    s = _sizes(D)
    p_dqkv, p_dy = ptr("dqkv", dqkv, (B, T, 3 * C)), ptr("dy", dy, (B, T, C))
    p_qkv, p_y, p_lse = ptr("qkv", qkv, (B, T, 3 * C)), ptr("y", y, (B, T, C)), ptr("lse", lse, (B, n_head, T))
    delta = scratch(B * n_head * T)  # held here until both launches are queued
    grid, block = (math.ceil(T / (16 * s["bwd_warps"])), n_head, B), 32 * s["bwd_warps"]
    q, k, v, dq, dk, dv = p_qkv, p_qkv + 4 * C, p_qkv + 8 * C, p_dqkv, p_dqkv + 4 * C, p_dqkv + 8 * C
    launch(f"k_flash_bwd_dq_d{D}", [dq, int(delta.gpudata), q, k, v, p_y, p_dy, p_lse, T, d_k, 3 * C, C], grid,
           stream, shared=s["dq"], block=block)
    launch(f"k_flash_bwd_dkdv_d{D}", [dk, dv, q, k, v, p_dy, p_lse, int(delta.gpudata), T, d_k, 3 * C, C], grid,
           stream, shared=s["dkdv"], block=block)
