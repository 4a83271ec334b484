// Fast variants of the row-wise kernels: a warp per row (softmax) or a block per row (the cross-entropy over
// the vocabulary), so that a warp reads a row in coalesced 128-byte lines and the reductions run in registers.
// Each reduction has a fixed order, so results repeat bit for bit. Tested against the one-thread-per-row
// reference kernels. The 16-byte loads and stores, and the alignment tests that choose them, are shared with
// layernorm_fast.cuh.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}

// the row of this warp in a 1-D launch of 32 threads a row
__device__ __forceinline__ long long warp_row() { return thread_index() / 32; }

// The softmax rows: a warp per row, which it holds in registers (up to ROW_REGS * 32 columns; longer rows
// are read again from the caches), loaded VEC floats at a time (4: one 16-byte load, where the rows are
// aligned to it). Only a row's first n columns are read: n = cols, or with causal = 1 (square (T, T)
// matrices masked above the diagonal, as causal_mask_fwd leaves them) n = i + 1 for row i, since
// exp(MASK_VALUE - max) is 0 in FP32; the columns from n on are written 0, as the full softmax gives them.
constexpr int ROW_REGS = 32;

template <int VEC>
__device__ __forceinline__ void load_vec(float (&v)[VEC], const float* p) {
    if constexpr (VEC == 4) {
        float4 f = *reinterpret_cast<const float4*>(p);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
        v[0] = p[0];
    }
}

template <int VEC>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[VEC]) {
    if constexpr (VEC == 4)
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else
        p[0] = v[0];
}

// The memory-bound fast kernels (layernorm_fast's) keep MB_UNROLL independent chunks (16-byte loads where
// aligned) a thread in flight, every load of a batch issued before its first store: a store may alias a later
// load, so the compiler cannot hoist loads over stores for us.
enum MemoryBoundLaunch : int {
    MB_UNROLL = 4,
};

// every pointer given on a 16-byte boundary (the unused ones are null, which is)
__device__ __forceinline__ bool all_aligned16(const void* a, const void* b, const void* c = nullptr,
                                              const void* d = nullptr, const void* e = nullptr,
                                              const void* f = nullptr) {
    return ((unsigned long long)a | (unsigned long long)b | (unsigned long long)c | (unsigned long long)d |
            (unsigned long long)e | (unsigned long long)f) % 16 == 0;
}

// Rows of C floats in 16-byte chunks need C % 4 == 0 and every row-wide pointer aligned (then every row
// start is).
__device__ __forceinline__ bool rows_vec4(int C, const void* a, const void* b, const void* c = nullptr,
                                          const void* d = nullptr, const void* e = nullptr,
                                          const void* f = nullptr) {
    return C % 4 == 0 && all_aligned16(a, b, c, d, e, f);
}

// zeros over columns [from, cols) of a row, by the warp
__device__ __forceinline__ void zero_tail(float* row, int from, int cols) {
    for (int j = from + threadIdx.x % 32; j < cols; j += 32) row[j] = 0.0f;
}

// The first column of chunk k of this lane: chunks of VEC columns, the warp's 32 side by side.
template <int VEC>
__device__ __forceinline__ int chunk_col(int k) { return (k * 32 + threadIdx.x % 32) * VEC; }

template <int VEC>
__device__ __forceinline__ void softmax_row_regs(float* pr, const float* xr, int n, int cols) {
    constexpr int CHUNKS = ROW_REGS / VEC;
    float v[CHUNKS][VEC] = {};
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c < n) load_vec<VEC>(v[k], xr + c);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (c + e < n) m = fmaxf(m, v[k][e]);
    }
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++)
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            v[k][e] = chunk_col<VEC>(k) + e < n ? expf(v[k][e] - m) : 0.0f;
            sum += v[k][e];
        }
    const float inv_sum = 1.0f / warp_sum(sum);  // one division a row, not one an element
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c >= cols) break;
#pragma unroll
        for (int e = 0; e < VEC; e++) v[k][e] = c + e < n ? v[k][e] * inv_sum : 0.0f;
        store_vec<VEC>(pr + c, v[k]);
    }
    zero_tail(pr, ROW_REGS * 32, cols);
}

// a row longer than the registers hold: each pass reads it again
__device__ __forceinline__ void softmax_row_loop(float* pr, const float* xr, int n, int cols) {
    int lane = threadIdx.x % 32;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) sum += expf(xr[j] - m);
    const float inv_sum = 1.0f / warp_sum(sum);
    for (int j = lane; j < n; j += 32) pr[j] = expf(xr[j] - m) * inv_sum;
    zero_tail(pr, n, cols);
}

__device__ __forceinline__ bool aligned16(const void* a, const void* b, int cols) {
    return cols % 4 == 0 && ((unsigned long long)a | (unsigned long long)b) % 16 == 0;
}

// Three blocks an SM (80 registers, no spills, where it would take 96): more rows in flight for a kernel that
// waits on memory. 256 threads a block, as every launcher (runtime.BLOCK).
extern "C" __global__ void __launch_bounds__(256, 3)
    k_softmax_fwd_fast(float* probs, const float* x, int rows, int cols, int causal) {
    long long r = warp_row();
    if (r >= rows) return;  // the whole warp leaves together
    const float* xr = x + r * cols;
    float* pr = probs + r * cols;
    int n = causal ? (int)(r % cols) + 1 : cols;
    if (n > ROW_REGS * 32)
        softmax_row_loop(pr, xr, n, cols);
    else if (aligned16(x, probs, cols))
        softmax_row_regs<4>(pr, xr, n, cols);
    else
        softmax_row_regs<1>(pr, xr, n, cols);
}

// dx = p * (dp - sum_j dp[j] * p[j]) over the row's first n columns, 0 after them (p is 0 there).
template <int VEC>
__device__ __forceinline__ void softmax_bwd_row_regs(float* dxr, const float* dp, const float* p, int n, int cols) {
    constexpr int CHUNKS = ROW_REGS / VEC;
    float vp[CHUNKS][VEC] = {}, vdp[CHUNKS][VEC] = {};
    float d = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c < n) {
            load_vec<VEC>(vp[k], p + c);
            load_vec<VEC>(vdp[k], dp + c);
        }
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (c + e < n) d += vdp[k][e] * vp[k][e];
    }
    d = warp_sum(d);
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c >= cols) break;
#pragma unroll
        for (int e = 0; e < VEC; e++) vp[k][e] = c + e < n ? vp[k][e] * (vdp[k][e] - d) : 0.0f;
        store_vec<VEC>(dxr + c, vp[k]);
    }
    zero_tail(dxr, ROW_REGS * 32, cols);
}

__device__ __forceinline__ void softmax_bwd_row_loop(float* dxr, const float* dp, const float* p, int n, int cols) {
    int lane = threadIdx.x % 32;
    float d = 0.0f;
    for (int j = lane; j < n; j += 32) d += dp[j] * p[j];
    d = warp_sum(d);
    for (int j = lane; j < n; j += 32) dxr[j] = p[j] * (dp[j] - d);
    zero_tail(dxr, n, cols);
}

extern "C" __global__ void k_softmax_bwd_fast(float* dx, const float* dprobs, const float* probs, int rows, int cols,
                                              int causal) {
    long long r = warp_row();
    if (r >= rows) return;
    const float* dp = dprobs + r * cols;
    const float* p = probs + r * cols;
    float* dxr = dx + r * cols;
    int n = causal ? (int)(r % cols) + 1 : cols;
    if (n > ROW_REGS * 32)
        softmax_bwd_row_loop(dxr, dp, p, n, cols);
    else if (aligned16(dprobs, probs, cols) && (unsigned long long)dx % 16 == 0)
        softmax_bwd_row_regs<4>(dxr, dp, p, n, cols);
    else
        softmax_bwd_row_regs<1>(dxr, dp, p, n, cols);
}

// Sum of the block's threads, in a fixed order; every thread gets it. `scratch` holds 32 floats.
__device__ float block_reduce(float v, float* scratch, bool is_max) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = (blockDim.x + 31) / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

// a block per position (row of logits (N, V))
extern "C" __global__ void k_crossentropy_fwd_fast(float* losses, float* probs, const float* logits,
                                                   const int* targets, int N, int V) {
    __shared__ float scratch[32];
    long long n = blockIdx.x;
    if (n >= N) return;
    const float* lr = logits + n * V;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, lr[v]);
    m = block_reduce(m, scratch, true);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(lr[v] - m);
    sum = block_reduce(sum, scratch, false);
    float* pr = probs + n * V;
    for (int v = threadIdx.x; v < V; v += blockDim.x) pr[v] = expf(lr[v] - m) / sum;
    if (threadIdx.x == 0) losses[n] = logf(sum) + m - lr[targets[n]];
}
