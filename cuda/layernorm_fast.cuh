// Fast variants of the layernorms, each reduction in a fixed order, so results repeat bit for bit; tested
// against the one-thread-per-row reference kernels and float64. The forwards take one warp per row: a row of up
// to ROW_REGS * 32 = 1024 columns in 16-byte chunks is held in registers; other rows are looped over, MB_UNROLL
// chunks per lane at a time, later passes reading the row again from the caches. The backward takes one block
// per row, each thread owning 4 columns.
#pragma once
#include "rows_fast.cuh"

// The lane's first column of batch chunk u in a loop from c0 (chunks of VEC, the warp's 32 side by side).
template <int VEC>
__device__ __forceinline__ int batch_col(int c0, int u) { return c0 + u * 32 * VEC; }

// out, mean and rstd of row n from its values v (the lane's chunks, 0 past C) and their lane sum. STREAM: out's
// 16-byte chunks stored evict-first (st.global.cs), so that the rows still to be read keep their place in L2.
template <int VEC, bool STREAM = false>
__device__ __forceinline__ void layernorm_regs_out(float* o, float* mean, float* rstd, float (&v)[ROW_REGS / VEC][VEC],
                                                   float sum, const float* w, const float* b, long long n, int C) {
    constexpr int CHUNKS = ROW_REGS / VEC;
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (chunk_col<VEC>(k) + e < C) {
                float d = v[k][e] - m;
                var += d * d;
            }
    const float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c >= C) break;
        float wv[VEC], bv[VEC];
        load_vec<VEC>(wv, w + c);
        load_vec<VEC>(bv, b + c);
#pragma unroll
        for (int e = 0; e < VEC; e++) v[k][e] = (v[k][e] - m) * s * wv[e] + bv[e];
        if constexpr (STREAM && VEC == 4)
            __stcs(reinterpret_cast<float4*>(o + c), make_float4(v[k][0], v[k][1], v[k][2], v[k][3]));
        else
            store_vec<VEC>(o + c, v[k]);
    }
    if (threadIdx.x % 32 == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

// The same from the row in memory (xr: the warp's own recent reads or writes, in the caches) and the lane's
// sum of it.
template <int VEC>
__device__ __forceinline__ void layernorm_loop_out(float* o, float* mean, float* rstd, const float* xr, float sum,
                                                   const float* w, const float* b, long long n, int C) {
    const int lane = threadIdx.x % 32;
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
#pragma unroll 4
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float t[VEC];
        load_vec<VEC>(t, xr + c);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float d = t[e] - m;
            var += d * d;
        }
    }
    const float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC * MB_UNROLL) {
        float t[MB_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            int c = batch_col<VEC>(c0, u);
            if (c < C) load_vec<VEC>(t[u], xr + c);
        }
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            int c = batch_col<VEC>(c0, u);
            if (c < C) {
                float wv[VEC], bv[VEC];  // every row's: in L1
                load_vec<VEC>(wv, w + c);
                load_vec<VEC>(bv, b + c);
#pragma unroll
                for (int e = 0; e < VEC; e++) t[u][e] = (t[u][e] - m) * s * wv[e] + bv[e];
                store_vec<VEC>(o + c, t[u]);
            }
        }
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

template <int VEC>
__device__ __forceinline__ void layernorm_fwd_row(float* o, float* mean, float* rstd, const float* xr, const float* w,
                                                  const float* b, long long n, int C) {
    if (VEC == 4 && C <= ROW_REGS * 32) {
        constexpr int CHUNKS = ROW_REGS / VEC;
        float v[CHUNKS][VEC] = {};
#pragma unroll
        for (int k = 0; k < CHUNKS; k++) {
            int c = chunk_col<VEC>(k);
            if (c < C) load_vec<VEC, true>(v[k], xr + c);  // evict-first: read once
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS; k++)
#pragma unroll
            for (int e = 0; e < VEC; e++) sum += v[k][e];  // 0 past C
        layernorm_regs_out<VEC, true>(o, mean, rstd, v, sum, w, b, n, C);
    } else {
        float sum = 0.0f;
#pragma unroll 4
        for (int c = threadIdx.x % 32 * VEC; c < C; c += 32 * VEC) {
            float t[VEC];
            load_vec<VEC>(t, xr + c);
#pragma unroll
            for (int e = 0; e < VEC; e++) sum += t[e];
        }
        layernorm_loop_out<VEC>(o, mean, rstd, xr, sum, w, b, n, C);
    }
}

// No minimum of blocks asked: as it is, it fits in 64 registers, four blocks per SM (asking for four spills).
extern "C" __global__ void __launch_bounds__(256)
    k_layernorm_fwd_fast(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                         int N, int C) {
    long long n = warp_row();
    if (n >= N) return;  // the whole warp leaves together
    if (rows_vec4(C, out, x, w, b))
        layernorm_fwd_row<4>(out + n * C, mean, rstd, x + n * C, w, b, n, C);
    else
        layernorm_fwd_row<1>(out + n * C, mean, rstd, x + n * C, w, b, n, C);
}

// The forward staged through shared memory by cp.async (sm_80 and later; the launcher takes k_layernorm_fwd_fast
// elsewhere), for rows of 16-byte chunks up to LN_STAGED_MAX_C columns. Each lane copies its own chunks into the
// warp's row of shared memory and reads back only those (no barrier); no register holds the row in flight, so more
// warps fit an SM. The same sums in the same order as layernorm_fwd_row<4>: k_layernorm_fwd_fast's bits.
enum LayernormStagedLaunch : int {
    LN_STAGED_WARPS = 8,   // rows per block, one warp each
    LN_STAGED_REGS = 32,   // registers per thread: 64 warps per SM where an SM holds 2048 threads (sm_80, sm_90)
    LN_STAGED_MAX_C = 1024, // its longest rows: those of the register path, whose bits it gives
};
static_assert(LN_STAGED_MAX_C == ROW_REGS * 32, "the staged forward takes the register path's rows");

// A register cap, not __launch_bounds__(256, 8): eight blocks of 256 threads are more than an SM of sm_75 or sm_89
// holds, which ptxas refuses for every architecture the module may be built for.
extern "C" __global__ void __maxnreg__(LN_STAGED_REGS)
    k_layernorm_fwd_staged(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                           int N, int C) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    extern __shared__ float4 ln_staged_rows[];  // C floats per warp
    const int lane = threadIdx.x % 32;
    if (warp_row() >= N) return;  // the whole warp leaves together
    const int n = (int)warp_row();
    float* row = reinterpret_cast<float*>(ln_staged_rows) + (threadIdx.x / 32) * C;
    const float* xr = x + (long long)n * C;
    {
        unsigned long long evict_first;  // x is read once: the rows still to come keep L2
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(evict_first));
        for (int c = lane * 4; c < C; c += 128)
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(
                             static_cast<unsigned>(__cvta_generic_to_shared(row + c))),
                         "l"(xr + c), "l"(evict_first)
                         : "memory");
        asm volatile("cp.async.wait_all;" ::: "memory");
    }
    float sum = 0.0f;
    for (int c = lane * 4; c < C; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + c);
        sum += v.x, sum += v.y, sum += v.z, sum += v.w;
    }
    if (chunk_col<4>(ROW_REGS / 4 - 1) >= C) sum += 0.0f;  // as the register path's zeros past C: -0 becomes +0
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * 4; c < C; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + c);
        float d;
        d = v.x - m, var += d * d;
        d = v.y - m, var += d * d;
        d = v.z - m, var += d * d;
        d = v.w - m, var += d * d;
    }
    const float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
    if (lane == 0) {  // now, not after the row: fewer registers held through its stores
        mean[n] = m;
        rstd[n] = s;
    }
    float* o = out + (long long)n * C;
    for (int c = lane * 4; c < C; c += 128) {
        const float4 v = *reinterpret_cast<const float4*>(row + c);
        const float4 wv = *reinterpret_cast<const float4*>(w + c), bv = *reinterpret_cast<const float4*>(b + c);
        *reinterpret_cast<float4*>(o + c) =
            make_float4((v.x - m) * s * wv.x + bv.x, (v.y - m) * s * wv.y + bv.y, (v.z - m) * s * wv.z + bv.z,
                        (v.w - m) * s * wv.w + bv.w);
    }
#endif
}

// The residual add and the layernorm that reads its sum, in one pass over the row: x = resid + branch (written:
// the next residual add and the backward read it; the same single rounding as k_residual_fwd), out =
// layernorm(x). Each lane sums the same columns in the same order as k_layernorm_fwd_fast, so out, mean and
// rstd are that kernel's bits wherever the two take the same path (both 16-byte chunks, or both one float).
template <int VEC>
__device__ __forceinline__ void residual_layernorm_row(float* xr, float* o, float* mean, float* rstd, const float* rr,
                                                       const float* br, const float* w, const float* b, long long n,
                                                       int C) {
    if (VEC == 4 && C <= ROW_REGS * 32) {
        constexpr int CHUNKS = ROW_REGS / VEC;
        float v[CHUNKS][VEC] = {}, u[CHUNKS][VEC] = {};
#pragma unroll
        for (int k = 0; k < CHUNKS; k++) {
            int c = chunk_col<VEC>(k);
            if (c < C) {
                load_vec<VEC, true>(v[k], rr + c);  // evict-first: read once
                load_vec<VEC, true>(u[k], br + c);
            }
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS; k++) {
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                v[k][e] = v[k][e] + u[k][e];  // 0 past C
                sum += v[k][e];
            }
            int c = chunk_col<VEC>(k);
            if (c < C) store_vec<VEC>(xr + c, v[k]);
        }
        layernorm_regs_out<VEC>(o, mean, rstd, v, sum, w, b, n, C);
    } else {
        float sum = 0.0f;
        for (int c0 = threadIdx.x % 32 * VEC; c0 < C; c0 += 32 * VEC * MB_UNROLL) {
            float t[MB_UNROLL][VEC], t2[MB_UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++) {
                int c = batch_col<VEC>(c0, u);
                if (c < C) {
                    load_vec<VEC>(t[u], rr + c);
                    load_vec<VEC>(t2[u], br + c);
                }
            }
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++) {
                int c = batch_col<VEC>(c0, u);
                if (c < C) {
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        t[u][e] = t[u][e] + t2[u][e];
                        sum += t[u][e];
                    }
                    store_vec<VEC>(xr + c, t[u]);
                }
            }
        }
        // each lane reads back the columns it wrote itself (the same chunks of the same VEC): visible to it
        layernorm_loop_out<VEC>(o, mean, rstd, xr, sum, w, b, n, C);
    }
}

// Read by microgpt/kernels/layernorm_fast.py: the fused residual add and layernorm's blocks of 4 warps (rows), 6 per
// SM: small blocks, so that a block's place is taken again as soon as its 4 rows are done.
enum ResidualLayernormLaunch : int {
    RESID_LN_THREADS = 128,
};

// At most 80 registers (held to 64 for more warps, ptxas spills): 24 warps, each with a row of both inputs in
// flight, are still more bytes in flight than the memory needs.
extern "C" __global__ void __launch_bounds__(RESID_LN_THREADS, 6)
    k_residual_layernorm_fwd_fast(float* x, float* out, float* mean, float* rstd, const float* resid,
                                  const float* branch, const float* w, const float* b, int N, int C) {
    long long n = warp_row();
    if (n >= N) return;
    const long long o = n * C;
    if (rows_vec4(C, x, out, resid, branch, w, b))
        residual_layernorm_row<4>(x + o, out + o, mean, rstd, resid + o, branch + o, w, b, n, C);
    else
        residual_layernorm_row<1>(x + o, out + o, mean, rstd, resid + o, branch + o, w, b, n, C);
}

// The backward, llm.c's way: one pass over the rows gives dx and each block's partial row of dw and db, then the
// last blocks to finish add the partial rows into dw and db (ln_bwd_finish), in the same launch. dx = rstd *
// (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w, xhat = (x - mean) * rstd: written, or added
// into where ACC. Every rounding is spelled out (_rn: no contraction left to the compiler). Block b takes rows
// [b * rows_per_block, (b + 1) * rows_per_block) in order, thread t owning columns 4t .. 4t + 3: the order of
// every sum depends on rows_per_block alone (the launcher's, a function of N), not on the GPU.

// Read by microgpt/kernels/layernorm_fast.py: which rows take which kernel, and the grids of their launches.
enum LayernormBwdLaunch : int {
    LN_BWD_ROWS = 2,         // rows a block takes at once (one barrier for their sums), the next 2 rows' loads in
                             // flight meanwhile
    LN_BWD_THREADS = 1024,   // rows of up to 4 * this many columns take k_layernorm_bwd_fast
    LN_BWD_REDUCE_COLS = 16, // columns of the 2 * C that a finishing block adds at a time (a strip; a multiple of 4)
};

// xhat = (x - mean) * rstd
__device__ __forceinline__ float ln_xhat(float x, float m, float s) { return __fmul_rn(__fsub_rn(x, m), s); }

// A thread's 4 columns of a row, from column c (a multiple of 4, below C): one 16-byte load (VEC = 4), or one
// float at a time with those past C left 0 (VEC = 1: rows of C % 4 != 0 have a thread with fewer than 4).
template <int VEC>
__device__ __forceinline__ void load_cols4(float (&v)[4], const float* row, int c, int C) {
    if constexpr (VEC == 4) {
        load_vec<4>(v, row + c);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] = c + e < C ? row[c + e] : 0.0f;
    }
}

template <int VEC>
__device__ __forceinline__ void store_cols4(float* row, const float (&v)[4], int c, int C) {
    if constexpr (VEC == 4) {
        store_vec<4>(row + c, v);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (c + e < C) row[c + e] = v[e];
    }
}

// A row's 4 columns from c (below C): x (h) becomes xhat, and dout (g) is added into the thread's shares of dw
// and db (pw, pb). Columns past C (VEC = 1) add nothing.
template <int VEC>
__device__ __forceinline__ void ln_bwd_cols_wb(const float (&g)[4], float (&h)[4], float (&pw)[4], float (&pb)[4],
                                               float m, float s, int c, int C) {
#pragma unroll
    for (int e = 0; e < 4; e++)
        if (VEC == 4 || c + e < C) {
            h[e] = ln_xhat(h[e], m, s);
            pw[e] = __fmaf_rn(g[e], h[e], pw[e]);
            pb[e] = __fadd_rn(pb[e], g[e]);
        }
}

// Then dout (g) becomes dxhat, and goes into the thread's two sums of the row with xhat (h).
template <int VEC>
__device__ __forceinline__ void ln_bwd_cols_sums(float (&g)[4], const float (&h)[4], const float (&wv)[4], int c,
                                                 int C, float& sum_g, float& sum_gh) {
#pragma unroll
    for (int e = 0; e < 4; e++)
        if (VEC == 4 || c + e < C) {
            g[e] = __fmul_rn(g[e], wv[e]);
            sum_g = __fadd_rn(sum_g, g[e]);
            sum_gh = __fmaf_rn(g[e], h[e], sum_gh);
        }
}

// dx of one column from its dxhat and xhat (h), the row's rstd (s) and its two means
__device__ __forceinline__ float ln_bwd_dx(float dxhat, float h, float s, float mean_g, float mean_gh) {
    return __fmul_rn(s, __fmaf_rn(-h, mean_gh, __fsub_rn(dxhat, mean_g)));
}

// dx of 4 columns, into g, from dxhat (g), xhat (h) and the row's two means.
__device__ __forceinline__ void ln_bwd_cols_dx(float (&g)[4], const float (&h)[4], float s, float mean_g,
                                               float mean_gh) {
#pragma unroll
    for (int e = 0; e < 4; e++) g[e] = ln_bwd_dx(g[e], h[e], s, mean_g, mean_gh);
}

// dx added into old where ACC: the one rounding of a separate k_residual_fwd.
template <bool ACC>
__device__ __forceinline__ void ln_bwd_cols_acc(float (&g)[4], const float (&old)[4]) {
#pragma unroll
    for (int e = 0; e < 4; e++)
        if (ACC) g[e] = __fadd_rn(old[e], g[e]);
}

// A block's rows, LN_BWD_ROWS at a time, the next group's loads issued before this group's sums are reduced
// across the block and its dx stored. The thread's shares of dw and db wait in shared memory between groups
// (shares: its 16 bytes of each), so that no registers hold them through the barrier.
template <int VEC, bool ACC>
__device__ __forceinline__ void layernorm_bwd_rows(float* dx, float* partials, float (*sums)[32][2 * LN_BWD_ROWS],
                                                   float4* shares, const float* dout, const float* x,
                                                   const float* w, const float* mean, const float* rstd, int N,
                                                   int C, int rows_per_block) {
    constexpr int R = LN_BWD_ROWS;
    static_assert(2 * R <= 32, "a warp's lanes hold the rows' means and rstds");
    const int c = threadIdx.x * 4, lane = threadIdx.x % 32;
    const bool mine = c < C;
    float* share_w = reinterpret_cast<float*>(shares + threadIdx.x);
    float* share_b = reinterpret_cast<float*>(shares + blockDim.x + threadIdx.x);
    {
        const float zero[4] = {};
        store_vec<4>(share_w, zero);
        store_vec<4>(share_b, zero);
    }
    const long long r0 = (long long)blockIdx.x * rows_per_block, r1 = min((long long)N, r0 + rows_per_block);
    // the group's rows (g: dout, h: x) and stat (lane r: row r's mean, lane R + r: its rstd), loaded a group
    // ahead: the next group's loads are in flight while this one is reduced and stored
    auto load_group = [&](long long n0, float (&g)[R][4], float (&h)[R][4], float& stat) {
        const int rows = (int)min((long long)R, r1 - n0);
        const long long o = n0 * C;
        stat = 0.0f;
        if (lane < 2 * R && lane % R < rows) stat = (lane < R ? mean : rstd)[n0 + lane % R];
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < rows && mine) {
                load_cols4<VEC>(g[r], dout + o + r * C, c, C);
                load_cols4<VEC>(h[r], x + o + r * C, c, C);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) g[r][e] = 0.0f, h[r][e] = 0.0f;
            }
    };
    float g[R][4], h[R][4], stat, g_next[R][4], h_next[R][4], stat_next = 0.0f;
    if (r0 < r1) load_group(r0, g, h, stat);
    int slot = 0;
    for (long long n0 = r0; n0 < r1; n0 += R, slot ^= 1) {
        const int rows = (int)min((long long)R, r1 - n0);
        const long long o = n0 * C;
        if (n0 + R < r1) load_group(n0 + R, g_next, h_next, stat_next);
        {
            float pw[4], pb[4];
            load_vec<4>(pw, share_w);
            load_vec<4>(pb, share_b);
#pragma unroll
            for (int r = 0; r < R; r++) {
                const float m = __shfl_sync(0xffffffff, stat, r), s = __shfl_sync(0xffffffff, stat, R + r);
                if (r < rows && mine) ln_bwd_cols_wb<VEC>(g[r], h[r], pw, pb, m, s, c, C);
            }
            store_vec<4>(share_w, pw);
            store_vec<4>(share_b, pb);
        }
        float v[2 * R] = {};  // row r's sum of dxhat, then of dxhat * xhat
        {
            float wv[4] = {};
            if (mine) load_cols4<VEC>(wv, w, c, C);  // again each time, from L1: 4 registers fewer held
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows && mine) ln_bwd_cols_sums<VEC>(g[r], h[r], wv, c, C, v[2 * r], v[2 * r + 1]);
        }
        block_sums<2 * R>(v, sums[slot]);
#pragma unroll
        for (int r = 0; r < R; r++)
            ln_bwd_cols_dx(g[r], h[r], __shfl_sync(0xffffffff, stat, R + r), v[2 * r] / C, v[2 * r + 1] / C);
        if (mine) {
            float old[R][4] = {};
            if (ACC)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < rows) load_cols4<VEC>(old[r], dx + o + r * C, c, C);
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r < rows) {
                    ln_bwd_cols_acc<ACC>(g[r], old[r]);
                    store_cols4<VEC>(dx + o + r * C, g[r], c, C);
                }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < 4; e++) g[r][e] = g_next[r][e], h[r][e] = h_next[r][e];
        stat = stat_next;
    }
}

// The block's partial row partials[blockIdx.x] from its threads' shares (each thread its own).
template <int VEC>
__device__ __forceinline__ void ln_bwd_partial_row(float* partials, const float4* shares, int C) {
    const int c = threadIdx.x * 4;
    if (c < C) {
        float* out = partials + (long long)blockIdx.x * 2 * C;
        float pw[4], pb[4];
        load_vec<4>(pw, reinterpret_cast<const float*>(shares + threadIdx.x));
        load_vec<4>(pb, reinterpret_cast<const float*>(shares + blockDim.x + threadIdx.x));
        store_cols4<VEC>(out, pw, c, C);
        store_cols4<VEC>(out + C, pb, c, C);
    }
}

// The partial rows are added up by the last `reducers` blocks to finish; they wait until every block has counted.
// Safe: the launcher keeps `reducers` to a quarter of the blocks the GPU holds at once, so a block still to run
// always finds a place, even beside three more such launches on other streams.
constexpr int LN_BWD_REDUCE_BATCH = 4;
// Strip `strip` of LN_BWD_REDUCE_COLS columns of the 2 * C, added into dw and db. A column's order depends on
// blockDim.x alone: thread group g adds partial rows g, g + G, ... in order, then the G groups' sums in order.
template <int VEC>
__device__ __forceinline__ void ln_bwd_reduce_strip(float* dw, float* db, const float* partials, float* group_sums,
                                                    int blocks, int C, int strip) {
    constexpr int UNITS = LN_BWD_REDUCE_COLS / VEC;  // a strip's loads per row: 4 of 16 bytes, or 16 floats
    static_assert(32 % UNITS == 0, "a warp holds whole groups");
    const int unit = threadIdx.x % UNITS, g = threadIdx.x / UNITS, G = blockDim.x / UNITS, C2 = 2 * C;
    const int c = strip * LN_BWD_REDUCE_COLS + unit * VEC;  // this thread's first column of the 2 * C
    float s[VEC] = {};
    if (c < C2)
        for (int k0 = g; k0 < blocks; k0 += G * LN_BWD_REDUCE_BATCH) {
            float t[LN_BWD_REDUCE_BATCH][VEC];
#pragma unroll
            for (int u = 0; u < LN_BWD_REDUCE_BATCH; u++) {
                const int k = k0 + G * u;
                if (k < blocks) {
                    const float* p = partials + (long long)k * C2 + c;  // in L2: written by other blocks
                    if constexpr (VEC == 4) {
                        float4 q = __ldcg(reinterpret_cast<const float4*>(p));
                        t[u][0] = q.x, t[u][1] = q.y, t[u][2] = q.z, t[u][3] = q.w;
                    } else {
                        t[u][0] = __ldcg(p);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < LN_BWD_REDUCE_BATCH; u++)
                if (k0 + G * u < blocks)
#pragma unroll
                    for (int e = 0; e < VEC; e++) s[e] += t[u][e];
        }
#pragma unroll
    for (int e = 0; e < VEC; e++) group_sums[g * LN_BWD_REDUCE_COLS + unit * VEC + e] = s[e];
    __syncthreads();
    if (threadIdx.x < LN_BWD_REDUCE_COLS) {
        const int j = strip * LN_BWD_REDUCE_COLS + threadIdx.x;
        if (j < C2) {
            float total = group_sums[threadIdx.x];
            for (int k = 1; k < G; k++) total += group_sums[k * LN_BWD_REDUCE_COLS + threadIdx.x];
            *(j < C ? dw + j : db + (j - C)) += total;
        }
    }
    __syncthreads();  // the next strip writes group_sums again
}

// After the block's partial row is written (every thread's share of it): its ticket, and the reduction if it is
// one of the last `reducers`. counters: 2, zero before the launch; the last reducer to finish sets them back.
// group_sums: blockDim.x * 4 floats of shared memory, free by now.
__device__ __forceinline__ void ln_bwd_finish(float* dw, float* db, const float* partials, unsigned int* counters,
                                              float* group_sums, int C, int reducers) {
    __shared__ unsigned int ticket;
    __threadfence();  // this block's partial row is visible to every block before the block counts as done
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(counters, 1u);
    __syncthreads();
    const unsigned int first = gridDim.x - reducers;
    if (ticket < first) return;  // the whole block leaves together
    if (threadIdx.x == 0) {
        const volatile unsigned int* arrived = counters;
        while (*arrived < gridDim.x) __nanosleep(256);
    }
    __syncthreads();
    __threadfence();
    const int strips = (2 * C + LN_BWD_REDUCE_COLS - 1) / LN_BWD_REDUCE_COLS;
    for (int strip = ticket - first; strip < strips; strip += reducers) {
        if (C % 2 == 0)  // partial rows of 2 * C floats: 16-byte aligned
            ln_bwd_reduce_strip<4>(dw, db, partials, group_sums, gridDim.x, C, strip);
        else
            ln_bwd_reduce_strip<1>(dw, db, partials, group_sums, gridDim.x, C, strip);
    }
    if (threadIdx.x == 0 && atomicAdd(counters + 1, 1u) == reducers - 1) {
        counters[0] = 0;  // every reducer is past its wait: the next launch finds both zero
        counters[1] = 0;
    }
}

// dx of every row (accumulate != 0: added into), each block's partial row of dw and db (partials: (gridDim.x, 2,
// C)), and their sums added into dw and db by the last `reducers` blocks (ln_bwd_finish). Rows of up to
// 4 * LN_BWD_THREADS columns; blockDim.x = ceil(C / 4) rounded up to a warp, and 32 * blockDim.x bytes of dynamic
// shared memory. At most 64 registers (the bound's 1024 threads), so that at C = 768 five blocks fit an SM.
extern "C" __global__ void __launch_bounds__(LN_BWD_THREADS, 1)
    k_layernorm_bwd_fast(float* dx, float* dw, float* db, float* partials, unsigned int* counters, const float* dout,
                         const float* x, const float* w, const float* mean, const float* rstd, int N, int C,
                         int rows_per_block, int accumulate, int reducers) {
    __shared__ __align__(16) float sums[2][32][2 * LN_BWD_ROWS];
    extern __shared__ float4 ln_bwd_shares[];
    if (rows_vec4(C, dx, dout, x, w, partials)) {
        if (accumulate)
            layernorm_bwd_rows<4, true>(dx, partials, sums, ln_bwd_shares, dout, x, w, mean, rstd, N, C,
                                        rows_per_block);
        else
            layernorm_bwd_rows<4, false>(dx, partials, sums, ln_bwd_shares, dout, x, w, mean, rstd, N, C,
                                         rows_per_block);
    } else {
        if (accumulate)
            layernorm_bwd_rows<1, true>(dx, partials, sums, ln_bwd_shares, dout, x, w, mean, rstd, N, C,
                                        rows_per_block);
        else
            layernorm_bwd_rows<1, false>(dx, partials, sums, ln_bwd_shares, dout, x, w, mean, rstd, N, C,
                                         rows_per_block);
    }
    // written once the paths have joined: an address kept from the start through the rows would take a register
    if (C % 4 == 0 && all_aligned16(partials, nullptr))
        ln_bwd_partial_row<4>(partials, ln_bwd_shares, C);
    else
        ln_bwd_partial_row<1>(partials, ln_bwd_shares, C);
    ln_bwd_finish(dw, db, partials, counters, reinterpret_cast<float*>(ln_bwd_shares), C, reducers);
}

// Rows too long for a block to span, one at a time: thread t owns columns 4t .. 4t + 3 of every 4 * blockDim.x.
// Its shares of dw and db live in the block's partial row itself (each column touched only by its own thread, so
// added in row order), read and written again for each row. One pass over the row for its sums, one for dx.
template <int VEC, bool ACC>
__device__ __forceinline__ void layernorm_bwd_wide_rows(float* dx, float* partials, float (*sums)[32][2],
                                                        const float* dout, const float* x, const float* w,
                                                        const float* mean, const float* rstd, int N, int C,
                                                        int rows_per_block) {
    const int step = 4 * blockDim.x;
    float* pw = partials + (long long)blockIdx.x * 2 * C;
    float* pb = pw + C;
    for (int c = threadIdx.x * 4; c < C; c += step) {
        const float zero[4] = {};
        store_cols4<VEC>(pw, zero, c, C);
        store_cols4<VEC>(pb, zero, c, C);
    }
    const long long r0 = (long long)blockIdx.x * rows_per_block, r1 = min((long long)N, r0 + rows_per_block);
    int slot = 0;
    for (long long n = r0; n < r1; n++, slot ^= 1) {
        const float m = mean[n], s = rstd[n];
        const float *dr = dout + n * C, *xr = x + n * C;
        float* dxr = dx + n * C;
        float v[2] = {};
        for (int c = threadIdx.x * 4; c < C; c += step) {
            float g[4], h[4], wv[4], a[4], b[4];
            load_cols4<VEC>(g, dr, c, C);
            load_cols4<VEC>(h, xr, c, C);
            load_cols4<VEC>(wv, w, c, C);
            load_cols4<VEC>(a, pw, c, C);
            load_cols4<VEC>(b, pb, c, C);
            ln_bwd_cols_wb<VEC>(g, h, a, b, m, s, c, C);
            store_cols4<VEC>(pw, a, c, C);
            store_cols4<VEC>(pb, b, c, C);
            ln_bwd_cols_sums<VEC>(g, h, wv, c, C, v[0], v[1]);
        }
        block_sums<2>(v, sums[slot]);
        const float mean_g = v[0] / C, mean_gh = v[1] / C;
        for (int c = threadIdx.x * 4; c < C; c += step) {
            float g[4], h[4], wv[4], old[4] = {};
            load_cols4<VEC>(g, dr, c, C);
            load_cols4<VEC>(h, xr, c, C);
            load_cols4<VEC>(wv, w, c, C);
            if (ACC) load_cols4<VEC>(old, dxr, c, C);
#pragma unroll
            for (int e = 0; e < 4; e++) {  // the roundings of the first pass: the same xhat and dxhat
                h[e] = ln_xhat(h[e], m, s);
                g[e] = __fmul_rn(g[e], wv[e]);
            }
            ln_bwd_cols_dx(g, h, s, mean_g, mean_gh);
            ln_bwd_cols_acc<ACC>(g, old);
            store_cols4<VEC>(dxr, g, c, C);
        }
    }
}

// k_layernorm_bwd_fast for rows longer than 4 * LN_BWD_THREADS columns (the same arguments, partial rows and
// reduction); blockDim.x = LN_BWD_THREADS, and 16 * LN_BWD_THREADS bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(LN_BWD_THREADS, 1)
    k_layernorm_bwd_fast_wide(float* dx, float* dw, float* db, float* partials, unsigned int* counters,
                              const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                              int N, int C, int rows_per_block, int accumulate, int reducers) {
    __shared__ __align__(16) float sums[2][32][2];
    extern __shared__ float ln_bwd_group_sums[];
    if (rows_vec4(C, dx, dout, x, w, partials)) {
        if (accumulate)
            layernorm_bwd_wide_rows<4, true>(dx, partials, sums, dout, x, w, mean, rstd, N, C, rows_per_block);
        else
            layernorm_bwd_wide_rows<4, false>(dx, partials, sums, dout, x, w, mean, rstd, N, C, rows_per_block);
    } else {
        if (accumulate)
            layernorm_bwd_wide_rows<1, true>(dx, partials, sums, dout, x, w, mean, rstd, N, C, rows_per_block);
        else
            layernorm_bwd_wide_rows<1, false>(dx, partials, sums, dout, x, w, mean, rstd, N, C, rows_per_block);
    }
    ln_bwd_finish(dw, db, partials, counters, ln_bwd_group_sums, C, reducers);
}
