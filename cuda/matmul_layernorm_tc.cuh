// A linear layer's dX product and the backward of the layernorm that made its input, in one kernel (sm_90a):
//   dout = dY @ W                           (M x C: the layernorm output's gradient, never stored)
//   dx  (+)= rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),   dxhat = dout * w, xhat = (x - mean) * rstd
//   dw += sum over rows of dout * xhat,   db += sum over rows of dout
// The product is k_gemm_wg_areg's (wg_areg_tiles: dY raw, W split); a row's column tiles exchange their shares of the
// row's two sums through global memory and add them in tile order (the same bits every run); the last block of each
// column tile adds dw and db.
#pragma once
#include <type_traits>

#include "colsum.cuh"          // colsum_chunks
#include "layernorm_fast.cuh"  // ln_xhat, ln_bwd_dx: the fast backward's roundings
#include "matmul_tc.cuh"       // wg_areg_tiles

// the two consumer warpgroups (the producer has left: bar 0, __syncthreads, would wait for it)
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// The epilogue's tiles in the stages' shared memory, free once the products are done: x's and dx's 128 x 128 tiles
// (rows of LN_TILE_LD floats: 16-byte aligned, and a warp's fragment reads spread over the banks), w's 128 columns,
// and the 8 consumer warps' column sums of dw and db (red).
constexpr int LN_TILE_LD = 132;
// the most column tiles a row may span (C <= 1024): mirrored in microgpt/kernels/matmul_layernorm_tc.py
enum LnTcLaunch : int { LN_MAX_ROW_TILES = 8 };
constexpr int LN_COPY_BATCH = 8;  // a thread's 16-byte loads in flight at a time
constexpr int LN_SMEM_FLOATS = 2 * 128 * LN_TILE_LD + 128 + 8 * 128 * 2;
static_assert(LN_SMEM_FLOATS * 4 <= WG_AREG_STAGES * (2 * WG_SPLIT + WgRawA<false>::FLOATS) * 4,
              "the epilogue fits the stages");

// The tile (m0, n0) of the M x C matrix a, zero outside it, copied by the 256 consumer threads into t (rows of
// LN_TILE_LD floats), or t back into a (STORE): one warp per row's 128 floats, rows tid / 32 + 8q, 16 bytes per
// thread where a's rows allow (VEC4: C % 4 == 0 and a 16-byte aligned), LN_COPY_BATCH loads in flight at a time.
template <bool STORE, bool VEC4>
__device__ __forceinline__ void tile_copy(float* t, std::conditional_t<STORE, float*, const float*> a, int M, int C,
                                          int m0, int n0) {
    const int tid = threadIdx.x - 128, r0 = tid / 32, c = (tid % 32) * 4, col = n0 + c;
    const long long step = 8LL * C;  // 8 rows of a
    auto p = a + (long long)(m0 + r0) * C + col;
    float* at = t + r0 * LN_TILE_LD + c;
    const int rows = min(16, (M - m0 - r0 + 7) / 8);  // of this thread's 16: those inside M
#pragma unroll
    for (int q0 = 0; q0 < 16; q0 += LN_COPY_BATCH) {
        float4 v[LN_COPY_BATCH];
#pragma unroll
        for (int q = 0; q < LN_COPY_BATCH; q++) {
            const int k = q0 + q;
            if constexpr (STORE) {
                if (k >= rows || col >= C) continue;
                const float4 u = *reinterpret_cast<const float4*>(at + k * 8 * LN_TILE_LD);
                if constexpr (VEC4) {
                    *reinterpret_cast<float4*>(p + k * step) = u;
                } else {
                    p[k * step] = u.x;
                    if (col + 1 < C) p[k * step + 1] = u.y;
                    if (col + 2 < C) p[k * step + 2] = u.z;
                    if (col + 3 < C) p[k * step + 3] = u.w;
                }
            } else {
                v[q] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (k < rows && col < C) {
                    if constexpr (VEC4)
                        v[q] = *reinterpret_cast<const float4*>(p + k * step);
                    else
                        v[q] = make_float4(p[k * step], col + 1 < C ? p[k * step + 1] : 0.0f,
                                           col + 2 < C ? p[k * step + 2] : 0.0f, col + 3 < C ? p[k * step + 3] : 0.0f);
                }
            }
        }
        if constexpr (!STORE)
#pragma unroll
            for (int q = 0; q < LN_COPY_BATCH; q++) *reinterpret_cast<float4*>(at + (q0 + q) * 8 * LN_TILE_LD) = v[q];
    }
}

template <bool STORE>
__device__ __forceinline__ void tile_copy(float* t, std::conditional_t<STORE, float*, const float*> a, int M, int C,
                                          int m0, int n0, bool vec4) {
    if (vec4)
        tile_copy<STORE, true>(t, a, M, C, m0, n0);
    else
        tile_copy<STORE, false>(t, a, M, C, m0, n0);
}

// The layernorm backward of a consumer's share of the tile (m0, n0) of dout (g, as wg_store lays it out: element
// i is row r0 + 8 ((i % 4) / 2), column n0 + 8 (i / 4) + 2t + i % 2, r0 = m0 + 16 * wg_warp + lane / 4).
// row_sums: (M, gridDim.x) float2 shares of each row's two sums; counters: (the rows' arrived, the rows' done,
// the column tiles' done, the ticket) 2 * gridDim.y + gridDim.x + 1, zero before the launch and left zero; smem: the
// stages' shared memory (LN_SMEM_FLOATS).
template <bool ACC>
__device__ __forceinline__ void wg_ln_bwd_epilogue(const float (&g)[64], float* dx, float* dw, float* db,
                                                   float* partials, float2* row_sums,
                                                   unsigned int* counters, float* smem, const float* x,
                                                   const float* w, const float* mean, const float* rstd, int M,
                                                   int C, int m0, int n0) {
    const int tid = threadIdx.x - 128, wg_warp = tid / 32, lane = tid % 32, t = lane % 4;
    const int lr0 = wg_warp * 16 + lane / 4, r0 = m0 + lr0;  // the thread's rows: lr0 and lr0 + 8 of the tile
    const int tiles = gridDim.x, tile_x = n0 / 128, tile_y = m0 / 128;
    float* xs = smem;                          // x's tile
    float* ds = xs + 128 * LN_TILE_LD;         // dx's: its old values (ACC), then the new
    float* ws = ds + 128 * LN_TILE_LD;         // w's 128 columns
    float* red = ws + 128;                     // [8 warps][128 columns][dw, db]
    const bool vec4 = C % 4 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(dx)) % 16 == 0;
    consumers_sync();  // every consumer's last wgmma has read the stages, which the tiles now take
    tile_copy<false>(xs, x, M, C, m0, n0, vec4);
    if (ACC) tile_copy<false>(ds, dx, M, C, m0, n0, vec4);
    if (tid < 128) ws[tid] = n0 + tid < C ? w[n0 + tid] : 0.0f;
    float m[2], s[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool in = r0 + 8 * r < M;
        m[r] = in ? mean[r0 + 8 * r] : 0.0f;
        s[r] = in ? rstd[r0 + 8 * r] : 0.0f;
    }
    consumers_sync();
    // element i of g: tile row lr0 + 8 ((i % 4) / 2), column 8 (i / 4) + 2t + i % 2; xhat from x's tile (0 outside
    // the matrix, where g is 0 too: the split operands' padding)
    auto xhat = [&](int i) {
        const int r = (i % 4) / 2, c = 8 * (i / 4) + 2 * t + i % 2;
        return r0 + 8 * r < M && n0 + c < C ? ln_xhat(xs[(lr0 + 8 * r) * LN_TILE_LD + c], m[r], s[r]) : 0.0f;
    };
    // ------------------------------------------------ the block's column sums of dout * xhat and dout over its 128
    // rows (dw, db), and the thread's shares of its 2 rows' sums of dxhat and of dxhat * xhat
    float s1[2] = {0.0f, 0.0f}, s2[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int i = 4 * j + e;  // rows lr0 and lr0 + 8: elements i and i + 2
            const float h0 = xhat(i), h1 = xhat(i + 2);
            float pw = __fmaf_rn(g[i + 2], h1, __fmul_rn(g[i], h0)), pb = __fadd_rn(g[i], g[i + 2]);
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
            const float wc = ws[8 * j + 2 * t + e], d0 = __fmul_rn(g[i], wc), d1 = __fmul_rn(g[i + 2], wc);
            s1[0] = __fadd_rn(s1[0], d0);
            s2[0] = __fmaf_rn(d0, h0, s2[0]);
            s1[1] = __fadd_rn(s1[1], d1);
            s2[1] = __fmaf_rn(d1, h1, s2[1]);
        }
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
            if (r0 + 8 * r < M) row_sums[(long long)(r0 + 8 * r) * tiles + tile_x] = make_float2(s1[r], s2[r]);
    __threadfence();  // the shares are visible to the row's other tiles before this block counts itself in
    consumers_sync();
    {
        const int c = tid % 128, kind = tid / 128;  // 256 threads: dw's 128 columns, then db's
        float sum = red[2 * c + kind];
        for (int k = 1; k < 8; k++) sum = __fadd_rn(sum, red[2 * (k * 128 + c) + kind]);
        if (n0 + c < C) partials[((long long)kind * gridDim.y + tile_y) * C + n0 + c] = sum;
    }
    // ------------------------------------------------ the rows' two sums, over every column tile of the row
    unsigned int* arrived = counters + tile_y;
    unsigned int* done = counters + gridDim.y + tile_y;
    // Waits for the row's other column tiles: safe while the GPU holds all of a row's tiles at once (one block per
    // SM, at most LN_MAX_ROW_TILES, each drawn in start order); with fewer SMs free to this launch it never ends.
    if (tid == 0) {
        __threadfence();  // after the barrier: every thread's shares (fenced each) before the count, as grid.sync
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
    {
        const int r = t % 2;  // this thread reads row r's shares (t = 0, 1 of the quad: rows lr0 and lr0 + 8)
        float a = 0.0f, b = 0.0f;
        if (r0 + 8 * r < M) {  // in tile order: every tile of the row adds the same sums
            float2 p[LN_MAX_ROW_TILES];
#pragma unroll
            for (int k = 0; k < LN_MAX_ROW_TILES; k++)  // all in flight at once
                if (k < tiles) p[k] = __ldcg(row_sums + (long long)(r0 + 8 * r) * tiles + k);
#pragma unroll
            for (int k = 0; k < LN_MAX_ROW_TILES; k++)
                if (k < tiles) {
                    a = __fadd_rn(a, p[k].x);
                    b = __fadd_rn(b, p[k].y);
                }
        }
#pragma unroll
        for (int q = 0; q < 2; q++) {  // row q's from the quad's thread q
            mean_g[q] = __shfl_sync(0xffffffff, a, (lane & ~3) | q) / C;
            mean_gh[q] = __shfl_sync(0xffffffff, b, (lane & ~3) | q) / C;
        }
    }
    // ------------------------------------------------ dx into its tile (added to the old values there), then out
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int r = (i % 4) / 2, c = 8 * (i / 4) + 2 * t + i % 2;
        float* at = ds + (lr0 + 8 * r) * LN_TILE_LD + c;
        const float v = ln_bwd_dx(__fmul_rn(g[i], ws[c]), xhat(i), s[r], mean_g[r], mean_gh[r]);
        *at = ACC ? __fadd_rn(*at, v) : v;
    }
    consumers_sync();
    tile_copy<true>(ds, dx, M, C, m0, n0, vec4);
    // ------------------------------------------------ dw and db, by the column tile's last block
    __threadfence();  // this block's partial rows (written before the exchange) are visible before it counts in
    consumers_sync();
    unsigned int* column_done = counters + 2 * gridDim.y + tile_x;
    int* last = reinterpret_cast<int*>(red);  // free since the partial rows were written
    if (tid == 0) {
        const bool is_last = atomicAdd(column_done, 1u) == gridDim.y - 1;
        if (is_last) *column_done = 0;  // every block of the column tile has counted in: left zero
        *last = is_last;
    }
    consumers_sync();
    if (*last) {
        __threadfence();
        const int c = tid % 128, kind = tid / 128;
        if (n0 + c < C)
            (kind ? db : dw)[n0 + c] += colsum_chunks(partials + (long long)kind * gridDim.y * C, gridDim.y, C, n0 + c);
    }
}

// dx (M x C) of the layernorm whose output's gradient is dY @ W (dY: M x K, ld; dY_map: a tensor map over it, or null;
// b_split: W^T's rows split, C_pad x K_pad, K_pad = ceil(K / 32) * 32), x its input, w its weight, mean and rstd its
// rows' statistics; dx written, or added into where accumulate; dw and db added into. partials: (2, gridDim.y, C);
// row_sums: (M, gridDim.x) float2; counters: 2 * gridDim.y + gridDim.x + 1, zero. Grid (ceil(C / 128), ceil(M / 128))
// of TC_WG_THREADS, TC_AREG_SMEM_BYTES of dynamic shared memory; a block's tile is the ticket it draws as it starts, in
// row-major order.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_wg_split_ln_bwd(float* dx, float* dw, float* db, float* partials, float2* row_sums, unsigned int* counters,
                           const float* dY, int ld, const TensorMap* dY_map, const uint32_t* b_split, const float* x,
                           const float* w, const float* mean, const float* rstd, int M, int C, int K, int K_pad,
                           int accumulate) {
#if WG_AVAILABLE
    extern __shared__ __align__(1024) float split_smem[];
    if (gridDim.x > LN_MAX_ROW_TILES) __trap();  // the row's shares are read LN_MAX_ROW_TILES at most
    __shared__ unsigned int ticket;
    if (threadIdx.x == 0) {  // the tiles in the order the blocks start: a row's earlier tiles have all started
        unsigned int* next = counters + 2 * gridDim.y + gridDim.x;
        ticket = atomicAdd(next, 1u);
        if (ticket == gridDim.x * gridDim.y - 1) *next = 0;  // the last ticket: every block has drawn its own
    }
    __syncthreads();
    const int m0 = (int)(ticket / gridDim.x) * 128, n0 = (int)(ticket % gridDim.x) * 128;
    auto epilogue = [&](const float (&acc)[64], int, int) {
        if (accumulate)
            wg_ln_bwd_epilogue<true>(acc, dx, dw, db, partials, row_sums, counters, split_smem, x, w, mean, rstd, M,
                                     C, m0, n0);
        else
            wg_ln_bwd_epilogue<false>(acc, dx, dw, db, partials, row_sums, counters, split_smem, x, w, mean, rstd, M,
                                      C, m0, n0);
    };
    wg_areg_tiles(split_smem, dY, ld, dY_map, M, K, b_split, gridDim.x, K_pad, ticket, 1, 1, epilogue);
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}
