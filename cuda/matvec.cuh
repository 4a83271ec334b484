// Products of a few rows: out (M, N) = epilogue(prologue(inp) (M, K) @ W (N, K)^T + bias), M <= MATVEC_ROWS.
// Sampling's decode step multiplies one position a sequence (M = B) by every weight matrix: a tiled SGEMM would
// spend its 128-row tile on M rows and leave most SMs idle, while this is a pass over W at memory speed, each
// weight read once. The step's other work rides along: the layernorm of the input in the prologue, GELU and the
// residual add in the epilogue.
#pragma once
#include "common.cuh"
#include "pointwise_fast.cuh"  // gelu_fwd_of
#include "rows_fast.cuh"       // block_sums
#include "matmul_tc.cuh"       // copy_to_shared, cp_async_commit, cp_async_wait

// Read by microgpt/kernels/matvec.py: which products come here, and the grid and block of their launch.
enum MatvecLaunch : int {
    MATVEC_ROWS = 8,           // products of at most this many rows take k_matvec
    MATVEC_THREADS = 128,      // a block: 4 warps
    MATVEC_CHUNK = 48 * 1024,  // bytes of W a block stages in shared memory, whole columns (at least COLS of them)
    MATVEC_BLOCKS = 256,       // a product of enough columns is cut into at least this many blocks
    MATVEC_GROUP_FEW = 2,      // the columns a warp takes at once in k_matvec_1 and _2: each load of an input
    MATVEC_GROUP = 4,          // row serves that many; in k_matvec_4 and _8, MATVEC_GROUP
};
static_assert(MATVEC_ROWS == 8, "k_matvec_1 .. k_matvec_8 cover every M up to MATVEC_ROWS");
static_assert(MATVEC_THREADS == 128, "matvec_block's reductions take 4 warps");

__host__ __device__ constexpr int matvec_cols(int rows) { return rows <= 2 ? MATVEC_GROUP_FEW : MATVEC_GROUP; }

__device__ __forceinline__ float madd(float acc, float x, float w) { return fmaf(x, w, acc); }
__device__ __forceinline__ float madd(float acc, float4 x, float4 w) {
    return fmaf(x.w, w.w, fmaf(x.z, w.z, fmaf(x.y, w.y, fmaf(x.x, w.x, acc))));
}
__device__ __forceinline__ float sum_of(float v) { return v; }
__device__ __forceinline__ float sum_of(float4 v) { return ((v.x + v.y) + v.z) + v.w; }

// n floats from global src to shared dst, asynchronously where the GPU can (copy_to_shared); cp_async_wait<0>()
// and a __syncthreads() before they are read.
template <typename Vec>
__device__ void matvec_stage(float* dst, const float* src, int n) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float);
    for (int i = threadIdx.x * WIDTH; i < n; i += MATVEC_THREADS * WIDTH) copy_to_shared<Vec>(dst + i, src + i);
    cp_async_commit();
}

// The sums over the block's 4 warps of each thread's s[r], r < ROWS (block_sums); every thread gets them, and red
// (4 x ROWS floats of shared memory, 16-byte aligned) is free again on return.
template <int ROWS>
__device__ void matvec_block_sum(float (&s)[ROWS], float (*red)[ROWS]) {
    block_sums<ROWS>(s, red, MATVEC_THREADS / 32);
    __syncthreads();
}

// Rows in registers for matvec_layernorm: HOLD elements (of Vec) of each row a thread, 32 or 64 floats.
template <int ROWS>
__host__ __device__ constexpr int matvec_ln_hold() { return ROWS <= 2 ? 8 / ROWS : 2; }

// matvec_layernorm past matvec_ln_hold: rounds of loads into shared memory, then its passes over the copy.
template <int ROWS, typename Vec>
__device__ void matvec_layernorm_rounds(float* xs, const float* inp, const float* ln_w, const float* ln_b, int M,
                                        int K, float (*red)[ROWS]) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float), IN_FLIGHT = 2;  // elements of each row a thread a round
    const int KV = K / WIDTH;
    float s[ROWS] = {};
    for (int kv0 = threadIdx.x; kv0 < KV; kv0 += IN_FLIGHT * MATVEC_THREADS) {
        Vec t[IN_FLIGHT][ROWS];
#pragma unroll
        for (int i = 0; i < IN_FLIGHT; i++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (r < M && kv0 + i * MATVEC_THREADS < KV)
                    t[i][r] = reinterpret_cast<const Vec*>(inp + (long long)r * K)[kv0 + i * MATVEC_THREADS];
#pragma unroll
        for (int i = 0; i < IN_FLIGHT; i++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                if (r < M && kv0 + i * MATVEC_THREADS < KV) {
                    reinterpret_cast<Vec*>(xs + r * K)[kv0 + i * MATVEC_THREADS] = t[i][r];
                    s[r] += sum_of(t[i][r]);
                }
    }
    matvec_block_sum<ROWS>(s, red);
    float mean[ROWS], var[ROWS] = {}, rstd[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) mean[r] = s[r] / K;
    for (int kv = threadIdx.x; kv < KV; kv += MATVEC_THREADS)  // the thread's own elements: no sync needed
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < M) {
                const float* v = xs + r * K + kv * WIDTH;
#pragma unroll
                for (int e = 0; e < WIDTH; e++) var[r] += (v[e] - mean[r]) * (v[e] - mean[r]);
            }
    matvec_block_sum<ROWS>(var, red);
#pragma unroll
    for (int r = 0; r < ROWS; r++) rstd[r] = 1.0f / sqrtf(var[r] / K + LN_EPS);
    for (int kv = threadIdx.x; kv < KV; kv += MATVEC_THREADS) {
        float w[WIDTH], b[WIDTH], v[ROWS][WIDTH];
#pragma unroll
        for (int e = 0; e < WIDTH; e++) w[e] = ln_w[kv * WIDTH + e], b[e] = ln_b[kv * WIDTH + e];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
#pragma unroll
            for (int e = 0; e < WIDTH; e++) v[r][e] = r < M ? xs[r * K + kv * WIDTH + e] : 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < M)
#pragma unroll
                for (int e = 0; e < WIDTH; e++)
                    xs[r * K + kv * WIDTH + e] = (v[r][e] - mean[r]) * rstd[r] * w[e] + b[e];
    }
    __syncthreads();
}

// The M input rows layernormed into shared memory xs (M x K): (x - mean) * rstd * w + b, mean and biased variance
// over K as k_layernorm_fwd takes them (two passes, LN_EPS), the block's threads over each row's K together.
// Where a thread's elements fit in matvec_ln_hold registers (K <= 1024 at float4 for every R), they stay there from
// their load to the store of their result, so that all of the block's loads from L2 are in flight at once: none is
// guarded (rows past M and elements past K read the last ones again, never summed or stored), and nothing is
// stored before the mean. Wider rows go through shared memory in rounds (matvec_layernorm_rounds). Both sum the
// same terms in the same order: the same bits.
template <int ROWS, typename Vec>
__device__ void matvec_layernorm(float* xs, const float* inp, const float* ln_w, const float* ln_b, int M, int K,
                                 float (*red)[ROWS]) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float), HOLD = matvec_ln_hold<ROWS>();
    const int KV = K / WIDTH;
    if (KV > HOLD * MATVEC_THREADS) return matvec_layernorm_rounds<ROWS, Vec>(xs, inp, ln_w, ln_b, M, K, red);
    Vec t[HOLD][ROWS];
#pragma unroll
    for (int j = 0; j < HOLD; j++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const Vec* row = reinterpret_cast<const Vec*>(inp + (long long)min(r, M - 1) * K);
            t[j][r] = row[min(threadIdx.x + j * MATVEC_THREADS, KV - 1)];
        }
    // The sums row by row, and a __syncwarp (no instruction) before them: with either left out, ptxas 13.0 issues
    // some of k_matvec_8's loads only after the sums of the first (docs/kernels/decode.md: how to check the SASS)
    __syncwarp();
    float s[ROWS] = {}, mean[ROWS], var[ROWS] = {}, rstd[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
#pragma unroll
        for (int j = 0; j < HOLD; j++)
            if (r < M && threadIdx.x + j * MATVEC_THREADS < KV) s[r] += sum_of(t[j][r]);
    matvec_block_sum<ROWS>(s, red);
#pragma unroll
    for (int r = 0; r < ROWS; r++) mean[r] = s[r] / K;
#pragma unroll
    for (int j = 0; j < HOLD; j++)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < M && threadIdx.x + j * MATVEC_THREADS < KV) {
                const float* v = reinterpret_cast<const float*>(&t[j][r]);
#pragma unroll
                for (int e = 0; e < WIDTH; e++) var[r] += (v[e] - mean[r]) * (v[e] - mean[r]);
            }
    matvec_block_sum<ROWS>(var, red);
#pragma unroll
    for (int r = 0; r < ROWS; r++) rstd[r] = 1.0f / sqrtf(var[r] / K + LN_EPS);
#pragma unroll
    for (int j = 0; j < HOLD; j++) {
        const int kv = threadIdx.x + j * MATVEC_THREADS;
        if (kv >= KV) break;
        float w[WIDTH], b[WIDTH];
#pragma unroll
        for (int e = 0; e < WIDTH; e++) w[e] = ln_w[kv * WIDTH + e], b[e] = ln_b[kv * WIDTH + e];
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < M) {
                Vec y;
                float* o = reinterpret_cast<float*>(&y);
                const float* v = reinterpret_cast<const float*>(&t[j][r]);
#pragma unroll
                for (int e = 0; e < WIDTH; e++) o[e] = (v[e] - mean[r]) * rstd[r] * w[e] + b[e];
                reinterpret_cast<Vec*>(xs + r * K)[kv] = y;
            }
    }
    __syncthreads();
}

// Block b takes columns n0 = b * cols .. n0 + cols - 1 of every row (fewer in the last block). Before pdl_wait()
// (the weights do not depend on the kernel before) it copies their rows of W, one contiguous run, into shared
// memory, and reads its bias. Then, for each unit u = warp, warp + 4, ... of (cols / COLS groups of COLS columns)
// x (parts of K): lane i sums k = i, i + 32, ... of the part in order, each input element read once for the
// group's COLS columns; a fixed shuffle tree adds the lanes; the parts are added in order. `parts` (4 / gcd(groups,
// 4)) makes the units a multiple of the 4 warps; it and cols depend on N and K alone, so no bit depends on the GPU.
template <int ROWS, typename Vec>
__device__ void matvec_block(float* out, const float* inp, const float* W, const float* bias, const float* ln_w,
                             const float* ln_b, const float* resid, int M, int K, int N, int gelu, int cols,
                             int parts) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float), COLS = matvec_cols(ROWS);
    extern __shared__ float4 matvec_smem[];
    __shared__ __align__(16) float red[4][ROWS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, KV = K / WIDTH;
    const int n0 = blockIdx.x * cols, ncols = min(cols, N - n0);
    const int groups = (cols + COLS - 1) / COLS, units = groups * parts;
    float* ws = reinterpret_cast<float*>(matvec_smem);  // cols x K
    float* xs = ws + cols * K;                           // M x K, the layernormed rows (with ln_w)
    float* sums = xs + (ln_w ? M * K : 0);               // units x COLS x ROWS
    // A residual product lets the next launch (a layernormed product, which reads only its weights, bias and gains
    // before its wait) start now, so that it stages its weights under this one's wait; the others once past theirs
    if (resid) pdl_launch_dependents();
    matvec_stage<Vec>(ws, W + (long long)n0 * K, ncols * K);
    const int t0 = threadIdx.x;  // the first output of the epilogue this thread writes, if any: row t0 / ncols
    const float b0 = bias && t0 < ncols * M ? __ldg(bias + n0 + t0 % ncols) : 0.0f;
    if (ln_w)  // the layernorm's gains and biases into L1, where its last pass reads them
        for (int k = threadIdx.x * 32; k < K; k += MATVEC_THREADS * 32) {
            asm volatile("prefetch.global.L1 [%0];" ::"l"(ln_w + k));
            asm volatile("prefetch.global.L1 [%0];" ::"l"(ln_b + k));
        }
    pdl_wait();
    if (!resid) pdl_launch_dependents();
    // the residual of that first output, read now: its latency under the product's
    const float r0 = resid && t0 < ncols * M ? resid[(long long)(t0 / ncols) * N + n0 + t0 % ncols] : 0.0f;
    const float* x = inp;
    if (ln_w) {
        matvec_layernorm<ROWS, Vec>(xs, inp, ln_w, ln_b, M, K, red);
        x = xs;
    } else {  // the input rows into L1, where the loads below find them (each line asked for once a block)
        for (long long at = threadIdx.x * 32LL; at < (long long)M * K; at += MATVEC_THREADS * 32)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(inp + at));
    }
    cp_async_wait<0>();
    __syncthreads();
    const int per_part = (KV + parts - 1) / parts;
    for (int u = warp; u < units; u += 4) {
        const int c0 = (u / parts) * COLS, k_begin = (u % parts) * per_part, k_end = min(KV, k_begin + per_part);
        // rows past M and columns past the block's repeat the last ones: every load unguarded, so that the
        // compiler may issue an unrolled loop's loads together; their sums are never read
        const Vec* xr = reinterpret_cast<const Vec*>(x);
        const Vec* wr = reinterpret_cast<const Vec*>(ws);
        float acc[COLS][ROWS] = {};
#pragma unroll(ROWS <= 2 ? 4 : 1)  // (more would spill the accumulators of 4 and 8 rows)
        for (int kv = k_begin + lane; kv < k_end; kv += 32) {
            Vec xv[ROWS];
#pragma unroll
            for (int r = 0; r < ROWS; r++) xv[r] = xr[min(r, M - 1) * KV + kv];
#pragma unroll
            for (int c = 0; c < COLS; c++) {
                const Vec w = wr[min(c0 + c, ncols - 1) * KV + kv];
#pragma unroll
                for (int r = 0; r < ROWS; r++) acc[c][r] = madd(acc[c][r], xv[r], w);
            }
        }
        // (c, r)'s sum in the lanes l with l / SPREAD = c * ROWS + r
        constexpr int N = COLS * ROWS, SPREAD = 32 / N;
        float flat[N];
#pragma unroll
        for (int i = 0; i < N; i++) flat[i] = acc[i / ROWS][i % ROWS];
        const float v = warp_sum_scatter<N>(flat);
        if (lane % SPREAD == 0) sums[u * N + lane / SPREAD] = v;
    }
    __syncthreads();
    for (int t = t0; t < ncols * M; t += MATVEC_THREADS) {
        const int r = t / ncols, c = t % ncols, g = c / COLS;
        float v = 0.0f;
        for (int p = 0; p < parts; p++) v += sums[((g * parts + p) * COLS + c % COLS) * ROWS + r];
        const long long at = (long long)r * N + n0 + c;
        v += t == t0 ? b0 : bias ? __ldg(bias + n0 + c) : 0.0f;
        if (gelu) v = gelu_fwd_of(v);
        if (resid) v += t == t0 ? r0 : resid[at];
        out[at] = v;
    }
}

// Grid: ceil(N / cols) blocks of MATVEC_THREADS. Dynamic shared memory: 4 * (cols * K + (ln_w ? M * K : 0) +
// ceil(cols / COLS) * parts * COLS * R) bytes. k_matvec_<R> takes M <= R rows (an accumulator a row and column
// of the group: a kernel each, so that M = 1 keeps few registers). ln_w (with ln_b): inp layernormed first; gelu:
// GELU of the product plus bias; resid (M, N), which may be out: added last (the residual stream's x = x +
// branch). vec4: K % 4 == 0 and inp, W 16-byte aligned (the launcher checks).
#define MATVEC_KERNEL(R, MIN_BLOCKS)                                                                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, MIN_BLOCKS)                                        \
        k_matvec_##R(float* out, const float* inp, const float* W, const float* bias, const float* ln_w,            \
                     const float* ln_b, const float* resid, int M, int K, int N, int gelu, int cols, int parts,     \
                     int vec4) {                                                                                    \
        if (vec4) matvec_block<R, float4>(out, inp, W, bias, ln_w, ln_b, resid, M, K, N, gelu, cols, parts);        \
        else matvec_block<R, float>(out, inp, W, bias, ln_w, ln_b, resid, M, K, N, gelu, cols, parts);              \
    }
// MIN_BLOCKS: the blocks an SM holds at once with the registers each R takes uncapped (77 for R = 1, 94 for R = 2,
// 80 for R = 4, 128 for R = 8 on sm_90): a tighter cap spills, or keeps an unrolled loop's loads from issuing
// together. Shared memory holds fewer blocks of a whole MATVEC_CHUNK anyway.
MATVEC_KERNEL(1, 6)
MATVEC_KERNEL(2, 5)
MATVEC_KERNEL(4, 6)
MATVEC_KERNEL(8, 4)
