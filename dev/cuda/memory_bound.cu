// Faster memory-bound kernels, second versions (k_<name>_v2) of the engine's elementwise, head-shuffling and
// row kernels, built the way k_softmax_fwd_fast / k_softmax_bwd_fast were: 16-byte loads and stores wherever
// the sizes and pointers allow (checked at run time, with a scalar path otherwise), every load of a thread's
// share issued before the first store (a store may alias a later load, so the compiler cannot hoist loads
// over stores for us), the layernorms' rows held in registers, and no 64-bit divisions per element. Not part
// of the engine yet: dev/memory_bound.py builds this file, checks each kernel against the current one on
// the same inputs and times the two.
//
// Each kernel takes the current kernel's arguments in the same order, so the current launchers' argument
// lists work unchanged; where the grid differs the kernel says so. Every kernel is also correct on its current
// launcher's grid of 256-thread blocks: the warp-per-row ones (layernorms, embedding) need a warp a row, as
// today's, and the others loop over their work, so any grid covers it (a poor one only runs slower).
// The elementwise kernels compute each element with the current kernel's expression, operation for
// operation, so their results are bit-identical; the layernorms sum in another order (as accurate).
#include "common.cuh"
#include "pointwise.cuh"  // GELU_K
#include "rows_fast.cuh"

// Mirrored in dev/memory_bound.py through source.int_constants: the grids it launches.
enum MemoryBoundLaunch : int {
    MB_BLOCK = 256,  // threads a block, as runtime.BLOCK
    MB_UNROLL = 4,   // independent chunks (16-byte loads where aligned) a thread has in flight
};

// every pointer given on a 16-byte boundary (the unused ones are null, which is)
__device__ __forceinline__ bool all_aligned16(const void* a, const void* b, const void* c = nullptr,
                                              const void* d = nullptr, const void* e = nullptr,
                                              const void* f = nullptr) {
    return ((unsigned long long)a | (unsigned long long)b | (unsigned long long)c | (unsigned long long)d |
            (unsigned long long)e | (unsigned long long)f) % 16 == 0;
}

// ------------------------------------------------------------------------------------------------ GELU
// The expressions of cuda/pointwise.cuh, character for character: the same contractions into FMAs, so the
// same bits.
__device__ __forceinline__ float gelu_fwd_of(float xi) {
    return 0.5f * xi * (1.0f + tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi)));
}

__device__ __forceinline__ float gelu_bwd_of(float d, float xi) {
    float th = tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi));
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * xi * xi);
    return d * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
}

struct GeluFwd {
    static constexpr bool BINARY = false;
    __device__ float operator()(float xi, float) const { return gelu_fwd_of(xi); }
};
struct GeluBwd {
    static constexpr bool BINARY = true;  // (dout, x)
    __device__ float operator()(float d, float xi) const { return gelu_bwd_of(d, xi); }
};

// out[i] = op(a[i], b[i]) over chunks [0, chunks) of VEC floats: MB_UNROLL chunks a thread, a block's
// threads side by side in each, every gridDim.x * MB_BLOCK * MB_UNROLL-th chunk. All of a thread's loads
// come before its stores, so out may be a or b (each chunk is read and written by one thread).
template <int VEC, class Op>
__device__ __forceinline__ void map_chunks(float* out, const float* a, const float* b, long long chunks, Op op) {
    const long long step = (long long)gridDim.x * blockDim.x * MB_UNROLL;
    for (long long i0 = (long long)blockIdx.x * blockDim.x * MB_UNROLL + threadIdx.x; i0 < chunks; i0 += step) {
        float va[MB_UNROLL][VEC], vb[MB_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i < chunks) {
                load_vec<VEC>(va[u], a + i * VEC);
                if constexpr (Op::BINARY) load_vec<VEC>(vb[u], b + i * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i < chunks) {
#pragma unroll
                for (int e = 0; e < VEC; e++) va[u][e] = op(va[u][e], Op::BINARY ? vb[u][e] : 0.0f);
                store_vec<VEC>(out + i * VEC, va[u]);
            }
        }
    }
}

template <class Op>
__device__ __forceinline__ void map_pointwise(float* out, const float* a, const float* b, long long n, Op op) {
    if (all_aligned16(out, a, Op::BINARY ? b : nullptr)) {
        map_chunks<4>(out, a, b, n / 4, op);
        // the last n % 4 elements, by the grid's first threads
        for (long long i = n / 4 * 4 + thread_index(); i < n; i += (long long)gridDim.x * blockDim.x)
            out[i] = op(a[i], Op::BINARY ? b[i] : 0.0f);
    } else {
        map_chunks<1>(out, a, b, n, op);
    }
}

// Grid: ceil(n / (MB_BLOCK * 4 * MB_UNROLL)) blocks (a thread's 16 elements in 4 loads), not one thread an
// element. At least four blocks an SM (64 registers; left alone, the backward takes 79).
extern "C" __global__ void __launch_bounds__(256, 4)
    k_gelu_fwd_v2(float* out, const float* x, long long n) {
    map_pointwise(out, x, nullptr, n, GeluFwd{});
}

// Grid: as k_gelu_fwd_v2.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_gelu_bwd_v2(float* dx, const float* dout, const float* x, long long n) {
    map_pointwise(dx, dout, x, n, GeluBwd{});
}

// ------------------------------------------------------------------------------------------------ layernorm
// A warp per row, as the current kernels (the same grid: 32 threads a row). A row of up to ROW_REGS * 32 = 1024
// columns in 16-byte chunks (C % 4 == 0, arrays aligned) is loaded into registers at once and every statistic
// comes from the registers. Other rows (longer, or read one float at a time: there 32 loads a lane in flight
// take more registers than the kernels have, and spill) take a loop over the row, MB_UNROLL chunks a lane at a
// time, each batch loaded before any of it is stored; its later passes read the row again from the caches.

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

// 16-byte chunks need C % 4 == 0 and every row-wide pointer aligned (then every row start is).
__device__ __forceinline__ bool rows_vec4(int C, const void* a, const void* b, const void* c,
                                          const void* d = nullptr, const void* e = nullptr,
                                          const void* f = nullptr) {
    return C % 4 == 0 && all_aligned16(a, b, c, d, e, f);
}

// No minimum of blocks asked: as it is it fits in 64 registers, four blocks an SM (asked for four, ptxas spilled).
extern "C" __global__ void __launch_bounds__(256)
    k_layernorm_fwd_fast_v2(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                            int N, int C) {
    long long n = warp_row();
    if (n >= N) return;  // the whole warp leaves together
    if (rows_vec4(C, out, x, w, b))
        layernorm_fwd_row<4>(out + n * C, mean, rstd, x + n * C, w, b, n, C);
    else
        layernorm_fwd_row<1>(out + n * C, mean, rstd, x + n * C, w, b, n, C);
}

// x = resid + branch (written; the same single rounding as k_residual_fwd), out = layernorm(x).
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
    k_residual_layernorm_fwd_fast_v2(float* x, float* out, float* mean, float* rstd, const float* resid,
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
// written, or added into with __fadd_rn where accumulate != 0, as k_layernorm_bwd_fast.
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
    k_layernorm_bwd_fast_v2(float* dx, const float* dout, const float* x, const float* w, const float* mean,
                            const float* rstd, int N, int C, int accumulate) {
    long long n = warp_row();
    if (n >= N) return;
    const long long o = n * C;
    if (rows_vec4(C, dx, dout, x, w))
        layernorm_bwd_row<4>(dx + o, dout + o, x + o, w, mean[n], rstd[n], C, accumulate);
    else
        layernorm_bwd_row<1>(dx + o, dout + o, x + o, w, mean[n], rstd[n], C, accumulate);
}

// ------------------------------------------------------------------------------------------------ heads
// Each head shuffle is a set of (T, d_k) matrices copied between row strides: per head (b, h), rows t of
// d_k floats, d_k apart on the heads side (B, NH, T, d_k) and 3C or C apart on the (B, T, 3C) / (B, T, C)
// side. Grid: (matrices, tiles of rows), blockIdx.x the matrix and blockIdx.y the tile, both looped over
// (so any grid covers everything; the y dimension stops at 65535). At least four blocks an SM (64 registers).

// The block's tiles of the matrix: w chunks of VEC floats a row, the block's threads side by side along the
// rows, blockDim / w rows a pass (one row and a loop along it where w > blockDim), MB_UNROLL passes in flight.
// Each thread finds its column once, not per element.
template <int VEC>
__device__ __forceinline__ void copy_rows(float* dst, long long dst_stride, const float* src, long long src_stride,
                                          int rows, int w) {
    const int per = max(1, (int)blockDim.x / w);
    const int r_in = threadIdx.x / w;  // 0 where w > blockDim
    if (r_in >= per) return;           // past the last whole row of a pass
    const int first_col = threadIdx.x - r_in * w;
    const long long tile = (long long)per * MB_UNROLL;
    for (long long r0 = blockIdx.y * tile + r_in; r0 < rows; r0 += gridDim.y * tile)
        for (int j = first_col; j < w; j += blockDim.x) {
            const float* s = src + r0 * src_stride + j * VEC;
            float* d = dst + r0 * dst_stride + j * VEC;
            float v[MB_UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++)
                if (r0 + u * per < rows) load_vec<VEC>(v[u], s + u * per * src_stride);
#pragma unroll
            for (int u = 0; u < MB_UNROLL; u++)
                if (r0 + u * per < rows) store_vec<VEC>(d + u * per * dst_stride, v[u]);
        }
}

// one (T, d_k) matrix: 16-byte chunks where d_k % 4 == 0 and the arrays are aligned (then every row is)
__device__ __forceinline__ void copy_head(float* dst, long long dst_stride, const float* src, long long src_stride,
                                          int T, int d_k, bool vec) {
    if (vec)
        copy_rows<4>(dst, dst_stride, src, src_stride, T, d_k / 4);
    else
        copy_rows<1>(dst, dst_stride, src, src_stride, T, d_k);
}

// Grid: (3 * B * NH, min(ceil(T / rows_per_tile), 65535)); rows_per_tile = MB_UNROLL * max(1, MB_BLOCK / w),
// w = d_k / 4 (d_k % 4 == 0) or d_k. Matrix m = (which * B + b) * NH + h: q, k or v of head (b, h).
extern "C" __global__ void __launch_bounds__(256, 4)
    k_split_heads_fwd_v2(float* q, float* k, float* v, const float* qkv, int B, int T, int NH, int d_k) {
    const int C = NH * d_k, BH = B * NH;
    const bool vec = d_k % 4 == 0 && all_aligned16(q, k, v, qkv);
    for (long long m = blockIdx.x; m < 3 * BH; m += gridDim.x) {
        const int which = m / BH, bh = m % BH, b = bh / NH, h = bh % NH;
        float* dst = (which == 0 ? q : which == 1 ? k : v) + (long long)bh * T * d_k;
        const float* src = qkv + (long long)b * T * 3 * C + which * C + h * d_k;
        copy_head(dst, d_k, src, 3 * C, T, d_k, vec);
    }
}

// Grid: as k_split_heads_fwd_v2.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_split_heads_bwd_v2(float* dqkv, const float* dq, const float* dk, const float* dv, int B, int T, int NH,
                         int d_k) {
    const int C = NH * d_k, BH = B * NH;
    const bool vec = d_k % 4 == 0 && all_aligned16(dqkv, dq, dk, dv);
    for (long long m = blockIdx.x; m < 3 * BH; m += gridDim.x) {
        const int which = m / BH, bh = m % BH, b = bh / NH, h = bh % NH;
        const float* src = (which == 0 ? dq : which == 1 ? dk : dv) + (long long)bh * T * d_k;
        float* dst = dqkv + (long long)b * T * 3 * C + which * C + h * d_k;
        copy_head(dst, 3 * C, src, d_k, T, d_k, vec);
    }
}

// Grid: (B * NH, min(ceil(T / rows_per_tile), 65535)), rows_per_tile as k_split_heads_fwd_v2's.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_merge_heads_fwd_v2(float* y, const float* heads, int B, int T, int NH, int d_k) {
    const int C = NH * d_k, BH = B * NH;
    const bool vec = d_k % 4 == 0 && all_aligned16(y, heads);
    for (long long bh = blockIdx.x; bh < BH; bh += gridDim.x) {
        const int b = bh / NH, h = bh % NH;
        copy_head(y + (long long)b * T * C + h * d_k, C, heads + (long long)bh * T * d_k, d_k, T, d_k, vec);
    }
}

// Grid: as k_merge_heads_fwd_v2.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_merge_heads_bwd_v2(float* dheads, const float* dy, int B, int T, int NH, int d_k) {
    const int C = NH * d_k, BH = B * NH;
    const bool vec = d_k % 4 == 0 && all_aligned16(dheads, dy);
    for (long long bh = blockIdx.x; bh < BH; bh += gridDim.x) {
        const int b = bh / NH, h = bh % NH;
        copy_head(dheads + (long long)bh * T * d_k, d_k, dy + (long long)b * T * C + h * d_k, C, T, d_k, vec);
    }
}

// ------------------------------------------------------------------------------------------------ cross-entropy
// dlogits = (probs - onehot(target)) * dloss over chunks [0, chunks) of VEC columns from column v0 of one row:
// the current kernel's expression, element for element.
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

// Grid: (1, min(N, 65535)): blockIdx.y the row (rows of an odd V start unaligned, so each row finds its own
// 16-byte boundary: a few scalar columns before it and after the last whole chunk), blockIdx.x a share of
// the row's columns; both looped over. dlogits and probs rows then align together where the two arrays
// differ by a multiple of 16 bytes (as any two allocations do); elsewhere the rows go scalar.
extern "C" __global__ void __launch_bounds__(256)
    k_crossentropy_bwd_v2(float* dlogits, const float* probs, const int* targets, const float* dlosses, int N,
                          int V) {
    const bool vec = ((unsigned long long)dlogits - (unsigned long long)probs) % 16 == 0;
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x, G = (long long)gridDim.x * blockDim.x;
    for (long long n = blockIdx.y; n < N; n += gridDim.y) {
        const float* p = probs + n * V;
        float* d = dlogits + n * V;
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

// ------------------------------------------------------------------------------------------------ embedding
// A warp per position (row of x), as the layernorms: the token's row of wte and the position's row of wpe,
// MB_UNROLL chunks of each a lane in flight. Grid: ceil(B * T * 32 / MB_BLOCK) blocks (32 threads a row, not
// one an element).
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

extern "C" __global__ void __launch_bounds__(256)
    k_embed_fwd_v2(float* x, const int* idx, const float* wte, const float* wpe, int B, int T, int C) {
    long long bt = warp_row();
    if (bt >= (long long)B * T) return;
    const int t = bt % T;  // once a row
    float* xr = x + bt * C;
    const float* er = wte + (long long)idx[bt] * C;
    const float* pr = wpe + (long long)t * C;
    if (rows_vec4(C, x, wte, wpe))
        embed_row<4>(xr, er, pr, C);
    else
        embed_row<1>(xr, er, pr, C);
}
