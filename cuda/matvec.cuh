// Products of a few rows: out (M, N) = epilogue(prologue(inp) (M, K) @ W (N, K)^T + bias), M <= MATVEC_ROWS.
// Sampling's decode step multiplies one position a sequence (M = B) by every weight matrix: a tiled SGEMM would
// spend its 128-row tile on M rows and leave most SMs idle, while this is a pass over W at memory speed, each
// weight read once. The step's other work rides along: the layernorm of the input in the prologue, GELU and the
// residual add in the epilogue.
#pragma once
#include "common.cuh"
#include "pointwise_fast.cuh"  // gelu_fwd_of
#include "rows_fast.cuh"       // warp_sum

// Read by microgpt/kernels/matvec.py: which products come here, and the grid and block of their launch.
enum MatvecLaunch : int {
    MATVEC_ROWS = 8,    // products of at most this many rows take k_matvec
    MATVEC_WARPS = 4,   // warps a block, one output column each
    MATVEC_BATCH = 8,   // weight loads a lane has in flight at once: all of a column's at K = 1024 (16-byte loads)
    MATVEC_SPLIT_BELOW = 1024,  // products of fewer columns split K over a block's warps
};
static_assert(MATVEC_ROWS == 8, "k_matvec_1 .. k_matvec_8 cover every M up to MATVEC_ROWS");

__device__ __forceinline__ float madd(float acc, float x, float w) { return fmaf(x, w, acc); }
__device__ __forceinline__ float madd(float acc, float4 x, float4 w) {
    return fmaf(x.w, w.w, fmaf(x.z, w.z, fmaf(x.y, w.y, fmaf(x.x, w.x, acc))));
}

// Row r of the M input rows in shared memory, layernormed: (x - mean) * rstd * w + b with mean, rstd over K as
// k_layernorm_fwd computes them (biased variance, LN_EPS), a warp a row.
template <typename Vec>
__device__ void matvec_layernorm(float* xs, const float* inp, const float* ln_w, const float* ln_b, int M, int K) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float);
    const int lane = threadIdx.x % 32, KV = K / WIDTH;
    for (int r = threadIdx.x / 32; r < M; r += MATVEC_WARPS) {
        const Vec* x = reinterpret_cast<const Vec*>(inp + (long long)r * K);
        float sum = 0.0f;
        for (int kv = lane; kv < KV; kv += 32) {
            const Vec t = x[kv];
            const float* v = reinterpret_cast<const float*>(&t);
#pragma unroll
            for (int e = 0; e < WIDTH; e++) sum += v[e];
        }
        const float m = warp_sum(sum) / K;
        float var = 0.0f;
        for (int kv = lane; kv < KV; kv += 32) {
            const Vec t = x[kv];
            const float* v = reinterpret_cast<const float*>(&t);
#pragma unroll
            for (int e = 0; e < WIDTH; e++) var += (v[e] - m) * (v[e] - m);
        }
        const float s = 1.0f / sqrtf(warp_sum(var) / K + LN_EPS);
        for (int kv = lane; kv < KV; kv += 32) {
            Vec t = x[kv];
            float* v = reinterpret_cast<float*>(&t);
#pragma unroll
            for (int e = 0; e < WIDTH; e++) v[e] = (v[e] - m) * s * ln_w[kv * WIDTH + e] + ln_b[kv * WIDTH + e];
            reinterpret_cast<Vec*>(xs + (long long)r * K)[kv] = t;
        }
    }
}

// Warp w of the block takes column n = blockIdx.x * (MATVEC_WARPS / split) + w / split of every row, and part
// w % split of its K (in units of Vec; split 1: all of it): lane i sums k = i, i + 32, ... of the part in order,
// MATVEC_BATCH loads of W at a time; a fixed shuffle tree adds the lanes, and the parts are added in order. The
// first batch of W is read before pdl_wait(): the weights do not depend on the kernel before.
template <int ROWS, typename Vec>
__device__ void matvec_block(float* out, const float* inp, const float* W, const float* bias, const float* ln_w,
                             const float* ln_b, const float* resid, int M, int K, int N, int gelu, int split) {
    extern __shared__ float4 matvec_rows[];  // with ln_w: the M layernormed rows
    __shared__ float parts[MATVEC_WARPS][ROWS];
    constexpr int WIDTH = sizeof(Vec) / sizeof(float);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, KV = K / WIDTH;
    const int n = blockIdx.x * (MATVEC_WARPS / split) + warp / split, part = warp % split;
    const int per_part = (KV + split - 1) / split, k_begin = part * per_part, k_end = min(KV, k_begin + per_part);
    const Vec* w = reinterpret_cast<const Vec*>(W + (long long)min(n, N - 1) * K);
    Vec wv[MATVEC_BATCH];
#pragma unroll
    for (int i = 0; i < MATVEC_BATCH; i++)
        if (k_begin + lane + 32 * i < k_end) wv[i] = __ldg(w + k_begin + lane + 32 * i);
    const float b_n = bias && n < N ? __ldg(bias + n) : 0.0f;
    if (ln_w)  // the layernorm's gains and biases into L1, where its last pass reads them
        for (int k = threadIdx.x * 32; k < K; k += MATVEC_WARPS * 32 * 32) {
            asm volatile("prefetch.global.L1 [%0];" ::"l"(ln_w + k));
            asm volatile("prefetch.global.L1 [%0];" ::"l"(ln_b + k));
        }
    pdl_wait();
    pdl_launch_dependents();
    // the residual this lane adds (row `lane`), read now: its latency under the product's
    const float r_n = resid && lane < M && n < N ? resid[(long long)lane * N + n] : 0.0f;
    const float* xs = inp;
    if (ln_w) {
        matvec_layernorm<Vec>(reinterpret_cast<float*>(matvec_rows), inp, ln_w, ln_b, M, K);
        __syncthreads();
        xs = reinterpret_cast<const float*>(matvec_rows);
    }
    float acc[ROWS] = {};
    for (int k0 = k_begin; k0 < k_end; k0 += 32 * MATVEC_BATCH) {
        if (k0 > k_begin) {
#pragma unroll
            for (int i = 0; i < MATVEC_BATCH; i++)
                if (k0 + lane + 32 * i < k_end) wv[i] = __ldg(w + k0 + lane + 32 * i);
        }
#pragma unroll
        for (int i = 0; i < MATVEC_BATCH; i++) {
            const int kv = k0 + lane + 32 * i;
            if (kv < k_end) {
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    if (r < M) acc[r] = madd(acc[r], reinterpret_cast<const Vec*>(xs + (long long)r * K)[kv], wv[i]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = warp_sum(acc[r]);  // every lane holds the sums
    if (split > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < ROWS; r++) parts[warp][r] = acc[r];
        }
        __syncthreads();
        if (part > 0) return;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float s = 0.0f;
            for (int p = 0; p < split; p++) s += parts[warp + p][r];
            acc[r] = s;
        }
    }
    if (n >= N) return;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (lane == r && r < M) {
            float v = acc[r] + b_n;
            if (gelu) v = gelu_fwd_of(v);
            if (resid) v += r_n;
            out[(long long)r * N + n] = v;
        }
    }
}

// Grid: one block of MATVEC_WARPS warps a MATVEC_WARPS / split columns, split 1 or MATVEC_WARPS (its warps share
// a column where N < MATVEC_SPLIT_BELOW, so that a short N still fills the GPU; a constant, so that the bits of
// out do not depend on the GPU). k_matvec_<R> takes M <= R rows (one accumulator a row: a kernel each, so that
// M = 1 keeps few registers). ln_w (with ln_b): inp layernormed first, into M * K floats of dynamic shared memory;
// gelu: GELU of the product plus bias; resid (M, N), which may be out: added last (the residual stream's x = x +
// branch). vec4: K % 4 == 0 and inp, W 16-byte aligned (the launcher checks).
#define MATVEC_KERNEL(R, MIN_BLOCKS)                                                                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_WARPS * 32, MIN_BLOCKS)                                     \
        k_matvec_##R(float* out, const float* inp, const float* W, const float* bias, const float* ln_w,            \
                     const float* ln_b, const float* resid, int M, int K, int N, int gelu, int split, int vec4) {   \
        if (vec4) matvec_block<R, float4>(out, inp, W, bias, ln_w, ln_b, resid, M, K, N, gelu, split);              \
        else matvec_block<R, float>(out, inp, W, bias, ln_w, ln_b, resid, M, K, N, gelu, split);                    \
    }
MATVEC_KERNEL(1, 6)  // MIN_BLOCKS: as many blocks an SM holds at once as the registers of R rows allow
MATVEC_KERNEL(2, 6)
MATVEC_KERNEL(4, 4)
MATVEC_KERNEL(8, 3)
