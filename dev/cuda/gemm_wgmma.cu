// Prototype: the 3xTF32 product on Hopper's warpgroup MMA (wgmma, sm_90a), to compare with the mma.sync
// kernel of cuda/matmul_tc.cuh. C = op(A) @ op(B), A stored M x K (K-contiguous) or K x M, B stored N x K or
// K x N. Built and checked by dev/matmul_tc.py (--wgmma).
//
// A block (two warpgroups, 256 threads) computes a 128 x 128 tile of C, each warpgroup 64 x 128 with
// wgmma.m64n128k8. Per BK = 32 slice of K: cp.async copies the raw tiles into shared memory as they lie in
// global memory (two stages); every thread then splits its share into TF32 hi and lo parts, written K-major
// with the 128-byte swizzle that the wgmma descriptors read (two buffers, so that the split of one slice
// runs while the tensor cores multiply the previous one); the slice's 12 wgmmas (4 k8 steps x lo*hi, hi*lo,
// hi*hi) sum into a fragment that FP32 adds then carry into the running sum.
#include <cstdint>

#define WG_BM 128
#define WG_BN 128
#define WG_BK 32
#define WG_THREADS 256

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, int bytes) {
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(bytes));
}

// Raw tile as in global memory: ROWS x COLS, COLS contiguous (K-contiguous: 128 x 32; else 32 x 128).
template <bool K_CONTIGUOUS>
struct Raw {
    static constexpr int ROWS = K_CONTIGUOUS ? 128 : WG_BK, COLS = K_CONTIGUOUS ? WG_BK : 128;
    static constexpr int LD = COLS + 4;
    static constexpr int FLOATS = ROWS * LD;
    __device__ static void load(float* s, const float* p, int ld, int r0, int c0, int row_end, int col_end) {
        for (int e = threadIdx.x; e < ROWS * COLS / 4; e += WG_THREADS) {
            const int r = e / (COLS / 4), c = (e % (COLS / 4)) * 4;
            const int row = r0 + r, col = c0 + c;
            const int n = row < row_end ? max(0, min(4, col_end - col)) : 0;
            cp_async16(s + r * LD + c, n > 0 ? p + (long long)row * ld + col : p, 4 * n);
        }
    }
    // element (mn, k) of the slice: row mn of the K-major view
    __device__ static float4 k_quad(const float* s, int mn, int k4) {
        if (K_CONTIGUOUS) return *reinterpret_cast<const float4*>(s + mn * LD + k4);
        return make_float4(s[k4 * LD + mn], s[(k4 + 1) * LD + mn], s[(k4 + 2) * LD + mn], s[(k4 + 3) * LD + mn]);
    }
};

// 128 rows x 32 floats, K-major, 128-byte rows, the 16-byte chunk c of row r stored at chunk c ^ (r % 8)
__device__ __forceinline__ int swizzled(int r, int k4) { return r * 32 + (((k4 >> 2) ^ (r & 7)) << 2); }

__device__ __forceinline__ uint32_t hi_bits(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

__device__ __forceinline__ void split_store(float* hi, float* lo, int at, float4 v) {
    uint4 h = make_uint4(hi_bits(v.x), hi_bits(v.y), hi_bits(v.z), hi_bits(v.w));
    float4 l = make_float4(v.x - __uint_as_float(h.x), v.y - __uint_as_float(h.y), v.z - __uint_as_float(h.z),
                           v.w - __uint_as_float(h.w));
    *reinterpret_cast<uint4*>(hi + at) = h;
    *reinterpret_cast<float4*>(lo + at) = l;
}

// K-major, 128B swizzle; stride between 8-row groups 1024 bytes
__device__ __forceinline__ uint64_t desc(const float* tile) {
    uint64_t addr = static_cast<uint64_t>(__cvta_generic_to_shared(tile));
    return ((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_128(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

template <bool TA, bool TB>
__device__ __forceinline__ void gemm_wg(float* C, const float* A, const float* B, int M, int N, int K) {
    using RawA = Raw<!TA>;
    using RawB = Raw<TB>;
    constexpr int SPLIT = 128 * 32;  // floats of one split tile
    extern __shared__ __align__(1024) float smem[];
    float* split = smem;                          // [2 buffers][A hi, A lo, B hi, B lo][128 x 32], 1024-aligned
    float* raw_a = smem + 2 * 4 * SPLIT;          // [2 stages][RawA::FLOATS]
    float* raw_b = raw_a + 2 * RawA::FLOATS;      // [2 stages][RawB::FLOATS]
    const int m0 = blockIdx.y * WG_BM, n0 = blockIdx.x * WG_BN;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int n_tiles = (K + WG_BK - 1) / WG_BK;

    auto load = [&](int stage, int k0) {
        float *ra = raw_a + stage * RawA::FLOATS, *rb = raw_b + stage * RawB::FLOATS;
        if (TA) RawA::load(ra, A, M, k0, m0, K, M);
        else RawA::load(ra, A, K, m0, k0, M, K);
        if (TB) RawB::load(rb, B, K, n0, k0, N, K);
        else RawB::load(rb, B, N, k0, n0, K, N);
        asm volatile("cp.async.commit_group;");
    };
    // thread's share: 4 quads of A and 4 of B; rows mn = e / 8 (K-contiguous order) or e % 128 (M/N-contiguous)
    auto split_slice = [&](int stage, int buf) {
        const float *ra = raw_a + stage * RawA::FLOATS, *rb = raw_b + stage * RawB::FLOATS;
        float* s = split + buf * 4 * SPLIT;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int e = tid + q * WG_THREADS;
            const int mn_a = TA ? e % 128 : e / 8, k4_a = TA ? (e / 128) * 4 : (e % 8) * 4;
            const int mn_b = TB ? e / 8 : e % 128, k4_b = TB ? (e % 8) * 4 : (e / 128) * 4;
            split_store(s, s + SPLIT, swizzled(mn_a, k4_a), RawA::k_quad(ra, mn_a, k4_a));
            split_store(s + 2 * SPLIT, s + 3 * SPLIT, swizzled(mn_b, k4_b), RawB::k_quad(rb, mn_b, k4_b));
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the tensor cores read what was stored
    };

    float acc[64], part[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f, part[i] = 0.0f;

    load(0, 0);
    for (int kt = 0; kt < n_tiles; kt++) {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        if (kt + 1 < n_tiles) load((kt + 1) % 2, (kt + 1) * WG_BK);
        split_slice(kt % 2, kt % 2);
        if (kt > 0) {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
            for (int i = 0; i < 64; i++) acc[i] += part[i];
        }
        __syncthreads();
        const float* s = split + (kt % 2) * 4 * SPLIT;
        const float *a_hi = s + wg * 64 * 32, *a_lo = s + SPLIT + wg * 64 * 32, *b_hi = s + 2 * SPLIT,
                    *b_lo = s + 3 * SPLIT;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK; kk += 8) {
            wgmma_128(part, desc(a_lo + kk), desc(b_hi + kk), kk > 0);
            wgmma_128(part, desc(a_hi + kk), desc(b_lo + kk), 1);
            wgmma_128(part, desc(a_hi + kk), desc(b_hi + kk), 1);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] += part[i];

    // fragment i: n8 block i / 4, rows g and g + 8 (i % 4 / 2), columns 2t and 2t + 1 (i % 2)
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int m = m0 + wg * 64 + warp * 16 + g + 8 * ((i % 4) / 2);
        const int n = n0 + (i / 4) * 8 + 2 * t + i % 2;
        if (m < M && n < N) C[(long long)m * N + n] = acc[i];
    }
}

#define WG_KERNEL(name, TA, TB)                                                                             \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)                                             \
    name(float* C, const float* A, const float* B, int M, int N, int K) {                                   \
        gemm_wg<TA, TB>(C, A, B, M, N, K);                                                                  \
    }
WG_KERNEL(k_gemm_wg_nn, false, false)
WG_KERNEL(k_gemm_wg_nt, false, true)
WG_KERNEL(k_gemm_wg_tn, true, false)
WG_KERNEL(k_gemm_wg_tt, true, true)
