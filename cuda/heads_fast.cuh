// Fast head split and merge. Each head (b, h) is a (T, d_k) matrix whose rows are d_k floats apart on the heads
// side (B, NH, T, d_k) and 3C or C floats apart on the (B, T, 3C) or (B, T, C) side; the kernels copy rows
// between the two strides, 16 bytes at a time where d_k % 4 == 0 and the arrays are 16-byte aligned (one float
// at a time otherwise). The copies give the reference kernels' bits.
#pragma once
#include "rows_fast.cuh"  // load_vec, store_vec, all_aligned16, MB_UNROLL

// Copies the block's tiles of one matrix: rows of w chunks of VEC floats, blockDim / w rows per pass (one row,
// looped along, where w > blockDim), MB_UNROLL passes in flight, every load before its store. Each thread
// finds its column once, not per element.
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

// Grid: (3 * B * NH, min(ceil(T / rows_per_tile), 65535)), both dimensions looped over; rows_per_tile =
// MB_UNROLL * max(1, 256 / w), w = d_k / 4 (d_k % 4 == 0) or d_k. Matrix m = (which * B + b) * NH + h: q, k or v
// of head (b, h). At least four blocks per SM (64 registers).
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

// The merges walk the (B, T, C) side in order: one block per row bt = b * T + t (blocks loop over rows), each
// thread moving one chunk (16 bytes, or one float) between y[bt][c] and heads[b][h][t][c - h * d_k], loaded
// and stored evict-first (ld.global.cs, st.global.cs).
template <int VEC, bool TO_HEADS>
__device__ __forceinline__ void merge_rows(float* dst, const float* src, int B, int T, int NH, int d_k) {
    const int w = d_k / VEC, row = NH * w;  // chunks of a head's row, of a (B, T, C) row
    const unsigned long long rows = (unsigned long long)B * T;
    for (unsigned long long bt = blockIdx.x; bt < rows; bt += gridDim.x) {
        // b = bt / T by a 32-bit division where the row count allows: a 64-bit division costs several times more
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

// Grid: min(B * T, 2^31 - 1) blocks, which loop over the rows. Block: the row's chunks (NH * d_k / 4 or
// NH * d_k) rounded up to a multiple of 32, at most 1024 threads (longer rows loop).
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
