// Where the layernorm backward's bandwidth goes, at andrea-120m's rows (N = 8192, C = 768): simple kernels that
// move the same bytes, against a copy kernel of the same size, and the engine's kernel in parts (GB/s counting
// bytes read and written). The engine's k_layernorm_bwd_fast reads dout and x and writes dx (75 MB);
// tools/profile_kernels.py holds it to a 2 GB device copy (4.28 TB/s on the H200), which short kernels do not
// reach. Each timing is the mean of 30 launches queued back to back, then of the same 30 as one CUDA graph (as
// the model's passes run them since 2026-12-01).
//
//     nvcc -O3 -arch=sm_90a -std=c++17 -I cuda -o /tmp/ln_bound dev/cuda/layernorm_bwd_bound.cu && /tmp/ln_bound
//
// H200, 2026-12-01 (% of the 2 GB copy, launched one by one / in a graph):
// - bounds: a copy kernel of 25 MB 69-78% / 76-78%; dout * x streamed, 2 reads and a write, 76-85% / 82-83%.
// - a warp a row without the engine's exact roundings: dx alone 83% / 90%; adding each lane's columns of dw and db
//   in registers, then the block's partial row, 68-78% / 73-85% (best at 264 blocks), before any reduction of the
//   partial rows.
// - the engine's block a row: 59% / 63% (dx added into: 66% / 69%); its rows and partial rows without the
//   reduction of the partial rows (ln_bwd_finish) 62% / 67% (70% / 74%): the reduction costs 1.7 us of 28.
//   Its blocks' rows spread over the grid (a front of neighbouring rows, as the warps below): the same.
// - the warp-a-row prototype below, with the engine's roundings: its rows alone 70% / 74% (81% / 86%), with its
//   partial rows 63% / 67% (73% / 77%), with the reduction 55% / 57% (65% / 68%): 2.5 us to make the partial rows
//   at the end, 4.6 to add them (96 strips of 16 columns for the 66 reducers that may wait: two rounds).
// So the pass cannot reach 80% while it ends in a grid-wide reduction: even its rows alone, with the roundings the
// engine spells out, stop at 74% of the copy in a graph (86% adding into dx).
// H200, 2026-12-02 (the same figures again within 2%, then): the prototype's partial rows added by clusters of 8, 4
// or 2 blocks through distributed shared memory (k_layernorm_bwd_cluster: the last block then adds 32 cluster rows,
// not 256), dx the prototype's bits: 54% / 50% / 49% in a graph added into, 64% without the last block's sum, where
// the prototype's rows and partial rows reach 77%: a cluster's two syncs hold each of its blocks until the slowest
// is done, and its blocks must be placed together.
// H200, 2026-12-02 (thirteenth session; graph): the prototype at 128, 132, 256 and 264 blocks with 66, 96 or 132
// reducers: 55-60% (63-71% adding into dx); 96 and 132 reducers the same, 66 a point or two slower; the engine
// 62.7% / 68.7% in the same run. Its rows alone 76% (85%), with the block's partial row 67% (77.5%): at 80% the pass
// has 22 us (75 MB at 4.25 TB/s), its rows alone take 23.3, ending each block at a barrier for its partial row adds
// 3.2 and the grid's reduction 3 more, however many blocks add it. Tried in a copy of the engine's kernel and not
// kept: each strip's group sums added by the shuffle tree and the warps' sums (not one thread's 64 adds in turn) and
// 8 partial rows a thread in flight: the engine 62.7% against 63.3%; the prototype with C a constant (no chunk
// guards): its rows and partial rows 79%, where k_warprow (float4s, the sums in trees, contracted) reaches 86%.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "layernorm_fast.cuh"  // the engine's k_layernorm_bwd_fast

#include "probe.cuh"  // CK, time_graph_ms

constexpr int N = 8192, C = 768;

__device__ __forceinline__ float wsum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float sum4(float4 a) { return a.x + a.y + a.z + a.w; }

__global__ void k_copy(float4* out, const float4* in, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        out[i] = in[i];
}
__global__ void k_stream21(float4* dx, const float4* a, const float4* b, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        dx[i] = mul4(a[i], b[i]);
}

// A warp a row (rows w, w + W, ... for warp w of W): dx from dout and x with the row's two sums; DWDB: each lane
// also adds its columns of dout * xhat and dout into registers, and the block's 8 warps' shares make one partial
// row (partials[blockIdx.x]: dw's C, then db's), as the engine's reduction would take them.
template <bool DWDB>
__global__ void __launch_bounds__(256, 2) k_warprow(float* dx, float* partials, const float* dout, const float* x,
                                                    const float* w, const float* mean, const float* rstd) {
    constexpr int K = C / 128;  // float4 chunks a lane
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float4 aw[K], ab[K];
    for (int k = 0; k < K; k++) aw[k] = ab[k] = make_float4(0, 0, 0, 0);
    for (long long n = blockIdx.x * 8LL + warp; n < N; n += gridDim.x * 8LL) {
        const float4* dr = reinterpret_cast<const float4*>(dout + n * C);
        const float4* xr = reinterpret_cast<const float4*>(x + n * C);
        float4 g[K], h[K];
        for (int k = 0; k < K; k++) g[k] = dr[lane + 32 * k], h[k] = xr[lane + 32 * k];
        const float m = mean[n], s = rstd[n];
        float s1 = 0, s2 = 0;
        for (int k = 0; k < K; k++) {
            h[k] = make_float4((h[k].x - m) * s, (h[k].y - m) * s, (h[k].z - m) * s, (h[k].w - m) * s);
            if (DWDB) aw[k] = add4(aw[k], mul4(g[k], h[k])), ab[k] = add4(ab[k], g[k]);
            g[k] = mul4(g[k], reinterpret_cast<const float4*>(w)[lane + 32 * k]);
            s1 += sum4(g[k]);
            s2 += sum4(mul4(g[k], h[k]));
        }
        s1 = wsum(s1) / C, s2 = wsum(s2) / C;
        float4* o = reinterpret_cast<float4*>(dx + n * C);
        for (int k = 0; k < K; k++)
            o[lane + 32 * k] = make_float4(s * (g[k].x - s1 - h[k].x * s2), s * (g[k].y - s1 - h[k].y * s2),
                                           s * (g[k].z - s1 - h[k].z * s2), s * (g[k].w - s1 - h[k].w * s2));
    }
    if (DWDB) {
        __shared__ float4 sh[8][C / 4];
        for (int half = 0; half < 2; half++) {
            for (int k = 0; k < K; k++) sh[warp][lane + 32 * k] = half ? ab[k] : aw[k];
            __syncthreads();
            float4* out = reinterpret_cast<float4*>(partials + (blockIdx.x * 2LL + half) * C);
            for (int u = threadIdx.x; u < C / 4; u += 256) {
                float4 t = sh[0][u];
                for (int q = 1; q < 8; q++) t = add4(t, sh[q][u]);
                out[u] = t;
            }
            __syncthreads();
        }
    }
}

// A prototype of the backward a warp a row (the engine's arithmetic and reduction, ln_bwd_finish), kept for its
// measurements: slower than the engine's block a row once its partial rows are made and added (below).
constexpr int NARROW_CHUNKS = 6, NARROW_THREADS = 256;

// Rows of up to 4 * 32 * NARROW_CHUNKS columns (andrea-120m's 768): a warp a row, with no barrier
// between rows. Lane l owns the 4-column chunks l, l + 32, ... of every row (columns 4 (k * 32 + l) ..), so its
// shares of dw and db add up in registers over all the rows its warp takes, and the row's two sums come from
// the lane's chunks and the shuffle tree. Warp w of block b takes the rows 8 b + w, 8 (b + G) + w, ... (G blocks)
// in order, so that the grid's warps read one front of neighbouring rows; at the end the block's 8 warps' shares
// are added in warp order into its partial row, and the launch's last blocks add those (ln_bwd_finish) as in
// k_layernorm_bwd_fast. Which rows a block adds is set by G, which the launcher makes a function of N alone.
// One float at a time (C % 4 != 0 or arrays off 16 bytes) reads the same columns a lane: the same bits.
template <int VEC, bool ACC>
__device__ __forceinline__ void layernorm_bwd_narrow_rows(float* dx, float (&pw)[NARROW_CHUNKS][4],
                                                          float (&pb)[NARROW_CHUNKS][4], const float* dout,
                                                          const float* x, const float* w, const float* mean,
                                                          const float* rstd, int N, int C) {
    constexpr int K = NARROW_CHUNKS;
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (long long n = (long long)blockIdx.x * warps + threadIdx.x / 32; n < N; n += (long long)gridDim.x * warps) {
        const long long o = n * C;
        float g[K][4], h[K][4];  // dout and x of the lane's chunks (0 past C)
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (k * 32 + lane) * 4;
            if (c < C) {
                load_cols4<VEC>(g[k], dout + o, c, C);
                load_cols4<VEC>(h[k], x + o, c, C);
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++) g[k][e] = 0.0f, h[k][e] = 0.0f;
            }
        }
        const float m = mean[n], s = rstd[n];
        float sum_g = 0.0f, sum_gh = 0.0f;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (k * 32 + lane) * 4;
            if (c < C) {
                float wv[4];
                load_cols4<VEC>(wv, w, c, C);  // every row's: from L1
                ln_bwd_cols_wb<VEC>(g[k], h[k], pw[k], pb[k], m, s, c, C);
                ln_bwd_cols_sums<VEC>(g[k], h[k], wv, c, C, sum_g, sum_gh);
            }
        }
        const float mean_g = warp_sum(sum_g) / C, mean_gh = warp_sum(sum_gh) / C;
#pragma unroll
        for (int k = 0; k < K; k++) ln_bwd_cols_dx(g[k], h[k], s, mean_g, mean_gh);
        if (ACC)  // dx's old values, into x's registers (free now): every chunk's loads in flight at once
#pragma unroll
            for (int k = 0; k < K; k++) {
                const int c = (k * 32 + lane) * 4;
                if (c < C) load_cols4<VEC>(h[k], dx + o, c, C);
            }
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = (k * 32 + lane) * 4;
            if (c < C) {
                ln_bwd_cols_acc<ACC>(g[k], h[k]);
                store_cols4<VEC>(dx + o, g[k], c, C);
            }
        }
    }
}

// The block's partial row, dw's C then db's, from its warps' shares: chunk j of it is the sum of the warps' chunk j,
// in warp order, through shares (one of dw's or db's at a time).
__device__ __forceinline__ void ln_bwd_narrow_partial_row(float* partials,
                                                          float4 (*shares)[32 * NARROW_CHUNKS],
                                                          const float (&pw)[NARROW_CHUNKS][4],
                                                          const float (&pb)[NARROW_CHUNKS][4], int C) {
    constexpr int K = NARROW_CHUNKS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const bool vec = C % 4 == 0 && all_aligned16(partials, nullptr);
    float* out = partials + (long long)blockIdx.x * 2 * C;
    for (int half = 0; half < 2; half++) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float (&v)[4] = half ? pb[k] : pw[k];
            shares[warp][k * 32 + lane] = make_float4(v[0], v[1], v[2], v[3]);
        }
        __syncthreads();
        for (int j = threadIdx.x; j * 4 < C; j += blockDim.x) {
            float4 t = shares[0][j];
            for (int q = 1; q < warps; q++) {
                const float4 u = shares[q][j];
                t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
            }
            const float v[4] = {t.x, t.y, t.z, t.w};
            if (vec)
                store_cols4<4>(out + half * C, v, j * 4, C);
            else
                store_cols4<1>(out + half * C, v, j * 4, C);
        }
        __syncthreads();  // the shares are written again (db's), then hold the reduction's group sums
    }
}

// dx of every row as k_layernorm_bwd_fast (the same arguments, partial rows and reduction), for rows of up to
// 4 * 32 * NARROW_CHUNKS columns; blockDim.x = NARROW_THREADS. 128 registers at most: two blocks an
// SM, 16 warps with a row of dout and of x each in flight.
__global__ void __launch_bounds__(NARROW_THREADS, 2)
    k_layernorm_bwd_fast_narrow(float* dx, float* dw, float* db, float* partials, unsigned int* counters,
                                const float* dout, const float* x, const float* w, const float* mean,
                                const float* rstd, int N, int C, int accumulate, int reducers) {
    constexpr int K = NARROW_CHUNKS, WARPS = NARROW_THREADS / 32;
    __shared__ __align__(16) float4 shares[WARPS][32 * K];  // one of dw's or db's partial rows a warp
    float pw[K][4] = {}, pb[K][4] = {};
    if (rows_vec4(C, dx, dout, x, w)) {
        if (accumulate)
            layernorm_bwd_narrow_rows<4, true>(dx, pw, pb, dout, x, w, mean, rstd, N, C);
        else
            layernorm_bwd_narrow_rows<4, false>(dx, pw, pb, dout, x, w, mean, rstd, N, C);
    } else {
        if (accumulate)
            layernorm_bwd_narrow_rows<1, true>(dx, pw, pb, dout, x, w, mean, rstd, N, C);
        else
            layernorm_bwd_narrow_rows<1, false>(dx, pw, pb, dout, x, w, mean, rstd, N, C);
    }
    ln_bwd_narrow_partial_row(partials, shares, pw, pb, C);
    ln_bwd_finish(dw, db, partials, counters, reinterpret_cast<float*>(shares), C, reducers);
}

// the engine's rows without the reduction of the partial rows (ln_bwd_finish): where the time goes
template <bool ACC, bool PARTIAL>
__global__ void __launch_bounds__(NARROW_THREADS, 2)
    k_narrow_nofinish(float* dx, float* partials, const float* dout, const float* x, const float* w,
                      const float* mean, const float* rstd, int n_rows, int cols) {
    __shared__ __align__(16) float4 shares[NARROW_THREADS / 32][32 * NARROW_CHUNKS];
    float pw[NARROW_CHUNKS][4] = {}, pb[NARROW_CHUNKS][4] = {};
    layernorm_bwd_narrow_rows<4, ACC>(dx, pw, pb, dout, x, w, mean, rstd, n_rows, cols);
    if (PARTIAL) ln_bwd_narrow_partial_row(partials, shares, pw, pb, cols);
}
template <bool ACC>
__global__ void __launch_bounds__(LN_BWD_THREADS, 1)
    k_block_nofinish(float* dx, float* partials, const float* dout, const float* x, const float* w,
                     const float* mean, const float* rstd, int n_rows, int cols, int rows_per_block) {
    __shared__ __align__(16) float sums[2][32][2 * LN_BWD_ROWS];
    extern __shared__ float4 rows_only_shares[];
    layernorm_bwd_rows<4, ACC>(dx, partials, sums, rows_only_shares, dout, x, w, mean, rstd, n_rows, cols,
                               rows_per_block);
    ln_bwd_partial_row<4>(partials, rows_only_shares, cols);
}

// The prototype's rows with no grid-wide reduction of 256 partial rows at the end (sm_90): clusters of
// CLUSTER_BLOCKS blocks add their blocks' partial rows through distributed shared memory first, each block a slice of
// the columns, so that the launch's last block adds 32 cluster rows, not 256, and no block waits for another. The
// block's partial row: its 8 warps' shares in warp order; the cluster's: its blocks' in rank order; dw and db: the
// clusters' in order. G = 256 blocks (a function of N alone, one wave at two an SM).
namespace cg = cooperative_groups;
constexpr int CLUSTER_GRID = 256;
template <bool ACC, bool FINISH, int CLUSTER_BLOCKS>
__global__ void __cluster_dims__(CLUSTER_BLOCKS, 1, 1) __launch_bounds__(NARROW_THREADS, 2)
    k_layernorm_bwd_cluster(float* dx, float* dw, float* db, float* cluster_rows, unsigned int* counter,
                            const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                            int N, int C) {
    constexpr int K = NARROW_CHUNKS, WARPS = NARROW_THREADS / 32, Q = 32 * K;  // Q: a half's float4s
    __shared__ __align__(16) float4 shares[WARPS][2][Q];  // each warp's dw and db shares: 48 KB
    unsigned int& ticket = *reinterpret_cast<unsigned int*>(&shares[WARPS - 1][1][Q - 1]);  // free by then
    float pw[K][4] = {}, pb[K][4] = {};
    layernorm_bwd_narrow_rows<4, ACC>(dx, pw, pb, dout, x, w, mean, rstd, N, C);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < K; k++) {
        shares[warp][0][k * 32 + lane] = make_float4(pw[k][0], pw[k][1], pw[k][2], pw[k][3]);
        shares[warp][1][k * 32 + lane] = make_float4(pb[k][0], pb[k][1], pb[k][2], pb[k][3]);
    }
    __syncthreads();
    float4* row = &shares[0][0][0];  // the block's partial row, dw's then db's, over warp 0's shares
    for (int j = threadIdx.x; j < 2 * Q; j += NARROW_THREADS) {
        const int half = j / Q, q = j % Q;
        float4 t = shares[0][half][q];
        for (int v = 1; v < WARPS; v++) {
            const float4 u = shares[v][half][q];
            t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
        }
        row[j] = t;  // shares[0][half][q]: this thread's alone
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's partial row is in its shared memory
    const int rank = cluster.block_rank(), per = 2 * Q / CLUSTER_BLOCKS;  // float4s of the slice
    const int cid = blockIdx.x / CLUSTER_BLOCKS;
    for (int j = threadIdx.x; j < per; j += NARROW_THREADS) {
        const int at = rank * per + j;
        float4 t = cluster.map_shared_rank(row, 0)[at];
        for (int r = 1; r < CLUSTER_BLOCKS; r++) {
            const float4 u = cluster.map_shared_rank(row, r)[at];
            t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
        }
        reinterpret_cast<float4*>(cluster_rows)[(long long)cid * 2 * Q + at] = t;
    }
    cluster.sync();  // no block leaves while another reads its shared memory
    if (!FINISH) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(counter, 1u);
    __syncthreads();
    if (ticket != gridDim.x - 1) return;
    __threadfence();
    const int clusters = gridDim.x / CLUSTER_BLOCKS;
    for (int j = threadIdx.x; j < 2 * Q; j += NARROW_THREADS) {
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int k0 = 0; k0 < clusters; k0 += 8) {
            float4 u[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (k0 + i < clusters) u[i] = __ldcg(reinterpret_cast<const float4*>(cluster_rows) + (k0 + i) * 2 * Q + j);
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (k0 + i < clusters) t.x += u[i].x, t.y += u[i].y, t.z += u[i].z, t.w += u[i].w;
        }
        float* out = (j < Q ? dw : db) + 4 * (j % Q);
        out[0] += t.x, out[1] += t.y, out[2] += t.z, out[3] += t.w;
    }
    if (threadIdx.x == 0) *counter = 0;
}

__global__ void k_fill(float* a, long long n, unsigned seed, float scale, float offset) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        a[i] = offset + scale * ((h & 0xffffff) / 16777216.0f - 0.5f);
    }
}

int main() {
    const long long n = (long long)N * C;
    const int SETS = 3;  // copies of the arrays, rotated: the 50 MB L2 holds no repeat
    std::vector<float*> a(SETS), b(SETS), o(SETS);
    float *w, *mean, *rstd, *partials;
    for (int i = 0; i < SETS; i++) {
        CK(cudaMalloc(&a[i], n * 4));
        CK(cudaMalloc(&b[i], n * 4));
        CK(cudaMalloc(&o[i], n * 4));
        CK(cudaMemset(a[i], 0, n * 4));
        CK(cudaMemset(b[i], 0, n * 4));
    }
    CK(cudaMalloc(&w, C * 4));
    CK(cudaMalloc(&mean, N * 4));
    CK(cudaMalloc(&rstd, N * 4));
    CK(cudaMalloc(&partials, 4096 * 2 * C * 4));
    CK(cudaMemset(w, 0, C * 4));
    CK(cudaMemset(mean, 0, N * 4));
    CK(cudaMemset(rstd, 0, N * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const double copy_gbs = copy_bandwidth_gbs();  // the 2 GB copy profile_kernels takes as 100%
    printf("2 GB copy: %.0f GB/s\n", copy_gbs);
    // f(set, stream): the mean of 30 launches back to back, plainly and as one CUDA graph (as a step may run them)
    auto time = [&](const char* name, double bytes, auto f) {
        for (int i = 0; i < 3; i++) f(i % SETS, (cudaStream_t)0);
        CK(cudaDeviceSynchronize());
        const int reps = 30;
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; i++) f(i % SETS, (cudaStream_t)0);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms, gms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        cudaStream_t st;
        CK(cudaStreamCreate(&st));
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < reps; i++) f(i % SETS, st);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&gms, e0, e1));
        gms /= reps;
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        CK(cudaStreamDestroy(st));
        printf("%-42s %8.4f ms %7.0f GB/s %5.1f%%   graph %8.4f ms %7.0f GB/s %5.1f%%\n", name, ms, bytes / ms / 1e6,
               bytes / ms / 1e6 / copy_gbs * 100, gms, bytes / gms / 1e6, bytes / gms / 1e6 / copy_gbs * 100);
    };
    for (int blocks : {1056, 8192}) {
        char name[64];
        snprintf(name, sizeof name, "copy, %d blocks", blocks);
        time(name, 2.0 * n * 4, [&](int s, cudaStream_t st) {
            k_copy<<<blocks, 256, 0, st>>>((float4*)o[s], (const float4*)a[s], n / 4);
        });
        snprintf(name, sizeof name, "dout * x streamed, %d blocks", blocks);
        time(name, 3.0 * n * 4, [&](int s, cudaStream_t st) {
            k_stream21<<<blocks, 256, 0, st>>>((float4*)o[s], (const float4*)a[s], (const float4*)b[s], n / 4);
        });
    }
    {  // the engine's: 192 threads a row, 16 rows a block, 512 blocks, 96 reducers (as the launcher takes them)
        unsigned int* counters;
        CK(cudaMalloc(&counters, 8));
        CK(cudaMemset(counters, 0, 8));
        float *dw, *db;
        CK(cudaMalloc(&dw, C * 4));
        CK(cudaMalloc(&db, C * 4));
        for (int acc : {0, 1})
            time(acc ? "engine, dx added into" : "engine", (3.0 + acc) * n * 4, [&](int s, cudaStream_t st) {
                k_layernorm_bwd_fast<<<512, 192, 32 * 192, st>>>(o[s], dw, db, partials, counters, a[s], b[s], w, mean,
                                                                rstd, N, C, 16, acc, 96);
            });
        // the narrow rows' kernel: a warp a row, 256 blocks (one wave at two an SM), 66 reducers (a quarter of
        // the 264 resident); and 128 blocks
        for (int blocks : {128, 132, 256, 264})
            for (int reducers : {66, 96, 132})
                for (int acc : {0, 1}) {
                    if (reducers > blocks) continue;
                    char name[80];
                    snprintf(name, sizeof name, "warp a row (prototype), %d blocks, %d reducers%s", blocks, reducers,
                             acc ? ", dx added into" : "");
                    time(name, (3.0 + acc) * n * 4, [&](int s, cudaStream_t st) {
                        k_layernorm_bwd_fast_narrow<<<blocks, 256, 0, st>>>(o[s], dw, db, partials, counters, a[s],
                                                                            b[s], w, mean, rstd, N, C, acc, reducers);
                    });
                }
        for (int rows_blocks : {256, 264})
            for (int acc : {0, 1})
                for (bool partial : {false, true}) {
                    char name[80];
                    snprintf(name, sizeof name, "prototype's rows%s, %d blocks%s",
                             partial ? " + partial rows" : " alone", rows_blocks, acc ? ", added into" : "");
                    auto k = acc ? (partial ? k_narrow_nofinish<true, true> : k_narrow_nofinish<true, false>)
                                 : (partial ? k_narrow_nofinish<false, true> : k_narrow_nofinish<false, false>);
                    time(name, (3.0 + acc) * n * 4, [&](int s, cudaStream_t st) {
                        k<<<rows_blocks, 256, 0, st>>>(o[s], partials, a[s], b[s], w, mean, rstd, N, C);
                    });
                }
        for (int acc : {0, 1})
            time(acc ? "engine's rows + partial rows, added into" : "engine's rows + partial rows", (3.0 + acc) * n * 4,
                 [&](int s, cudaStream_t st) {
                     auto k = acc ? k_block_nofinish<true> : k_block_nofinish<false>;
                     k<<<512, 192, 32 * 192, st>>>(o[s], partials, a[s], b[s], w, mean, rstd, N, C, 16);
                 });
    }
    {  // the clusters' reduction: checked against the prototype (dx the same bits; dw and db the same sums in
       // another order), then timed
        unsigned int* counter;
        float *dw, *db, *dw2, *db2, *cluster_rows, *dx_check;
        CK(cudaMalloc(&counter, 16));
        CK(cudaMemset(counter, 0, 16));
        for (float** p : {&dw, &db, &dw2, &db2}) {
            CK(cudaMalloc(p, C * 4));
            CK(cudaMemset(*p, 0, C * 4));
        }
        CK(cudaMalloc(&cluster_rows, 128 * 2 * C * 4));
        CK(cudaMalloc(&dx_check, n * 4));
        k_fill<<<1024, 256>>>(a[0], n, 1u, 2.0f, 0.0f);
        k_fill<<<1024, 256>>>(b[0], n, 2u, 2.0f, 0.5f);
        k_fill<<<8, 256>>>(w, C, 3u, 1.0f, 1.0f);
        k_fill<<<32, 256>>>(mean, N, 4u, 0.2f, 0.5f);
        k_fill<<<32, 256>>>(rstd, N, 5u, 0.5f, 1.0f);
        k_layernorm_bwd_fast_narrow<<<256, 256>>>(dx_check, dw, db, partials, counter, a[0], b[0], w, mean, rstd, N, C,
                                                  0, 66);
        k_layernorm_bwd_cluster<false, true, 8><<<CLUSTER_GRID, NARROW_THREADS>>>(o[0], dw2, db2, cluster_rows,
                                                                                 counter + 2, a[0], b[0], w, mean,
                                                                                 rstd, N, C);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> h1(n), h2(n), w1(C), w2(C), b1(C), b2(C);
        CK(cudaMemcpy(h1.data(), dx_check, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2.data(), o[0], n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(w1.data(), dw, C * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(w2.data(), dw2, C * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b1.data(), db, C * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b2.data(), db2, C * 4, cudaMemcpyDeviceToHost));
        long long differ = 0;
        for (long long i = 0; i < n; i++) differ += memcmp(&h1[i], &h2[i], 4) != 0;
        double worst = 0.0;
        for (int c = 0; c < C; c++)
            worst = std::max(worst, std::max(fabs(w1[c] - w2[c]) / (fabs(w1[c]) + 1e-3),
                                             fabs(b1[c] - b2[c]) / (fabs(b1[c]) + 1e-3)));
        printf("clusters against the prototype: dx words that differ %lld of %lld; dw, db worst relative %.2e\n",
               differ, n, worst);
        auto cl = [&](auto acc_c, auto finish_c, auto cl_c) {
            constexpr bool ACC = decltype(acc_c)::value, FIN = decltype(finish_c)::value;
            constexpr int CL = decltype(cl_c)::value;
            char name[96];
            snprintf(name, sizeof name, "clusters of %d%s%s", CL, FIN ? "" : " without the last block's sum",
                     ACC ? ", added into" : "");
            time(name, (3.0 + ACC) * n * 4, [&](int s, cudaStream_t st) {
                k_layernorm_bwd_cluster<ACC, FIN, CL><<<CLUSTER_GRID, NARROW_THREADS, 0, st>>>(
                    o[s], dw2, db2, cluster_rows, counter + 2, a[s], b[s], w, mean, rstd, N, C);
            });
        };
        using T_ = std::true_type;
        using F_ = std::false_type;
        using C8 = std::integral_constant<int, 8>;
        using C4 = std::integral_constant<int, 4>;
        using C2 = std::integral_constant<int, 2>;
        cl(T_{}, T_{}, C8{}), cl(T_{}, F_{}, C8{}), cl(F_{}, T_{}, C8{}), cl(T_{}, T_{}, C4{}), cl(T_{}, F_{}, C4{});
        cl(T_{}, T_{}, C2{});
    }
    for (int blocks : {1024, 528, 396, 264, 132}) {
        char name[64];
        snprintf(name, sizeof name, "warp a row, %d blocks", blocks);
        time(name, 3.0 * n * 4,
             [&](int s, cudaStream_t st) {
                 k_warprow<false><<<blocks, 256, 0, st>>>(o[s], partials, a[s], b[s], w, mean, rstd);
             });
        snprintf(name, sizeof name, "warp a row, dw and db too, %d blocks", blocks);
        time(name, 3.0 * n * 4,
             [&](int s, cudaStream_t st) {
                 k_warprow<true><<<blocks, 256, 0, st>>>(o[s], partials, a[s], b[s], w, mean, rstd);
             });
    }
    return 0;
}
