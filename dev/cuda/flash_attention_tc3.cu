// Flash attention on the tensor cores at FP32 accuracy (3xTF32), third version: the backward in one kernel.
// tc2 (flash_attention_tc2.cu) ran on the H200 at 0.414 ms forward and about 1.54 ms backward at B=8, 12 heads,
// T=1024, d_k=64 (SDPA: 0.480 and about 1.2): its dQ kernel (0.70 ms, 3 products a tile pair) and its dK/dV
// kernel (0.82 ms, 4) both recompute S = Q K^T and dP = dO V^T, 7 products a tile pair where 5 do.
//
// The forward is tc2's, unchanged. The backward is a small kernel for delta (and the counters' reset) and one
// kernel for dQ, dK and dV: a block owns a tile of 64 keys (four warps of 16, as tc2's dK/dV kernel), computes
// S^T, dP^T and dS for each query tile its keys see, adds P^T dO and dS^T Q into dV and dK in registers, and
// the query tile's part of dQ, dS K, into dQ in global memory (dS^T staged through shared memory over the
// tile's Q and dO, which are no longer needed by then): 5 products a tile pair.
//
// dQ without float atomics, deterministic: query tile i's parts are added in a fixed order, key tile 0 first
// (it writes, so dQ needs no zeroing), then 1, ..., i last (it applies the scale, as tc2 applies it once to
// the sum). A block waits, before its add, until a per-(head, query tile) counter says the key tile before it
// has added; it publishes its own add at its next step's first barrier (all its threads' stores are done by
// then) with a release store. Two choices keep the waits out of the steady state and the tail short:
// - A block streams its query tiles from the last one down to its diagonal, so key tiles j - 1 and j reach
//   query tile i at the same step: j waits once, at its first step, for j - 1's add, and then runs that far
//   behind it. (The order j = i, ..., 0 with the tiles streamed upwards pipelines as well, but makes the
//   longest block of a head, key tile 0, depend on all the others: it must start last.)
// - Blocks take their (key tile, head) from a ticket, key tile major: every head's key tile 0 (the longest, n
//   tiles) starts first, the one-tile blocks last. A list-scheduling simulation at T = 1024, 2048, 4096 (264
//   block slots) gives 1.01x the ideal makespan, against 1.21x, 1.11x, 1.05x for head-major orders (tc2's
//   dK/dV kernel's among them). The ticket also makes the absence of deadlock independent of the order the
//   hardware dispatches blocks in: a block waits only on the block of the ticket `heads` before its own, which
//   has taken its ticket and so is resident, and which waits in turn only on an earlier ticket; key tile 0's
//   blocks never wait.
//
// The backward's S^T = K Q^T must be the forward's S = Q K^T bit for bit (p = 1 exactly on a one-key row,
// so that ds = 0 there): its three mmas run in the transposed order (K hi * Q lo, K lo * Q hi, hi * hi, where
// the forward sums Q lo * K hi, Q hi * K lo, hi * hi), the same terms with the same k into the same partial
// sums; dP^T likewise, so that it matches the delta kernel's dP = dO V^T. (tc2's dK/dV kernel swapped the
// operands but kept the order, which can differ in the last bit.) This holds if the tensor cores round a sum
// of the same products at the same k alike whichever operand carries them: --tc3's check prints whether dQ
// and dK come out exactly 0 at T = 1.
#include "matmul_tc.cuh"  // tf32_split, mma_tf32, mma_tf32_first, cp_async16, cp_async4

#define F3_KEYS 64   // rows of a streamed tile, and the backward's keys a block
#define F3_WARPS 4   // the backward's warps of 16 keys: one tile of keys a block, as the counters count tiles
#define F3_DS_LD 72  // row stride of the staged dS^T (64 queries x 64 keys), laid out as f3_at<64>
// Query tiles that see at most this many key tiles take delta from a pass over P and dP, as the fast variant
// does (so p = 1 gives ds = 0 exactly), the rest from dO * O in FP64
#ifndef F3_DELTA_PASS_TILES
#define F3_DELTA_PASS_TILES 2
#endif

// Shared tiles at row stride D + 8, column d of row r at r * (D + 8) + (d ^ ((r & 4) << 1)): read as row
// pairs of d (float2, rows 8 apart across a warp) and as columns (rows 2t, 2t + 1 across a quad) without bank
// conflicts; the XOR moves whole 16-byte chunks, so cp.async fills it 16 bytes at a time.
template <int D>
__device__ __forceinline__ int f3_at(int r, int d) {
    return r * (D + 8) + (d ^ ((r & 4) << 1));
}

// rows [r0, r0 + ROWS) of the (T, d_k) matrix p into s, zero past T and past d_k up to D, by cp.async: 16
// bytes at a time where vec (d_k % 4 == 0 and p on a 16-byte boundary), else 4
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void f3_load(float* s, const float* p, int r0, int T, int d_k, bool vec) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < ROWS * D / 4 / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / (D / 4), d = e % (D / 4) * 4;
            const bool in = r0 + r < T && d < d_k;
            cp_async16(s + f3_at<D>(r, d), in ? p + (long long)(r0 + r) * d_k + d : p, in ? 16 : 0);
        }
    } else {
        for (int i = 0; i < ROWS * D / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, r = e / D, d = e % D;
            const bool in = r0 + r < T && d < d_k;
            cp_async4(s + f3_at<D>(r, d), in ? p + (long long)(r0 + r) * d_k + d : p, in ? 4 : 0);
        }
    }
}

// three products of a split pair into a zeroed fragment, added into acc. TRANS: the small terms in the
// other order, so that A B computed as (B^T A^T)^T sums the same terms into the same partial sums
template <bool TRANS = false>
__device__ __forceinline__ void f3_mma3(float (&acc)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                        float b0, float b1) {
    uint32_t b_hi[2], b_lo[2];
    tf32_split(b0, b_hi[0], b_lo[0]);
    tf32_split(b1, b_hi[1], b_lo[1]);
    float p[4];
    if constexpr (TRANS) {
        mma_tf32_first(p, a_hi, b_lo);
        mma_tf32(p, a_lo, b_hi);
    } else {
        mma_tf32_first(p, a_lo, b_hi);
        mma_tf32(p, a_hi, b_lo);
    }
    mma_tf32(p, a_hi, b_hi);
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] += p[r];
}

// acc[j] = A B^T over d, for the 8 n8 tiles of B's 64 rows: A the warp's 16 rows of a shared tile (a: its row
// 0, a multiple of 8 of the tile), B the 64 rows at b; both raw, split as they are read
template <int D, int UNROLL, bool TRANS>
__device__ __forceinline__ void f3_rows_dot(float (&acc)[8][4], const float* a, const float* b) {
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
            f3_mma3<TRANS>(acc[j], a_hi, a_lo, bv.x, bv.y);
        }
    }
}

// out += W M: W the warp's 16 x 64 weights in the accumulator layout (w[j]: columns 8j + 2t, + 1), M the 64
// rows of a shared tile at m; each step of 8 rows of M relabelled (logical k t = row 2t, t + 4 = row 2t + 1)
template <int D>
__device__ __forceinline__ void f3_weigh(float (&out)[D / 8][4], const float (&w)[8][4], const float* m) {
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
            const int at = f3_at<D>(r, 8 * n + g);
            f3_mma3(out[n], a_hi, a_lo, m[at], m[at + D + 8]);
        }
    }
}

// out = the warp's 16 rows of the staged dS^T (at a: 64 keys a row, stride F3_DS_LD) times the block's K (at
// ks, 64 keys), columns c0 + 8n + (0..7) of K. The A fragment is read as f3_rows_dot reads its A (keys 2t and
// 2t + 1 of a k8 step as logical k t and t + 4, one float2), the B fragment as f3_weigh reads its M (rows 2t
// and 2t + 1, the same relabelling), so both sides sum the same key for each k.
template <int D, int NQ>
__device__ __forceinline__ void f3_dq_part(float (&out)[NQ][4], const float* a, const float* ks, int c0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < NQ; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) out[n][r] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        const int col = (8 * kb + 2 * t) ^ ((g & 4) << 1);
        const float2 u = *reinterpret_cast<const float2*>(a + g * F3_DS_LD + col);
        const float2 w = *reinterpret_cast<const float2*>(a + (g + 8) * F3_DS_LD + col);
        const float av[4] = {u.x, w.x, u.y, w.y};
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(av[r], a_hi[r], a_lo[r]);
        const int r = 8 * kb + 2 * t;
#pragma unroll
        for (int n = 0; n < NQ; n++) {
            const int at = f3_at<D>(r, c0 + 8 * n + g);
            f3_mma3(out[n], a_hi, a_lo, ks[at], ks[at + D + 8]);
        }
    }
}

__device__ __forceinline__ float f3_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float f3_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

__device__ __forceinline__ bool f3_aligned(const void* a, const void* b, const void* c, const void* d = nullptr) {
    return ((unsigned long long)a | (unsigned long long)b | (unsigned long long)c | (unsigned long long)d) % 16 ==
           0;
}

// the counters' two sides: a release store that publishes a block's dQ stores (after a barrier that every
// thread of the block crossed after its stores), an acquire load that orders the waiting thread's dQ loads
// after it (each thread that loads dQ acquires for itself, so no barrier is needed on that side)
__device__ __forceinline__ int f3_load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void f3_store_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Shared memory in floats, mirrored in dev/flash_attention.py: the resident tiles (the forward's Q; the delta
// pass's Q and dO; the backward's K and V), two stages of two streamed 64-row tiles, and for the backward two
// stages of the query tile's lse and delta and the block's ticket (4 floats: a static __shared__ int would take
// 1 KB, as matmul_tc.cuh's wgmma buffers align dynamic shared memory to 1024). dS^T (64 x F3_DS_LD) lies over a
// stage's two tiles: 2 x 64 x (D + 8) >= 64 x 72 floats for every D >= 32.
template <int D, int WARPS>
struct F3Smem {
    static constexpr int LD = D + 8, ROWS = 16 * WARPS, TILE = F3_KEYS * LD;
    static constexpr int FWD = ROWS * LD + 4 * TILE, DELTA = 2 * ROWS * LD + 4 * TILE,
                         BWD = 2 * ROWS * LD + 4 * TILE + 4 * F3_KEYS + 4;
    static_assert(2 * TILE >= F3_KEYS * F3_DS_LD, "dS^T must fit over a stage's Q and dO");
};

// ---------------------------------------------------------------------------------------------- forward
// tc2's, unchanged (the backward recomputes its S bit for bit). A block owns 16 * WARPS query rows of one head
// (blockIdx.y = b * NH + h), the longest rows first; an online softmax in FP32 over the 64-key tiles up to the
// diagonal; lse[i] = max + log(sum) for the backward.
template <int D, int WARPS>
__device__ void flash3_fwd(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k) {
#if TC_AVAILABLE
    using S = F3Smem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float f3_smem[];
    float* qs = f3_smem;
    float* kv = qs + S::ROWS * S::LD;  // stage s: K at kv + 2 s TILE, V after it
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, o += head;
    lse += (long long)blockIdx.y * T;
    const bool vec = d_k % 4 == 0 && f3_aligned(q, k, v);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = (min(q0 + S::ROWS, T) - 1) / F3_KEYS + 1;  // up to the block's last row

    f3_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, vec);
    f3_load<D, F3_KEYS, THREADS>(kv, k, 0, T, d_k, vec);
    f3_load<D, F3_KEYS, THREADS>(kv + S::TILE, v, 0, T, d_k, vec);
    cp_async_commit();

    float acc[ND][4];  // O: of n8 tile n, (row_a, 8n + 2t), (row_a, 8n + 2t + 1), (row_b, ...), (row_b, ...)
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[n][r] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    for (int i = 0; i < n_tiles; i++) {
        const int k0 = i * F3_KEYS;
        cp_async_wait<0>();
        __syncthreads();  // tile i is in for every thread, and every warp is done with tile i - 1's stage
        if (i + 1 < n_tiles) {
            float* next = kv + ((i + 1) & 1) * 2 * S::TILE;
            f3_load<D, F3_KEYS, THREADS>(next, k, k0 + F3_KEYS, T, d_k, vec);
            f3_load<D, F3_KEYS, THREADS>(next + S::TILE, v, k0 + F3_KEYS, T, d_k, vec);
        }
        cp_async_commit();
        if (k0 > first + 15 || first >= T) continue;  // every key of the tile masked, or no row of the warp's
        const float* ks = kv + (i & 1) * 2 * S::TILE;

        float s[8][4];  // this warp's 16 rows against keys k0 + 8 j .. + 7, in the accumulator layout
        f3_rows_dot<D, 2, false>(s, qs + 16 * warp * S::LD, ks);

        // scale, as the literal line does, and mask; the online softmax of rows a (s[j][0..1]) and b
        const bool whole = k0 + F3_KEYS - 1 <= first && k0 + F3_KEYS <= T;  // no key hidden from any row
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
        const float new_a = fmaxf(m_a, f3_quad_max(mx_a)), new_b = fmaxf(m_b, f3_quad_max(mx_b));
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
        l_a = l_a * alpha_a + f3_quad_sum(sum_a);
        l_b = l_b * alpha_b + f3_quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            acc[n][0] *= alpha_a, acc[n][1] *= alpha_a;
            acc[n][2] *= alpha_b, acc[n][3] *= alpha_b;
        }
        f3_weigh<D>(acc, s, ks + S::TILE);  // O += P V, P in registers
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
// delta = the row's sum of p dp, for the 64 query rows of tile blockIdx.x (grid (ceil(T / 64), B * NH)), and
// the backward's counters set to 0: this query tile's, and block (0, 0) the ticket. Tiles below
// F3_DELTA_PASS_TILES sum p dp over their key tiles, p and dp as the backward kernel computes them (so ds is
// exactly 0 where p is 1: a one-key row); the rest sum dO * O over d in FP64 (the same value in one read of O;
// O carries the forward's rounding, and the FP32 sum's own would add to it).
template <int D>
__device__ void flash3_bwd_delta(float* delta, int* sync, const float* q, const float* k, const float* v,
                                 const float* o, const float* d_o, const float* lse, int T, int d_k) {
#if TC_AVAILABLE
    using S = F3Smem<D, F3_WARPS>;
    constexpr int THREADS = 32 * F3_WARPS;
    extern __shared__ __align__(16) float f3_smem[];
    if (threadIdx.x == 0) {
        sync[blockIdx.y * gridDim.x + blockIdx.x] = 0;
        if (blockIdx.x == 0 && blockIdx.y == 0) sync[gridDim.y * gridDim.x] = 0;
    }
    float* qs = f3_smem;
    float* dos = qs + S::ROWS * S::LD;
    float* kv = dos + S::ROWS * S::LD;
    const long long head = (long long)blockIdx.y * T * d_k;
    q += head, k += head, v += head, o += head, d_o += head;
    lse += (long long)blockIdx.y * T, delta += (long long)blockIdx.y * T;
    const bool vec = d_k % 4 == 0 && f3_aligned(q, k, v, d_o);
    const int q0 = blockIdx.x * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = blockIdx.x + 1;  // key tiles up to the diagonal

    float delta_a = 0.0f, delta_b = 0.0f;
    if (n_tiles <= F3_DELTA_PASS_TILES) {
        const float lse_a = row_a < T ? lse[row_a] : 0.0f, lse_b = row_b < T ? lse[row_b] : 0.0f;
        auto load_kv = [&](int stage, int k0) {
            float* s = kv + stage * 2 * S::TILE;
            f3_load<D, F3_KEYS, THREADS>(s, k, k0, T, d_k, vec);
            f3_load<D, F3_KEYS, THREADS>(s + S::TILE, v, k0, T, d_k, vec);
        };
        f3_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, vec);
        f3_load<D, S::ROWS, THREADS>(dos, d_o, q0, T, d_k, vec);
        load_kv(0, 0);
        cp_async_commit();
        for (int i = 0; i < n_tiles; i++) {
            const int k0 = i * F3_KEYS;
            cp_async_wait<0>();
            __syncthreads();  // tile i is in, and every warp is done with tile i - 1's stage
            if (i + 1 < n_tiles) load_kv((i + 1) & 1, k0 + F3_KEYS);
            cp_async_commit();
            if (k0 > first + 15 || first >= T) continue;
            const float* ks = kv + (i & 1) * 2 * S::TILE;
            // S = Q K^T in the forward's order; dP = dO V^T in the order whose transpose the backward runs
            float p[8][4], dp[8][4];
            f3_rows_dot<D, 1, false>(p, qs + 16 * warp * S::LD, ks);
            f3_rows_dot<D, 1, false>(dp, dos + 16 * warp * S::LD, ks + S::TILE);
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = k0 + 8 * j + 2 * t + e;
                    // _rn: s * scale rounded as the forward rounds it (no FMA with lse), so p is 1 where it was
                    const float pa = key <= row_a && key < T ? expf(__fmul_rn(p[j][e], scale) - lse_a) : 0.0f;
                    const float pb = key <= row_b && key < T ? expf(__fmul_rn(p[j][2 + e], scale) - lse_b) : 0.0f;
                    delta_a += pa * dp[j][e];
                    delta_b += pb * dp[j][2 + e];
                }
        }
        cp_async_wait<0>();  // no copy may outlive the block (the empty group after the last tile)
        delta_a = f3_quad_sum(delta_a), delta_b = f3_quad_sum(delta_b);
    } else {
        // a quad's four threads take every fourth d, in a fixed order
        double sum_a = 0.0, sum_b = 0.0;
#pragma unroll
        for (int d = t; d < D; d += 4) {
            if (d >= d_k) break;
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
#else
    __trap();
#endif
}

// dv = sum over queries of p^T do, dk = scale * sum of ds^T q, dq = scale * sum over keys of ds k, for the
// 64 keys of key tile j of head bh, (j, bh) from the ticket: grid (ceil(T / 64) * B * NH), 128 threads. A warp
// owns 16 keys; the block streams the 64-row query tiles from the last down to the diagonal.
// sync: B * NH * ceil(T / 64) counters (head-major), then the ticket; all 0 at the start (the delta kernel
// zeroes them; this kernel leaves them 0 as well).
template <int D>
__device__ void flash3_bwd(float* dq, float* dk, float* dv, int* sync, const float* q, const float* k,
                           const float* v, const float* d_o, const float* lse, const float* delta, int T, int d_k) {
#if TC_AVAILABLE
    using S = F3Smem<D, F3_WARPS>;
    constexpr int THREADS = 32 * F3_WARPS, ND = D / 8;
    // n8 tiles of dQ's part at a time: 32 columns, whose part and loaded sum (32 registers) fit beside dK and dV
    // at d_k 64 (all 64 at once: 300-400 bytes spilled)
    constexpr int NQ = 4;
    static_assert(S::ROWS == F3_KEYS, "a block's keys are one tile");
    extern __shared__ __align__(16) float f3_smem[];
    float* ks = f3_smem;
    float* vs = ks + S::ROWS * S::LD;
    float* qd = vs + S::ROWS * S::LD;  // stage s: Q at qd + 2 s TILE, dO after it
    float* ld = qd + 4 * S::TILE;      // stage s: lse at ld + 2 s F3_KEYS, delta after it
    int& ticket = *reinterpret_cast<int*>(ld + 4 * F3_KEYS);
    const int n = (T - 1) / F3_KEYS + 1, heads = gridDim.x / n;
    if (threadIdx.x == 0) {
        ticket = atomicAdd(sync + heads * n, 1);
        if (ticket == gridDim.x - 1) sync[heads * n] = 0;  // the last ticket drawn: left 0 for the next launch
    }
    __syncthreads();
    const int j = ticket / heads, bh = ticket % heads;  // key tile major: every head's longest block first
    int* counter = sync + bh * n;                       // counter[i]: key tiles that have added to dQ's tile i
    const long long head = (long long)bh * T * d_k;
    q += head, k += head, v += head, d_o += head, dq += head, dk += head, dv += head;
    lse += (long long)bh * T, delta += (long long)bh * T;
    const bool vec = d_k % 4 == 0 && f3_aligned(q, k, v, d_o);
    const int k0 = j * F3_KEYS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = k0 + 16 * warp, key_a = first + g, key_b = key_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_steps = n - j;  // query tiles n - 1 down to j

    auto load_tile = [&](int stage, int q0) {
        float* s = qd + stage * 2 * S::TILE;
        f3_load<D, F3_KEYS, THREADS>(s, q, q0, T, d_k, vec);
        f3_load<D, F3_KEYS, THREADS>(s + S::TILE, d_o, q0, T, d_k, vec);
        for (int e = threadIdx.x; e < 2 * F3_KEYS; e += THREADS) {
            const int qi = q0 + e % F3_KEYS;
            const float* src = e < F3_KEYS ? lse : delta;
            cp_async4(ld + stage * 2 * F3_KEYS + e, qi < T ? src + qi : src, qi < T ? 4 : 0);
        }
    };
    f3_load<D, S::ROWS, THREADS>(ks, k, k0, T, d_k, vec);
    f3_load<D, S::ROWS, THREADS>(vs, v, k0, T, d_k, vec);
    load_tile(0, (n - 1) * F3_KEYS);
    cp_async_commit();

    float acc_k[ND][4], acc_v[ND][4];
#pragma unroll
    for (int c = 0; c < ND; c++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc_k[c][r] = 0.0f, acc_v[c][r] = 0.0f;
    int* publish = nullptr;  // thread 0's: the counter of the last step's add, set once the block's stores are done
    for (int s = 0; s < n_steps; s++) {
        const int i = n - 1 - s, q0 = i * F3_KEYS;
        cp_async_wait<0>();
        __syncthreads();  // tile i is in; every warp is done with step s - 1 (its stage, and its dQ stores)
        if (publish != nullptr) {
            __threadfence();
            f3_store_release(publish, j + 1);
            publish = nullptr;
        }
        if (s + 1 < n_steps) load_tile((s + 1) & 1, q0 - F3_KEYS);
        cp_async_commit();
        float* qs = qd + (s & 1) * 2 * S::TILE;
        const float* dos = qs + S::TILE;
        const float* tl = ld + (s & 1) * 2 * F3_KEYS;

        // ds^T: rows this warp's keys, columns the tile's queries 8c + 2t (+ 1); 0 for a warp past T
        float dst[8][4];
        if (first < T) {
            float pt[8][4];
            f3_rows_dot<D, 1, true>(pt, ks + 16 * warp * S::LD, qs);
            f3_rows_dot<D, 1, true>(dst, vs + 16 * warp * S::LD, dos);
#pragma unroll
            for (int c = 0; c < 8; c++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = 8 * c + 2 * t + e, qi = q0 + col;
                    const float l = tl[col], dl = tl[F3_KEYS + col];
                    const bool seen_a = key_a <= qi && qi < T && key_a < T, seen_b = key_b <= qi && qi < T && key_b < T;
                    pt[c][e] = seen_a ? expf(__fmul_rn(pt[c][e], scale) - l) : 0.0f;
                    pt[c][2 + e] = seen_b ? expf(__fmul_rn(pt[c][2 + e], scale) - l) : 0.0f;
                    dst[c][e] = pt[c][e] * (dst[c][e] - dl);
                    dst[c][2 + e] = pt[c][2 + e] * (dst[c][2 + e] - dl);
                }
            f3_weigh<D>(acc_v, pt, dos);
            f3_weigh<D>(acc_k, dst, qs);
        } else {
#pragma unroll
            for (int c = 0; c < 8; c++)
#pragma unroll
                for (int r = 0; r < 4; r++) dst[c][r] = 0.0f;
        }
        __syncthreads();  // every warp is done with the stage's Q and dO: dS^T goes over them
        float* ds_t = qs;  // 64 queries x 64 keys, as f3_at<64>
#pragma unroll
        for (int c = 0; c < 8; c++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 8 * c + 2 * t + e;
                ds_t[f3_at<64>(col, 16 * warp + g)] = dst[c][e];
                ds_t[f3_at<64>(col, 16 * warp + g + 8)] = dst[c][2 + e];
            }
        __syncthreads();  // dS^T is whole

        // dQ's rows q0 + 16 warp + g (+ 8) += dS^T K over the block's keys: after key tile j - 1's add,
        // the first (j = 0) writes, the last (j = i) scales
        const int row_a = q0 + 16 * warp + g, row_b = row_a + 8;
        if (q0 + 16 * warp < T) {
            if (j > 0)
                while (f3_load_acquire(counter + i) != j) __nanosleep(100);
#pragma unroll
            for (int c0 = 0; c0 < D; c0 += 8 * NQ) {
                float prev[NQ][4];  // loaded before the product, to land while it runs
                if (j > 0)
#pragma unroll
                    for (int c = 0; c < NQ; c++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int d = c0 + 8 * c + 2 * t + e;
                            // a conditional load of volatile asm is a branch: load dq[0] where out of bounds
                            prev[c][e] = __ldcg(row_a < T && d < d_k ? dq + (long long)row_a * d_k + d : dq);
                            prev[c][2 + e] = __ldcg(row_b < T && d < d_k ? dq + (long long)row_b * d_k + d : dq);
                        }
                float part[NQ][4];
                f3_dq_part<D, NQ>(part, ds_t + 16 * warp * F3_DS_LD, ks, c0);
#pragma unroll
                for (int c = 0; c < NQ; c++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int d = c0 + 8 * c + 2 * t + e;
                        if (d >= d_k) continue;
                        float x_a = j > 0 ? prev[c][e] + part[c][e] : part[c][e];
                        float x_b = j > 0 ? prev[c][2 + e] + part[c][2 + e] : part[c][2 + e];
                        if (j == i) x_a *= scale, x_b *= scale;
                        if (row_a < T) __stcg(dq + (long long)row_a * d_k + d, x_a);
                        if (row_b < T) __stcg(dq + (long long)row_b * d_k + d, x_b);
                    }
            }
        }
        if (threadIdx.x == 0 && j < i) publish = counter + i;  // j = i, the last step, adds last: no one waits
    }
    // the last add to query tile j was this block's: its counter back to 0 for the next launch, once every warp
    // has seen it at j (a warp may still be in its spin until this barrier)
    __syncthreads();
    if (threadIdx.x == 0 && j > 0) counter[j] = 0;
#pragma unroll
    for (int c = 0; c < ND; c++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * c + 2 * t + e;
            if (d >= d_k) continue;
            if (key_a < T) {
                dk[(long long)key_a * d_k + d] = acc_k[c][e] * scale;
                dv[(long long)key_a * d_k + d] = acc_v[c][e];
            }
            if (key_b < T) {
                dk[(long long)key_b * d_k + d] = acc_k[c][2 + e] * scale;
                dv[(long long)key_b * d_k + d] = acc_v[c][2 + e];
            }
        }
#else
    __trap();
#endif
}

// The kernels for each padded width D: the forward with W warps a block, grid (ceil(T / (16 W)), B * NH),
// F3Smem::FWD floats of dynamic shared memory; the delta kernel, grid (ceil(T / 64), B * NH), DELTA; the
// backward, grid (ceil(T / 64) * B * NH), BWD; both 128 threads.
#define FLASH3_FWD(D, W, BOUNDS)                                                                              \
    extern "C" __global__ void BOUNDS k_flash3_fwd_d##D##_w##W(float* o, float* lse, const float* q,         \
                                                               const float* k, const float* v, int T,         \
                                                               int d_k) {                                     \
        flash3_fwd<D, W>(o, lse, q, k, v, T, d_k);                                                             \
    }
#define FLASH3_BWD(D)                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * F3_WARPS) k_flash3_bwd_delta_d##D(                       \
        float* delta, int* sync, const float* q, const float* k, const float* v, const float* o,               \
        const float* d_o, const float* lse, int T, int d_k) {                                                  \
        flash3_bwd_delta<D>(delta, sync, q, k, v, o, d_o, lse, T, d_k);                                        \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * F3_WARPS) k_flash3_bwd_d##D(                             \
        float* dq, float* dk, float* dv, int* sync, const float* q, const float* k, const float* v,            \
        const float* d_o, const float* lse, const float* delta, int T, int d_k) {                              \
        flash3_bwd<D>(dq, dk, dv, sync, q, k, v, d_o, lse, delta, T, d_k);                                     \
    }
// the forward's bounds as tc2's: 8 warps at two blocks an SM (128 registers, no spills); 4 warps left to ptxas
FLASH3_FWD(32, 4, __launch_bounds__(128))
FLASH3_FWD(64, 4, __launch_bounds__(128))
FLASH3_FWD(128, 4, __launch_bounds__(128))
FLASH3_FWD(64, 8, __launch_bounds__(256, 2))
FLASH3_BWD(32)
FLASH3_BWD(64)
FLASH3_BWD(128)
#undef FLASH3_FWD
#undef FLASH3_BWD
