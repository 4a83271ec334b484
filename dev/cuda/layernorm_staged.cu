// The layernorms with their rows staged through shared memory, so that no register holds a row in flight:
// each lane's own 16-byte chunks by cp.async (sm_80), or whole rows by Hopper's bulk copy engine (cp.async.bulk on
// an mbarrier), one row a warp or a ring of several. Every kernel here computes from the same values in the same
// order as the engine's, so its results must be the engine's bits (checked below); each is timed against the
// engine's kernel and a copy kernel of the same bytes, launched one by one and as one CUDA graph, rotating three
// sets of arrays (the 50 MB L2 keeps no repeat). andrea-120m's rows: N = 8192, C = 768.
//
//     nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I cuda -o /tmp/ln_staged dev/cuda/layernorm_staged.cu \
//         && /tmp/ln_staged
//
// H200, 2026-12-01 (% of the 2 GB cudaMemcpy, 4.25-4.28 TB/s; one by one / in a graph; every variant the engine's
// bits). The same-size copy kernel: 79-81% / 85-88%.
// - forward: k_layernorm_fwd_fast (the row in 24 registers a lane, 60 registers, 32 warps an SM: two waves of rows)
//   72.7-73.7% / 77.5-78.9%. A warp a row staged by cp.async (32 registers, 64 warps an SM: every row in flight
//   in one wave), out stored plainly: 74.2-75.7% / 82.4-84.1% in four runs; out evict-first 72-75% / 77-80%; x
//   without the evict-first hint 71-72% / 77-79%; 48 warps an SM (40 registers) 66% / 70%; blocks of 4 or 16
//   warps about the same as 8. Taken into the engine as k_layernorm_fwd_staged (the profile: 75.3% / 81.8%).
// - forward, bulk copies: a row a warp 69-71% / 74-76%; a ring of S rows a warp, R rows each (W warps a block):
//   W4 S1 R1 71% / 76%, W4 S2 R2 62-64% / 67%, W4 S4 R4 59-62% / 63-66%, W8 S2 R4 71% / 76%, W1 S4 R4 62% / 66%:
//   a warp's rows in turn behind one another cost more than the bytes in flight gain.
// - backward: k_layernorm_bwd_fast 63-64% / 67-68% (adding into dx 69-70% / 72-73%). Its groups of 2 rows fed by
//   bulk copies through 2-4 stages: 53-60% / 55-64% (adding 66-68% / 69-71%); each thread's 4 columns by cp.async
//   (40-80 registers, 4-8 blocks an SM, dx's old values staged too where added into): 46-57% / 48-60%, at 8, 16
//   or 32 rows a block. The barrier of each group's row sums, not the loads, holds it back; none kept.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "layernorm_fast.cuh"

#include "probe.cuh"  // CK, time_graph_ms

constexpr int N = 8192, C = 768;

// ---- the bulk copy and its barrier ----
__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(bar)) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, int parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}" ::"r"(sa(bar)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from src into dst, counted on bar's phase
template <bool HINT>
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
    if constexpr (HINT)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
            ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(bar)), "l"(policy)
            : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(bar))
                     : "memory");
}
__device__ __forceinline__ void bar_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(bar)), "r"(bytes) : "memory");
}

// ---- forward: a warp a row, S rows of the warp's in flight in its shared-memory stages ----
// Warp w of the grid takes rows [w * rows_per_warp, (w + 1) * rows_per_warp).
template <int W, int S, bool HINT>
__global__ void __launch_bounds__(W * 32) k_ln_fwd_tma(float* out, float* mean, float* rstd, const float* x,
                                                        const float* w, const float* b, int n_rows, int cols,
                                                        int rows_per_warp) {
    extern __shared__ __align__(128) float stages[];
    __shared__ __align__(8) uint64_t full[W][S];
    constexpr int CHUNKS = ROW_REGS / 4;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long r0 = ((long long)blockIdx.x * W + warp) * rows_per_warp;
    const long long r1 = min((long long)n_rows, r0 + rows_per_warp);
    if (r0 >= r1) return;  // the whole warp: nothing below waits for the block
    float* ring = stages + (long long)warp * S * cols;
    const uint32_t bytes = cols * 4;
    const uint64_t policy = HINT ? evict_first_policy() : 0;
    if (lane == 0) {
        for (int s = 0; s < S; s++) bar_init(&full[warp][s]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the copy engine sees the barriers
        for (int s = 0; s < S && r0 + s < r1; s++) {
            bar_expect(&full[warp][s], bytes);
            bulk_load<HINT>(ring + s * cols, x + (r0 + s) * cols, bytes, &full[warp][s], policy);
        }
    }
    __syncwarp();
    for (long long n = r0; n < r1; n++) {
        const int i = (int)(n - r0), s = i % S;
        bar_wait(&full[warp][s], (i / S) & 1);
        const float* row = ring + s * cols;
        float v[CHUNKS][4] = {};
#pragma unroll
        for (int k = 0; k < CHUNKS; k++) {
            int c = chunk_col<4>(k);
            if (c < cols) load_vec<4>(v[k], row + c);
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) sum += v[k][e];
        __syncwarp();  // every lane's reads of the stage are done (its values summed): the stage is free
        if (lane == 0 && n + S < r1) {
            bar_expect(&full[warp][s], bytes);
            bulk_load<HINT>(ring + s * cols, x + (n + S) * cols, bytes, &full[warp][s], policy);
        }
        layernorm_regs_out<4, true>(out + n * cols, mean, rstd, v, sum, w, b, n, cols);
    }
}


// ---- forward: a warp a row, the row in shared memory (not registers), so that the kernel fits 32 registers and
// 64 warps an SM: all of N = 8192 rows in flight in one wave (the engine's 60 registers hold it to 32 warps, two
// waves). COPY: 0 the bulk copy engine (one copy a row, an mbarrier), 1 cp.async of each lane's own 16-byte chunks
// (sm_80; a lane reads back only what it copied, so no barrier). The same sums in the same order as
// layernorm_fwd_row<4>, read three times from shared memory.
__device__ __forceinline__ void cp_async16_ef(void* dst, const void* src, uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sa(dst)), "l"(src), "l"(policy)
                 : "memory");
}
template <int COPY, int WARPS, int MIN_BLOCKS, bool HINT = true, bool STCS = true>
__global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
    k_ln_fwd_smem(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int n_rows,
                  int cols) {
    extern __shared__ __align__(128) float srows[];
    __shared__ __align__(8) uint64_t full[WARPS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long n = (long long)blockIdx.x * WARPS + warp;
    if (n >= n_rows) return;
    float* row = srows + (long long)warp * cols;
    const float* xr = x + n * cols;
    const uint64_t policy = evict_first_policy();
    if (COPY == 0) {
        if (lane == 0) {
            bar_init(&full[warp]);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bar_expect(&full[warp], cols * 4);
            bulk_load<true>(row, xr, cols * 4, &full[warp], policy);
        }
        __syncwarp();
        bar_wait(&full[warp], 0);
    } else {
        for (int c = lane * 4; c < cols; c += 128)
            if (HINT)
                cp_async16_ef(row + c, xr + c, policy);
            else
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(row + c)), "l"(xr + c) : "memory");
        asm volatile("cp.async.wait_all;" ::: "memory");
    }
    float sum = 0.0f;
    for (int c = lane * 4; c < cols; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + c);
        sum += v.x, sum += v.y, sum += v.z, sum += v.w;
    }
    const float m = warp_sum(sum) / cols;
    float var = 0.0f;
    for (int c = lane * 4; c < cols; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + c);
        float d;
        d = v.x - m, var += d * d;
        d = v.y - m, var += d * d;
        d = v.z - m, var += d * d;
        d = v.w - m, var += d * d;
    }
    const float s = 1.0f / sqrtf(warp_sum(var) / cols + LN_EPS);
    for (int c = lane * 4; c < cols; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + c);
        const float4 wv = *reinterpret_cast<const float4*>(w + c), bv = *reinterpret_cast<const float4*>(b + c);
        const float4 o4 = make_float4((v.x - m) * s * wv.x + bv.x, (v.y - m) * s * wv.y + bv.y, (v.z - m) * s * wv.z + bv.z,
                           (v.w - m) * s * wv.w + bv.w);
        if (STCS)
            __stcs(reinterpret_cast<float4*>(out + n * cols + c), o4);
        else
            *reinterpret_cast<float4*>(out + n * cols + c) = o4;
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

// ---- backward: the engine's block a row (layernorm_bwd_rows), its groups of rows fed by bulk copies ----
// Stage s holds a group's R rows of dout, then of x (then of dx where ACC and DX_STAGED), each contiguous; thread
// 0 refills a stage once the block's barrier in block_sums has passed (every thread's reads of it done before).
template <int S, bool ACC, bool DX_STAGED>
__global__ void __launch_bounds__(LN_BWD_THREADS, 1)
    k_ln_bwd_tma(float* dx, float* dw, float* db, float* partials, unsigned int* counters, const float* dout,
                 const float* x, const float* w, const float* mean, const float* rstd, int n_rows, int cols,
                 int rows_per_block, int reducers) {
    constexpr int R = LN_BWD_ROWS;
    constexpr int ARRAYS = ACC && DX_STAGED ? 3 : 2;
    __shared__ __align__(16) float sums[2][32][2 * R];
    __shared__ __align__(8) uint64_t full[S];
    extern __shared__ float4 dyn[];  // the threads' shares of dw and db, then the stages
    float4* shares = dyn;
    float* ring = reinterpret_cast<float*>(dyn + 2 * blockDim.x);
    const long long stage_floats = (long long)ARRAYS * R * cols;
    const int c = threadIdx.x * 4, lane = threadIdx.x % 32;
    const bool mine = c < cols;
    float* share_w = reinterpret_cast<float*>(shares + threadIdx.x);
    float* share_b = reinterpret_cast<float*>(shares + blockDim.x + threadIdx.x);
    {
        const float zero[4] = {};
        store_vec<4>(share_w, zero);
        store_vec<4>(share_b, zero);
    }
    const long long r0 = (long long)blockIdx.x * rows_per_block, r1 = min((long long)n_rows, r0 + rows_per_block);
    auto issue = [&](long long n0, int s) {
        const int rows = (int)min((long long)R, r1 - n0);
        const uint32_t bytes = rows * cols * 4;
        float* st = ring + s * stage_floats;
        bar_expect(&full[s], ARRAYS * bytes);
        bulk_load<true>(st, dout + n0 * cols, bytes, &full[s], evict_first_policy());
        bulk_load<true>(st + R * cols, x + n0 * cols, bytes, &full[s], evict_first_policy());
        if (ARRAYS == 3) bulk_load<false>(st + 2 * R * cols, dx + n0 * cols, bytes, &full[s], 0);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) bar_init(&full[s]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        for (int s = 0; s < S && r0 + s * R < r1; s++) issue(r0 + s * R, s);
    }
    __syncthreads();
    auto load_stat = [&](long long n0) {
        const int rows = (int)min((long long)R, r1 - n0);
        float st = 0.0f;
        if (lane < 2 * R && lane % R < rows) st = (lane < R ? mean : rstd)[n0 + lane % R];
        return st;
    };
    float stat = r0 < r1 ? load_stat(r0) : 0.0f;
    int slot = 0;
    for (long long n0 = r0, j = 0; n0 < r1; n0 += R, j++, slot ^= 1) {
        const int rows = (int)min((long long)R, r1 - n0), s = (int)(j % S);
        const long long o = n0 * cols;
        const float stat_next = n0 + R < r1 ? load_stat(n0 + R) : 0.0f;
        bar_wait(&full[s], (int)((j / S) & 1));
        const float* st = ring + s * stage_floats;
        float g[R][4], h[R][4], old[R][4] = {};
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < rows && mine) {
                load_vec<4>(g[r], st + r * cols + c);
                load_vec<4>(h[r], st + (R + r) * cols + c);
                if (ARRAYS == 3) load_vec<4>(old[r], st + (2 * R + r) * cols + c);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) g[r][e] = 0.0f, h[r][e] = 0.0f;
            }
        {
            float pw[4], pb[4];
            load_vec<4>(pw, share_w);
            load_vec<4>(pb, share_b);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float m = __shfl_sync(0xffffffff, stat, r), sd = __shfl_sync(0xffffffff, stat, R + r);
                if (r < rows && mine) ln_bwd_cols_wb<4>(g[r], h[r], pw, pb, m, sd, c, cols);
            }
            store_vec<4>(share_w, pw);
            store_vec<4>(share_b, pb);
        }
        float v[2 * R] = {};
        {
            float wv[4] = {};
            if (mine) load_vec<4>(wv, w + c);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows && mine) ln_bwd_cols_sums<4>(g[r], h[r], wv, c, cols, v[2 * r], v[2 * r + 1]);
        }
        block_sums<2 * R>(v, sums[slot]);  // its barrier: every thread's reads of stage s are done
        if (threadIdx.x == 0 && n0 + S * R < r1) issue(n0 + S * R, s);
#pragma unroll
        for (int r = 0; r < R; r++)
            ln_bwd_cols_dx(g[r], h[r], __shfl_sync(0xffffffff, stat, R + r), v[2 * r] / cols, v[2 * r + 1] / cols);
        if (mine) {
            if (ACC && !DX_STAGED)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < rows) load_vec<4>(old[r], dx + o + r * cols + c);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows) {
                    ln_bwd_cols_acc<ACC>(g[r], old[r]);
                    store_vec<4>(dx + o + r * cols + c, g[r]);
                }
        }
        stat = stat_next;
    }
    ln_bwd_partial_row<4>(partials, shares, cols);
    ln_bwd_finish(dw, db, partials, counters, reinterpret_cast<float*>(shares), cols, reducers);
}


// ---- backward: the engine's block a row, each thread's 4 columns of its rows copied by itself (cp.async) into its
// own slots of S stages of R rows (dout, x, and dx's old values where ACC), so that no register holds a row in
// flight and no barrier guards the copies; its shares of dw and db in registers. The same roundings in the same
// order as k_layernorm_bwd_fast: the same bits.
__device__ __forceinline__ void cp16(void* dst, const void* src, uint64_t policy, bool hint) {
    if (hint)
        cp_async16_ef(dst, src, policy);
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa(dst)), "l"(src) : "memory");
}
template <int S, bool ACC, int MINB>
__global__ void __launch_bounds__(192, MINB)
    k_ln_bwd_staged(float* dx, float* dw, float* db, float* partials, unsigned int* counters, const float* dout,
                    const float* x, const float* w, const float* mean, const float* rstd, int n_rows, int cols,
                    int rows_per_block, int reducers) {
    constexpr int R = LN_BWD_ROWS, ARRAYS = ACC ? 3 : 2;
    __shared__ __align__(16) float sums[2][32][2 * R];
    extern __shared__ __align__(16) float ring[];  // [S][R][ARRAYS][cols]
    const int c = threadIdx.x * 4, lane = threadIdx.x % 32;
    const bool mine = c < cols;
    const long long r0 = (long long)blockIdx.x * rows_per_block, r1 = min((long long)n_rows, r0 + rows_per_block);
    const uint64_t policy = evict_first_policy();
    auto slot_of = [&](int s, int r, int a) { return ring + ((s * R + r) * ARRAYS + a) * cols + c; };
    auto issue = [&](long long n0, int s) {
        if (mine)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (n0 + r < r1) {
                    const long long o = (n0 + r) * cols + c;
                    cp16(slot_of(s, r, 0), dout + o, policy, true);
                    cp16(slot_of(s, r, 1), x + o, policy, true);
                    if (ACC) cp16(slot_of(s, r, 2), dx + o, policy, false);
                }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int s = 0; s < S; s++) issue(r0 + s * R, s);
    auto load_stat = [&](long long n0) {
        const int rows = (int)min((long long)R, r1 - n0);
        float st = 0.0f;
        if (lane < 2 * R && lane % R < rows) st = (lane < R ? mean : rstd)[n0 + lane % R];
        return st;
    };
    float stat = r0 < r1 ? load_stat(r0) : 0.0f;
    float pw[4] = {}, pb[4] = {};
    int slot = 0;
    for (long long n0 = r0, j = 0; n0 < r1; n0 += R, j++, slot ^= 1) {
        const int rows = (int)min((long long)R, r1 - n0), s = (int)(j % S);
        const long long o = n0 * cols;
        const float stat_next = n0 + R < r1 ? load_stat(n0 + R) : 0.0f;
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 1) : "memory");
        float g[R][4], h[R][4], old[R][4] = {};
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < rows && mine) {
                load_vec<4>(g[r], slot_of(s, r, 0));
                load_vec<4>(h[r], slot_of(s, r, 1));
                if (ACC) load_vec<4>(old[r], slot_of(s, r, 2));
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) g[r][e] = 0.0f, h[r][e] = 0.0f;
            }
        issue(n0 + S * R, s);  // this thread's own slots, read above (its loads of them in order before the copy)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float m = __shfl_sync(0xffffffff, stat, r), sd = __shfl_sync(0xffffffff, stat, R + r);
            if (r < rows && mine) ln_bwd_cols_wb<4>(g[r], h[r], pw, pb, m, sd, c, cols);
        }
        float v[2 * R] = {};
        {
            float wv[4] = {};
            if (mine) load_vec<4>(wv, w + c);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows && mine) ln_bwd_cols_sums<4>(g[r], h[r], wv, c, cols, v[2 * r], v[2 * r + 1]);
        }
        block_sums<2 * R>(v, sums[slot]);
#pragma unroll
        for (int r = 0; r < R; r++)
            ln_bwd_cols_dx(g[r], h[r], __shfl_sync(0xffffffff, stat, R + r), v[2 * r] / cols, v[2 * r + 1] / cols);
        if (mine)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows) {
                    ln_bwd_cols_acc<ACC>(g[r], old[r]);
                    store_vec<4>(dx + o + r * cols + c, g[r]);
                }
        stat = stat_next;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (mine) {
        float* p = partials + (long long)blockIdx.x * 2 * cols;
        store_vec<4>(p + c, pw);
        store_vec<4>(p + cols + c, pb);
    }
    ln_bwd_finish(dw, db, partials, counters, ring, cols, reducers);
}

// a 16-byte chunk a thread, evict-first both ways: the fastest copy of short_copy_bound.cu
__global__ void __launch_bounds__(256) k_copy(float4* out, const float4* in, long long n4) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) __stcs(out + i, __ldcs(in + i));
}
__global__ void __launch_bounds__(256) k_copy21(float4* out, const float4* a, const float4* b, long long n4) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 p = __ldcs(a + i), q = __ldcs(b + i);
        __stcs(out + i, make_float4(p.x * q.x, p.y * q.y, p.z * q.z, p.w * q.w));
    }
}

static cudaEvent_t e0, e1;
static double copy_gbs;

// f(set, stream): the mean of 30 launches back to back, the median of 5 such; one by one, then as one graph
// (time_graph_ms)
template <typename F>
void time(const char* name, double bytes, F f) {
    const int reps = 30;
    for (int i = 0; i < 6; i++) f(i % 3, (cudaStream_t)0);
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int k = 0; k < 5; k++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; i++) f(i % 3, (cudaStream_t)0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms / reps);
    }
    std::sort(t.begin(), t.end());
    const double ms = t[2], gms = time_graph_ms(f);
    printf("%-52s %7.4f ms %5.1f%%   graph %7.4f ms %5.1f%%\n", name, ms, 100.0 * bytes / ms / 1e6 / copy_gbs, gms,
           100.0 * bytes / gms / 1e6 / copy_gbs);
}

static std::vector<float> host(const float* d, long long n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}
static bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

template <int W, int S, bool HINT>
void fwd_variant(int sms, float** out, float** mean, float** rstd, float** in, float* w, float* bias, int rows_per_warp,
                 const std::vector<float>& ref_out, const std::vector<float>& ref_rstd) {
    auto k = k_ln_fwd_tma<W, S, HINT>;
    const int smem = W * S * C * 4;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int grid = (N + W * rows_per_warp - 1) / (W * rows_per_warp);
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, W * 32, smem));
    CK(cudaMemset(out[0], 0xFF, (long long)N * C * 4));
    k<<<grid, W * 32, smem>>>(out[0], mean[0], rstd[0], in[0], w, bias, N, C, rows_per_warp);
    CK(cudaDeviceSynchronize());
    const bool ok = same(host(out[0], (long long)N * C), ref_out) && same(host(rstd[0], N), ref_rstd);
    char name[128];
    snprintf(name, sizeof name, "fwd tma W%d S%d R%d%s (%d blocks, %d/SM%s)", W, S, rows_per_warp, HINT ? " ef" : "",
             grid, per_sm, ok ? "" : ", NOT THE ENGINE'S BITS");
    time(name, 2.0 * N * C * 4, [&](int s, cudaStream_t st) {
        k<<<grid, W * 32, smem, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C, rows_per_warp);
    });
    (void)sms;
}

template <int COPY, int WARPS, int MIN_BLOCKS, bool HINT = true, bool STCS = true>
void fwd_smem_variant(float** out, float** mean, float** rstd, float** in, float* w, float* bias,
                      const std::vector<float>& ref_out, const std::vector<float>& ref_rstd) {
    auto k = k_ln_fwd_smem<COPY, WARPS, MIN_BLOCKS, HINT, STCS>;
    const int smem = WARPS * C * 4;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int grid = (N + WARPS - 1) / WARPS;
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, WARPS * 32, smem));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k));
    CK(cudaMemset(out[0], 0xFF, (long long)N * C * 4));
    k<<<grid, WARPS * 32, smem>>>(out[0], mean[0], rstd[0], in[0], w, bias, N, C);
    CK(cudaDeviceSynchronize());
    const bool ok = same(host(out[0], (long long)N * C), ref_out) && same(host(rstd[0], N), ref_rstd);
    char name[128];
    snprintf(name, sizeof name, "fwd smem %s%s%s, %d warps (%d regs, %d/SM)%s", COPY ? "cp.async" : "bulk",
             HINT ? "" : " no hint", STCS ? "" : " plain st", WARPS, fa.numRegs, per_sm,
             ok ? "" : ", NOT THE ENGINE'S BITS");
    time(name, 2.0 * N * C * 4, [&](int s, cudaStream_t st) {
        k<<<grid, WARPS * 32, smem, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
}

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    copy_gbs = copy_bandwidth_gbs();  // the ceiling profile_kernels takes
    printf("2 GB copy: %.0f GB/s (100%%), %d SMs\n", copy_gbs, sms);
    const long long n = (long long)N * C;
    float *in[3], *in2[3], *out[3], *mean[3], *rstd[3];
    std::vector<float> h(n);
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc(&in[i], n * 4));
        CK(cudaMalloc(&in2[i], n * 4));
        CK(cudaMalloc(&out[i], n * 4));
        CK(cudaMalloc(&mean[i], N * 4));
        CK(cudaMalloc(&rstd[i], N * 4));
        for (auto& v : h) v = (float)rand() / RAND_MAX * 2 - 1;
        CK(cudaMemcpy(in[i], h.data(), n * 4, cudaMemcpyHostToDevice));
        for (auto& v : h) v = (float)rand() / RAND_MAX * 2 - 1;
        CK(cudaMemcpy(in2[i], h.data(), n * 4, cudaMemcpyHostToDevice));
    }
    float *w, *bias;
    CK(cudaMalloc(&w, C * 4));
    CK(cudaMalloc(&bias, C * 4));
    {
        std::vector<float> hw(C), hb(C);
        for (int c = 0; c < C; c++) hw[c] = 0.5f + (float)rand() / RAND_MAX, hb[c] = (float)rand() / RAND_MAX - 0.5f;
        CK(cudaMemcpy(w, hw.data(), C * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(bias, hb.data(), C * 4, cudaMemcpyHostToDevice));
    }
    const double fwd_bytes = 2.0 * n * 4;
    time("copy 25 MB, a chunk a thread, evict-first", fwd_bytes, [&](int s, cudaStream_t st) {
        k_copy<<<(n / 4 + 255) / 256, 256, 0, st>>>((float4*)out[s], (const float4*)in[s], n / 4);
    });
    time("engine layernorm forward (256 threads)", fwd_bytes, [&](int s, cudaStream_t st) {
        k_layernorm_fwd_fast<<<N * 32 / 256, 256, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
    k_layernorm_fwd_fast<<<N * 32 / 256, 256>>>(out[0], mean[0], rstd[0], in[0], w, bias, N, C);
    CK(cudaDeviceSynchronize());
    const std::vector<float> ref_out = host(out[0], n), ref_mean = host(mean[0], N), ref_rstd = host(rstd[0], N);
    {  // the engine's staged forward (the prototype below with plain stores), as its launcher runs it
        const int smem = LN_STAGED_WARPS * C * 4;
        CK(cudaMemset(out[0], 0xFF, n * 4));
        k_layernorm_fwd_staged<<<N / LN_STAGED_WARPS, LN_STAGED_WARPS * 32, smem>>>(out[0], mean[0], rstd[0], in[0],
                                                                                    w, bias, N, C);
        CK(cudaDeviceSynchronize());
        const bool ok = same(host(out[0], n), ref_out) && same(host(rstd[0], N), ref_rstd);
        time(ok ? "engine k_layernorm_fwd_staged" : "engine k_layernorm_fwd_staged, NOT k_layernorm_fwd_fast's bits",
             fwd_bytes, [&](int s, cudaStream_t st) {
                 k_layernorm_fwd_staged<<<N / LN_STAGED_WARPS, LN_STAGED_WARPS * 32, smem, st>>>(
                     out[s], mean[s], rstd[s], in[s], w, bias, N, C);
             });
    }
    fwd_smem_variant<1, 8, 8, true, false>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_smem_variant<1, 8, 8>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_smem_variant<1, 8, 8, false>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_smem_variant<1, 16, 4, true, false>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_smem_variant<1, 4, 16, true, false>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_smem_variant<1, 8, 6, true, false>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_smem_variant<0, 8, 8>(out, mean, rstd, in, w, bias, ref_out, ref_rstd);
    fwd_variant<4, 1, true>(sms, out, mean, rstd, in, w, bias, 1, ref_out, ref_rstd);
    fwd_variant<4, 2, true>(sms, out, mean, rstd, in, w, bias, 2, ref_out, ref_rstd);
    fwd_variant<4, 4, true>(sms, out, mean, rstd, in, w, bias, 4, ref_out, ref_rstd);
    fwd_variant<8, 2, true>(sms, out, mean, rstd, in, w, bias, 4, ref_out, ref_rstd);
    fwd_variant<1, 4, true>(sms, out, mean, rstd, in, w, bias, 4, ref_out, ref_rstd);

    // ---- backward: dout = in, x = in2, mean and rstd from the forward above (of set 0's in; any values do) ----
    for (int i = 0; i < 3; i++) {
        CK(cudaMemcpy(mean[i], ref_mean.data(), N * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(rstd[i], ref_rstd.data(), N * 4, cudaMemcpyHostToDevice));
    }
    float *partials, *dw, *db;
    unsigned int* counters;
    CK(cudaMalloc(&partials, 4096LL * 2 * C * 4));
    CK(cudaMalloc(&dw, C * 4));
    CK(cudaMalloc(&db, C * 4));
    CK(cudaMalloc(&counters, 8));
    CK(cudaMemset(counters, 0, 8));
    time("dout * x streamed (2 reads, a write)", 3.0 * n * 4, [&](int s, cudaStream_t st) {
        k_copy21<<<(n / 4 + 255) / 256, 256, 0, st>>>((float4*)out[s], (const float4*)in[s], (const float4*)in2[s],
                                                      n / 4);
    });
    const int threads = 192, resident_cap = 132 * 5;
    // reference bits: the engine's kernel as its launcher runs it (512 blocks of 16 rows, 96 reducers)
    std::vector<float> ref_dx[2], ref_dw[2], ref_db[2];
    for (int acc : {0, 1}) {
        CK(cudaMemcpy(out[0], in[1], n * 4, cudaMemcpyDeviceToDevice));
        CK(cudaMemset(dw, 0, C * 4));
        CK(cudaMemset(db, 0, C * 4));
        k_layernorm_bwd_fast<<<512, threads, 32 * threads>>>(out[0], dw, db, partials, counters, in[0], in2[0], w,
                                                             mean[0], rstd[0], N, C, 16, acc, 96);
        CK(cudaDeviceSynchronize());
        ref_dx[acc] = host(out[0], n), ref_dw[acc] = host(dw, C), ref_db[acc] = host(db, C);
        time(acc ? "engine layernorm backward, dx added into" : "engine layernorm backward", (3.0 + acc) * n * 4,
             [&](int s, cudaStream_t st) {
                 k_layernorm_bwd_fast<<<512, threads, 32 * threads, st>>>(out[s], dw, db, partials, counters, in[s],
                                                                          in2[s], w, mean[s], rstd[s], N, C, 16, acc,
                                                                          96);
             });
    }
    auto bwd = [&](auto kern, int S, int arrays, bool acc, int rows_per_block, const char* what) {
        const int smem = 32 * threads + S * arrays * LN_BWD_ROWS * C * 4;
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
        const int grid = (N + rows_per_block - 1) / rows_per_block;
        const int reducers = std::max(1, std::min({2 * C / LN_BWD_REDUCE_COLS, grid, 132 * per_sm / 4}));
        CK(cudaMemcpy(out[0], in[1], n * 4, cudaMemcpyDeviceToDevice));
        CK(cudaMemset(dw, 0, C * 4));
        CK(cudaMemset(db, 0, C * 4));
        kern<<<grid, threads, smem>>>(out[0], dw, db, partials, counters, in[0], in2[0], w, mean[0], rstd[0], N, C,
                                      rows_per_block, reducers);
        CK(cudaDeviceSynchronize());
        const bool ok = rows_per_block != 16 ||
                        (same(host(out[0], n), ref_dx[acc]) && same(host(dw, C), ref_dw[acc]) &&
                         same(host(db, C), ref_db[acc]));
        char name[128];
        snprintf(name, sizeof name, "bwd tma S%d %s%d rows a block (%d blocks, %d/SM, %d red.)%s", S, what,
                 rows_per_block, grid, per_sm, reducers, ok ? "" : " NOT THE ENGINE'S BITS");
        time(name, (3.0 + acc) * n * 4, [&](int s, cudaStream_t st) {
            kern<<<grid, threads, smem, st>>>(out[s], dw, db, partials, counters, in[s], in2[s], w, mean[s], rstd[s],
                                              N, C, rows_per_block, reducers);
        });
        (void)resident_cap;
    };
    auto staged = [&](auto kern, int S, bool acc, int rows_per_block, int minb) {
        const int smem = std::max(S * LN_BWD_ROWS * (acc ? 3 : 2) * C * 4, 16 * threads);
        CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem));
        cudaFuncAttributes fa;
        CK(cudaFuncGetAttributes(&fa, kern));
        const int grid = (N + rows_per_block - 1) / rows_per_block;
        const int reducers = std::max(1, std::min({2 * C / LN_BWD_REDUCE_COLS, grid, 132 * per_sm / 4}));
        CK(cudaMemcpy(out[0], in[1], n * 4, cudaMemcpyDeviceToDevice));
        CK(cudaMemset(dw, 0, C * 4));
        CK(cudaMemset(db, 0, C * 4));
        kern<<<grid, threads, smem>>>(out[0], dw, db, partials, counters, in[0], in2[0], w, mean[0], rstd[0], N, C,
                                      rows_per_block, reducers);
        CK(cudaDeviceSynchronize());
        const bool ok = rows_per_block != 16 ||
                        (same(host(out[0], n), ref_dx[acc]) && same(host(dw, C), ref_dw[acc]) &&
                         same(host(db, C), ref_db[acc]));
        char name[160];
        snprintf(name, sizeof name, "bwd staged S%d %s%d rows a block (%d blocks, %d regs, %d/SM, %d red.)%s", S,
                 acc ? "acc " : "", rows_per_block, grid, fa.numRegs, per_sm, reducers,
                 ok ? "" : " NOT THE ENGINE'S BITS");
        time(name, (3.0 + acc) * n * 4, [&](int s, cudaStream_t st) {
            kern<<<grid, threads, smem, st>>>(out[s], dw, db, partials, counters, in[s], in2[s], w, mean[s], rstd[s],
                                              N, C, rows_per_block, reducers);
        });
    };
    for (int rpb : {16, 8, 32}) {
        staged(k_ln_bwd_staged<2, false, 8>, 2, false, rpb, 8);
        staged(k_ln_bwd_staged<3, false, 6>, 3, false, rpb, 6);
        staged(k_ln_bwd_staged<2, true, 6>, 2, true, rpb, 6);
        staged(k_ln_bwd_staged<3, true, 4>, 3, true, rpb, 4);
    }
    staged(k_ln_bwd_staged<2, false, 5>, 2, false, 16, 5);
    staged(k_ln_bwd_staged<4, false, 4>, 4, false, 16, 4);
    bwd(k_ln_bwd_tma<2, false, false>, 2, 2, false, 16, "");
    bwd(k_ln_bwd_tma<2, true, false>, 2, 2, true, 16, "acc ");
    return 0;
}
