// Fast variants of the row-wise kernels: one warp per row (softmax, the embedding's forward) or one block per
// row (the cross-entropy over the vocabulary), so that a warp reads a row in coalesced 128-byte lines and the
// reductions run in registers, each in a fixed order (results repeat bit for bit). Also the helpers the other
// fast headers share: the 16-byte loads and stores, the alignment tests that choose them, and MB_UNROLL.
#pragma once
#include "common.cuh"

// The xor shuffle tree: every lane adds the same pairs (a + b and b + a are the same bits), so all lanes end
// with the same sum, in the same order every run (float, or double where the host's rule sums in double).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

// The warp's sums of each of a lane's N values (N a power of two, at most 32), scattered over the lanes: lane l
// returns the sum of value l / (32 / N), as warp_sum returns it, bit for bit (the same pairs of lanes added at each
// offset, in the same order). While a lane holds more than one value, each offset halves them: the lane keeps the
// half its offset bit selects and sends its partner the other, so N sums take N - 1 + 5 - log2(N) shuffles, not 5 N.
template <int N, int OFF = 16>
__device__ __forceinline__ float warp_sum_scatter(float (&v)[N]) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "a power of two, at most a value a lane");
    constexpr int K = N * OFF / 16;  // the values a lane still holds
    if constexpr (K >= 2) {
        const bool up = threadIdx.x & OFF;
#pragma unroll
        for (int j = 0; j < K / 2; j++) {
            const float send = up ? v[j] : v[j + K / 2], keep = up ? v[j + K / 2] : v[j];
            v[j] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
        }
    } else {
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);
    }
    if constexpr (OFF > 1) return warp_sum_scatter<N, OFF / 2>(v);
    else return v[0];
}

// v (K floats per thread, K a power of two) becomes the block's sums of it: each warp's by warp_sum_scatter (sum k
// in lane k * 32 / K, which stores it; warp_sum's bits), then the warps' in warp order, through slot (K floats for
// each of the block's warps, 16-byte aligned). One barrier: a caller that writes slot again either alternates
// between two slots (a warp that writes this one again has passed the next call's barrier, after every warp's reads
// of it) or waits at a second barrier. warps: the block's, blockDim.x / 32 unless the caller knows it at compile time.
template <int K>
__device__ __forceinline__ void block_sums(float (&v)[K], float (*slot)[K], int warps = blockDim.x / 32) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float mine = warp_sum_scatter(v);
    if (lane % (32 / K) == 0) slot[warp][lane / (32 / K)] = mine;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; k++) v[k] = slot[0][k];
    for (int j = 1; j < warps; j++) {
        if constexpr (K % 4 == 0) {  // 16-byte reads: a warp's K sums in K / 4 loads
#pragma unroll
            for (int q = 0; q < K / 4; q++) {
                float4 t = reinterpret_cast<const float4*>(slot[j])[q];
                v[4 * q] += t.x, v[4 * q + 1] += t.y, v[4 * q + 2] += t.z, v[4 * q + 3] += t.w;
            }
        } else {
#pragma unroll
            for (int k = 0; k < K; k++) v[k] += slot[j][k];
        }
    }
}

// The warp's largest and smallest value, on every lane (max and min are exact: any order, the same result).
template <class T>
__device__ __forceinline__ T warp_max(T v) {
    for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}

template <class T>
__device__ __forceinline__ T warp_min(T v) {
    for (int off = 16; off > 0; off >>= 1) v = min(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}

// the row of this warp in a 1-D launch of 32 threads per row
__device__ __forceinline__ long long warp_row() { return thread_index() / 32; }

// Softmax rows: one warp per row, held in registers up to ROW_REGS * 32 columns (longer rows are read again).
// With causal = 1 (square (T, T) matrices masked above the diagonal) row i reads only its first i + 1 columns,
// since exp(MASK_VALUE - max) is 0 in FP32, and writes 0 to the rest, as the full softmax does.
constexpr int ROW_REGS = 32;

// ONCE: loaded evict-first (ld.global.cs), for what the kernel reads once and nothing reads soon after, so that
// the rows still to be read keep their place in L2
template <int VEC, bool ONCE = false>
__device__ __forceinline__ void load_vec(float (&v)[VEC], const float* p) {
    if constexpr (VEC == 4) {
        float4 f = ONCE ? __ldcs(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
        v[0] = ONCE ? __ldcs(p) : p[0];
    }
}

// ONCE: stored evict-first (st.global.cs), for what nothing in the kernel reads back
template <int VEC, bool ONCE = false>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[VEC]) {
    if constexpr (VEC == 4) {
        const float4 f = make_float4(v[0], v[1], v[2], v[3]);
        if (ONCE)
            __stcs(reinterpret_cast<float4*>(p), f);
        else
            *reinterpret_cast<float4*>(p) = f;
    } else if (ONCE) {
        __stcs(p, v[0]);
    } else {
        p[0] = v[0];
    }
}

// The memory-bound fast kernels keep MB_UNROLL independent chunks per thread in flight, every load of a batch
// issued before its first store (a store may alias a later load, so the compiler cannot hoist loads over it).
// Mirrored in microgpt/kernels/rows_fast.py (unroll()): the grids of the kernels that loop over their work.
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

// Three blocks per SM (80 registers, no spills, where it would take 96): more rows in flight for a kernel that
// waits on memory. 256 threads per block, as every launcher (runtime.BLOCK).
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

// The cross-entropy forward makes two passes over a row: an online softmax for its max and sum of exp together,
// then the probabilities, reading the row again from shared memory where it fits, else from global memory. Rows
// of an odd V start at varying offsets from 16 bytes: each pass runs scalars up to a 16-byte boundary, float4s,
// then a scalar tail.

// (m, s): the max so far and the sum of exp(x - m) so far; x = -inf (a masked logit) adds nothing
__device__ __forceinline__ void online_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else if (x != -INFINITY) {
        s += expf(x - m);
    }
}

// (m, s) and (m2, s2) as one: the same bits whichever is first (the shuffle tree's lanes add both ways)
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    const float M = fmaxf(m, m2);
    s = M == -INFINITY ? 0.0f : s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

__device__ __forceinline__ float max4(float4 x) { return fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)); }

__device__ __forceinline__ float sum_exp4(float4 x, float m) {
    return (expf(x.x - m) + expf(x.y - m)) + (expf(x.z - m) + expf(x.w - m));
}

// the scalars before a row's first 16-byte boundary (at most n)
__device__ __forceinline__ int head_to_16(const float* row, int n) {
    return min(n, (int)((16 - (unsigned long long)row % 16) % 16 / 4));
}

// MB_UNROLL float4s of a row, blockDim apart from chunk i0 on (those past nvec left unset), all loads in flight
__device__ __forceinline__ void load_chunks(float4 (&x)[MB_UNROLL], const float4* row, int i0, int nvec) {
#pragma unroll
    for (int u = 0; u < MB_UNROLL; u++)
        if (i0 + u * (int)blockDim.x < nvec) x[u] = row[i0 + u * blockDim.x];
}

// Rows of up to CE_SMEM_MAX_FLOATS - 3 floats (3: the shift that aligns the row's 16-byte chunks) are kept in
// dynamic shared memory by the first pass for the second; 0 keeps every row in global memory. The launcher reads
// it (microgpt/kernels/rows_fast.py). CE_STREAM_STORES = 1: probabilities stored evict-first (st.global.cs).
enum CrossEntropyFwdLaunch : int {
    CE_SMEM_MAX_FLOATS = 12032,
    CE_STREAM_STORES = 1,
};

// the bytes of dynamic shared memory this launch was given
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

// The probabilities' stores: st.global.cs, or where CE_STREAM_STORES = 0 a plain st.global, written in asm as
// __stcs is: a C++ store through a generic pointer may alias the shared copy of the row as far as the compiler
// knows, which costs registers.
__device__ __forceinline__ void ce_store(float* p, float v) {
    if constexpr (CE_STREAM_STORES)
        __stcs(p, v);
    else
        asm("st.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

__device__ __forceinline__ void ce_store(float4* p, float4 v) {
    if constexpr (CE_STREAM_STORES)
        __stcs(p, v);
    else
        asm("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

// One row (vec: probs has the same offset from 16 bytes as logits). keep: the first pass also copies the row into
// shared memory at smem, aligned as the logits are, and the second pass and the loss read that copy; both paths
// give the same bits. keep is a run-time flag rather than a template parameter, to save registers.
__device__ __forceinline__ void crossentropy_fwd_row(bool keep, float* losses, float* pr, const float* lr,
                                                     float* smem, float* pair_m, float* pair_s, long long n,
                                                     const int* targets, int V) {
    const int head = head_to_16(lr, V), nvec = (V - head) / 4, tail = head + 4 * nvec;
    const bool vec = head == head_to_16(pr, V);
    const float4* lr4 = reinterpret_cast<const float4*>(lr + head);
    float* sx = smem + (4 - head) % 4;  // sx + head: smem + 4, or smem itself where head = 0
    float4* sx4 = reinterpret_cast<float4*>(sx + head);
    // where the second pass's scalars and the loss read x: a generic pointer (a few columns per row, or every one
    // where probs and logits differ in alignment); its float4s are read from either space by name
    const float* xr = keep ? sx : lr;

    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < head; v += blockDim.x) {
        const float x = lr[v];
        if (keep) sx[v] = x;
        online_add(m, s, x);
    }
    for (int i0 = threadIdx.x; i0 < nvec; i0 += MB_UNROLL * blockDim.x) {
        float4 x[MB_UNROLL];
        load_chunks(x, lr4, i0, nvec);
        if (keep) {
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++)
                if (i0 + u * (int)blockDim.x < nvec) sx4[i0 + u * blockDim.x] = x[u];
        }
        float M = m;
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++)
            if (i0 + u * (int)blockDim.x < nvec) M = fmaxf(M, max4(x[u]));
        const float shift = M == -INFINITY ? 0.0f : M;  // all masked so far: each exp is 0, not exp(nan)
        float b = 0.0f;
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++)
            if (i0 + u * (int)blockDim.x < nvec) b += sum_exp4(x[u], shift);
        s = s * expf(m - shift) + b;  // expf(0) = 1 where the max held: s unchanged
        m = M;
    }
    for (int v = tail + threadIdx.x; v < V; v += blockDim.x) {
        const float x = lr[v];
        if (keep) sx[v] = x;
        online_add(m, s, x);
    }
    // the block's (m, s): a shuffle tree in each warp, then the warps in order; every thread gets it. The barrier
    // also puts the whole copy of the row in shared memory before any thread reads it.
    for (int off = 16; off > 0; off >>= 1)
        online_merge(m, s, __shfl_xor_sync(0xffffffff, m, off), __shfl_xor_sync(0xffffffff, s, off));
    if (threadIdx.x % 32 == 0) pair_m[threadIdx.x / 32] = m, pair_s[threadIdx.x / 32] = s;
    __syncthreads();
    m = pair_m[0], s = pair_s[0];
    for (int w = 1; w < (int)(blockDim.x + 31) / 32; w++) online_merge(m, s, pair_m[w], pair_s[w]);

    // the loss before the second pass, which then needs neither s nor the loss's pointers
    if (threadIdx.x == 0) losses[n] = logf(s) + m - xr[targets[n]];
    const float inv_s = 1.0f / s;
    if (vec) {
        for (int v = threadIdx.x; v < head; v += blockDim.x) ce_store(pr + v, expf(xr[v] - m) * inv_s);
        float4* pr4 = reinterpret_cast<float4*>(pr + head);
        for (int i0 = threadIdx.x; i0 < nvec; i0 += MB_UNROLL * blockDim.x) {
            float4 x[MB_UNROLL];
            if (keep)
                load_chunks(x, sx4, i0, nvec);
            else
                load_chunks(x, lr4, i0, nvec);
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++)
                if (i0 + u * (int)blockDim.x < nvec)
                    ce_store(pr4 + i0 + u * blockDim.x,
                             make_float4(expf(x[u].x - m) * inv_s, expf(x[u].y - m) * inv_s,
                                         expf(x[u].z - m) * inv_s, expf(x[u].w - m) * inv_s));
        }
        for (int v = tail + threadIdx.x; v < V; v += blockDim.x) ce_store(pr + v, expf(xr[v] - m) * inv_s);
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) ce_store(pr + v, expf(xr[v] - m) * inv_s);
    }
}

// One block per position (row of logits (N, V); probs' rows ldp floats apart, logits' ldl): the row kept in shared
// memory where the launch was given 4 * (V + 3) bytes of it, else read twice from global memory. Each pass computes
// one expf per logit, and the second multiplies by 1 / sum: one division per row.
extern "C" __global__ void __launch_bounds__(256)
    k_crossentropy_fwd_fast(float* losses, float* probs, const float* logits, const int* targets, int N, int V,
                            int ldp, int ldl) {
    extern __shared__ __align__(16) float ce_row[];
    __shared__ float pair_m[32], pair_s[32];
    const long long n = blockIdx.x;
    if (n >= N) return;
    const float* lr = logits + n * ldl;
    float* pr = probs + n * ldp;
    const bool keep = dynamic_smem_bytes() >= 4ull * ((unsigned long long)V + 3);
    crossentropy_fwd_row(keep, losses, pr, lr, ce_row, pair_m, pair_s, n, targets, V);
}

// dlogits = (probs - onehot(target)) * dloss over chunks [0, chunks) of VEC columns from column v0 of one row:
// k_crossentropy_bwd's expression, element for element (so the same bits).
template <int VEC>
__device__ __forceinline__ void crossentropy_bwd_span(float* d, const float* p, int v0, int chunks, int target,
                                                      float dl) {
    const long long step = (long long)gridDim.x * blockDim.x * MB_UNROLL;
    for (long long i0 = (long long)blockIdx.x * blockDim.x * MB_UNROLL + threadIdx.x; i0 < chunks; i0 += step) {
        float t[MB_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i < chunks) load_vec<VEC>(t[u], p + v0 + i * VEC);
        }
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i < chunks) {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    int v = v0 + (int)i * VEC + e;
                    t[u][e] = (t[u][e] - (v == target ? 1.0f : 0.0f)) * dl;
                }
                store_vec<VEC>(d + v0 + i * VEC, t[u]);
            }
        }
    }
}

// Grid: (1, min(N, 65535)): blockIdx.y the row, blockIdx.x a share of its columns, both looped over (dlogits' rows
// ldd floats apart, probs' ldp). Each row finds its own 16-byte boundary (rows of an odd pitch start unaligned);
// a row takes the 16-byte path where its dlogits and probs differ by a multiple of 16 bytes (every row, where the
// two pitches are equal, as two allocations' addresses do). Gives k_crossentropy_bwd's bits.
extern "C" __global__ void __launch_bounds__(256)
    k_crossentropy_bwd_fast(float* dlogits, const float* probs, const int* targets, const float* dlosses, int N,
                            int V, int ldd, int ldp) {
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x, G = (long long)gridDim.x * blockDim.x;
    for (long long n = blockIdx.y; n < N; n += gridDim.y) {
        const float* p = probs + n * ldp;
        float* d = dlogits + n * ldd;
        const bool vec = ((unsigned long long)d - (unsigned long long)p) % 16 == 0;
        const int target = targets[n];
        const float dl = dlosses[n];
        if (vec) {
            const int head = min(V, (int)((16 - (unsigned long long)p % 16) % 16 / 4));  // columns before 16 bytes
            const int chunks = (V - head) / 4, tail = head + 4 * chunks;
            for (long long v = g; v < head; v += G) d[v] = (p[v] - (v == target ? 1.0f : 0.0f)) * dl;
            crossentropy_bwd_span<4>(d, p, head, chunks, target, dl);
            for (long long v = tail + g; v < V; v += G) d[v] = (p[v] - (v == target ? 1.0f : 0.0f)) * dl;
        } else {
            crossentropy_bwd_span<1>(d, p, 0, V, target, dl);
        }
    }
}

// x = wte[token] + wpe[t] for one position: MB_UNROLL chunks of each of the two rows in flight per lane.
template <int VEC>
__device__ __forceinline__ void embed_row(float* xr, const float* er, const float* pr, int C) {
    for (int c0 = threadIdx.x % 32 * VEC; c0 < C; c0 += 32 * VEC * MB_UNROLL) {
        float e[MB_UNROLL][VEC], p[MB_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            int c = c0 + u * 32 * VEC;
            if (c < C) {
                load_vec<VEC>(e[u], er + c);
                load_vec<VEC>(p[u], pr + c);
            }
        }
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            int c = c0 + u * 32 * VEC;
            if (c < C) {
#pragma unroll
                for (int k = 0; k < VEC; k++) e[u][k] = e[u][k] + p[u][k];
                store_vec<VEC>(xr + c, e[u]);
            }
        }
    }
}

// One warp per position (row of x (B, T, C)): the token id and the position are found once per row. The same
// single rounding of each sum as k_embed_fwd, so its bits. Grid: ceil(B * T * 32 / 256) blocks (32 threads per row).
extern "C" __global__ void __launch_bounds__(256)
    k_embed_fwd_fast(float* x, const int* idx, const float* wte, const float* wpe, int B, int T, int C) {
    long long bt = warp_row();
    if (bt >= (long long)B * T) return;
    const int t = bt % T;
    float* xr = x + bt * C;
    const float* er = wte + (long long)idx[bt] * C;
    const float* pr = wpe + (long long)t * C;
    if (rows_vec4(C, x, wte, wpe))
        embed_row<4>(xr, er, pr, C);
    else
        embed_row<1>(xr, er, pr, C);
}
