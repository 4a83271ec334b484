// Fast variants of the layernorms: a warp per row (the grid of 32 threads a row), each reduction in a fixed
// order, so results repeat bit for bit; tested against the one-thread-per-row reference kernels and float64.
//
// A row of up to ROW_REGS * 32 = 1024 columns in 16-byte chunks (C % 4 == 0, arrays aligned) is loaded into
// registers at once and every statistic comes from the registers. Other rows (longer, or read one float at a
// time: there 32 loads a lane in flight take more registers than the kernels have, and spill) take a loop over
// the row, MB_UNROLL chunks a lane at a time, each batch loaded before any of it is stored; its later passes
// read the row again from the caches. On the H200 at andrea-120m's shapes (B=8, T=1024, C=768) these bodies
// took the forward from 0.0225 to 0.0167 ms (71% of the copy bandwidth), the fused residual add and layernorm
// from 0.0394 to 0.0303 (78%), and the backward's dx from 0.0388 to 0.0240 (0.0424 to 0.0286 adding into dx),
// against the first warp-per-row kernels that read one float at a time; their errors against float64 stayed
// within 1.5x of those kernels'.
#pragma once
#include "rows_fast.cuh"

// The lane's first column of batch chunk u in a loop from c0 (chunks of VEC, the warp's 32 side by side).
template <int VEC>
__device__ __forceinline__ int batch_col(int c0, int u) { return c0 + u * 32 * VEC; }

// out, mean and rstd of row n from its values v (the lane's chunks, 0 past C) and their lane sum.
template <int VEC>
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
            if (c < C) load_vec<VEC>(v[k], xr + c);
        }
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS; k++)
#pragma unroll
            for (int e = 0; e < VEC; e++) sum += v[k][e];  // 0 past C
        layernorm_regs_out<VEC>(o, mean, rstd, v, sum, w, b, n, C);
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

// No minimum of blocks asked: as it is it fits in 64 registers, four blocks an SM (asked for four, ptxas spilled).
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
                load_vec<VEC>(v[k], rr + c);
                load_vec<VEC>(u[k], br + c);
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

// Three blocks an SM (at most 80 registers; held to 64 for four, ptxas spills): 24 warps with a row of both
// inputs in flight each are still more bytes in flight than the memory needs.
extern "C" __global__ void __launch_bounds__(256, 3)
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

// The backward, llm.c's way: one pass over the rows gives dx and each block's share of dw and db.
//
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w, xhat = (x - mean) * rstd:
// written, or added into where ACC (as k_layernorm_bwd: the residual stream's gradient, the same rounding as a
// separate k_residual_fwd). Every rounding is spelled out (_rn: no contraction left to the compiler), as the
// first warp-per-row kernel compiled them (read from its SASS), so dx keeps that kernel's bits: in registers
// dxhat is rounded once and reused; in the loop, dxhat - mean(dxhat) is one FMA.
// Each warp also adds its rows' dout * xhat and dout into its own partial rows of dw and db (pw, pb: C floats
// each; a lane only ever touches its own columns), one row after another, rounded the same on every path, so
// the partials do not depend on the path a row takes nor on where they live (shared or global memory).
template <int VEC>
__device__ __forceinline__ void add_wb_partials(float* pw, float* pb, const float (&g)[VEC], const float (&xhat)[VEC]) {
    float a[VEC], b[VEC];
    load_vec<VEC>(a, pw);
    load_vec<VEC>(b, pb);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        a[e] = __fmaf_rn(g[e], xhat[e], a[e]);
        b[e] = __fadd_rn(b[e], g[e]);
    }
    store_vec<VEC>(pw, a);
    store_vec<VEC>(pb, b);
}

// xhat = (x - mean) * rstd
__device__ __forceinline__ float ln_xhat(float x, float m, float s) { return __fmul_rn(__fsub_rn(x, m), s); }

// A row held in registers (16-byte chunks, C <= ROW_REGS * 32). dout, then dxhat; x, then xhat. The dx added
// into is loaded only once the row's sums are taken (asked of L2 ahead: prefetch_l2), so that the three rows
// never hold registers at once.
template <bool ACC>
__device__ __forceinline__ void layernorm_bwd_row_regs(float* dxr, float* pw, float* pb, const float* dr,
                                                       const float* xr, const float* w, float m, float s, int C) {
    constexpr int VEC = 4, CHUNKS = ROW_REGS / VEC;
    float g[CHUNKS][VEC] = {}, h[CHUNKS][VEC] = {};
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c < C) {
            load_vec<VEC>(g[k], dr + c);
            load_vec<VEC>(h[k], xr + c);
        }
    }
    float sum_g = 0.0f, sum_gh = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c < C) {
            float wv[VEC];
            load_vec<VEC>(wv, w + c);
#pragma unroll
            for (int e = 0; e < VEC; e++) h[k][e] = ln_xhat(h[k][e], m, s);
            add_wb_partials<VEC>(pw + c, pb + c, g[k], h[k]);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                g[k][e] = __fmul_rn(g[k][e], wv[e]);
                sum_g = __fadd_rn(sum_g, g[k][e]);
                sum_gh = __fmaf_rn(g[k][e], h[k][e], sum_gh);
            }
        }
    }
    const float mean_dxhat = warp_sum(sum_g) / C, mean_dxhat_xhat = warp_sum(sum_gh) / C;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++) {
        int c = chunk_col<VEC>(k);
        if (c < C) {
            float old[VEC];
            if (ACC) load_vec<VEC>(old, dxr + c);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                float v = __fmul_rn(s, __fmaf_rn(-h[k][e], mean_dxhat_xhat, __fsub_rn(g[k][e], mean_dxhat)));
                g[k][e] = ACC ? __fadd_rn(old[e], v) : v;
            }
            store_vec<VEC>(dxr + c, g[k]);
        }
    }
}

// Any other row (longer, or read one float at a time): a pass for the sums, a pass for dx (from the caches).
template <int VEC, bool ACC>
__device__ __forceinline__ void layernorm_bwd_row_loop(float* dxr, float* pw, float* pb, const float* dr,
                                                       const float* xr, const float* w, float m, float s, int C) {
    const int lane = threadIdx.x % 32;
    float sum_g = 0.0f, sum_gh = 0.0f;
#pragma unroll 4
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float gv[VEC], xv[VEC], wv[VEC];
        load_vec<VEC>(gv, dr + c);
        load_vec<VEC>(xv, xr + c);
        load_vec<VEC>(wv, w + c);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float dxhat = __fmul_rn(gv[e], wv[e]);
            sum_g = __fadd_rn(sum_g, dxhat);
            sum_gh = __fmaf_rn(dxhat, ln_xhat(xv[e], m, s), sum_gh);
        }
    }
    const float mean_dxhat = warp_sum(sum_g) / C, mean_dxhat_xhat = warp_sum(sum_gh) / C;
    for (int c0 = lane * VEC; c0 < C; c0 += 32 * VEC * MB_UNROLL) {
        float gv[MB_UNROLL][VEC], xv[MB_UNROLL][VEC], wv[MB_UNROLL][VEC], old[MB_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            int c = batch_col<VEC>(c0, u);
            if (c < C) {
                load_vec<VEC>(gv[u], dr + c);
                load_vec<VEC>(xv[u], xr + c);
                load_vec<VEC>(wv[u], w + c);
                if (ACC) load_vec<VEC>(old[u], dxr + c);
            }
        }
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            int c = batch_col<VEC>(c0, u);
            if (c < C) {
#pragma unroll
                for (int e = 0; e < VEC; e++) xv[u][e] = ln_xhat(xv[u][e], m, s);
                add_wb_partials<VEC>(pw + c, pb + c, gv[u], xv[u]);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float t = __fmaf_rn(gv[u][e], wv[u][e], -mean_dxhat);
                    float v = __fmul_rn(s, __fmaf_rn(xv[u][e], -mean_dxhat_xhat, t));
                    gv[u][e] = ACC ? __fadd_rn(old[u][e], v) : v;
                }
                store_vec<VEC>(dxr + c, gv[u]);
            }
        }
    }
}

// A hint that `bytes` from p (16-byte aligned, a multiple of 16) will be read soon: one instruction asks for a
// whole row (Hopper's bulk prefetch into L2; nothing before it).
__device__ __forceinline__ void prefetch_l2(const float* p, int bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(p)), "r"(bytes)
                 : "memory");
#endif
}

// Block b takes rows [b * rows_per_block, (b + 1) * rows_per_block) of N; warp k of it the rows k, k + warps,
// k + 2 * warps, ... in that order. part holds the block's warps' partial rows (warps, 2, C: dw's C, then db's);
// the block's partial row partials[b] (2, C) = those added in warp order. Where rows are 16-byte chunks, a
// warp asks L2 for its next row (and, where ACC, this row's dx) as it starts on a row: two rows a warp in flight
// for the registers of one.
template <int VEC, bool REGS, bool ACC>
__device__ __forceinline__ void layernorm_bwd_block(float* dx, float* partials, float* part, const float* dout,
                                                    const float* x, const float* w, const float* mean,
                                                    const float* rstd, int N, int C, int rows_per_block) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32, C2 = 2 * C;
    float* pw = part + warp * C2;
    float* pb = pw + C;
    for (int j = lane; j < C2; j += 32) pw[j] = 0.0f;
    __syncwarp();  // the zeros, written lane by lane, before each lane adds into its own columns
    const long long r0 = (long long)blockIdx.x * rows_per_block, r1 = min((long long)N, r0 + rows_per_block);
    for (long long n = r0 + warp; n < r1; n += warps) {
        const long long o = n * C;
        if (VEC == 4 && lane == 0) {
            if (ACC && n == r0 + warp) prefetch_l2(dx + o, C * 4);
            if (n + warps < r1) {
                const long long o2 = o + (long long)warps * C;
                prefetch_l2(dout + o2, C * 4);
                prefetch_l2(x + o2, C * 4);
                if (ACC) prefetch_l2(dx + o2, C * 4);
            }
        }
        if constexpr (REGS)
            layernorm_bwd_row_regs<ACC>(dx + o, pw, pb, dout + o, x + o, w, mean[n], rstd[n], C);
        else
            layernorm_bwd_row_loop<VEC, ACC>(dx + o, pw, pb, dout + o, x + o, w, mean[n], rstd[n], C);
    }
    __syncthreads();  // every warp's partials (shared, or global: visible to the block after the barrier too)
    float* out = partials + (long long)blockIdx.x * C2;
    for (int j = threadIdx.x; j < C2; j += blockDim.x) {
        float t = part[j];
        for (int k = 1; k < warps; k++) t += part[k * C2 + j];
        out[j] = t;
    }
}

// The path of every row, chosen once: in registers, or looped over 16-byte chunks or single floats; the warps'
// partials in shared memory (LDS, STS) or, for rows too long for it (never one held in registers), in global.
template <bool ACC>
__device__ __forceinline__ void layernorm_bwd_blocks(float* dx, float* partials, float* warp_partials,
                                                     const float* dout, const float* x, const float* w,
                                                     const float* mean, const float* rstd, int N, int C,
                                                     int rows_per_block) {
    extern __shared__ float4 ln_bwd_smem[];
    const bool vec = rows_vec4(C, dx, dout, x, w);
    if (warp_partials == nullptr) {
        float* part = reinterpret_cast<float*>(ln_bwd_smem);
        if (vec && C <= ROW_REGS * 32)
            layernorm_bwd_block<4, true, ACC>(dx, partials, part, dout, x, w, mean, rstd, N, C, rows_per_block);
        else if (vec)
            layernorm_bwd_block<4, false, ACC>(dx, partials, part, dout, x, w, mean, rstd, N, C, rows_per_block);
        else
            layernorm_bwd_block<1, false, ACC>(dx, partials, part, dout, x, w, mean, rstd, N, C, rows_per_block);
    } else {
        float* part = warp_partials + (long long)blockIdx.x * (blockDim.x / 32) * 2 * C;
        if (vec)
            layernorm_bwd_block<4, false, ACC>(dx, partials, part, dout, x, w, mean, rstd, N, C, rows_per_block);
        else
            layernorm_bwd_block<1, false, ACC>(dx, partials, part, dout, x, w, mean, rstd, N, C, rows_per_block);
    }
}

// dx of every row (accumulate != 0: added into), and each block's partial row of dw and db (partials:
// (gridDim.x, 2, C)), which k_layernorm_bwd_fast_reduce adds into dw and db. The warps' partial rows live in
// dynamic shared memory (blockDim.x / 32 * 2 * C floats), or where that is more than a block may have (C above
// 3,600 or so on the H200) in warp_partials (gridDim.x * blockDim.x / 32 rows of 2 * C floats, global): the
// same additions in the same order either way. No atomics: which rows a block adds, and in which order, is set
// by rows_per_block alone (the launcher's, a function of N), so every run on every GPU gives the same bits.
// Two blocks an SM (at most 128 registers).
extern "C" __global__ void __launch_bounds__(256, 2)
    k_layernorm_bwd_fast(float* dx, float* partials, float* warp_partials, const float* dout, const float* x,
                         const float* w, const float* mean, const float* rstd, int N, int C, int rows_per_block,
                         int accumulate) {
    if (accumulate)
        layernorm_bwd_blocks<true>(dx, partials, warp_partials, dout, x, w, mean, rstd, N, C, rows_per_block);
    else
        layernorm_bwd_blocks<false>(dx, partials, warp_partials, dout, x, w, mean, rstd, N, C, rows_per_block);
}

// dw += the column sums of the blocks' dw partials, db += those of db (partials: (blocks, 2, C)), in a fixed
// order: column j of the 2 * C is a lane's; warp k of the block adds the partials k, k + 8, k + 16, ...
// (REDUCE_BATCH loads in flight at a time), then the 8 warps' sums are added in warp order. Grid: ceil(2C / 32)
// blocks of 256 threads.
constexpr int REDUCE_BATCH = 32;
extern "C" __global__ void __launch_bounds__(256)
    k_layernorm_bwd_fast_reduce(float* dw, float* db, const float* partials, int blocks, int C) {
    __shared__ float sums[8][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int j = blockIdx.x * 32 + lane, C2 = 2 * C;
    float t = 0.0f;
    if (j < C2)
        for (int k0 = warp; k0 < blocks; k0 += 8 * REDUCE_BATCH) {
            float v[REDUCE_BATCH];
#pragma unroll
            for (int u = 0; u < REDUCE_BATCH; u++) {
                int k = k0 + 8 * u;
                v[u] = k < blocks ? partials[(long long)k * C2 + j] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < REDUCE_BATCH; u++)
                if (k0 + 8 * u < blocks) t += v[u];
        }
    sums[warp][lane] = t;
    __syncthreads();
    if (warp == 0 && j < C2) {
        for (int k = 1; k < 8; k++) t += sums[k][lane];
        float* out = j < C ? dw + j : db + (j - C);
        *out += t;
    }
}
