// Flash attention on the tensor cores at FP32 accuracy (3xTF32): the tc variant's fused attention, one kernel
// forward and two backward, no T x T buffer. The forward streams the 64-key tiles of K and V through shared
// memory (two cp.async stages) with an online softmax; it keeps O and one log-sum-exp a row. The backward
// recomputes the probabilities from the log-sum-exp: dQ's kernel (a block of query rows against the key tiles
// up to the diagonal) writes delta for dK/dV's (a block of keys against the query tiles from the diagonal on).
// The prototypes and how each choice measured: dev/cuda/flash_attention_tc2.cu, dev/NOTES.md.
//
// Every product is three TF32 mma.sync (lo*hi, hi*lo, hi*hi into a zeroed fragment; the operands split into
// hi and lo as their fragments are read) added into a running sum kept in FP32 registers, 8 of d at a time:
// the tensor cores' own accumulation does not round to nearest, and summed over long runs it would show.
// Deterministic: every sum in a fixed order, no atomics.
//
// Heads are read where the QKV projection leaves them and written where W_O reads them: head h of batch row b
// is columns h * d_k .. + d_k of rows b * T .. + T of a matrix whose rows are ld floats apart (qkv and dqkv:
// 3C, Q at column 0, K at C, V at 2C; y and dy: C), so no split or merge of heads runs before or after.
#pragma once
#include "matmul_tc.cuh"  // tf32_split, mma_tf32, mma_tf32_first, cp_async16, cp_async4, TC_AVAILABLE

#define FA_KEYS 64  // rows of a streamed tile
// Floats of shared memory of each kernel (D: d_k padded to 32, 64 or 128; W: warps of 16 rows a block): the
// resident rows (Q; Q and dO; K and V) and two stages of two streamed tiles (and, for dK/dV, of the query
// tile's lse and delta), each row D + 8 floats apart.
#define FA_SMEM_FWD(D, W) (16 * (W) * ((D) + 8) + 4 * FA_KEYS * ((D) + 8))
#define FA_SMEM_DQ(D, W) (2 * 16 * (W) * ((D) + 8) + 4 * FA_KEYS * ((D) + 8))
#define FA_SMEM_DKDV(D, W) (2 * 16 * (W) * ((D) + 8) + 4 * FA_KEYS * ((D) + 8) + 4 * FA_KEYS)
// The forward of d_k 64 runs 8 warps a block (two blocks an SM at 128 registers: 0.416 ms against 0.455 with
// 4 warps at andrea-120m's shape); every other kernel 4.
#define FA_FWD_WARPS_32 4
#define FA_FWD_WARPS_64 8
#define FA_FWD_WARPS_128 4
#define FA_FWD_WARPS(D) FA_FWD_WARPS_##D
#define FA_BWD_WARPS 4
enum FlashLaunch : int {
    FA_KEYS_A_TILE = FA_KEYS,
    FA_BWD_W = FA_BWD_WARPS,
    FA_FWD_W32 = FA_FWD_WARPS(32),
    FA_FWD_W64 = FA_FWD_WARPS(64),
    FA_FWD_W128 = FA_FWD_WARPS(128),
    FA_FWD_BYTES32 = FA_SMEM_FWD(32, FA_FWD_WARPS(32)) * 4,
    FA_FWD_BYTES64 = FA_SMEM_FWD(64, FA_FWD_WARPS(64)) * 4,
    FA_FWD_BYTES128 = FA_SMEM_FWD(128, FA_FWD_WARPS(128)) * 4,
    FA_DQ_BYTES32 = FA_SMEM_DQ(32, FA_BWD_WARPS) * 4,
    FA_DQ_BYTES64 = FA_SMEM_DQ(64, FA_BWD_WARPS) * 4,
    FA_DQ_BYTES128 = FA_SMEM_DQ(128, FA_BWD_WARPS) * 4,
    FA_DKDV_BYTES32 = FA_SMEM_DKDV(32, FA_BWD_WARPS) * 4,
    FA_DKDV_BYTES64 = FA_SMEM_DKDV(64, FA_BWD_WARPS) * 4,
    FA_DKDV_BYTES128 = FA_SMEM_DKDV(128, FA_BWD_WARPS) * 4,
};

// Blocks whose rows see at most this many key tiles take delta from a pass over P and dP, as the fast variant
// does (so p = 1 gives ds = 0 exactly); the rest from dO * O in FP64 (dev/NOTES.md: dO * O alone put dQ and dK
// past the accuracy bar at T <= 77)
#define FA_DELTA_PASS_TILES 2

// Shared tiles at row stride D + 8, column d of row r at r * (D + 8) + (d ^ ((r & 4) << 1)): read as row
// pairs of d (float2, rows 8 apart across a warp) and as columns (rows 2t, 2t + 1 across a quad) without bank
// conflicts; the XOR moves whole 16-byte chunks, so cp.async fills it 16 bytes at a time.
template <int D>
__device__ __forceinline__ int fa_at(int r, int d) {
    return r * (D + 8) + (d ^ ((r & 4) << 1));
}

// rows [r0, r0 + ROWS) of a head (rows ld floats apart, d_k wide, T of them) into s, zero past T and past d_k
// up to D, by cp.async: 16 bytes at a time where vec (d_k and ld multiples of 4, p on a 16-byte boundary)
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void fa_load(float* s, const float* p, int r0, int T, int d_k, int ld, bool vec) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < ROWS * D / 4 / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / (D / 4), d = e % (D / 4) * 4;
            const bool in = r0 + r < T && d < d_k;
            cp_async16(s + fa_at<D>(r, d), in ? p + (long long)(r0 + r) * ld + d : p, in ? 16 : 0);
        }
    } else {
        for (int i = 0; i < ROWS * D / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / D, d = e % D;
            const bool in = r0 + r < T && d < d_k;
            cp_async4(s + fa_at<D>(r, d), in ? p + (long long)(r0 + r) * ld + d : p, in ? 4 : 0);
        }
    }
}

// three products of a split pair into a zeroed fragment, added into acc
__device__ __forceinline__ void fa_mma3(float (&acc)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
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

// acc[j] = A B^T over d, for the 8 n8 tiles of B's 64 rows: A the warp's 16 rows of a shared tile (a: its row
// 0, a multiple of 8 of the tile), B the 64 rows at b; both raw, split as they are read
template <int D, int UNROLL>
__device__ __forceinline__ void fa_rows_dot(float (&acc)[8][4], const float* a, const float* b) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[j][r] = 0.0f;
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
            fa_mma3(acc[j], a_hi, a_lo, bv.x, bv.y);
        }
    }
}

// out += W M: W the warp's 16 x 64 weights in the accumulator layout (w[j]: columns 8j + 2t, + 1), M the 64
// rows of a shared tile at m; each step of 8 rows of M relabelled (logical k t = row 2t, t + 4 = row 2t + 1)
template <int D>
__device__ __forceinline__ void fa_weigh(float (&out)[D / 8][4], const float (&w)[8][4], const float* m) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        const float a[4] = {w[kb][0], w[kb][2], w[kb][1], w[kb][3]};
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(a[r], a_hi[r], a_lo[r]);
        const int r = 8 * kb + 2 * t;  // and r + 1, which shares its bit 2
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const int at = fa_at<D>(r, 8 * n + g);
            fa_mma3(out[n], a_hi, a_lo, m[at], m[at + D + 8]);
        }
    }
}

__device__ __forceinline__ float fa_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float fa_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

__device__ __forceinline__ bool fa_aligned(const void* a, const void* b, const void* c, const void* d = nullptr) {
    return ((unsigned long long)a | (unsigned long long)b | (unsigned long long)c | (unsigned long long)d) % 16 ==
           0;
}

template <int D, int WARPS>
struct FlashSmem {
    static constexpr int LD = D + 8, ROWS = 16 * WARPS, TILE = FA_KEYS * LD;
    static constexpr int FWD = FA_SMEM_FWD(D, WARPS), DQ = FA_SMEM_DQ(D, WARPS), DKDV = FA_SMEM_DKDV(D, WARPS);
};

// The grid is (tiles, NH, B): head h = blockIdx.y of batch row b = blockIdx.z, at this offset in a matrix of rows
// ld floats apart (no division: with b * NH + h in one index, the division cost the forward 33 registers'
// spills at its bound of 128); its rows of lse and delta (B, NH, T) at fa_row(T).
__device__ __forceinline__ long long fa_head(int T, int d_k, int ld) {
    return (long long)blockIdx.z * T * ld + (long long)blockIdx.y * d_k;
}
__device__ __forceinline__ long long fa_row(int T) { return ((long long)blockIdx.z * gridDim.y + blockIdx.y) * T; }

// ---------------------------------------------------------------------------------------------- forward
// A block owns 16 * WARPS query rows of one head (fa_head), the longest rows first; an
// online softmax in FP32 over the 64-key tiles up to the diagonal; lse[i] = max + log(sum) for the backward.
template <int D, int WARPS>
__device__ void flash_fwd(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k,
                          int ld_in, int ld_out) {
#if TC_AVAILABLE
    using S = FlashSmem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float fa_smem[];
    float* qs = fa_smem;
    float* kv = qs + S::ROWS * S::LD;  // stage s: K at kv + 2 s TILE, V after it
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in;  // o and lse offset where they are written: no registers held through the loop
    const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && fa_aligned(q, k, v);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = (min(q0 + S::ROWS, T) - 1) / FA_KEYS + 1;  // up to the block's last row

    fa_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, ld_in, vec);
    fa_load<D, FA_KEYS, THREADS>(kv, k, 0, T, d_k, ld_in, vec);
    fa_load<D, FA_KEYS, THREADS>(kv + S::TILE, v, 0, T, d_k, ld_in, vec);
    cp_async_commit();

    float acc[ND][4];  // O: of n8 tile n, (row_a, 8n + 2t), (row_a, 8n + 2t + 1), (row_b, ...), (row_b, ...)
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[n][r] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    for (int i = 0; i < n_tiles; i++) {
        const int k0 = i * FA_KEYS;
        cp_async_wait<0>();
        __syncthreads();  // tile i is in for every thread, and every warp is done with tile i - 1's stage
        if (i + 1 < n_tiles) {
            float* next = kv + ((i + 1) & 1) * 2 * S::TILE;
            fa_load<D, FA_KEYS, THREADS>(next, k, k0 + FA_KEYS, T, d_k, ld_in, vec);
            fa_load<D, FA_KEYS, THREADS>(next + S::TILE, v, k0 + FA_KEYS, T, d_k, ld_in, vec);
        }
        cp_async_commit();
        if (k0 > first + 15 || first >= T) continue;  // every key of the tile masked, or no row of the warp's
        const float* ks = kv + (i & 1) * 2 * S::TILE;

        float s[8][4];  // this warp's 16 rows against keys k0 + 8 j .. + 7, in the accumulator layout
        fa_rows_dot<D, 2>(s, qs + 16 * warp * S::LD, ks);

        // scale, as the literal line does, and mask; the online softmax of rows a (s[j][0..1]) and b
        const bool whole = k0 + FA_KEYS - 1 <= first && k0 + FA_KEYS <= T;  // no key hidden from any row
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
        const float new_a = fmaxf(m_a, fa_quad_max(mx_a)), new_b = fmaxf(m_b, fa_quad_max(mx_b));
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
        l_a = l_a * alpha_a + fa_quad_sum(sum_a);
        l_b = l_b * alpha_b + fa_quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            acc[n][0] *= alpha_a, acc[n][1] *= alpha_a;
            acc[n][2] *= alpha_b, acc[n][3] *= alpha_b;
        }
        fa_weigh<D>(acc, s, ks + S::TILE);  // O += P V, P in registers
    }

    o += fa_head(T, d_k, ld_out);
    lse += fa_row(T);
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (row_a < T) o[(long long)row_a * ld_out + d] = acc[n][e] / l_a;
            if (row_b < T) o[(long long)row_b * ld_out + d] = acc[n][2 + e] / l_b;
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
__device__ void flash_bwd_dq(float* dq, float* delta, const float* q, const float* k, const float* v,
                             const float* o, const float* d_o, const float* lse, int T, int d_k, int ld_in,
                             int ld_out) {
#if TC_AVAILABLE
    using S = FlashSmem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float fa_smem[];
    float* qs = fa_smem;
    float* dos = qs + S::ROWS * S::LD;
    float* kv = dos + S::ROWS * S::LD;
    const long long in = fa_head(T, d_k, ld_in), out = fa_head(T, d_k, ld_out);
    q += in, k += in, v += in, o += out, d_o += out;
    lse += fa_row(T), delta += fa_row(T);
    const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 && fa_aligned(q, k, v, d_o);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const float lse_a = row_a < T ? lse[row_a] : 0.0f, lse_b = row_b < T ? lse[row_b] : 0.0f;
    const int n_tiles = (min(q0 + S::ROWS, T) - 1) / FA_KEYS + 1;

    auto load_kv = [&](int stage, int k0) {
        float* s = kv + stage * 2 * S::TILE;
        fa_load<D, FA_KEYS, THREADS>(s, k, k0, T, d_k, ld_in, vec);
        fa_load<D, FA_KEYS, THREADS>(s + S::TILE, v, k0, T, d_k, ld_in, vec);
    };
    // one pass over the key tiles up to the block's last row, tile 0 already on its way: step(k0, p, dp, ks)
    // for each tile the warp sees, p = exp(q k^T * scale - lse) (0 where the mask or the padding hides the
    // key), dp = do v^T, ks the tile's K (its V after it)
    auto each_tile = [&](auto step) {
        for (int i = 0; i < n_tiles; i++) {
            const int k0 = i * FA_KEYS;
            cp_async_wait<0>();
            __syncthreads();  // tile i is in, and every warp is done with tile i - 1's stage
            if (i + 1 < n_tiles) load_kv((i + 1) & 1, k0 + FA_KEYS);
            cp_async_commit();
            if (k0 > first + 15 || first >= T) continue;
            const float* ks = kv + (i & 1) * 2 * S::TILE;
            float p[8][4], dp[8][4];
            fa_rows_dot<D, 1>(p, qs + 16 * warp * S::LD, ks);
            fa_rows_dot<D, 1>(dp, dos + 16 * warp * S::LD, ks + S::TILE);
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

    fa_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, ld_in, vec);
    fa_load<D, S::ROWS, THREADS>(dos, d_o, q0, T, d_k, ld_out, vec);
    load_kv(0, 0);
    cp_async_commit();

    // delta of rows a and b. Short rows: the sum of p dp over the keys, in a pass of its own (p and dp as the
    // dq pass computes them: where p is 1, ds is exactly 0). Long rows: the sum of dO * O over d, the same value
    // in one read of O, with a quad's four threads taking every fourth d in FP64, in a fixed order (O carries
    // the forward's rounding, so the FP32 sum's own would add to it).
    float delta_a = 0.0f, delta_b = 0.0f;
    if (n_tiles <= FA_DELTA_PASS_TILES) {
        each_tile([&](int, const float (&p)[8][4], const float (&dp)[8][4], const float*) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    delta_a += p[j][e] * dp[j][e];
                    delta_b += p[j][2 + e] * dp[j][2 + e];
                }
        });
        delta_a = fa_quad_sum(delta_a), delta_b = fa_quad_sum(delta_b);
        __syncthreads();  // every warp is done with the last tile's stage before the dq pass loads tile 0 again
        load_kv(0, 0);
        cp_async_commit();
    } else {
        double sum_a = 0.0, sum_b = 0.0;
        for (int d = t; d < d_k; d += 4) {
            if (row_a < T) sum_a += (double)d_o[(long long)row_a * ld_out + d] * o[(long long)row_a * ld_out + d];
            if (row_b < T) sum_b += (double)d_o[(long long)row_b * ld_out + d] * o[(long long)row_b * ld_out + d];
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
        fa_weigh<D>(acc, p, ks);  // dq += ds k
    });
    dq += in;
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (row_a < T) dq[(long long)row_a * ld_in + d] = acc[n][e] * scale;
            if (row_b < T) dq[(long long)row_b * ld_in + d] = acc[n][2 + e] * scale;
        }
#else
    __trap();
#endif
}

// for a block of 16 * WARPS keys: dv = sum over queries of p^T do, dk = scale * sum of ds^T q; a warp owns 16
// keys and streams the 64-row query tiles from the diagonal on
template <int D, int WARPS>
__device__ void flash_bwd_dkdv(float* dk, float* dv, const float* q, const float* k, const float* v,
                               const float* d_o, const float* lse, const float* delta, int T, int d_k,
                               int ld_in, int ld_out) {
#if TC_AVAILABLE
    using S = FlashSmem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float fa_smem[];
    float* ks = fa_smem;
    float* vs = ks + S::ROWS * S::LD;
    float* qd = vs + S::ROWS * S::LD;      // stage s: Q at qd + 2 s TILE, dO after it
    float* ld = qd + 4 * S::TILE;          // stage s: lse at ld + 2 s FA_KEYS, delta after it
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in, d_o += fa_head(T, d_k, ld_out);
    lse += fa_row(T), delta += fa_row(T);
    const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 && fa_aligned(q, k, v, d_o);
    const int k0 = blockIdx.x * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = k0 + 16 * warp, key_a = first + g, key_b = key_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = (T - 1) / FA_KEYS + 1 - k0 / FA_KEYS;  // query tiles from k0 to the end

    auto load_tile = [&](int stage, int q0) {
        float* s = qd + stage * 2 * S::TILE;
        fa_load<D, FA_KEYS, THREADS>(s, q, q0, T, d_k, ld_in, vec);
        fa_load<D, FA_KEYS, THREADS>(s + S::TILE, d_o, q0, T, d_k, ld_out, vec);
        for (int e = threadIdx.x; e < 2 * FA_KEYS; e += THREADS) {
            const int qi = q0 + e % FA_KEYS;
            const float* src = e < FA_KEYS ? lse : delta;
            cp_async4(ld + stage * 2 * FA_KEYS + e, qi < T ? src + qi : src, qi < T ? 4 : 0);
        }
    };
    fa_load<D, S::ROWS, THREADS>(ks, k, k0, T, d_k, ld_in, vec);
    fa_load<D, S::ROWS, THREADS>(vs, v, k0, T, d_k, ld_in, vec);
    load_tile(0, k0);
    cp_async_commit();

    float acc_k[ND][4], acc_v[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc_k[n][r] = 0.0f, acc_v[n][r] = 0.0f;
    for (int i = 0; i < n_tiles; i++) {
        const int q0 = k0 + i * FA_KEYS;
        cp_async_wait<0>();
        __syncthreads();
        if (i + 1 < n_tiles) load_tile((i + 1) & 1, q0 + FA_KEYS);
        cp_async_commit();
        if (q0 + FA_KEYS - 1 < first || first >= T) continue;  // every query of the tile before the warp's keys
        const float* qs = qd + (i & 1) * 2 * S::TILE;
        const float* dos = qs + S::TILE;
        const float* tl = ld + (i & 1) * 2 * FA_KEYS;
        // p^T and dp^T: rows this warp's keys, columns the tile's queries 8j + 2t (+ 1)
        float pt[8][4], dpt[8][4];
        fa_rows_dot<D, 1>(pt, ks + 16 * warp * S::LD, qs);
        fa_rows_dot<D, 1>(dpt, vs + 16 * warp * S::LD, dos);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 8 * j + 2 * t + e, qi = q0 + col;
                const float l = tl[col], dl = tl[FA_KEYS + col];
                const bool seen_a = key_a <= qi && qi < T && key_a < T, seen_b = key_b <= qi && qi < T && key_b < T;
                pt[j][e] = seen_a ? expf(__fmul_rn(pt[j][e], scale) - l) : 0.0f;
                pt[j][2 + e] = seen_b ? expf(__fmul_rn(pt[j][2 + e], scale) - l) : 0.0f;
                dpt[j][e] = pt[j][e] * (dpt[j][e] - dl);  // ds^T
                dpt[j][2 + e] = pt[j][2 + e] * (dpt[j][2 + e] - dl);
            }
        fa_weigh<D>(acc_v, pt, dos);
        fa_weigh<D>(acc_k, dpt, qs);
    }
    dk += fa_head(T, d_k, ld_in), dv += fa_head(T, d_k, ld_in);
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * n + 2 * t + e;
            if (d >= d_k) continue;
            if (key_a < T) {
                dk[(long long)key_a * ld_in + d] = acc_k[n][e] * scale;
                dv[(long long)key_a * ld_in + d] = acc_v[n][e];
            }
            if (key_b < T) {
                dk[(long long)key_b * ld_in + d] = acc_k[n][2 + e] * scale;
                dv[(long long)key_b * ld_in + d] = acc_v[n][2 + e];
            }
        }
#else
    __trap();
#endif
}

// The kernels for each padded width D: grid (ceil(T / (16 WARPS)), NH, B), 32 WARPS threads, FA_SMEM_*'s
// floats of dynamic shared memory. q, k, v (and dq, dk, dv) are the heads' columns of one matrix of rows ld_in
// apart, o and d_o of one of rows ld_out apart; lse and delta (B, NH, T).
// The 8-warp forward held to two blocks an SM (128 registers, no spills); the 4-warp ones left to ptxas (187 at
// d_k 64 without spills, where a bound of one block gives 255 and spills)
#define FA_FWD_BOUNDS_32 __launch_bounds__(32 * FA_FWD_WARPS(32))
#define FA_FWD_BOUNDS_64 __launch_bounds__(32 * FA_FWD_WARPS(64), 2)
#define FA_FWD_BOUNDS_128 __launch_bounds__(32 * FA_FWD_WARPS(128))
#define FLASH_KERNELS(D)                                                                                       \
    extern "C" __global__ void FA_FWD_BOUNDS_##D k_flash_fwd_d##D(float* o, float* lse, const float* q,         \
                                                                  const float* k, const float* v, int T,       \
                                                                  int d_k, int ld_in, int ld_out) {    \
        flash_fwd<D, FA_FWD_WARPS(D)>(o, lse, q, k, v, T, d_k, ld_in, ld_out);                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * FA_BWD_WARPS)                                           \
        k_flash_bwd_dq_d##D(float* dq, float* delta, const float* q, const float* k, const float* v,          \
                            const float* o, const float* d_o, const float* lse, int T, int d_k, int ld_in,     \
                            int ld_out) {                                                           \
        flash_bwd_dq<D, FA_BWD_WARPS>(dq, delta, q, k, v, o, d_o, lse, T, d_k, ld_in, ld_out);             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * FA_BWD_WARPS)                                           \
        k_flash_bwd_dkdv_d##D(float* dk, float* dv, const float* q, const float* k, const float* v,           \
                              const float* d_o, const float* lse, const float* delta, int T, int d_k, int ld_in,  \
                              int ld_out) {                                                         \
        flash_bwd_dkdv<D, FA_BWD_WARPS>(dk, dv, q, k, v, d_o, lse, delta, T, d_k, ld_in, ld_out);          \
    }
FLASH_KERNELS(32)
FLASH_KERNELS(64)
FLASH_KERNELS(128)
#undef FLASH_KERNELS
