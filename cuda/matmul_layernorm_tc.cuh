// A linear layer's dX product and the backward of the layernorm that made its input, in one kernel (sm_90a):
//
//   dout = dY @ W                           (M x C: the layernorm output's gradient, never stored)
//   dx  (+)= rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),   dxhat = dout * w, xhat = (x - mean) * rstd
//   dw += sum over rows of dout * xhat,   db += sum over rows of dout
//
// Apart, the product writes dout and k_layernorm_bwd_fast reads it back beside x: 50 MB a layernorm at
// andrea-120m's B = 8, T = 1024, and a memory-bound pass of its own. Here the product's tiles go straight into the
// layernorm's arithmetic. The product is k_gemm_wg_split's (wg_split_tile: the same acc bits); its epilogue needs
// the whole row's two sums, which the row's ceil(C / 128) column tiles (consecutive blocks: the grid is
// (ceil(C / 128), ceil(M / 128))) exchange through global memory: each writes its 128 columns' share of each row's
// sums, counts itself in, waits for the others, and adds the shares in tile order, so every tile of a row sees
// the same sums, and every run the same bits. Blocks start in order, one to an SM, so a waiting block's partners
// have started or finished: the launcher keeps a row's tiles to a few (C <= 1024) on a GPU of many more SMs.
//
// dw and db: each block's column sums over its 128 rows, in a fixed order (the warps' shuffle trees, then the 8
// warps in order), make partials (2, gridDim.y, C): dw's rows, then db's; k_colsum_reduce adds them in row order.
#pragma once
#include "layernorm_fast.cuh"  // ln_xhat, the backward's roundings
#include "matmul_tc.cuh"       // wg_split_tile

// the two consumer warpgroups (the producer has left: bar 0, __syncthreads, would wait for it)
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// The layernorm backward of a consumer's share of the tile (m0, n0) of dout (g, as wg_store lays it out: element i
// is row r0 + 8 ((i % 4) / 2), column n0 + 8 (i / 4) + 2t + i % 2, r0 = m0 + 16 * wg_warp + lane / 4). row_sums: (M, gridDim.x) float2 shares of each row's
// two sums; counters: 2 * gridDim.y, zero before the launch and left zero; red: 8 KB of the block's shared memory.
// xhat of the two columns c, c + 1 of row `row` (0 outside the matrix, where g is 0 too: the split operands'
// padding); pairs: one 8-byte load
__device__ __forceinline__ float2 ln_xhat_pair(const float* x, int row, int c, int M, int C, float m, float s,
                                               bool pairs) {
    float2 v = make_float2(0.0f, 0.0f);
    if (row < M && c < C) {
        const float* p = x + (long long)row * C + c;
        v = pairs ? *reinterpret_cast<const float2*>(p) : make_float2(p[0], c + 1 < C ? p[1] : 0.0f);
        v.x = ln_xhat(v.x, m, s);
        v.y = c + 1 < C ? ln_xhat(v.y, m, s) : 0.0f;
    }
    return v;
}

template <bool ACC>
__device__ __forceinline__ void wg_ln_bwd_epilogue(const float (&g)[64], float* dx, float* partials, float2* row_sums,
                                                   unsigned int* counters, float* red, const float* x,
                                                   const float* w, const float* mean, const float* rstd, int M,
                                                   int C, int m0, int n0) {
    const int tid = threadIdx.x - 128, wg_warp = tid / 32, lane = tid % 32, t = lane % 4;
    const int r0 = m0 + wg_warp * 16 + lane / 4;  // wg_warp: the 8 consumer warps, 4 a warpgroup of 64 rows
    const int tiles = gridDim.x;
    // pairs of columns in one 8-byte access where every row starts 8-byte aligned
    const bool pairs = C % 2 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(dx)) % 8 == 0;
    float m[2], s[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool in = r0 + 8 * r < M;
        m[r] = in ? mean[r0 + 8 * r] : 0.0f;
        s[r] = in ? rstd[r0 + 8 * r] : 0.0f;
    }
    // ------------------------------------------------ one pass over x: the block's column sums of dout * xhat
    // and dout over its 128 rows (dw, db), and the thread's shares of its 2 rows' sums of dxhat and dxhat * xhat
    consumers_sync();  // every consumer's last wgmma has read the stages, which red now takes
    float s1[2] = {0.0f, 0.0f}, s2[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int c = n0 + 8 * j + 2 * t;
        const float2 h0 = ln_xhat_pair(x, r0, c, M, C, m[0], s[0], pairs);
        const float2 h1 = ln_xhat_pair(x, r0 + 8, c, M, C, m[1], s[1], pairs);
        const float hv[2][2] = {{h0.x, h0.y}, {h1.x, h1.y}};
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int i = 4 * j + e;  // rows r0 and r0 + 8: elements i and i + 2
            float pw = __fmaf_rn(g[i + 2], hv[1][e], __fmul_rn(g[i], hv[0][e])), pb = __fadd_rn(g[i], g[i + 2]);
#pragma unroll
            for (int o = 4; o < 32; o *= 2) {  // the warp's 8 row pairs
                pw = __fadd_rn(pw, __shfl_xor_sync(0xffffffff, pw, o));
                pb = __fadd_rn(pb, __shfl_xor_sync(0xffffffff, pb, o));
            }
            if (lane < 4) {
                float* at = red + 2 * (wg_warp * 128 + 8 * j + 2 * t + e);
                at[0] = pw;
                at[1] = pb;
            }
            const float wc = c + e < C ? w[c + e] : 0.0f;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float d = __fmul_rn(g[i + 2 * r], wc);
                s1[r] = __fadd_rn(s1[r], d);
                s2[r] = __fmaf_rn(d, hv[r][e], s2[r]);
            }
        }
    }
    consumers_sync();
    {
        const int c = tid % 128, kind = tid / 128;  // 256 threads: dw's 128 columns, then db's
        float sum = red[2 * c + kind];
        for (int k = 1; k < 8; k++) sum = __fadd_rn(sum, red[2 * (k * 128 + c) + kind]);
        if (n0 + c < C) partials[((long long)kind * gridDim.y + blockIdx.y) * C + n0 + c] = sum;
    }
    // ------------------------------------------------ the rows' two sums, over every column tile of the row
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int o = 1; o < 4; o *= 2) {  // the quad's 4 threads hold the row's 128 columns
            s1[r] = __fadd_rn(s1[r], __shfl_xor_sync(0xffffffff, s1[r], o));
            s2[r] = __fadd_rn(s2[r], __shfl_xor_sync(0xffffffff, s2[r], o));
        }
    if (t == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (r0 + 8 * r < M) row_sums[(long long)(r0 + 8 * r) * tiles + blockIdx.x] = make_float2(s1[r], s2[r]);
    __threadfence();  // the shares are visible to the row's other tiles before this block counts itself in
    consumers_sync();
    unsigned int* arrived = counters + blockIdx.y;
    unsigned int* done = counters + gridDim.y + blockIdx.y;
    if (tid == 0) {
        atomicAdd(arrived, 1u);
        while (*reinterpret_cast<volatile unsigned int*>(arrived) < (unsigned int)tiles) __nanosleep(32);
        __threadfence();
        if (atomicAdd(done, 1u) == (unsigned int)tiles - 1) {  // every tile of the row is past its wait
            *arrived = 0;
            *done = 0;
        }
    }
    consumers_sync();
    float mean_g[2], mean_gh[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float a = 0.0f, b = 0.0f;
        if (r0 + 8 * r < M)
            for (int k = 0; k < tiles; k++) {  // in tile order: every tile of the row adds the same sums
                const float2 p = __ldcg(row_sums + (long long)(r0 + 8 * r) * tiles + k);
                a = __fadd_rn(a, p.x);
                b = __fadd_rn(b, p.y);
            }
        mean_g[r] = a / C;
        mean_gh[r] = b / C;
    }
    // ------------------------------------------------ dx, written or added into (x again, from the caches)
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int c = n0 + 8 * j + 2 * t;
        const float w0 = c < C ? w[c] : 0.0f, w1 = c + 1 < C ? w[c + 1] : 0.0f;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = r0 + 8 * r, i = 4 * j + 2 * r;
            if (row >= M || c >= C) continue;
            const float2 h = ln_xhat_pair(x, row, c, M, C, m[r], s[r], pairs);
            float2 v;
            v.x = __fmul_rn(s[r], __fmaf_rn(-h.x, mean_gh[r], __fsub_rn(__fmul_rn(g[i], w0), mean_g[r])));
            v.y = __fmul_rn(s[r], __fmaf_rn(-h.y, mean_gh[r], __fsub_rn(__fmul_rn(g[i + 1], w1), mean_g[r])));
            float* p = dx + (long long)row * C + c;
            if (pairs) {
                if (ACC) {
                    const float2 old = *reinterpret_cast<const float2*>(p);
                    v.x = __fadd_rn(old.x, v.x);
                    v.y = __fadd_rn(old.y, v.y);
                }
                *reinterpret_cast<float2*>(p) = v;
            } else {
                p[0] = ACC ? __fadd_rn(p[0], v.x) : v.x;
                if (c + 1 < C) p[1] = ACC ? __fadd_rn(p[1], v.y) : v.y;
            }
        }
    }
}

// dx (M x C) of the layernorm whose output's gradient is dY @ W, from the product's split operands (a_split: dY,
// M_pad x K_pad; b_split: W^T's rows, C_pad x K_pad; each hi then lo, as k_gemm_wg_split), x (M x C) its input,
// w its weight, mean and rstd its rows' statistics; dx written, or added into where accumulate. partials: (2,
// gridDim.y, C); row_sums: (M, gridDim.x) float2; counters: 2 * gridDim.y, zero. A grid of (ceil(C / 128),
// ceil(M / 128)) blocks of TC_WG_THREADS, TC_SPLIT_SMEM_BYTES of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_wg_split_ln_bwd(float* dx, float* partials, float2* row_sums, unsigned int* counters,
                           const uint32_t* a_split, const uint32_t* b_split, const float* x, const float* w,
                           const float* mean, const float* rstd, int M, int C, int K_pad, int accumulate) {
#if WG_AVAILABLE
    extern __shared__ __align__(1024) float split_smem[];
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128;
    float acc[64];
    if (!wg_split_tile(acc, split_smem, a_split, b_split, m0, n0, K_pad)) return;
    if (accumulate)
        wg_ln_bwd_epilogue<true>(acc, dx, partials, row_sums, counters, split_smem, x, w, mean, rstd, M, C, m0, n0);
    else
        wg_ln_bwd_epilogue<false>(acc, dx, partials, row_sums, counters, split_smem, x, w, mean, rstd, M, C, m0, n0);
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}
