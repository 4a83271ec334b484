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

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w, xhat = (x - mean) * rstd:
// written, or added into with __fadd_rn where accumulate != 0 (as k_layernorm_bwd: the residual stream's
// gradient, the same rounding as a separate k_residual_fwd). dw and db come from k_layernorm_bwd_fast_wb.
template <int VEC>
__device__ __forceinline__ void layernorm_bwd_row(float* dxr, const float* dr, const float* xr, const float* w,
                                                  float m, float s, int C, int accumulate) {
    if (VEC == 4 && C <= ROW_REGS * 32) {
        constexpr int CHUNKS = ROW_REGS / VEC;
        // dout, then dxhat, then dx; x, then xhat; the dx added into, loaded with the rest (one trip to memory)
        float g[CHUNKS][VEC] = {}, h[CHUNKS][VEC] = {}, old[CHUNKS][VEC] = {};
#pragma unroll
        for (int k = 0; k < CHUNKS; k++) {
            int c = chunk_col<VEC>(k);
            if (c < C) {
                load_vec<VEC>(g[k], dr + c);
                load_vec<VEC>(h[k], xr + c);
                if (accumulate) load_vec<VEC>(old[k], dxr + c);
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
                for (int e = 0; e < VEC; e++) {
                    g[k][e] = g[k][e] * wv[e];
                    h[k][e] = (h[k][e] - m) * s;
                    sum_g += g[k][e];
                    sum_gh += g[k][e] * h[k][e];
                }
            }
        }
        const float mean_dxhat = warp_sum(sum_g) / C, mean_dxhat_xhat = warp_sum(sum_gh) / C;
#pragma unroll
        for (int k = 0; k < CHUNKS; k++) {
            int c = chunk_col<VEC>(k);
            if (c < C) {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    float v = s * (g[k][e] - mean_dxhat - h[k][e] * mean_dxhat_xhat);
                    g[k][e] = accumulate ? __fadd_rn(old[k][e], v) : v;  // _rn: no FMA with the product above
                }
                store_vec<VEC>(dxr + c, g[k]);
            }
        }
    } else {
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
                float dxhat = gv[e] * wv[e];
                sum_g += dxhat;
                sum_gh += dxhat * ((xv[e] - m) * s);
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
                    if (accumulate) load_vec<VEC>(old[u], dxr + c);
                }
            }
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++) {
                int c = batch_col<VEC>(c0, u);
                if (c < C) {
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        float v = s * (gv[u][e] * wv[u][e] - mean_dxhat - (xv[u][e] - m) * s * mean_dxhat_xhat);
                        gv[u][e] = accumulate ? __fadd_rn(old[u][e], v) : v;
                    }
                    store_vec<VEC>(dxr + c, gv[u]);
                }
            }
        }
    }
}

// Two blocks an SM (at most 128 registers): dout, x and the dx added into, 96 floats a lane, in flight together.
extern "C" __global__ void __launch_bounds__(256, 2)
    k_layernorm_bwd_fast(float* dx, const float* dout, const float* x, const float* w, const float* mean,
                         const float* rstd, int N, int C, int accumulate) {
    long long n = warp_row();
    if (n >= N) return;
    const long long o = n * C;
    if (rows_vec4(C, dx, dout, x, w))
        layernorm_bwd_row<4>(dx + o, dout + o, x + o, w, mean[n], rstd[n], C, accumulate);
    else
        layernorm_bwd_row<1>(dx + o, dout + o, x + o, w, mean[n], rstd[n], C, accumulate);
}

// Pass 1 of dw, db: per (group of 32 columns, chunk of rows), as k_colsum_partial; k_colsum_reduce adds
// the chunks into dw and db.
extern "C" __global__ void k_layernorm_bwd_fast_wb(float* dw_partials, float* db_partials, const float* dout,
                                                   const float* x, const float* mean, const float* rstd,
                                                   int N, int C, int rows_per_chunk) {
    __shared__ float part_w[8][32], part_b[8][32];
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += 8) {
            float d = dout[(long long)r * C + c];
            sw += d * (x[(long long)r * C + c] - mean[r]) * rstd[r];
            sb += d;
        }
    part_w[ty][tx] = sw;
    part_b[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 1; k < 8; k++) {
            sw += part_w[k][tx];
            sb += part_b[k][tx];
        }
        dw_partials[(long long)blockIdx.y * C + c] = sw;
        db_partials[(long long)blockIdx.y * C + c] = sb;
    }
}
