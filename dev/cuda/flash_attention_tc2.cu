// Flash attention on the tensor cores at FP32 accuracy (3xTF32), second version. The first
// (flash_attention_tc.cu) ran correct on the H200 but slow: 0.825 ms forward, 3.587 ms forward+backward at
// B=8, 12 heads, T=1024, d_k=64, against SDPA's 0.489 / 1.697. Its tiles were loaded by plain loads between
// two barriers, split into hi and lo as they were stored: every tile's load latency stood in front of its
// products, with two blocks (eight warps) an SM to cover it.
//
// Here the tiles that stream (K and V in the forward and in dQ's kernel, Q and dO in dK/dV's) are copied raw
// with cp.async into two stages: the next tile lands while the products of this one run. The operands are
// split into TF32 hi and lo as each fragment is read (as the mma.sync SGEMM does), which costs a few ALU
// instructions a product and saves the split tiles' shared memory. A block is WARPS warps of 16 rows (query
// rows in the forward and dQ's kernel, keys in dK/dV's); a warp skips the tiles its causal mask hides.
// The backward's delta (the row's sum of p dp) is computed as the sum of dO * O over d, the same value (the
// row of P V is O), instead of a first pass over the keys: dQ's kernel reads O once.
//
// The same mma order as the first version for each product: lo*hi, hi*lo, hi*hi into a zeroed fragment, then
// one FP32 add into the running sum; deterministic: every sum in a fixed order, no atomics.
#include "matmul_tc.cuh"  // tf32_split, mma_tf32, mma_tf32_first, cp_async16, cp_async4

#define F2_KEYS 64  // rows of a streamed tile
// 1: the small terms of 3xTF32 summed apart (f2_mma_split), in the forward's products or the backward's
#ifndef F2_SMALL_FWD
#define F2_SMALL_FWD 0
#endif
#ifndef F2_SMALL_BWD
#define F2_SMALL_BWD 0
#endif
// Blocks whose rows see at most this many key tiles take delta from a pass over P and dP, as the fast variant
// does (so p = 1 gives ds = 0 exactly), the rest from dO * O in FP64
#ifndef F2_DELTA_PASS_TILES
#define F2_DELTA_PASS_TILES 2
#endif

// Shared tiles at row stride D + 8, column d of row r at r * (D + 8) + (d ^ ((r & 4) << 1)): read as row
// pairs of d (float2, rows 8 apart across a warp) and as columns (rows 2t, 2t + 1 across a quad) without bank
// conflicts; the XOR moves whole 16-byte chunks, so cp.async fills it 16 bytes at a time.
template <int D>
__device__ __forceinline__ int f2_at(int r, int d) {
    return r * (D + 8) + (d ^ ((r & 4) << 1));
}

// rows [r0, r0 + ROWS) of the (T, d_k) matrix p into s, zero past T and past d_k up to D, by cp.async: 16
// bytes at a time where vec (d_k % 4 == 0 and p on a 16-byte boundary), else 4
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void f2_load(float* s, const float* p, int r0, int T, int d_k, bool vec) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < ROWS * D / 4 / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / (D / 4), d = e % (D / 4) * 4;
            const bool in = r0 + r < T && d < d_k;
            cp_async16(s + f2_at<D>(r, d), in ? p + (long long)(r0 + r) * d_k + d : p, in ? 16 : 0);
        }
    } else {
        for (int i = 0; i < ROWS * D / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / D, d = e % D;
            const bool in = r0 + r < T && d < d_k;
            cp_async4(s + f2_at<D>(r, d), in ? p + (long long)(r0 + r) * d_k + d : p, in ? 4 : 0);
        }
    }
}

// three products of a split pair into a zeroed fragment, added into acc
__device__ __forceinline__ void f2_mma3(float (&acc)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                        float b0, float b1) {
    uint32_t b_hi[2], b_lo[2];
    tf32_split(b0, b_hi[0], b_lo[0]);
    tf32_split(b1, b_hi[1], b_lo[1]);
    float p[4];
    mma_tf32_first(p, a_lo, b_hi);
    mma_tf32(p, a_hi, b_lo);
    mma_tf32(p, a_hi, b_hi);
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] += p[r];
}

// hi*hi into a zeroed fragment added into acc in FP32; lo*hi and hi*lo summed into small by the tensor cores
__device__ __forceinline__ void f2_mma_split(float (&acc)[4], float (&small)[4], const uint32_t (&a_hi)[4],
                                             const uint32_t (&a_lo)[4], float b0, float b1) {
    uint32_t b_hi[2], b_lo[2];
    tf32_split(b0, b_hi[0], b_lo[0]);
    tf32_split(b1, b_hi[1], b_lo[1]);
    float p[4];
    mma_tf32_first(p, a_hi, b_hi);
    mma_tf32(small, a_lo, b_hi);
    mma_tf32(small, a_hi, b_lo);
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] += p[r];
}

// acc[j] = A B^T over d, for the 8 n8 tiles of B's 64 rows: A the warp's 16 rows of a shared tile (a: its row
// 0, a multiple of 8 of the tile), B the 64 rows at b; both raw, split as they are read
template <int D, int UNROLL, bool SMALL>
__device__ __forceinline__ void f2_rows_dot(float (&acc)[8][4], const float* a, const float* b) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[j][r] = 0.0f;
    // SMALL: the hi*lo and lo*hi terms (2^-11 of the sum and less) summed in the tensor cores over all of d:
    // their truncating adds cost little at FP32's resolution, and only hi*hi waits on the FP32 add each step
    float small[SMALL ? 8 : 1][4];
    if constexpr (SMALL)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) small[j][r] = 0.0f;
#pragma unroll UNROLL
    for (int kk = 0; kk < D; kk += 8) {
        // rows g, g + 8 of A and 8j + g of B share bit 2, so one swizzled column serves them all
        const int col = (kk + 2 * t) ^ ((g & 4) << 1);
        const float2 u = *reinterpret_cast<const float2*>(a + g * (D + 8) + col);
        const float2 w = *reinterpret_cast<const float2*>(a + (g + 8) * (D + 8) + col);
        const float av[4] = {u.x, w.x, u.y, w.y};  // (g, d 2t), (g + 8, 2t), (g, 2t + 1), (g + 8, 2t + 1)
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(av[r], a_hi[r], a_lo[r]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float2 bv = *reinterpret_cast<const float2*>(b + (8 * j + g) * (D + 8) + col);
            if constexpr (SMALL) f2_mma_split(acc[j], small[SMALL ? j : 0], a_hi, a_lo, bv.x, bv.y);
            else f2_mma3(acc[j], a_hi, a_lo, bv.x, bv.y);
        }
    }
    if constexpr (SMALL)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[j][r] += small[SMALL ? j : 0][r];
}

// out += W M: W the warp's 16 x 64 weights in the accumulator layout (w[j]: columns 8j + 2t, + 1), M the 64
// rows of a shared tile at m; each step of 8 rows of M relabelled (logical k t = row 2t, t + 4 = row 2t + 1)
template <int D, bool SMALL>
__device__ __forceinline__ void f2_weigh(float (&out)[D / 8][4], const float (&w)[8][4], const float* m) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float small[SMALL ? D / 8 : 1][4];
    if constexpr (SMALL)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int r = 0; r < 4; r++) small[n][r] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        const float a[4] = {w[kb][0], w[kb][2], w[kb][1], w[kb][3]};
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(a[r], a_hi[r], a_lo[r]);
        const int r = 8 * kb + 2 * t;  // and r + 1, which shares its bit 2
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const int at = f2_at<D>(r, 8 * n + g);
            if constexpr (SMALL) f2_mma_split(out[n], small[SMALL ? n : 0], a_hi, a_lo, m[at], m[at + D + 8]);
            else f2_mma3(out[n], a_hi, a_lo, m[at], m[at + D + 8]);
        }
    }
    if constexpr (SMALL)
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int r = 0; r < 4; r++) out[n][r] += small[SMALL ? n : 0][r];
}

__device__ __forceinline__ float f2_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float f2_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

__device__ __forceinline__ bool f2_aligned(const void* a, const void* b, const void* c, const void* d = nullptr) {
    return ((unsigned long long)a | (unsigned long long)b | (unsigned long long)c | (unsigned long long)d) % 16 ==
           0;
}

// Shared memory in floats, mirrored in dev/flash_attention.py: the resident tiles (Q; Q and dO; K and V) and
// two stages of two streamed 64-row tiles (and, for dK/dV, of the query tile's lse and delta).
template <int D, int WARPS>
struct F2Smem {
    static constexpr int LD = D + 8, ROWS = 16 * WARPS, TILE = F2_KEYS * LD;
    static constexpr int FWD = ROWS * LD + 4 * TILE, DQ = 2 * ROWS * LD + 4 * TILE,
                         DKDV = 2 * ROWS * LD + 4 * TILE + 4 * F2_KEYS;
};

// ---------------------------------------------------------------------------------------------- forward
// A block owns 16 * WARPS query rows of one head (blockIdx.y = b * NH + h), the longest rows first; an
// online softmax in FP32 over the 64-key tiles up to the diagonal; lse[i] = max + log(sum) for the backward.
template <int D, int WARPS>
__device__ void flash2_fwd(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {
#if TC_AVAILABLE
    using S = F2Smem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float f2_smem[];
    float* qs = f2_smem;
    float* kv = qs + S::ROWS * S::LD;  // stage s: K at kv + 2 s TILE, V after it
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, o += head;
    lse += (long long)blockIdx.y * T;
    const bool vec = d_k % 4 == 0 && f2_aligned(q, k, v);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = (min(q0 + S::ROWS, T) - 1) / F2_KEYS + 1;  // up to the block's last row

    f2_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, vec);
    f2_load<D, F2_KEYS, THREADS>(kv, k, 0, T, d_k, vec);
    f2_load<D, F2_KEYS, THREADS>(kv + S::TILE, v, 0, T, d_k, vec);
    cp_async_commit();

    float acc[ND][4];  // O: of n8 tile n, (row_a, 8n + 2t), (row_a, 8n + 2t + 1), (row_b, ...), (row_b, ...)
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[n][r] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    for (int i = 0; i < n_tiles; i++) {
        const int k0 = i * F2_KEYS;
        cp_async_wait<0>();
        __syncthreads();  // tile i is in for every thread, and every warp is done with tile i - 1's stage
        if (i + 1 < n_tiles) {
            float* next = kv + ((i + 1) & 1) * 2 * S::TILE;
            f2_load<D, F2_KEYS, THREADS>(next, k, k0 + F2_KEYS, T, d_k, vec);
            f2_load<D, F2_KEYS, THREADS>(next + S::TILE, v, k0 + F2_KEYS, T, d_k, vec);
        }
        cp_async_commit();
        if (k0 > first + 15 || first >= T) continue;  // every key of the tile masked, or no row of the warp's
        const float* ks = kv + (i & 1) * 2 * S::TILE;

        float s[8][4];  // this warp's 16 rows against keys k0 + 8 j .. + 7, in the accumulator layout
        f2_rows_dot<D, 2, F2_SMALL_FWD>(s, qs + 16 * warp * S::LD, ks);

        // scale, as the literal line does, and mask; the online softmax of rows a (s[j][0..1]) and b
        const bool whole = k0 + F2_KEYS - 1 <= first && k0 + F2_KEYS <= T;  // no key hidden from any row
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + 8 * j + 2 * t + e;
                s[j][e] = (whole || (key <= row_a && key < T)) ? s[j][e] * scale : -INFINITY;
                s[j][2 + e] = (whole || (key <= row_b && key < T)) ? s[j][2 + e] * scale : -INFINITY;
                mx_a = fmaxf(mx_a, s[j][e]);
                mx_b = fmaxf(mx_b, s[j][2 + e]);
            }
        // finite: the tile's key k0 <= first <= row (for padding rows past T too)
        const float new_a = fmaxf(m_a, f2_quad_max(mx_a)), new_b = fmaxf(m_b, f2_quad_max(mx_b));
        const float alpha_a = expf(m_a - new_a), alpha_b = expf(m_b - new_b);
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[j][e] = expf(s[j][e] - new_a);
                s[j][2 + e] = expf(s[j][2 + e] - new_b);
                sum_a += s[j][e];
                sum_b += s[j][2 + e];
            }
        l_a = l_a * alpha_a + f2_quad_sum(sum_a);
        l_b = l_b * alpha_b + f2_quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            acc[n][0] *= alpha_a, acc[n][1] *= alpha_a;
            acc[n][2] *= alpha_b, acc[n][3] *= alpha_b;
        }
        f2_weigh<D, F2_SMALL_FWD>(acc, s, ks + S::TILE);  // O += P V, P in registers
    }

#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (row_a < T) o[(long long)row_a * d_k + d] = acc[n][e] / l_a;
            if (row_b < T) o[(long long)row_b * d_k + d] = acc[n][2 + e] / l_b;
        }
    if (t == 0) {
        if (row_a < T) lse[row_a] = m_a + logf(l_a);
        if (row_b < T) lse[row_b] = m_b + logf(l_b);
    }
#else
    __trap();  // mma.sync TF32 needs sm_80
#endif
}

// ---------------------------------------------------------------------------------------------- backward
// dq = scale * sum over keys of ds k, ds = p (dp - delta), dp = do v^T, p = exp(q k^T * scale - lse),
// delta = sum over d of do * o (the row's sum of p dp), written for the dK/dV kernel
template <int D, int WARPS>
__device__ void flash2_bwd_dq(float* dq, float* delta, const float* q, const float* k, const float* v,
                              const float* o, const float* d_o, const float* lse, int T, int d_k) {
#if TC_AVAILABLE
    using S = F2Smem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float f2_smem[];
    float* qs = f2_smem;
    float* dos = qs + S::ROWS * S::LD;
    float* kv = dos + S::ROWS * S::LD;
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, o += head, d_o += head, dq += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const bool vec = d_k % 4 == 0 && f2_aligned(q, k, v, d_o);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const float lse_a = row_a < T ? lse[row_a] : 0.0f, lse_b = row_b < T ? lse[row_b] : 0.0f;
    const int n_tiles = (min(q0 + S::ROWS, T) - 1) / F2_KEYS + 1;

    auto load_kv = [&](int stage, int k0) {
        float* s = kv + stage * 2 * S::TILE;
        f2_load<D, F2_KEYS, THREADS>(s, k, k0, T, d_k, vec);
        f2_load<D, F2_KEYS, THREADS>(s + S::TILE, v, k0, T, d_k, vec);
    };
    // one pass over the key tiles up to the block's last row, tile 0 already on its way: step(k0, p, dp, ks)
    // for each tile the warp sees, p = exp(q k^T * scale - lse) (0 where the mask or the padding hides the
    // key), dp = do v^T, ks the tile's K (its V after it)
    auto each_tile = [&](auto step) {
        for (int i = 0; i < n_tiles; i++) {
            const int k0 = i * F2_KEYS;
            cp_async_wait<0>();
            __syncthreads();  // tile i is in, and every warp is done with tile i - 1's stage
            if (i + 1 < n_tiles) load_kv((i + 1) & 1, k0 + F2_KEYS);
            cp_async_commit();
            if (k0 > first + 15 || first >= T) continue;
            const float* ks = kv + (i & 1) * 2 * S::TILE;
            float p[8][4], dp[8][4];
            f2_rows_dot<D, 1, F2_SMALL_BWD>(p, qs + 16 * warp * S::LD, ks);
            f2_rows_dot<D, 1, F2_SMALL_BWD>(dp, dos + 16 * warp * S::LD, ks + S::TILE);
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = k0 + 8 * j + 2 * t + e;
                    // _rn: s * scale rounded as the forward rounds it (no FMA with lse), so p is 1 where it was
                    p[j][e] = key <= row_a && key < T ? expf(__fmul_rn(p[j][e], scale) - lse_a) : 0.0f;
                    p[j][2 + e] = key <= row_b && key < T ? expf(__fmul_rn(p[j][2 + e], scale) - lse_b) : 0.0f;
                }
            step(k0, p, dp, ks);
        }
    };

    f2_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, vec);
    f2_load<D, S::ROWS, THREADS>(dos, d_o, q0, T, d_k, vec);
    load_kv(0, 0);
    cp_async_commit();

    // delta of rows a and b. Short rows: the sum of p dp over the keys, in a pass of its own (p and dp as the
    // dq pass computes them: where p is 1, ds is exactly 0). Long rows: the sum of dO * O over d, the same value
    // in one read of O, with a quad's four threads taking every fourth d in FP64, in a fixed order (O carries
    // the forward's rounding, so the FP32 sum's own would add to it).
    float delta_a = 0.0f, delta_b = 0.0f;
    if (n_tiles <= F2_DELTA_PASS_TILES) {
        each_tile([&](int, const float (&p)[8][4], const float (&dp)[8][4], const float*) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    delta_a += p[j][e] * dp[j][e];
                    delta_b += p[j][2 + e] * dp[j][2 + e];
                }
        });
        delta_a = f2_quad_sum(delta_a), delta_b = f2_quad_sum(delta_b);
        __syncthreads();  // every warp is done with the last tile's stage before the dq pass loads tile 0 again
        load_kv(0, 0);
        cp_async_commit();
    } else {
        double sum_a = 0.0, sum_b = 0.0;
        for (int d = t; d < d_k; d += 4) {
            if (row_a < T) sum_a += (double)d_o[(long long)row_a * d_k + d] * o[(long long)row_a * d_k + d];
            if (row_b < T) sum_b += (double)d_o[(long long)row_b * d_k + d] * o[(long long)row_b * d_k + d];
        }
        sum_a += __shfl_xor_sync(0xffffffff, sum_a, 1), sum_b += __shfl_xor_sync(0xffffffff, sum_b, 1);
        sum_a += __shfl_xor_sync(0xffffffff, sum_a, 2), sum_b += __shfl_xor_sync(0xffffffff, sum_b, 2);
        delta_a = (float)sum_a, delta_b = (float)sum_b;
    }
    if (t == 0) {
        if (row_a < T) delta[row_a] = delta_a;
        if (row_b < T) delta[row_b] = delta_b;
    }

    float acc[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[n][r] = 0.0f;
    each_tile([&](int, float (&p)[8][4], const float (&dp)[8][4], const float* ks) {
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                p[j][e] *= dp[j][e] - delta_a;  // ds (0 where p is)
                p[j][2 + e] *= dp[j][2 + e] - delta_b;
            }
        f2_weigh<D, F2_SMALL_BWD>(acc, p, ks);  // dq += ds k
    });
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (row_a < T) dq[(long long)row_a * d_k + d] = acc[n][e] * scale;
            if (row_b < T) dq[(long long)row_b * d_k + d] = acc[n][2 + e] * scale;
        }
#else
    __trap();
#endif
}

// for a block of 16 * WARPS keys: dv = sum over queries of p^T do, dk = scale * sum of ds^T q; a warp owns 16
// keys and streams the 64-row query tiles from the diagonal on
template <int D, int WARPS>
__device__ void flash2_bwd_dkdv(float* dk, float* dv, const float* q, const float* k, const float* v,
                                const float* d_o, const float* lse, const float* delta, int T, int d_k) {
#if TC_AVAILABLE
    using S = F2Smem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float f2_smem[];
    float* ks = f2_smem;
    float* vs = ks + S::ROWS * S::LD;
    float* qd = vs + S::ROWS * S::LD;      // stage s: Q at qd + 2 s TILE, dO after it
    float* ld = qd + 4 * S::TILE;          // stage s: lse at ld + 2 s F2_KEYS, delta after it
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, d_o += head, dk += head, dv += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const bool vec = d_k % 4 == 0 && f2_aligned(q, k, v, d_o);
    const int k0 = blockIdx.x * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = k0 + 16 * warp, key_a = first + g, key_b = key_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = (T - 1) / F2_KEYS + 1 - k0 / F2_KEYS;  // query tiles from k0 to the end

    auto load_tile = [&](int stage, int q0) {
        float* s = qd + stage * 2 * S::TILE;
        f2_load<D, F2_KEYS, THREADS>(s, q, q0, T, d_k, vec);
        f2_load<D, F2_KEYS, THREADS>(s + S::TILE, d_o, q0, T, d_k, vec);
        for (int e = threadIdx.x; e < 2 * F2_KEYS; e += THREADS) {
            const int qi = q0 + e % F2_KEYS;
            const float* src = e < F2_KEYS ? lse : delta;
            cp_async4(ld + stage * 2 * F2_KEYS + e, qi < T ? src + qi : src, qi < T ? 4 : 0);
        }
    };
    f2_load<D, S::ROWS, THREADS>(ks, k, k0, T, d_k, vec);
    f2_load<D, S::ROWS, THREADS>(vs, v, k0, T, d_k, vec);
    load_tile(0, k0);
    cp_async_commit();

    float acc_k[ND][4], acc_v[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc_k[n][r] = 0.0f, acc_v[n][r] = 0.0f;
    for (int i = 0; i < n_tiles; i++) {
        const int q0 = k0 + i * F2_KEYS;
        cp_async_wait<0>();
        __syncthreads();
        if (i + 1 < n_tiles) load_tile((i + 1) & 1, q0 + F2_KEYS);
        cp_async_commit();
        if (q0 + F2_KEYS - 1 < first || first >= T) continue;  // every query of the tile before the warp's keys
        const float* qs = qd + (i & 1) * 2 * S::TILE;
        const float* dos = qs + S::TILE;
        const float* tl = ld + (i & 1) * 2 * F2_KEYS;
        // p^T and dp^T: rows this warp's keys, columns the tile's queries 8j + 2t (+ 1)
        float pt[8][4], dpt[8][4];
        f2_rows_dot<D, 1, F2_SMALL_BWD>(pt, ks + 16 * warp * S::LD, qs);
        f2_rows_dot<D, 1, F2_SMALL_BWD>(dpt, vs + 16 * warp * S::LD, dos);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 8 * j + 2 * t + e, qi = q0 + col;
                const float l = tl[col], dl = tl[F2_KEYS + col];
                const bool seen_a = key_a <= qi && qi < T && key_a < T, seen_b = key_b <= qi && qi < T && key_b < T;
                pt[j][e] = seen_a ? expf(__fmul_rn(pt[j][e], scale) - l) : 0.0f;
                pt[j][2 + e] = seen_b ? expf(__fmul_rn(pt[j][2 + e], scale) - l) : 0.0f;
                dpt[j][e] = pt[j][e] * (dpt[j][e] - dl);  // ds^T
                dpt[j][2 + e] = pt[j][2 + e] * (dpt[j][2 + e] - dl);
            }
        f2_weigh<D, F2_SMALL_BWD>(acc_v, pt, dos);
        f2_weigh<D, F2_SMALL_BWD>(acc_k, dpt, qs);
    }
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (key_a < T) {
                dk[(long long)key_a * d_k + d] = acc_k[n][e] * scale;
                dv[(long long)key_a * d_k + d] = acc_v[n][e];
            }
            if (key_b < T) {
                dk[(long long)key_b * d_k + d] = acc_k[n][2 + e] * scale;
                dv[(long long)key_b * d_k + d] = acc_v[n][2 + e];
            }
        }
#else
    __trap();
#endif
}

// The kernels for each padded width D and WARPS: grid (ceil(T / (16 WARPS)), B * NH), 32 WARPS threads,
// F2Smem's floats of dynamic shared memory.
#define FLASH2_KERNELS(D, W, FWD_BLOCKS)                                                                       \
    extern "C" __global__ void F2_BOUNDS_##FWD_BLOCKS(W) k_flash2_fwd_d##D##_w##W(                            \
        float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {               \
        flash2_fwd<D, W>(o, lse, q, k, v, T, d_k);                                                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * W) k_flash2_bwd_dq_d##D##_w##W(                         \
        float* dq, float* delta, const float* q, const float* k, const float* v, const float* o,               \
        const float* d_o, const float* lse, int T, int d_k) {                                                  \
        flash2_bwd_dq<D, W>(dq, delta, q, k, v, o, d_o, lse, T, d_k);                                          \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * W) k_flash2_bwd_dkdv_d##D##_w##W(                       \
        float* dk, float* dv, const float* q, const float* k, const float* v, const float* d_o,                \
        const float* lse, const float* delta, int T, int d_k) {                                                \
        flash2_bwd_dkdv<D, W>(dk, dv, q, k, v, d_o, lse, delta, T, d_k);                                       \
    }
// FWD_BLOCKS: blocks an SM the forward's registers must allow (8 warps: two, at 128 registers, without spills;
// 4 warps: left to ptxas, which takes 187 at d_k 64 without spills where a bound of 1 gives 255 and spills)
#define F2_BOUNDS_1(W) __launch_bounds__(32 * W)
#define F2_BOUNDS_2(W) __launch_bounds__(32 * W, 2)
FLASH2_KERNELS(32, 4, 1)
FLASH2_KERNELS(64, 4, 1)
FLASH2_KERNELS(128, 4, 1)
FLASH2_KERNELS(64, 8, 2)
#undef FLASH2_KERNELS
