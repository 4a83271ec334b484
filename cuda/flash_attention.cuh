// Flash attention on the tensor cores at FP32 accuracy (3xTF32, mma.sync; on sm_90a at d_k <= 64, the forward and
// the backward's dQ, dK and dV on wgmma): the tc variant's fused attention, no T x T buffer. The forward streams
// 64-key tiles of K and V with an online softmax, keeping O and one log-sum-exp per row; the backward recomputes
// the probabilities from it: delta (k_flash_bwd_delta_*, k_flash_bwd_delta_rows), then one kernel for dQ, dK and
// dV. Deterministic: every sum in a fixed order, no float atomics. Heads are read where the QKV projection leaves
// them and written where W_O reads them: head h of batch row b is columns h * d_k .. + d_k of rows b * T .. + T of a
// matrix whose rows are ld floats apart (qkv and dqkv: 3C; y and dy: C).
#pragma once
#include "matmul_tc.cuh"  // tf32_split(_store), mma_tf32(_first), cp_async16/4, quad_sum, quad_max, TC_AVAILABLE
#include "rows_fast.cuh"  // all_aligned16

#define FA_KEYS 64  // rows of a streamed tile
#define FA_DS_LD 72  // row stride of the backward's staged dS^T (64 queries x 64 keys), laid out as fa_at<64>
// Floats of shared memory of each kernel (D: d_k padded to 32, 64 or 128; W: warps of 16 rows per block): resident
// rows and two stages of two streamed tiles, rows D + 8 floats apart (SPLIT = 1: one raw stage, and its hi and lo);
// the backward adds two stages of lse and delta, and its ticket (4 floats: a static __shared__ int would take 1 KB,
// as matmul_tc.cuh's wgmma buffers align dynamic shared memory to 1024).
#define FA_SMEM_FWD(D, W, SPLIT) (16 * (W) * ((D) + 8) + (4 + 2 * (SPLIT)) * FA_KEYS * ((D) + 8))
#define FA_SMEM_DELTA(D, W) (2 * 16 * (W) * ((D) + 8) + 4 * FA_KEYS * ((D) + 8))
#define FA_SMEM_BWD(D, W, SPLIT) (2 * 16 * (W) * ((D) + 8) + (4 + 2 * (SPLIT)) * FA_KEYS * ((D) + 8) + 4 * FA_KEYS + 4)
// The forward's warps per block, and whether it splits each tile of K and V into hi and lo once, the block together,
// into shared memory its warps read (FA_FWD_SPLIT), rather than each warp splitting every fragment it reads.
#define FA_FWD_WARPS_32 4
#define FA_FWD_WARPS_64 8
#define FA_FWD_WARPS_128 4
#define FA_FWD_WARPS(D) FA_FWD_WARPS_##D
#define FA_FWD_SPLIT_32 0
#define FA_FWD_SPLIT_64 1
#define FA_FWD_SPLIT_128 0
#define FA_FWD_SPLIT(D) FA_FWD_SPLIT_##D
// The backward's block takes FA_BWD_TILES(D) key tiles, 4 warps each; with FA_BWD_SPLIT(D) it splits each query
// tile's Q and dO into hi and lo once, for all its warps (hi over the raw stage, lo beside it). The delta pass runs
// 4 warps (64 query rows) at every width.
#define FA_BWD_TILES_32 1
#define FA_BWD_TILES_64 2
#define FA_BWD_TILES_128 1
#define FA_BWD_TILES(D) FA_BWD_TILES_##D
#define FA_BWD_SPLIT_32 0
#define FA_BWD_SPLIT_64 1
#define FA_BWD_SPLIT_128 0
#define FA_BWD_SPLIT(D) FA_BWD_SPLIT_##D
#define FA_BWD_WARPS(D) (4 * FA_BWD_TILES(D))
#define FA_DELTA_WARPS 4
// Query tiles that see at most this many key tiles take delta from a pass over P and dP, as the fast variant
// does (so p = 1 gives ds = 0 exactly); the rest from dO * O in FP64 (dO * O alone put dQ and dK past the
// accuracy bar at T <= 77)
#define FA_DELTA_PASS_TILES 2
// The wgmma forward (sm_90a, D = 64): query rows a block (two consumer warpgroups of 64), split buffers (K hi and lo
// in 2 tiles of 64 keys x 32 of d, V^T hi and lo in 2 of 64 d x 32 keys) and raw stages (K, V as they lie)
#define FA_WG_ROWS 128
#define FA_WG_BUFS 2
#define FA_WG_RAWS 3
#define FA_WG_TILE (64 * 32)
#define FA_SMEM_FWD_WG ((FA_WG_BUFS * 8 * FA_WG_TILE + FA_WG_RAWS * 2 * FA_KEYS * 64) * 4 + 2 * FA_WG_BUFS * 8)
// The wgmma backward (sm_90a, D = 64): queries a step, split buffers (Q hi, Q lo, dO hi, dO lo as they lie: 32
// queries x 32 of d, two slices each; then Q^T and dO^T hi and lo: 64 d x 32 queries), raw stages (Q, dO as they
// lie, lse, delta), the block's K (128 keys, rows FB_WG_KS_LD apart) and the step's dS (32 queries x 128 keys)
#define FB_WG_Q 32
#define FB_WG_BUFS 2
#define FB_WG_RAWS 2
#define FB_WG_QN (FB_WG_Q * 32)
#define FB_WG_QT (64 * FB_WG_Q)
#define FB_WG_BUF (8 * FB_WG_QN + 4 * FB_WG_QT)
#define FB_WG_RAW (2 * FB_WG_Q * 64 + 2 * FB_WG_Q)
#define FB_WG_KS_LD (64 + 4)
#define FB_WG_KS (2 * FA_KEYS * FB_WG_KS_LD)
#define FB_WG_DS_LD (128 + 8)
#define FB_WG_DS (FB_WG_Q * FB_WG_DS_LD)
// the wgmma backward's delta pass: two warpgroups (a block the pass's FA_WG_ROWS rows); the split buffers of
// FA_DELTA_PASS_TILES key tiles (K hi, K lo, V hi, V lo, as they lie), then their raw K and V
#define FA_DELTA_WG_THREADS 256
#define FA_SMEM_DELTA_WG ((FA_DELTA_PASS_TILES * 8 * FA_WG_TILE + 2 * FA_DELTA_PASS_TILES * FA_KEYS * 64) * 4)
// floats, then the full and empty barriers of each buffer and the ticket (4 floats)
#define FA_SMEM_BWD_WG                                                                                        \
    ((FB_WG_BUFS * FB_WG_BUF + FB_WG_RAWS * FB_WG_RAW + FB_WG_KS + FB_WG_DS + FB_WG_BUFS * 2 * FB_WG_Q) * 4 + \
     2 * FB_WG_BUFS * 8 + 16)
enum FlashLaunch : int {
    FA_KEYS_A_TILE = FA_KEYS,
    FA_DELTA_W = FA_DELTA_WARPS,
    FA_BWD_W32 = FA_BWD_WARPS(32),
    FA_BWD_W64 = FA_BWD_WARPS(64),
    FA_BWD_W128 = FA_BWD_WARPS(128),
    FA_BWD_KT32 = FA_BWD_TILES(32),
    FA_BWD_KT64 = FA_BWD_TILES(64),
    FA_BWD_KT128 = FA_BWD_TILES(128),
    FA_PASS_TILES = FA_DELTA_PASS_TILES,
    FA_FWD_W32 = FA_FWD_WARPS(32),
    FA_FWD_W64 = FA_FWD_WARPS(64),
    FA_FWD_W128 = FA_FWD_WARPS(128),
    FA_FWD_BYTES32 = FA_SMEM_FWD(32, FA_FWD_WARPS(32), FA_FWD_SPLIT(32)) * 4,
    FA_FWD_BYTES64 = FA_SMEM_FWD(64, FA_FWD_WARPS(64), FA_FWD_SPLIT(64)) * 4,
    FA_FWD_BYTES128 = FA_SMEM_FWD(128, FA_FWD_WARPS(128), FA_FWD_SPLIT(128)) * 4,
    FA_FWD_WG_ROWS = FA_WG_ROWS,
    FA_FWD_WG_BYTES = FA_SMEM_FWD_WG,
    FA_BWD_WG_BYTES = FA_SMEM_BWD_WG,
    FA_DELTA_WG_BYTES = FA_SMEM_DELTA_WG,
    FA_DELTA_WG_BLOCK = FA_DELTA_WG_THREADS,
    FA_DELTA_BYTES32 = FA_SMEM_DELTA(32, FA_DELTA_WARPS) * 4,
    FA_DELTA_BYTES64 = FA_SMEM_DELTA(64, FA_DELTA_WARPS) * 4,
    FA_DELTA_BYTES128 = FA_SMEM_DELTA(128, FA_DELTA_WARPS) * 4,
    FA_BWD_BYTES32 = FA_SMEM_BWD(32, FA_BWD_WARPS(32), FA_BWD_SPLIT(32)) * 4,
    FA_BWD_BYTES64 = FA_SMEM_BWD(64, FA_BWD_WARPS(64), FA_BWD_SPLIT(64)) * 4,
    FA_BWD_BYTES128 = FA_SMEM_BWD(128, FA_BWD_WARPS(128), FA_BWD_SPLIT(128)) * 4,
};

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

// three products of a split pair into a zeroed fragment, added into acc. TRANS: the small terms in the
// other order, so that A B computed as (B^T A^T)^T sums the same terms into the same partial sums
template <bool TRANS = false>
__device__ __forceinline__ void fa_mma3(float (&acc)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                        const uint32_t (&b_hi)[2], const uint32_t (&b_lo)[2]) {
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
// ... B given raw (b0, b1), split here
template <bool TRANS = false>
__device__ __forceinline__ void fa_mma3(float (&acc)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                        float b0, float b1) {
    uint32_t b_hi[2], b_lo[2];
    tf32_split(b0, b_hi[0], b_lo[0]);
    tf32_split(b1, b_hi[1], b_lo[1]);
    fa_mma3<TRANS>(acc, a_hi, a_lo, b_hi, b_lo);
}

// Tiles split once (FA_FWD_SPLIT): the hi and lo of a tile of floats, as TF32 bit patterns at the same places.
struct FaSplit {
    const uint32_t *hi, *lo;
};
template <class Tile>
constexpr bool fa_is_split = false;
template <>
constexpr bool fa_is_split<FaSplit> = true;
// the raw tiles at raw (n floats, a multiple of 4) into hi and lo, by the block's THREADS
template <int THREADS>
__device__ __forceinline__ void fa_split_tiles(uint32_t* hi, uint32_t* lo, const float* raw, int n) {
    for (int i = threadIdx.x; i < n / 4; i += THREADS)
        tf32_split_store(hi, lo, 4 * i, reinterpret_cast<const float4*>(raw)[i]);
}

// A streamed tile of ROWS x D at s split in place: hi over s (as TF32 bit patterns), lo at lo (the same layout),
// each thread the elements its own fa_load copied, so that its cp.async wait is all it needs before (the block's
// barrier after makes the split seen)
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void fa_split_own(float* s, uint32_t* lo, bool vec) {
    uint32_t* hi = reinterpret_cast<uint32_t*>(s);
    if (vec) {
#pragma unroll
        for (int i = 0; i < ROWS * D / 4 / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, at = fa_at<D>(e / (D / 4), e % (D / 4) * 4);
            tf32_split_store(hi, lo, at, *reinterpret_cast<const float4*>(s + at));
        }
    } else {
        for (int i = 0; i < ROWS * D / THREADS; i++) {
            const int e = threadIdx.x + i * THREADS, at = fa_at<D>(e / D, e % D);
            const float x = s[at];
            tf32_split(x, hi[at], lo[at]);
        }
    }
}

// acc[j] = A B^T over d, for the 8 n8 tiles of B's 64 rows: A the warp's 16 rows of a shared tile (a: its row
// 0, a multiple of 8 of the tile), B the 64 rows at b; both raw, split as they are read (B: or split already)
template <int D, int UNROLL, bool TRANS = false, class Tile = const float*>
__device__ __forceinline__ void fa_rows_dot(float (&acc)[8][4], const float* a, Tile b) {
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
            const int at = (8 * j + g) * (D + 8) + col;
            if constexpr (fa_is_split<Tile>) {
                const uint2 h = *reinterpret_cast<const uint2*>(b.hi + at);
                const uint2 l = *reinterpret_cast<const uint2*>(b.lo + at);
                fa_mma3<TRANS>(acc[j], a_hi, a_lo, {h.x, h.y}, {l.x, l.y});
            } else {
                const float2 bv = *reinterpret_cast<const float2*>(b + at);
                fa_mma3<TRANS>(acc[j], a_hi, a_lo, bv.x, bv.y);
            }
        }
    }
}

// out += W M: W the warp's 16 x 64 weights in the accumulator layout (w[j]: columns 8j + 2t, + 1), M the 64
// rows of a shared tile at m (raw, or split already); each step of 8 rows of M relabelled (logical k t = row 2t,
// t + 4 = row 2t + 1)
template <int D, class Tile = const float*>
__device__ __forceinline__ void fa_weigh(float (&out)[D / 8][4], const float (&w)[8][4], Tile m) {
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
            if constexpr (fa_is_split<Tile>)
                fa_mma3(out[n], a_hi, a_lo, {m.hi[at], m.hi[at + D + 8]}, {m.lo[at], m.lo[at + D + 8]});
            else
                fa_mma3(out[n], a_hi, a_lo, m[at], m[at + D + 8]);
        }
    }
}

// out = one warp's 16 rows of a staged dS (or dS^T) times 64 keys of K, columns c0 + 8n + (0..7) of K. The A
// fragment is read as fa_rows_dot reads its A (keys 2t and 2t + 1 of a k8 step as logical k t and t + 4, one
// float2), the B fragment as fa_weigh reads its M (rows 2t and 2t + 1, the same relabelling), so both sides sum the
// same key for each k. L lays them out: a's rows L::A_LD apart, L::a_col(key, g) the column of key in row g of a
// (and of row g + 8), L::b_at(key, d) the index in ks of K's rows key and key + 1 at column d.
template <class L, int NQ>
__device__ __forceinline__ void fa_dq_product(float (&out)[NQ][4], const float* a, const float* ks, int c0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < NQ; n++)
#pragma unroll
        for (int r = 0; r < 4; r++) out[n][r] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        const int key = 8 * kb + 2 * t, col = L::a_col(key, g);
        const float2 u = *reinterpret_cast<const float2*>(a + g * L::A_LD + col);
        const float2 w = *reinterpret_cast<const float2*>(a + (g + 8) * L::A_LD + col);
        const float av[4] = {u.x, w.x, u.y, w.y};
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(av[r], a_hi[r], a_lo[r]);
#pragma unroll
        for (int n = 0; n < NQ; n++) {
            const int2 at = L::b_at(key, c0 + 8 * n + g);
            fa_mma3(out[n], a_hi, a_lo, ks[at.x], ks[at.y]);
        }
    }
}

// the mma.sync backward's dQ product: dS^T staged as fa_at<64> lays it out (FA_DS_LD), K as fa_at<D>
template <int D>
struct FaDqLayout {
    static constexpr int A_LD = FA_DS_LD;
    __device__ static int a_col(int key, int g) { return key ^ ((g & 4) << 1); }
    __device__ static int2 b_at(int key, int d) {  // key even: key + 1 shares its swizzle
        const int at = fa_at<D>(key, d);
        return make_int2(at, at + D + 8);
    }
};

// the counters' two sides: a release store that publishes a block's dQ stores (after a barrier that every
// thread of the block crossed after its stores), an acquire load that orders the waiting thread's dQ loads
// after it (each thread that loads dQ acquires for itself, so no barrier is needed on that side)
__device__ __forceinline__ int fa_load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fa_store_release(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <int D, int WARPS>
struct FlashSmem {
    static constexpr int LD = D + 8, ROWS = 16 * WARPS, TILE = FA_KEYS * LD;
    static_assert(2 * TILE >= FA_KEYS * FA_DS_LD, "dS^T must fit over a stage's Q and dO");
};

// The grid is (tiles, NH, B): head h = blockIdx.y of batch row b = blockIdx.z, at this offset in a matrix of rows
// ld floats apart (no division, which with b * NH + h in one index made the forward spill); its rows of lse and
// delta (B, NH, T) at fa_row(T).
__device__ __forceinline__ long long fa_head(int T, int d_k, int ld) {
    return (long long)blockIdx.z * T * ld + (long long)blockIdx.y * d_k;
}
__device__ __forceinline__ long long fa_row(int T) { return ((long long)blockIdx.z * gridDim.y + blockIdx.y) * T; }

// ---------------------------------------------------------------------------------------------- forward
// A block owns 16 * WARPS query rows of one head (fa_head), the longest rows first: an online softmax in FP32 over
// the 64-key tiles up to the diagonal, and lse[i] = max + log(sum) for the backward. SPLIT: the block splits each
// raw tile of K and V into hi and lo once, while the next lands; else each fragment is split as it is read.
template <int D, int WARPS, bool SPLIT>
__device__ void flash_fwd(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k,
                          int ld_in, int ld_out) {
#if TC_AVAILABLE
    using S = FlashSmem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    extern __shared__ __align__(16) float fa_smem[];
    float* qs = fa_smem;
    float* kv = qs + S::ROWS * S::LD;  // stage s: K at kv + 2 s TILE, V after it (SPLIT: one stage)
    uint32_t* split_hi = reinterpret_cast<uint32_t*>(kv + 2 * S::TILE);  // SPLIT: K's, then V's
    uint32_t* split_lo = split_hi + 2 * S::TILE;
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in;  // o and lse offset where they are written: no registers held through the loop
    const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && all_aligned16(q, k, v);
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
        if constexpr (SPLIT) {
            fa_split_tiles<THREADS>(split_hi, split_lo, kv, 2 * S::TILE);
            __syncthreads();  // tile i's hi and lo are in, and the raw stage is free for tile i + 1
        }
        if (i + 1 < n_tiles) {
            float* next = SPLIT ? kv : kv + ((i + 1) & 1) * 2 * S::TILE;
            fa_load<D, FA_KEYS, THREADS>(next, k, k0 + FA_KEYS, T, d_k, ld_in, vec);
            fa_load<D, FA_KEYS, THREADS>(next + S::TILE, v, k0 + FA_KEYS, T, d_k, ld_in, vec);
        }
        cp_async_commit();
        if (k0 > first + 15 || first >= T) continue;  // every key of the tile masked, or no row of the warp's
        const float* ks = kv + (i & 1) * 2 * S::TILE;

        float s[8][4];  // this warp's 16 rows against keys k0 + 8 j .. + 7, in the accumulator layout
        if constexpr (SPLIT)
            fa_rows_dot<D, 2>(s, qs + 16 * warp * S::LD, FaSplit{split_hi, split_lo});
        else
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
        const float new_a = fmaxf(m_a, quad_max(mx_a)), new_b = fmaxf(m_b, quad_max(mx_b));
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
        l_a = l_a * alpha_a + quad_sum(sum_a);
        l_b = l_b * alpha_b + quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            acc[n][0] *= alpha_a, acc[n][1] *= alpha_a;
            acc[n][2] *= alpha_b, acc[n][3] *= alpha_b;
        }
        if constexpr (SPLIT)  // O += P V, P in registers
            fa_weigh<D>(acc, s, FaSplit{split_hi + S::TILE, split_lo + S::TILE});
        else
            fa_weigh<D>(acc, s, ks + S::TILE);
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

// ---------------------------------------------------------------------------------------------- forward on wgmma
// The same forward on sm_90a's wgmma, d_k <= 64: a block of FA_WG_ROWS query rows of one head, two consumer
// warpgroups of 64 rows and a producer warpgroup. The producer copies each 64-key tile of K and V raw (cp.async,
// FA_WG_RAWS deep) and splits it into hi and lo where wgmma reads B: K as it lies (keys x d), V transposed (d x
// keys) with each 8 keys relabelled (logical k t = key 2t, t + 4 = key 2t + 1), so that P, in S's accumulators, is
// wgmma's A fragment unmoved. Q and P are A from registers, split by each consumer; every 32-long slice of a product
// goes into a zeroed fragment added in FP32, as in the tensor-core products.

// d = one 32-long slice of A @ B over the warpgroup's 64 rows, d the accumulators of m64nNk8 (FRAG = N / 2): A's raw
// fragments a[K0 .. K0 + 3] (a[kk][v]: rows g, g + 8, g, g + 8 of the warp's 16, k 8kk + t, t, t + 4, t + 4) split
// here, B's hi and lo N x 32 tiles at descriptors b_hi and b_lo, into a zeroed fragment, waited for. The small terms
// of every k8 step first (lo*hi, hi*lo; TRANS: hi*lo, lo*hi, so that A B computed as (B^T A^T)^T sums the same
// terms), then the hi*hi: the tensor cores' sums lose bits below the running sum's, which stays small until then.
template <int K0, bool TRANS = false, int FRAG, int NA>
__device__ __forceinline__ void fa_wg_slice_issue(float (&d)[FRAG], uint32_t (&hi)[4][4], uint32_t (&lo)[4][4],
                                                  const float (&a)[NA][4], uint64_t b_hi, uint64_t b_lo) {
#if WG_AVAILABLE
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int v = 0; v < 4; v++) tf32_split(a[K0 + kk][v], hi[kk][v], lo[kk][v]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if constexpr (TRANS) {
            wgmma_tf32_rs(d, hi[kk], b_lo + 2 * kk, kk > 0);
            wgmma_tf32_rs(d, lo[kk], b_hi + 2 * kk, 1);
        } else {
            wgmma_tf32_rs(d, lo[kk], b_hi + 2 * kk, kk > 0);
            wgmma_tf32_rs(d, hi[kk], b_lo + 2 * kk, 1);
        }
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_tf32_rs(d, hi[kk], b_hi + 2 * kk, 1);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// ... waited for (ptxas keeps the split fragments, which the tensor cores read, until then)
template <int FRAG>
__device__ __forceinline__ void fa_wg_slice_wait(float (&d)[FRAG]) {
#if WG_AVAILABLE
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < FRAG; i++) asm volatile("" : "+f"(d[i])::"memory");  // read only after the wait
#endif
}
template <int K0, bool TRANS = false, int FRAG, int NA>
__device__ __forceinline__ void fa_wg_slice(float (&d)[FRAG], const float (&a)[NA][4], uint64_t b_hi, uint64_t b_lo) {
    uint32_t hi[4][4], lo[4][4];
    fa_wg_slice_issue<K0, TRANS>(d, hi, lo, a, b_hi, b_lo);
    fa_wg_slice_wait(d);
}

// rows r0 .. r0 + ROWS - 1 of a head (ld floats apart) into s (ROWS x 64, as they lie) by producer thread tid, zero
// past T and d_k
template <int ROWS>
__device__ __forceinline__ void fa_wg_load(float* s, const float* p, int r0, int T, int d_k, int ld, bool vec,
                                           int tid) {
    if (vec) {
#pragma unroll 2
        for (int i = 0; i < ROWS * 64 / 4 / 128; i++) {
            const int e = tid + 128 * i, r = e / 16, d = e % 16 * 4;
            const bool in = r0 + r < T && d < d_k;
            cp_async16(s + r * 64 + d, in ? p + (long long)(r0 + r) * ld + d : p, in ? 16 : 0);
        }
    } else {
#pragma unroll 1
        for (int i = 0; i < ROWS * 64 / 128; i++) {
            const int e = tid + 128 * i, r = e / 64, d = e % 64;
            const bool in = r0 + r < T && d < d_k;
            cp_async4(s + r * 64 + d, in ? p + (long long)(r0 + r) * ld + d : p, in ? 4 : 0);
        }
    }
}

// a raw 64 x 64 tile (rows of 64 floats) split as it lies into hi (2 tiles of FA_WG_TILE: d 0 .. 31, 32 .. 63,
// 128B-swizzled) and lo (the 2 after them), by the 128 threads of a warpgroup (tid)
__device__ __forceinline__ void fa_wg_split_rows(float* hi, const float* raw, int tid) {
#pragma unroll 1
    for (int i = 0; i < FA_KEYS * 64 / 4 / 128; i++) {  // row e / 16, d 4 (e % 16) ..: a row's chunks across lanes
        const int e = tid + 128 * i, r = e / 16, d4 = e % 16 * 4;
        const int at = d4 / 32 * FA_WG_TILE + wg_swizzled(r, d4 % 32);
        tf32_split_store(hi, hi + 2 * FA_WG_TILE, at, *reinterpret_cast<const float4*>(raw + r * 64 + d4));
    }
}

// a raw stage (K, V) split into a buffer (K hi, K lo, V^T hi, V^T lo; each two tiles of FA_WG_TILE, 128B-swizzled)
// by producer thread tid
__device__ __forceinline__ void fa_wg_split(float* buf, const float* raw, int tid) {
    const float* vr = raw + FA_KEYS * 64;
    fa_wg_split_rows(buf, raw, tid);  // K as it lies
#pragma unroll 1
    for (int i = 0; i < FA_KEYS * 64 / 4 / 128; i++) {  // V^T: row d = e % 64 across lanes, logical keys c4 ..
        const int e = tid + 128 * i, d = e % 64, c4 = e / 64 * 4;
        const int key = (c4 & ~7) + (c4 & 4 ? 1 : 0);  // logical c4 .. c4 + 3: keys key, key + 2, key + 4, key + 6
        const float4 x = make_float4(vr[key * 64 + d], vr[(key + 2) * 64 + d], vr[(key + 4) * 64 + d],
                                     vr[(key + 6) * 64 + d]);
        tf32_split_store(buf + 4 * FA_WG_TILE, buf + 6 * FA_WG_TILE, c4 / 32 * FA_WG_TILE + wg_swizzled(d, c4 % 32),
                         x);
    }
}

// k_flash_fwd_d64's function and arguments; grid (ceil(T / FA_WG_ROWS), NH, B), TC_WG_THREADS threads,
// FA_FWD_WG_BYTES of dynamic shared memory. setmaxnreg shares the block's 384 x 168 registers as 128 x 72 (the
// producer) and 256 x 216.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_flash_fwd_wg_d64(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k,
                       int ld_in, int ld_out) {
#if WG_AVAILABLE
    constexpr int BUF = 8 * FA_WG_TILE, RAW = 2 * FA_KEYS * 64;
    extern __shared__ __align__(1024) float fa_wg_smem[];
    float* split = fa_wg_smem;               // [FA_WG_BUFS][BUF]
    float* raw = split + FA_WG_BUFS * BUF;   // [FA_WG_RAWS][RAW]
    uint64_t* full = reinterpret_cast<uint64_t*>(raw + FA_WG_RAWS * RAW);
    uint64_t* empty = full + FA_WG_BUFS;
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_WG_ROWS;  // the longest rows first
    const int n_tiles = (min(q0 + FA_WG_ROWS, T) - 1) / FA_KEYS + 1;
    wg_init_barriers(full, empty, FA_WG_BUFS);
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

    if (wg == 0) {  // ------------------------------------------------ the producer: copy and split K and V
        asm volatile("setmaxnreg.dec.sync.aligned.u32 72;" ::: "memory");
        const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && all_aligned16(k, v);
        auto load = [&](int stage, int k0) {
            fa_wg_load<FA_KEYS>(raw + stage * RAW, k, k0, T, d_k, ld_in, vec, tid);
            fa_wg_load<FA_KEYS>(raw + stage * RAW + FA_KEYS * 64, v, k0, T, d_k, ld_in, vec, tid);
        };
#pragma unroll
        for (int i = 0; i < FA_WG_RAWS - 1; i++) {
            if (i < n_tiles) load(i, i * FA_KEYS);
            cp_async_commit();
        }
        for (int kt = 0; kt < n_tiles; kt++) {
            cp_async_wait<FA_WG_RAWS - 2>();  // this thread's copies of tile kt have landed
            asm volatile("bar.sync 1, 128;" ::: "memory");  // ... every producer's, and all are done splitting kt - 1
            const int next = kt + FA_WG_RAWS - 1;
            if (next < n_tiles) load(next % FA_WG_RAWS, next * FA_KEYS);
            cp_async_commit();
            const int buf = kt % FA_WG_BUFS;
            mbar_wait(&empty[buf], ((kt / FA_WG_BUFS) & 1) ^ 1);  // the consumers are done with its last tile
            fa_wg_split(split + buf * BUF, raw + (kt % FA_WG_RAWS) * RAW, tid);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // what was stored, the tensor cores read
            mbar_arrive(&full[buf]);
        }
        return;
    }

    // ---------------------------------------------------------------- the consumers: 64 query rows each
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;" ::: "memory");
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 64 * (wg - 1), warp_first = first + 16 * warp;
    const int row_a = warp_first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    float qf[8][4];  // Q's raw A fragments: k8 step kk, (row_a, d 8kk + t), (row_b, ..), (row_a, + 4), (row_b, + 4)
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = r % 2 ? row_b : row_a, d = 8 * kk + t + 4 * (r / 2);
            qf[kk][r] = row < T && d < d_k ? q[(long long)row * ld_in + d] : 0.0f;
        }
    float acc[32];  // O: (row_a, 8 (i / 4) + 2t + i % 2) for i % 4 < 2, else row_b's
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    const uint64_t desc = wg_desc(split);
    for (int kt = 0; kt < n_tiles; kt++) {
        const int buf = kt % FA_WG_BUFS, k0 = kt * FA_KEYS;
        mbar_wait(&full[buf], (kt / FA_WG_BUFS) & 1);
        if (k0 > first + 63 || first >= T) {  // every key of the tile masked, or no row of the warpgroup's
            mbar_arrive(&empty[buf]);
            continue;
        }
        const uint64_t k_hi = desc + buf * BUF / 4, k_lo = k_hi + 2 * FA_WG_TILE / 4;
        const uint64_t v_hi = k_hi + 4 * FA_WG_TILE / 4, v_lo = k_hi + 6 * FA_WG_TILE / 4;
        float s[32], part[32];
        fa_wg_slice<0>(s, qf, k_hi, k_lo);  // S = Q K^T: d 0 .. 31, then 32 .. 63
        fa_wg_slice<4>(part, qf, k_hi + FA_WG_TILE / 4, k_lo + FA_WG_TILE / 4);
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] += part[i];

        // scale, as the literal line does, and mask; the online softmax of rows a (i % 4 < 2) and b
        const bool whole = k0 + FA_KEYS - 1 <= warp_first && k0 + FA_KEYS <= T;  // no key hidden from any row
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int key = k0 + 8 * (i / 4) + 2 * t + i % 2;
            const bool b = i % 4 >= 2;
            s[i] = (whole || (key <= (b ? row_b : row_a) && key < T)) ? s[i] * scale : -INFINITY;
            if (b) mx_b = fmaxf(mx_b, s[i]);
            else mx_a = fmaxf(mx_a, s[i]);
        }
        // finite: tile 0 came first, and its key 0 is every row's
        const float new_a = fmaxf(m_a, quad_max(mx_a)), new_b = fmaxf(m_b, quad_max(mx_b));
        const float alpha_a = expf(m_a - new_a), alpha_b = expf(m_b - new_b);
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const bool b = i % 4 >= 2;
            s[i] = expf(s[i] - (b ? new_b : new_a));
            if (b) sum_b += s[i];
            else sum_a += s[i];
        }
        l_a = l_a * alpha_a + quad_sum(sum_a);
        l_b = l_b * alpha_b + quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] *= i % 4 < 2 ? alpha_a : alpha_b;

        float pf[8][4];  // P as A fragments: keys 8kb + 2t (logical t) and 8kb + 2t + 1 (logical t + 4)
#pragma unroll
        for (int kb = 0; kb < 8; kb++)
            pf[kb][0] = s[4 * kb], pf[kb][1] = s[4 * kb + 2], pf[kb][2] = s[4 * kb + 1], pf[kb][3] = s[4 * kb + 3];
        fa_wg_slice<0>(part, pf, v_hi, v_lo);  // O += P V: keys 0 .. 31, then 32 .. 63
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] += part[i];
        fa_wg_slice<4>(part, pf, v_hi + FA_WG_TILE / 4, v_lo + FA_WG_TILE / 4);
        mbar_arrive(&empty[buf]);
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] += part[i];
    }

    o += fa_head(T, d_k, ld_out);
    lse += fa_row(T);
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int d = 8 * (i / 4) + 2 * t + i % 2, row = i % 4 < 2 ? row_a : row_b;
        if (d < d_k && row < T) o[(long long)row * ld_out + d] = acc[i] / (i % 4 < 2 ? l_a : l_b);
    }
    if (t == 0) {
        if (row_a < T) lse[row_a] = m_a + logf(l_a);
        if (row_b < T) lse[row_b] = m_b + logf(l_b);
    }
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}

// ---------------------------------------------------------------------------------------------- backward
// delta = the row's sum of p dp (p and dp as the backward computes them, so ds = 0 exactly where p = 1), for the 64
// query rows of tile blockIdx.x of one head; launched for the first FA_DELTA_PASS_TILES query tiles only. It also
// zeroes those tiles' counters (block (0, 0, 0): the ticket too), so the backward needs no scratch from before.
template <int D>
__device__ void flash_bwd_delta(float* delta, int* sync, const float* q, const float* k, const float* v,
                                const float* d_o, const float* lse, int T, int d_k, int ld_in, int ld_out) {
#if TC_AVAILABLE
    using S = FlashSmem<D, FA_DELTA_WARPS>;
    constexpr int THREADS = 32 * FA_DELTA_WARPS;
    extern __shared__ __align__(16) float fa_smem[];
    const int n = (T - 1) / FA_KEYS + 1;  // query tiles per head
    if (threadIdx.x == 0) {
        sync[fa_row(n) + blockIdx.x] = 0;  // (b, h, query tile): the backward's counter[i] of head b NH + h
        if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) sync[n * gridDim.y * gridDim.z] = 0;
    }
    float* qs = fa_smem;
    float* dos = qs + S::ROWS * S::LD;
    float* kv = dos + S::ROWS * S::LD;
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in, d_o += fa_head(T, d_k, ld_out);
    lse += fa_row(T), delta += fa_row(T);
    const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 && all_aligned16(q, k, v, d_o);
    const int q0 = blockIdx.x * S::ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = q0 + 16 * warp, row_a = first + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_tiles = blockIdx.x + 1;  // key tiles up to the diagonal

    float delta_a = 0.0f, delta_b = 0.0f;
    const float lse_a = row_a < T ? lse[row_a] : 0.0f, lse_b = row_b < T ? lse[row_b] : 0.0f;
    auto load_kv = [&](int stage, int k0) {
        float* s = kv + stage * 2 * S::TILE;
        fa_load<D, FA_KEYS, THREADS>(s, k, k0, T, d_k, ld_in, vec);
        fa_load<D, FA_KEYS, THREADS>(s + S::TILE, v, k0, T, d_k, ld_in, vec);
    };
    fa_load<D, S::ROWS, THREADS>(qs, q, q0, T, d_k, ld_in, vec);
    fa_load<D, S::ROWS, THREADS>(dos, d_o, q0, T, d_k, ld_out, vec);
    load_kv(0, 0);
    cp_async_commit();
    for (int i = 0; i < n_tiles; i++) {
        const int k0 = i * FA_KEYS;
        cp_async_wait<0>();
        __syncthreads();  // tile i is in, and every warp is done with tile i - 1's stage
        if (i + 1 < n_tiles) load_kv((i + 1) & 1, k0 + FA_KEYS);
        cp_async_commit();
        if (k0 > first + 15 || first >= T) continue;
        const float* ks = kv + (i & 1) * 2 * S::TILE;
        // S = Q K^T in the forward's order; dP = dO V^T in the order whose transpose the backward runs
        float p[8][4], dp[8][4];
        fa_rows_dot<D, 1>(p, qs + 16 * warp * S::LD, ks);
        fa_rows_dot<D, 1>(dp, dos + 16 * warp * S::LD, ks + S::TILE);
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
    delta_a = quad_sum(delta_a), delta_b = quad_sum(delta_b);
    if (t == 0) {
        if (row_a < T) delta[row_a] = delta_a;
        if (row_b < T) delta[row_b] = delta_b;
    }
#else
    __trap();
#endif
}

// delta of the query tiles past the first FA_DELTA_PASS_TILES: the row's sum of dO * O over d (p dp's value, in one
// read of O), summed in FP64 and rounded once, and those tiles' counters set to 0. One warp per (b, t) row, all its
// heads; a head's P lanes (d_k / V rounded up to a power of two) each sum 4 of d, then a shuffle tree adds them.
// o and d_o: (B, T) rows ld_out floats apart, head h at h * d_k. Five blocks per SM (sm_75: four).
constexpr int FA_DELTA_ROW_GROUPS = 2;  // groups of heads (32 / P each) whose loads all go out before their sums
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define FA_DELTA_ROW_BLOCKS 4
#else
#define FA_DELTA_ROW_BLOCKS 5
#endif
extern "C" __global__ void __launch_bounds__(256, FA_DELTA_ROW_BLOCKS)
    k_flash_bwd_delta_rows(float* delta, int* sync, const float* o, const float* d_o, int B, int NH, int T,
                           int d_k, int ld_out) {
    constexpr int T0 = FA_DELTA_PASS_TILES * FA_KEYS;
    if (d_k > 4 * 32) __trap();  // 4 of d per lane (flash_attention.MAX_D_K is 128)
    const int rows = T - T0, w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (w >= B * rows) return;  // the whole warp leaves together
    const bool vec = d_k % 4 == 0 && ld_out % 4 == 0 && all_aligned16(o, d_o);
    const int V = vec ? 4 : 1;
    int P = 1;
    while (P < 32 && P * V < d_k) P *= 2;
    const int lane = threadIdx.x % 32, j = lane % P, heads = 32 / P;  // heads: a group's
    const int b = w / rows, t = T0 + w - b * rows, tiles = (T - 1) / FA_KEYS + 1;
    const long long row = ((long long)b * T + t) * ld_out;
    for (int h0 = 0; h0 < NH; h0 += FA_DELTA_ROW_GROUPS * heads) {
        float x[FA_DELTA_ROW_GROUPS][4], y[FA_DELTA_ROW_GROUPS][4];
#pragma unroll
        for (int g = 0; g < FA_DELTA_ROW_GROUPS; g++) {
            const int h = h0 + g * heads + lane / P;
            const long long at = row + (long long)h * d_k;
            if (vec) {
                const bool in = h < NH && 4 * j < d_k;
                const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                const float4 a = in ? *reinterpret_cast<const float4*>(d_o + at + 4 * j) : zero;
                const float4 c = in ? *reinterpret_cast<const float4*>(o + at + 4 * j) : zero;
                x[g][0] = a.x, x[g][1] = a.y, x[g][2] = a.z, x[g][3] = a.w;
                y[g][0] = c.x, y[g][1] = c.y, y[g][2] = c.z, y[g][3] = c.w;
            } else {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int d = j + P * r;
                    x[g][r] = h < NH && d < d_k ? d_o[at + d] : 0.0f;
                    y[g][r] = h < NH && d < d_k ? o[at + d] : 0.0f;
                }
            }
        }
#pragma unroll
        for (int g = 0; g < FA_DELTA_ROW_GROUPS; g++) {
            if (h0 + g * heads >= NH) break;  // the whole warp
            double sum = 0.0;
#pragma unroll
            for (int r = 0; r < 4; r++) sum += (double)x[g][r] * y[g][r];
            for (int m = P / 2; m >= 1; m /= 2) sum += __shfl_xor_sync(0xffffffff, sum, m);
            const int h = h0 + g * heads + lane / P;
            if (j == 0 && h < NH) {
                const long long bh = (long long)b * NH + h;
                delta[bh * T + t] = (float)sum;
                if (t % FA_KEYS == 0) sync[bh * tiles + t / FA_KEYS] = 0;
            }
        }
    }
}

// dV = sum over queries of P^T dO, dK = scale * sum of dS^T Q, dQ = scale * sum over keys of dS K, for key tiles
// KT m .. KT m + KT - 1 (KT = FA_BWD_TILES(D)) of head bh = b * NH + h, (m, bh) from the ticket, not blockIdx. A warp
// owns 16 keys, keeps dK and dV in registers, and adds each query tile's part of dQ into global memory (dS^T staged
// in shared memory over the tile's Q and dO) in a fixed order of key tiles, behind per-tile counters. S^T and dP^T
// are the forward's S and the delta kernel's dP bit for bit (fa_mma3<true>), so ds = 0 exactly where p = 1.
// sync: B * NH * ceil(T / 64) counters (b, h, query tile), then the ticket; all 0 at the start, and left 0.
template <int D, int KT, bool SPLIT>
__device__ void flash_bwd(float* dq, float* dk, float* dv, int* sync, const float* q, const float* k,
                          const float* v, const float* d_o, const float* lse, const float* delta, int T, int d_k,
                          int ld_in, int ld_out) {
#if TC_AVAILABLE
    constexpr int WARPS = 4 * KT;
    using S = FlashSmem<D, WARPS>;
    constexpr int THREADS = 32 * WARPS, ND = D / 8;
    // n8 tiles of dQ's part at a time: 32 columns, whose part and loaded sum (32 registers) fit beside dK and dV
    // at d_k 64 (all 64 at once spilled)
    constexpr int NQ = 4;
    static_assert(S::ROWS == KT * FA_KEYS, "a block's keys are KT tiles");
    static_assert(KT == 1 || S::TILE >= FA_KEYS * FA_DS_LD, "each key tile's dS^T fits over one of Q and dO");
    static_assert(D % (8 * NQ * KT) == 0, "a warp of each key tile takes D / KT columns of dQ's rows");
    extern __shared__ __align__(16) float fa_smem[];
    float* ks = fa_smem;
    float* vs = ks + S::ROWS * S::LD;
    float* qd = vs + S::ROWS * S::LD;  // stage s: Q at qd + 2 s TILE, dO after it
    // SPLIT: the current stage's Q and dO lo (their hi over the stage)
    uint32_t* q_lo = reinterpret_cast<uint32_t*>(qd + 4 * S::TILE);
    uint32_t* do_lo = q_lo + S::TILE;
    float* ls = qd + (4 + 2 * SPLIT) * S::TILE;  // stage s: lse at ls + 2 s FA_KEYS, delta after it
    int& ticket = *reinterpret_cast<int*>(ls + 4 * FA_KEYS);
    // n from T, not gridDim.x: with gridDim.x, ptxas spilled at d_k 64
    const int n = (T - 1) / FA_KEYS + 1, blocks = (n - 1) / KT + 1, heads = gridDim.y * gridDim.z;
    if (threadIdx.x == 0) {
        ticket = atomicAdd(sync + heads * n, 1);
        if (ticket == heads * blocks - 1) sync[heads * n] = 0;  // the last ticket drawn: left 0 for the next launch
    }
    __syncthreads();
    // The head (bh = b * NH + h, NH = gridDim.y) and its offsets are recomputed from the ticket in shared memory
    // where they are used, after a barrier that no load of it moves across: held in registers through the loop
    // (with the addresses the compiler derives from them), they spilled.
    auto ticket_head = [&]() { return ticket % heads; };
    auto head = [&](int bh, int ld) {
        const int b = bh / gridDim.y;
        return (long long)b * T * ld + (long long)(bh - b * (int)gridDim.y) * d_k;
    };
    auto counter = [&](int bh, int i) { return sync + bh * n + i; };  // blocks that have added to dQ's tile i
    const int m = ticket / heads;                                    // block major: every head's longest first
    const long long in = head(ticket_head(), ld_in);
    const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 &&
                     all_aligned16(q + in, k + in, v + in, d_o + head(ticket_head(), ld_out));
    const int j0 = KT * m, k0 = j0 * FA_KEYS;  // the block's first key tile, and its first key
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int first = k0 + 16 * warp, key_a = first + g, key_b = key_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    const int n_steps = n - j0;  // query tiles n - 1 down to j0

    auto load_tile = [&](int stage, int q0) {
        float* s = qd + stage * 2 * S::TILE;
        const int h = ticket_head();
        fa_load<D, FA_KEYS, THREADS>(s, q + head(h, ld_in), q0, T, d_k, ld_in, vec);
        fa_load<D, FA_KEYS, THREADS>(s + S::TILE, d_o + head(h, ld_out), q0, T, d_k, ld_out, vec);
        for (int e = threadIdx.x; e < 2 * FA_KEYS; e += THREADS) {
            const int qi = q0 + e % FA_KEYS;
            const float* src = (e < FA_KEYS ? lse : delta) + (long long)h * T;
            cp_async4(ls + stage * 2 * FA_KEYS + e, qi < T ? src + qi : src, qi < T ? 4 : 0);
        }
    };
    fa_load<D, S::ROWS, THREADS>(ks, k + in, k0, T, d_k, ld_in, vec);
    fa_load<D, S::ROWS, THREADS>(vs, v + in, k0, T, d_k, ld_in, vec);
    load_tile(0, (n - 1) * FA_KEYS);
    cp_async_commit();

    float acc_k[ND][4], acc_v[ND][4];
#pragma unroll
    for (int c = 0; c < ND; c++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc_k[c][r] = 0.0f, acc_v[c][r] = 0.0f;
    int* publish = nullptr;  // thread 0's: the counter of the last step's add, set once the block's stores are done
    for (int s = 0; s < n_steps; s++) {
        const int i = n - 1 - s, q0 = i * FA_KEYS;
        float* qs = qd + (s & 1) * 2 * S::TILE;
        const float* dos = qs + S::TILE;
        cp_async_wait<0>();
        if constexpr (SPLIT) {  // lo's last readers passed the last step's second barrier
            fa_split_own<D, FA_KEYS, THREADS>(qs, q_lo, vec);
            fa_split_own<D, FA_KEYS, THREADS>(qs + S::TILE, do_lo, vec);
        }
        __syncthreads();  // tile i is in (and split); every warp is done with step s - 1 (its stage, its dQ stores)
        if (publish != nullptr) {
            __threadfence();
            fa_store_release(publish, m + 1);
            publish = nullptr;
        }
        if (s + 1 < n_steps) load_tile((s + 1) & 1, q0 - FA_KEYS);
        cp_async_commit();
        const float* tl = ls + (s & 1) * 2 * FA_KEYS;

        // ds^T: rows this warp's keys, columns the tile's queries 8c + 2t (+ 1); 0 for a warp past T, and for
        // a warp whose keys all come after the tile's queries (a second key tile at the first's diagonal)
        float dst[8][4];
        if (first < T && first < q0 + FA_KEYS) {
            float pt[8][4];
            if constexpr (SPLIT) {
                const FaSplit q_split{reinterpret_cast<const uint32_t*>(qs), q_lo};
                fa_rows_dot<D, 1, true>(pt, ks + 16 * warp * S::LD, q_split);
                fa_rows_dot<D, 1, true>(dst, vs + 16 * warp * S::LD,
                                        FaSplit{reinterpret_cast<const uint32_t*>(dos), do_lo});
            } else {
                fa_rows_dot<D, 1, true>(pt, ks + 16 * warp * S::LD, qs);
                fa_rows_dot<D, 1, true>(dst, vs + 16 * warp * S::LD, dos);
            }
#pragma unroll
            for (int c = 0; c < 8; c++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = 8 * c + 2 * t + e, qi = q0 + col;
                    const float l = tl[col], dl = tl[FA_KEYS + col];
                    const bool seen_a = key_a <= qi && qi < T && key_a < T, seen_b = key_b <= qi && qi < T && key_b < T;
                    pt[c][e] = seen_a ? expf(__fmul_rn(pt[c][e], scale) - l) : 0.0f;
                    pt[c][2 + e] = seen_b ? expf(__fmul_rn(pt[c][2 + e], scale) - l) : 0.0f;
                    dst[c][e] = pt[c][e] * (dst[c][e] - dl);
                    dst[c][2 + e] = pt[c][2 + e] * (dst[c][2 + e] - dl);
                }
            if constexpr (SPLIT) {
                fa_weigh<D>(acc_v, pt, FaSplit{reinterpret_cast<const uint32_t*>(dos), do_lo});
                fa_weigh<D>(acc_k, dst, FaSplit{reinterpret_cast<const uint32_t*>(qs), q_lo});
            } else {
                fa_weigh<D>(acc_v, pt, dos);
                fa_weigh<D>(acc_k, dst, qs);
            }
        } else {
#pragma unroll
            for (int c = 0; c < 8; c++)
#pragma unroll
                for (int r = 0; r < 4; r++) dst[c][r] = 0.0f;
        }
        __syncthreads();  // every warp is done with the stage's Q and dO: dS^T goes over them
        // key tile kt's 64 queries x 64 keys at qs + kt TILE, as fa_at<64>
        float* ds_t = qs + warp / 4 * S::TILE;
#pragma unroll
        for (int c = 0; c < 8; c++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = 8 * c + 2 * t + e;
                ds_t[fa_at<64>(col, 16 * (warp % 4) + g)] = dst[c][e];
                ds_t[fa_at<64>(col, 16 * (warp % 4) + g + 8)] = dst[c][2 + e];
            }
        __syncthreads();  // dS^T is whole

        // dQ's rows q0 + 16 (warp % 4) + g (+ 8), columns D / KT of them (warp / 4), += dS^T K over the block's
        // key tiles in order, after block m - 1's add: key tile 0 writes, key tile i scales. Blocks stream query
        // tiles from the last down, so block m waits once, then runs a step behind m - 1. No deadlock whatever the
        // dispatch order: a block waits only on the ticket `heads` before its own, which is resident.
        const int rows = 16 * (warp % 4), row_a = q0 + rows + g, row_b = row_a + 8;
        const int tiles = min(KT, i - j0 + 1);  // the block's key tiles that see query tile i
        if (q0 + rows < T) {
            const int h = ticket_head();
            float* dq_h = dq + head(h, ld_in);
            if (m > 0)
                while (fa_load_acquire(counter(h, i)) != m) __nanosleep(100);
#pragma unroll
            for (int dc = 0; dc < D / KT; dc += 8 * NQ) {  // a constant count: the warp's own bounds spilled
                const int c0 = warp / 4 * (D / KT) + dc;
                float x[NQ][4];  // the sum so far, loaded before the product, to land while it runs
                if (m > 0)
#pragma unroll
                    for (int c = 0; c < NQ; c++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int d = c0 + 8 * c + 2 * t + e;
                            // a conditional load of volatile asm is a branch: load dq[0] where out of bounds
                            x[c][e] = __ldcg(row_a < T && d < d_k ? dq_h + (long long)row_a * ld_in + d : dq_h);
                            x[c][2 + e] = __ldcg(row_b < T && d < d_k ? dq_h + (long long)row_b * ld_in + d : dq_h);
                        }
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
                    if (kt >= tiles) break;
                    float part[NQ][4];
                    fa_dq_product<FaDqLayout<D>, NQ>(part, qs + kt * S::TILE + rows * FA_DS_LD,
                                                       ks + kt * FA_KEYS * S::LD, c0);
#pragma unroll
                    for (int c = 0; c < NQ; c++)
#pragma unroll
                        for (int r = 0; r < 4; r++) x[c][r] = m > 0 || kt > 0 ? x[c][r] + part[c][r] : part[c][r];
                }
#pragma unroll
                for (int c = 0; c < NQ; c++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int d = c0 + 8 * c + 2 * t + e;
                        if (d >= d_k) continue;
                        float x_a = x[c][e], x_b = x[c][2 + e];
                        if (i < j0 + KT) x_a *= scale, x_b *= scale;  // key tile i is the block's
                        if (row_a < T) __stcg(dq_h + (long long)row_a * ld_in + d, x_a);
                        if (row_b < T) __stcg(dq_h + (long long)row_b * ld_in + d, x_b);
                    }
            }
        }
        // a query tile of the block's own key tiles takes its last add from this block: no one waits
        if (threadIdx.x == 0 && i >= j0 + KT) publish = counter(ticket_head(), i);
    }
    // the last adds to query tiles j0 .. j0 + KT - 1 were this block's: their counters back to 0 for the next
    // launch, once every warp has seen them at m (a warp may still be in its spin until this barrier)
    __syncthreads();
    if (threadIdx.x == 0 && m > 0)
        for (int i = j0; i < min(j0 + KT, n); i++) *counter(ticket_head(), i) = 0;
    dk += head(ticket_head(), ld_in), dv += head(ticket_head(), ld_in);
#pragma unroll
    for (int c = 0; c < ND; c++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int d = 8 * c + 2 * t + e;
            if (d >= d_k) continue;
            if (key_a < T) {
                dk[(long long)key_a * ld_in + d] = acc_k[c][e] * scale;
                dv[(long long)key_a * ld_in + d] = acc_v[c][e];
            }
            if (key_b < T) {
                dk[(long long)key_b * ld_in + d] = acc_k[c][2 + e] * scale;
                dv[(long long)key_b * ld_in + d] = acc_v[c][2 + e];
            }
        }
#else
    __trap();
#endif
}

// The kernels for each padded width D: grid (ceil(T / (16 WARPS)), NH, B), 32 WARPS threads, FA_SMEM_*'s floats of
// dynamic shared memory. q, k, v (dq, dk, dv) are heads' columns of one matrix of rows ld_in apart, o and d_o of one
// of rows ld_out apart; lse and delta (B, NH, T); sync an int scratch of B * NH * ceil(T / 64) + 1 (zeroed by delta).
// The 8-warp forward of split tiles runs one block per SM, as its shared memory allows (up to 255 registers).
#define FA_FWD_BOUNDS_32 __launch_bounds__(32 * FA_FWD_WARPS(32))
#define FA_FWD_BOUNDS_64 __launch_bounds__(32 * FA_FWD_WARPS(64), 1)
#define FA_FWD_BOUNDS_128 __launch_bounds__(32 * FA_FWD_WARPS(128))
// the backward's blocks of 8 warps run one per SM (their shared memory), up to 255 registers as the 4-warp ones
#define FA_BWD_BOUNDS_32 __launch_bounds__(32 * FA_BWD_WARPS(32))
#define FA_BWD_BOUNDS_64 __launch_bounds__(32 * FA_BWD_WARPS(64), 1)
#define FA_BWD_BOUNDS_128 __launch_bounds__(32 * FA_BWD_WARPS(128))
#define FLASH_KERNELS(D)                                                                                       \
    extern "C" __global__ void FA_FWD_BOUNDS_##D k_flash_fwd_d##D(float* o, float* lse, const float* q,         \
                                                                  const float* k, const float* v, int T,       \
                                                                  int d_k, int ld_in, int ld_out) {    \
        flash_fwd<D, FA_FWD_WARPS(D), FA_FWD_SPLIT(D)>(o, lse, q, k, v, T, d_k, ld_in, ld_out);            \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * FA_DELTA_WARPS)                                         \
        k_flash_bwd_delta_d##D(float* delta, int* sync, const float* q, const float* k, const float* v,       \
                               const float* d_o, const float* lse, int T, int d_k, int ld_in, int ld_out) {    \
        flash_bwd_delta<D>(delta, sync, q, k, v, d_o, lse, T, d_k, ld_in, ld_out);                             \
    }                                                                                                          \
    extern "C" __global__ void FA_BWD_BOUNDS_##D                                                               \
        k_flash_bwd_d##D(float* dq, float* dk, float* dv, int* sync, const float* q, const float* k,           \
                         const float* v, const float* d_o, const float* lse, const float* delta, int T,        \
                         int d_k, int ld_in, int ld_out) {                                                     \
        flash_bwd<D, FA_BWD_TILES(D), FA_BWD_SPLIT(D)>(dq, dk, dv, sync, q, k, v, d_o, lse, delta, T, d_k, ld_in, \
                                                       ld_out);                                                \
    }
FLASH_KERNELS(32)
FLASH_KERNELS(64)
FLASH_KERNELS(128)
#undef FLASH_KERNELS

// ---------------------------------------------------------------------------------------------- backward on wgmma
// Flash attention's backward on sm_90a's wgmma, d_k <= 64 (D = 64): k_flash_bwd_d64's work (a block two 64-key tiles,
// (m, head) from the same ticket, query tiles from the last down to the diagonal, dQ added in the same fixed order
// behind the same counters) by three warpgroups. The producer (warpgroup 0) copies each step's 32 queries of Q and
// dO raw, with their lse and delta (cp.async, FB_WG_RAWS deep), and splits them into hi and lo where wgmma reads B
// (128B-swizzled K-major tiles of 32 floats a row, FB_WG_BUFS buffers): Q and dO as they lie (queries x d) for
// S^T = K Q^T and dP^T = V dO^T, and transposed (d x queries, each 8 queries relabelled: logical k t = query 2t,
// t + 4 = query 2t + 1) for dV += P^T dO and dK += dS^T Q, so that P^T and dS^T, in the accumulators of S^T, are
// wgmma's A fragments unmoved. Each consumer (warpgroups 1, 2) owns 64 keys: K's A fragments read from the block's
// resident K in shared memory, V's held raw in registers, dK and dV in registers. dS^T goes to shared memory, and
// the consumers' 8 warps add dS K into dQ by mma.sync (3xTF32, fa_mma3) over the block's keys, key tile by key
// tile, while the step's dK product runs (waited for after it). Every 32-long slice of a wgmma product into a zeroed
// fragment, added in FP32.
static_assert(FA_BWD_TILES(64) == 2, "k_flash_bwd_d64's grid, which the launcher gives both: two key tiles a block");
static_assert(FA_SMEM_BWD_WG <= 232448, "the opt-in limit of shared memory a block (227 KB)");
static_assert(FB_WG_BUF % 256 == 0 && (FB_WG_BUFS * FB_WG_BUF + FB_WG_RAWS * FB_WG_RAW) % 4 == 0, "alignment");

// K's element (key, d) in the block's resident tile. Rows 68 floats apart: both its readers are free of bank
// conflicts (S^T's A fragments: keys g, g + 8, d t, t + 4 of a k8 step; dQ's mma.sync B fragments: keys 2t, 2t + 1,
// d g), and every address is a lane's base and a constant (an XOR swizzle's, hoisted out of the loop, spilled)
__device__ __forceinline__ int fb_ks_at(int key, int d) { return key * FB_WG_KS_LD + d; }

// a raw stage (Q, dO, lse, delta) split into a buffer (Q and dO natural, then transposed and relabelled; lse and
// delta to ls) by producer thread tid
__device__ __forceinline__ void fb_wg_split(float* buf, float* ls, const float* raw, int tid) {
#pragma unroll 1
    for (int x = 0; x < 2; x++) {  // Q, dO: query e / 16, d 4 (e % 16) ..: a row's chunks across lanes
        const float* r = raw + x * FB_WG_Q * 64;
        float* hi = buf + 4 * x * FB_WG_QN;
#pragma unroll
        for (int i = 0; i < FB_WG_Q * 64 / 4 / 128; i++) {
            const int e = tid + 128 * i, qi = e / 16, d4 = e % 16 * 4;
            tf32_split_store(hi, hi + 2 * FB_WG_QN, d4 / 32 * FB_WG_QN + wg_swizzled(qi, d4 % 32),
                             *reinterpret_cast<const float4*>(r + qi * 64 + d4));
        }
    }
#pragma unroll 1
    for (int x = 0; x < 2; x++) {  // Q^T, dO^T: row d = e % 64 across lanes, logical queries c4 ..
        const float* r = raw + x * FB_WG_Q * 64;
        float* hi = buf + 8 * FB_WG_QN + 2 * x * FB_WG_QT;
#pragma unroll
        for (int i = 0; i < 64 * FB_WG_Q / 4 / 128; i++) {
            const int e = tid + 128 * i, d = e % 64, c4 = e / 64 * 4;
            const int qi = (c4 & ~7) + (c4 & 4 ? 1 : 0);  // logical c4 .. c4 + 3: queries qi, + 2, + 4, + 6
            const float4 y = make_float4(r[qi * 64 + d], r[(qi + 2) * 64 + d], r[(qi + 4) * 64 + d],
                                         r[(qi + 6) * 64 + d]);
            tf32_split_store(hi, hi + FB_WG_QT, wg_swizzled(d, c4), y);
        }
    }
    if (tid < 2 * FB_WG_Q) ls[tid] = raw[2 * FB_WG_Q * 64 + tid];
}

// the wgmma backward's dQ product (fa_dq_product): dS staged by query rows, FB_WG_DS_LD apart (the float2 reads of
// a quarter warp fall on distinct banks; the stores from the accumulators two to a bank), K as fb_ks_at lays it out;
// a and ks start at the key tile's first key
struct FbWgDqLayout {
    static constexpr int A_LD = FB_WG_DS_LD;
    __device__ static int a_col(int key, int) { return key; }
    __device__ static int2 b_at(int key, int d) { return make_int2(fb_ks_at(key, d), fb_ks_at(key + 1, d)); }
};

// grid (ceil(T / 128), NH, B) as k_flash_bwd_d64's (its work from the ticket), TC_WG_THREADS threads,
// FA_BWD_WG_BYTES of dynamic shared memory; after k_flash_bwd_delta_rows and k_flash_bwd_delta_d64 (delta, and the
// counters and ticket zeroed). setmaxnreg shares the block's 384 x 168 registers as 128 x 72 and 256 x 216.
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_flash_bwd_wg_d64(float* dq, float* dk, float* dv, int* sync, const float* q, const float* k, const float* v,
                       const float* d_o, const float* lse, const float* delta, int T, int d_k, int ld_in,
                       int ld_out) {
#if WG_AVAILABLE
    extern __shared__ __align__(1024) float fb_smem[];
    float* split = fb_smem;                             // [FB_WG_BUFS][FB_WG_BUF]
    float* raw = split + FB_WG_BUFS * FB_WG_BUF;        // [FB_WG_RAWS][FB_WG_RAW]
    float* ks = raw + FB_WG_RAWS * FB_WG_RAW;           // the block's 128 keys of K
    float* ds = ks + FB_WG_KS;                          // dS of the step: 32 queries x 128 keys
    float* ls = ds + FB_WG_DS;                          // [FB_WG_BUFS][lse 32, delta 32] of each buffer's step
    uint64_t* full = reinterpret_cast<uint64_t*>(ls + FB_WG_BUFS * 2 * FB_WG_Q);
    uint64_t* empty = full + FB_WG_BUFS;
    int* ticket_s = reinterpret_cast<int*>(empty + FB_WG_BUFS);
    const int n = (T - 1) / FA_KEYS + 1, blocks = (n - 1) / 2 + 1, heads = gridDim.y * gridDim.z;
    if (threadIdx.x == 0) {
        const int ticket = atomicAdd(sync + heads * n, 1);
        if (ticket == heads * blocks - 1) sync[heads * n] = 0;  // the last ticket drawn: left 0 for the next launch
        *ticket_s = ticket;
    }
    wg_init_barriers(full, empty, FB_WG_BUFS);  // its barrier makes the ticket seen
    const int ticket = *ticket_s, m = ticket / heads, bh = ticket % heads;  // block major: every head's longest first
    const int b = bh / (int)gridDim.y, h = bh - b * (int)gridDim.y;
    const long long in = (long long)b * T * ld_in + (long long)h * d_k;
    const long long out = (long long)b * T * ld_out + (long long)h * d_k;
    const int j0 = 2 * m, k0 = j0 * FA_KEYS;  // the block's first key tile, and its first key
    const int last = (T - 1) / FB_WG_Q, n_steps = last - k0 / FB_WG_Q + 1;  // 32-query steps: the last down to k0
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

    if (wg == 0) {  // ------------------------------------------------ the producer: copy and split Q and dO
        asm volatile("setmaxnreg.dec.sync.aligned.u32 72;" ::: "memory");
        const float *qh = q + in, *doh = d_o + out, *lh = lse + (long long)bh * T, *dh = delta + (long long)bh * T;
        const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 && all_aligned16(qh, doh);
        auto load = [&](int stage, int q0) {
            float* r = raw + stage * FB_WG_RAW;
            fa_wg_load<FB_WG_Q>(r, qh, q0, T, d_k, ld_in, vec, tid);
            fa_wg_load<FB_WG_Q>(r + FB_WG_Q * 64, doh, q0, T, d_k, ld_out, vec, tid);
            if (tid < 2 * FB_WG_Q) {
                const int qi = q0 + tid % FB_WG_Q;
                const float* src = tid < FB_WG_Q ? lh : dh;
                cp_async4(r + 2 * FB_WG_Q * 64 + tid, qi < T ? src + qi : src, qi < T ? 4 : 0);
            }
        };
#pragma unroll
        for (int i = 0; i < FB_WG_RAWS - 1; i++) {
            if (i < n_steps) load(i, (last - i) * FB_WG_Q);
            cp_async_commit();
        }
#pragma unroll 1
        for (int s = 0; s < n_steps; s++) {
            cp_async_wait<FB_WG_RAWS - 2>();  // this thread's copies of step s have landed
            asm volatile("bar.sync 1, 128;" ::: "memory");  // ... every producer's, and all are done splitting s - 1
            const int next = s + FB_WG_RAWS - 1;
            if (next < n_steps) load(next % FB_WG_RAWS, (last - next) * FB_WG_Q);
            cp_async_commit();
            const int buf = s % FB_WG_BUFS;
            mbar_wait(&empty[buf], ((s / FB_WG_BUFS) & 1) ^ 1);  // the consumers are done with its last step
            fb_wg_split(split + buf * FB_WG_BUF, ls + buf * 2 * FB_WG_Q, raw + (s % FB_WG_RAWS) * FB_WG_RAW, tid);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // what was stored, the tensor cores read
            mbar_arrive(&full[buf]);
        }
        return;
    }

    // ---------------------------------------------------------------- the consumers: 64 keys each
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;" ::: "memory");
    const int ctid = threadIdx.x - 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int kw = FA_KEYS * (wg - 1), kw0 = k0 + kw;      // the warpgroup's keys: row kw of ks, key kw0
    const int key_a = kw0 + 16 * warp + g, key_b = key_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    {  // the block's K into ks (cp.async, the consumers' 256 threads), zero past T and d_k
        const float* kh = k + in;
        if (d_k % 4 == 0 && ld_in % 4 == 0 && all_aligned16(kh, kh)) {
#pragma unroll
            for (int i = 0; i < FB_WG_KS / 4 / 256; i++) {
                const int e = ctid + 256 * i, key = e / 16, d = e % 16 * 4;
                const bool ok = k0 + key < T && d < d_k;
                cp_async16(ks + fb_ks_at(key, d), ok ? kh + (long long)(k0 + key) * ld_in + d : kh, ok ? 16 : 0);
            }
        } else {
#pragma unroll 1
            for (int i = 0; i < FB_WG_KS / 256; i++) {
                const int e = ctid + 256 * i, key = e / 64, d = e % 64;
                const bool ok = k0 + key < T && d < d_k;
                cp_async4(ks + fb_ks_at(key, d), ok ? kh + (long long)(k0 + key) * ld_in + d : kh, ok ? 4 : 0);
            }
        }
        cp_async_commit();
    }
    float vf[8][4];  // V's raw A fragments: k8 step kk, (key_a, d 8kk + t), (key_b, ..), (key_a, + 4), (key_b, + 4)
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int key = r % 2 ? key_b : key_a, d = 8 * kk + t + 4 * (r / 2);
            vf[kk][r] = key < T && d < d_k ? v[in + (long long)key * ld_in + d] : 0.0f;
        }
    float acc_k[32], acc_v[32];  // (key_a, d 8 (i / 4) + 2t + i % 2) for i % 4 < 2, else key_b's
#pragma unroll
    for (int i = 0; i < 32; i++) acc_k[i] = 0.0f, acc_v[i] = 0.0f;
    cp_async_wait<0>();  // this thread's copies of K (the first step's barrier: every thread's)
    const uint64_t desc = wg_desc(split);
    int* publish = nullptr;  // consumer thread 0's: the counter of the last 64-query tile added, set once all stored
#pragma unroll 1
    for (int s = 0; s < n_steps; s++) {
        const int h32 = last - s, q0 = h32 * FB_WG_Q, i = h32 / 2;  // 32 queries from q0, of 64-query tile i
        const int buf = s % FB_WG_BUFS;
        // every consumer is done with the last step's dS and its dQ stores (K is in, at the first)
        asm volatile("bar.sync 2, 256;" ::: "memory");
        if (publish != nullptr) {
            __threadfence();
            fa_store_release(publish, m + 1);
            publish = nullptr;
        }
        mbar_wait(&full[buf], (s / FB_WG_BUFS) & 1);
        float part_k[32];  // dK's part of the step, and its split A fragments: in flight through the dQ product
        uint32_t k_hi[4][4], k_lo[4][4];
        float st[16];  // S^T, P^T, then dS^T: (key_a, query q0 + 8 (i / 4) + 2t + i % 2) for i % 4 < 2, else key_b's
        const bool seen = kw0 <= q0 + FB_WG_Q - 1 && kw0 < T;  // a key of the warpgroup's sees a query of the step
        if (seen) {
            const float* l = ls + buf * 2 * FB_WG_Q;
            const uint64_t b0 = desc + buf * FB_WG_BUF / 4;
            const uint64_t qn_hi = b0, qn_lo = b0 + 2 * FB_WG_QN / 4, dn_hi = b0 + 4 * FB_WG_QN / 4,
                           dn_lo = b0 + 6 * FB_WG_QN / 4, qt_hi = b0 + 8 * FB_WG_QN / 4,
                           qt_lo = qt_hi + FB_WG_QT / 4, dt_hi = qt_hi + 2 * FB_WG_QT / 4,
                           dt_lo = qt_hi + 3 * FB_WG_QT / 4;
            // S^T = K Q^T: d 0 .. 31, then 32 .. 63 (the forward's S in the transposed order)
            float part[32];
#pragma unroll
            for (int sl = 0; sl < 2; sl++) {
                float kf[4][4];
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
#pragma unroll
                    for (int r = 0; r < 4; r++)
                        kf[kk][r] = ks[fb_ks_at(kw + 16 * warp + g + 8 * (r % 2), 32 * sl + 8 * kk + t + 4 * (r / 2))];
                if (sl == 0) {
                    fa_wg_slice<0, true>(st, kf, qn_hi, qn_lo);
                } else {
                    float p2[16];
                    fa_wg_slice<0, true>(p2, kf, qn_hi + FB_WG_QN / 4, qn_lo + FB_WG_QN / 4);
#pragma unroll
                    for (int r = 0; r < 16; r++) st[r] += p2[r];
                }
            }
            // P^T = exp(scale S^T - lse), where key <= query < T
#pragma unroll
            for (int r = 0; r < 16; r++) {
                const int c = 8 * (r / 4) + 2 * t + r % 2, qi = q0 + c, key = r % 4 < 2 ? key_a : key_b;
                // _rn: s * scale rounded as the forward rounds it (no FMA with lse)
                st[r] = key <= qi && qi < T ? expf(__fmul_rn(st[r], scale) - l[c]) : 0.0f;
            }
            // st's X^T (P^T, then dS^T) as A fragments (queries 8kb + 2t as logical t, 8kb + 2t + 1 as t + 4)
            auto st_fragments = [&](float(&af)[4][4]) {
#pragma unroll
                for (int kb = 0; kb < 4; kb++) {
                    af[kb][0] = st[4 * kb], af[kb][1] = st[4 * kb + 2];
                    af[kb][2] = st[4 * kb + 1], af[kb][3] = st[4 * kb + 3];
                }
            };
            {  // dV += P^T dO
                float af[4][4];
                st_fragments(af);
                fa_wg_slice<0>(part, af, dt_hi, dt_lo);
#pragma unroll
                for (int r = 0; r < 32; r++) acc_v[r] += part[r];
            }
            // dP^T = V dO^T: d 0 .. 31, then 32 .. 63; dS^T = P^T (dP^T - delta). V's split is made a step's
            // work: hoisted out of the loop, its 64 registers of hi and lo spilled
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
#pragma unroll
                for (int r = 0; r < 4; r++) asm volatile("" : "+f"(vf[kk][r]));
            float dp[16], p2[16];
            fa_wg_slice<0, true>(dp, vf, dn_hi, dn_lo);
            fa_wg_slice<4, true>(p2, vf, dn_hi + FB_WG_QN / 4, dn_lo + FB_WG_QN / 4);
#pragma unroll
            for (int r = 0; r < 16; r++) {
                const int c = 8 * (r / 4) + 2 * t + r % 2;
                st[r] = st[r] * ((dp[r] + p2[r]) - l[FB_WG_Q + c]);
            }
            // dS for dQ (row = query, column = the block's key; a warpgroup that sees no query of the step adds
            // nothing to dQ, which does not read its columns), stored before dK's product: its registers free
#pragma unroll
            for (int r = 0; r < 16; r++)
                ds[(8 * (r / 4) + 2 * t + r % 2) * FB_WG_DS_LD + kw + 16 * warp + g + 8 * ((r % 4) / 2)] = st[r];
            {  // dK += dS^T Q, waited for after the dQ product
                float af[4][4];
                st_fragments(af);
                fa_wg_slice_issue<0>(part_k, k_hi, k_lo, af, qt_hi, qt_lo);
            }
        }
        asm volatile("bar.sync 2, 256;" ::: "memory");  // dS is whole

        // dQ's rows q0 + rq + g (+ 8), columns c0 .. c0 + 15 (warp cw of the 8) += dS K over the block's key tiles
        // in order, after block m - 1's add to tile i: key tile 0 writes, key tile i scales (k_flash_bwd_d64's order)
        const int cw = 4 * (wg - 1) + warp, rq = 16 * (cw % 2), c0 = 16 * (cw / 2);
        const int row_a = q0 + rq + g, row_b = row_a + 8;
        const int tiles = min(2, i - j0 + 1);  // the block's key tiles that see query tile i
        if (q0 + rq < T) {
            float* dq_h = dq + in;
            const bool pairs = d_k % 2 == 0 && aligned8(dq_h, ld_in);  // columns d, d + 1 as one access
            if (m > 0)
                while (fa_load_acquire(sync + bh * n + i) != m) __nanosleep(100);
            float x[2][4];  // the sum so far, loaded before the product, to land while it runs
            if (m > 0)  // rows a and b, columns d and d + 1; past the end, dq_h read in their place (not stored)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int d = c0 + 8 * c + 2 * t;
                    const float* at_a = row_a < T && d < d_k ? dq_h + (long long)row_a * ld_in + d : dq_h;
                    const float* at_b = row_b < T && d < d_k ? dq_h + (long long)row_b * ld_in + d : dq_h;
                    if (pairs) {
                        const float2 a = __ldcg(reinterpret_cast<const float2*>(at_a));
                        const float2 b = __ldcg(reinterpret_cast<const float2*>(at_b));
                        x[c][0] = a.x, x[c][1] = a.y, x[c][2] = b.x, x[c][3] = b.y;
                    } else {
                        const bool d1 = d + 1 < d_k;
                        x[c][0] = __ldcg(at_a), x[c][1] = __ldcg(row_a < T && d1 ? at_a + 1 : dq_h);
                        x[c][2] = __ldcg(at_b), x[c][3] = __ldcg(row_b < T && d1 ? at_b + 1 : dq_h);
                    }
                }
#pragma unroll
            for (int kt = 0; kt < 2; kt++) {
                if (kt >= tiles) break;
                float part[2][4];
                fa_dq_product<FbWgDqLayout, 2>(part, ds + rq * FB_WG_DS_LD + FA_KEYS * kt,
                                                      ks + fb_ks_at(FA_KEYS * kt, 0), c0);
#pragma unroll
                for (int c = 0; c < 2; c++)
#pragma unroll
                    for (int r = 0; r < 4; r++) x[c][r] = m > 0 || kt > 0 ? x[c][r] + part[c][r] : part[c][r];
            }
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int d = c0 + 8 * c + 2 * t;
                if (d >= d_k) continue;
                float2 x_a = make_float2(x[c][0], x[c][1]), x_b = make_float2(x[c][2], x[c][3]);
                if (i < j0 + 2) x_a.x *= scale, x_a.y *= scale, x_b.x *= scale, x_b.y *= scale;  // the block's tile i
                float *at_a = dq_h + (long long)row_a * ld_in + d, *at_b = dq_h + (long long)row_b * ld_in + d;
                if (pairs) {
                    if (row_a < T) __stcg(reinterpret_cast<float2*>(at_a), x_a);
                    if (row_b < T) __stcg(reinterpret_cast<float2*>(at_b), x_b);
                    continue;
                }
                if (row_a < T) __stcg(at_a, x_a.x);
                if (row_b < T) __stcg(at_b, x_b.x);
                if (d + 1 < d_k && row_a < T) __stcg(at_a + 1, x_a.y);
                if (d + 1 < d_k && row_b < T) __stcg(at_b + 1, x_b.y);
            }
        }
        fa_wg_slice_wait(part_k);  // on every path: inside `if (seen)`, ptxas would serialize the wgmmas
        if (seen)
#pragma unroll
            for (int r = 0; r < 32; r++) acc_k[r] += part_k[r];
        mbar_arrive(&empty[buf]);  // its tiles read, and its lse and delta
        // the tile's last step (its lower 32 queries): published at the next step's first barrier, unless this
        // block's key tiles hold the diagonal (the last add: no one waits)
        if (ctid == 0 && h32 % 2 == 0 && i >= j0 + 2) publish = sync + bh * n + i;
    }
    // every consumer's stores are done, and every warp has seen the counters at m (one may still be in its spin
    // until this barrier): the last adds to query tiles j0, j0 + 1 were this block's, their counters back to 0
    asm volatile("bar.sync 2, 256;" ::: "memory");
    if (ctid == 0) {
        if (publish != nullptr) {
            __threadfence();
            fa_store_release(publish, m + 1);
        }
        if (m > 0)
            for (int i = j0; i < min(j0 + 2, n); i++) sync[bh * n + i] = 0;
    }
    dk += in, dv += in;
    const bool pairs = d_k % 2 == 0 && aligned8(dk, ld_in) && aligned8(dv, ld_in);  // columns d, d + 1 as one store
#pragma unroll
    for (int r = 0; r < 32; r += 2) {  // columns d and d + 1 of row key
        const int d = 8 * (r / 4) + 2 * t, key = r % 4 < 2 ? key_a : key_b;
        if (d >= d_k || key >= T) continue;
        float *dk_at = dk + (long long)key * ld_in + d, *dv_at = dv + (long long)key * ld_in + d;
        if (pairs) {
            *reinterpret_cast<float2*>(dk_at) = make_float2(acc_k[r] * scale, acc_k[r + 1] * scale);
            *reinterpret_cast<float2*>(dv_at) = make_float2(acc_v[r], acc_v[r + 1]);
            continue;
        }
        dk_at[0] = acc_k[r] * scale, dv_at[0] = acc_v[r];
        if (d + 1 < d_k) dk_at[1] = acc_k[r + 1] * scale, dv_at[1] = acc_v[r + 1];
    }
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}

// delta of the first FA_DELTA_PASS_TILES query tiles for k_flash_bwd_wg_d64: flash_bwd_delta's sum of p dp, with p
// and dp bit for bit as that kernel recomputes them (S = Q K^T in the wgmma forward's order; dP = dO V^T, whose
// transpose V dO^T it runs with the small terms swapped), so that ds = 0 exactly where p = 1. A block the pass's
// FA_WG_ROWS query rows of head blockIdx.y of batch row blockIdx.z, two warpgroups of 64 rows; K and V of the key
// tiles they see split once into shared memory as they lie (warpgroup 0 K's, 1 V's). It also zeroes those tiles'
// counters (block (0, 0, 0): the ticket too). grid (1, NH, B), FA_DELTA_WG_THREADS threads, FA_DELTA_WG_BYTES of
// shared memory.
extern "C" __global__ void __launch_bounds__(FA_DELTA_WG_THREADS, 1)
    k_flash_bwd_delta_wg_d64(float* delta, int* sync, const float* q, const float* k, const float* v,
                             const float* d_o, const float* lse, int T, int d_k, int ld_in, int ld_out) {
#if WG_AVAILABLE
    static_assert(FA_WG_ROWS == FA_DELTA_PASS_TILES * FA_KEYS, "a block the pass's query tiles");
    static_assert(FA_DELTA_WG_THREADS == 2 * 128, "two warpgroups of 64 rows: K's and V's split");
    constexpr int BUF = 8 * FA_WG_TILE, RAW = FA_KEYS * 64;
    extern __shared__ __align__(1024) float fa_wg_smem[];
    float* split = fa_wg_smem;                          // [key tile][K hi, K lo, V hi, V lo]
    float* raw = split + FA_DELTA_PASS_TILES * BUF;     // [K, V][key tile]
    const int n = (T - 1) / FA_KEYS + 1, tiles = min(n, FA_DELTA_PASS_TILES);
    if (threadIdx.x == 0) {
        for (int i = 0; i < tiles; i++) sync[fa_row(n) + i] = 0;  // (b, h, query tile): the backward's counters
        if (blockIdx.y == 0 && blockIdx.z == 0) sync[n * gridDim.y * gridDim.z] = 0;
    }
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in, d_o += fa_head(T, d_k, ld_out);
    lse += fa_row(T), delta += fa_row(T);
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    {
        const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && all_aligned16(k, v);
        float* mine = raw + wg * FA_DELTA_PASS_TILES * RAW;
        for (int i = 0; i < tiles; i++) fa_wg_load<FA_KEYS>(mine + i * RAW, wg ? v : k, i * FA_KEYS, T, d_k, ld_in,
                                                            vec, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();  // every thread's copies have landed
        for (int i = 0; i < tiles; i++) fa_wg_split_rows(split + i * BUF + 4 * wg * FA_WG_TILE, mine + i * RAW, tid);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // what was stored, the tensor cores read
    }
    __syncthreads();
    const int first = FA_KEYS * wg;  // the warpgroup's rows: it sees key tiles 0 .. wg
    if (first >= T) return;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int row_a = first + 16 * warp + g, row_b = row_a + 8;
    const float scale = 1.0f / sqrtf((float)d_k);
    float qf[8][4], df[8][4];  // Q's and dO's raw A fragments, as k_flash_fwd_wg_d64 reads Q
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = r % 2 ? row_b : row_a, d = 8 * kk + t + 4 * (r / 2);
            const bool ok = row < T && d < d_k;
            qf[kk][r] = ok ? q[(long long)row * ld_in + d] : 0.0f;
            df[kk][r] = ok ? d_o[(long long)row * ld_out + d] : 0.0f;
        }
    const float lse_a = row_a < T ? lse[row_a] : 0.0f, lse_b = row_b < T ? lse[row_b] : 0.0f;
    float delta_a = 0.0f, delta_b = 0.0f;
    const uint64_t desc = wg_desc(split);
    for (int kt = 0; kt <= wg && kt < tiles; kt++) {
        const uint64_t k_hi = desc + kt * BUF / 4, k_lo = k_hi + 2 * FA_WG_TILE / 4;
        const uint64_t v_hi = k_hi + 4 * FA_WG_TILE / 4, v_lo = k_hi + 6 * FA_WG_TILE / 4;
        float s[32], dp[32], part[32];
        fa_wg_slice<0>(s, qf, k_hi, k_lo);  // S = Q K^T: d 0 .. 31, then 32 .. 63
        fa_wg_slice<4>(part, qf, k_hi + FA_WG_TILE / 4, k_lo + FA_WG_TILE / 4);
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] += part[i];
        fa_wg_slice<0>(dp, df, v_hi, v_lo);  // dP = dO V^T, likewise
        fa_wg_slice<4>(part, df, v_hi + FA_WG_TILE / 4, v_lo + FA_WG_TILE / 4);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int key = FA_KEYS * kt + 8 * (i / 4) + 2 * t + i % 2;
            const bool b = i % 4 >= 2;
            // _rn: s * scale rounded as the backward rounds it (no FMA with lse)
            const float p = key <= (b ? row_b : row_a) && key < T
                                ? expf(__fmul_rn(s[i], scale) - (b ? lse_b : lse_a)) : 0.0f;
            if (b) delta_b += p * (dp[i] + part[i]);
            else delta_a += p * (dp[i] + part[i]);
        }
    }
    delta_a = quad_sum(delta_a), delta_b = quad_sum(delta_b);
    if (t == 0) {
        if (row_a < T) delta[row_a] = delta_a;
        if (row_b < T) delta[row_b] = delta_b;
    }
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}
