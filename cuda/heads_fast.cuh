// Fast head split and merge: each is a set of (T, d_k) matrices copied between row strides, per head (b, h)
// rows t of d_k floats, d_k apart on the heads side (B, NH, T, d_k) and 3C or C apart on the (B, T, 3C) /
// (B, T, C) side. 16 bytes at a time where d_k % 4 == 0 and the arrays are aligned (one float at a time
// otherwise). The split: a block copies tiles of one matrix's rows, MB_UNROLL rows a thread in flight, every load
// before its stores; each thread finds its column once, where the reference kernels divide their 64-bit index by
// d_k, T and NH for every element. The merge: a block a (B, T, C) row, a thread a chunk of it, evict-first both
// ways. The copies are the reference kernels' bits: checked bit-identical on the H200, where at andrea-120m's
// shapes (B=8, T=1024, 12 heads of 64) split_heads took 0.0677 -> 0.0413 ms forward and 0.1353 -> 0.0420
// backward, merge_heads 0.0369 -> 0.0154 and 0.0483 -> 0.0152 (in the split's form).
//
// Grid of the split: (matrices, tiles of rows), blockIdx.x the matrix and blockIdx.y the tile, both looped over
// (so any grid covers everything; the y dimension stops at 65535). At least four blocks an SM (64 registers).
#pragma once
#include "rows_fast.cuh"  // load_vec, store_vec, all_aligned16, MB_UNROLL

// The block's tiles of the matrix: w chunks of VEC floats a row, the block's threads side by side along the
// rows, blockDim / w rows a pass (one row and a loop along it where w > blockDim), MB_UNROLL passes in flight.
// Each thread finds its column once, not per element.
template <int VEC>
__device__ __forceinline__ void copy_rows(float* dst, long long dst_stride, const float* src, long long src_stride,
                                          int rows, int w) {
    const int per = max(1, (int)blockDim.x / w);
    const int r_in = threadIdx.x / w;  // 0 where w > blockDim
    if (r_in >= per) return;           // past the last whole row of a pass
    const int first_col = threadIdx.x - r_in * w;
    const long long tile = (long long)per * MB_UNROLL;
    for (long long r0 = blockIdx.y * tile + r_in; r0 < rows; r0 += gridDim.y * tile)
        for (int j = first_col; j < w; j += blockDim.x) {
            const float* s = src + r0 * src_stride + j * VEC;
            float* d = dst + r0 * dst_stride + j * VEC;
            float v[MB_UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++)
                if (r0 + u * per < rows) load_vec<VEC>(v[u], s + u * per * src_stride);
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++)
                if (r0 + u * per < rows) store_vec<VEC>(d + u * per * dst_stride, v[u]);
        }
}

// one (T, d_k) matrix: 16-byte chunks where d_k % 4 == 0 and the arrays are aligned (then every row is)
__device__ __forceinline__ void copy_head(float* dst, long long dst_stride, const float* src, long long src_stride,
                                          int T, int d_k, bool vec) {
    if (vec)
        copy_rows<4>(dst, dst_stride, src, src_stride, T, d_k / 4);
    else
        copy_rows<1>(dst, dst_stride, src, src_stride, T, d_k);
}

// Grid: (3 * B * NH, min(ceil(T / rows_per_tile), 65535)); rows_per_tile = MB_UNROLL * max(1, 256 / w),
// w = d_k / 4 (d_k % 4 == 0) or d_k. Matrix m = (which * B + b) * NH + h: q, k or v of head (b, h).
extern "C" __global__ void __launch_bounds__(256, 4)
    k_split_heads_fwd_fast(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int d_k) {
    const int C = NH * d_k, BH = B * NH;
    const bool vec = d_k % 4 == 0 && all_aligned16(q, k, v, qkv);
    for (long long m = blockIdx.x; m < 3 * BH; m += gridDim.x) {
        const int which = m / BH, bh = m % BH, b = bh / NH, h = bh % NH;
        float* dst = (which == 0 ? q : which == 1 ? k : v) + (long long)bh * T * d_k;
        const float* src = qkv + (long long)b * T * 3 * C + which * C + h * d_k;
        copy_head(dst, d_k, src, 3 * C, T, d_k, vec);
    }
}

// Grid: as k_split_heads_fwd_fast.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_split_heads_bwd_fast(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T, int NH,
                         int d_k) {
    const int C = NH * d_k, BH = B * NH;
    const bool vec = d_k % 4 == 0 && all_aligned16(dqkv, dq, dk, dv);
    for (long long m = blockIdx.x; m < 3 * BH; m += gridDim.x) {
        const int which = m / BH, bh = m % BH, b = bh / NH, h = bh % NH;
        const float* src = (which == 0 ? dq : which == 1 ? dk : dv) + (long long)bh * T * d_k;
        float* dst = dqkv + (long long)b * T * 3 * C + which * C + h * d_k;
        copy_head(dst, 3 * C, src, d_k, T, d_k, vec);
    }
}

// The merges walk the (B, T, C) side in order, a block a row bt = b * T + t (the blocks looping over the rows),
// its threads along the row's chunks (16 bytes where d_k % 4 == 0 and the arrays are aligned, else a float),
// each moving one chunk between y[bt][c] and heads[b][h][t][c - h d_k], loaded and stored evict-first: a pass
// of 25 MB each way at andrea-120m's shapes, which the split's tiles of (T, d_k) took at 72-73% of the copy
// bandwidth launched one by one and 80% in a CUDA graph, this form at 78-80% and 84-85% (H200, 2026-12-01,
// dev/cuda/short_copy_bound.cu; a copy kernel of the same bytes: 81% and 87%).
template <int VEC, bool TO_HEADS>
__device__ __forceinline__ void merge_rows(float* dst, const float* src, int B, int T, int NH, int d_k) {
    const int w = d_k / VEC, row = NH * w;  // chunks of a head's row, of a (B, T, C) row
    const unsigned long long rows = (unsigned long long)B * T;
    for (unsigned long long bt = blockIdx.x; bt < rows; bt += gridDim.x) {
        // b = bt / T by a 32-bit division where the rows allow it: a 64-bit one costs several times its instructions
        const unsigned long long b = rows >> 32 ? bt / T : (unsigned)bt / (unsigned)T, t = bt - b * T;
        for (int j = threadIdx.x; j < row; j += blockDim.x) {
            const int h = j / w, i = j - h * w;
            const long long y_at = (long long)bt * NH * d_k + (long long)j * VEC;
            const long long heads_at = (((long long)b * NH + h) * T + t) * d_k + (long long)i * VEC;
            float v[VEC];
            load_vec<VEC, true>(v, src + (TO_HEADS ? y_at : heads_at));
            store_vec<VEC, true>(dst + (TO_HEADS ? heads_at : y_at), v);
        }
    }
}

// Grid: min(B * T, 2^31 - 1) blocks (they loop over the rows) of the row's chunks (NH * d_k / 4 or NH * d_k) rounded up to a warp, at most
// 1024 threads (longer rows loop).
extern "C" __global__ void __launch_bounds__(1024)
    k_merge_heads_fwd_fast(float* y, const float* heads, int B, int T, int NH, int d_k) {
    if (d_k % 4 == 0 && all_aligned16(y, heads))
        merge_rows<4, false>(y, heads, B, T, NH, d_k);
    else
        merge_rows<1, false>(y, heads, B, T, NH, d_k);
}

// Grid: as k_merge_heads_fwd_fast.
extern "C" __global__ void __launch_bounds__(1024)
    k_merge_heads_bwd_fast(float* dheads, const float* dy, int B, int T, int NH, int d_k) {
    if (d_k % 4 == 0 && all_aligned16(dheads, dy))
        merge_rows<4, true>(dheads, dy, B, T, NH, d_k);
    else
        merge_rows<1, true>(dheads, dy, B, T, NH, d_k);
}
