// What the wgmma product's split and its consumers' waits cost it. dev/NOTES.md found the producer warpgroup
// (copy, split, swizzle) the kernel's bottleneck, and every block splits its tiles afresh: a 128-row slice of A
// once for each of the N / 128 column tiles (24 times in mlp.fc's forward), a slice of B once for each of the
// M / 128 row tiles (64 times at B*T = 8192). Against the engine's k_gemm_wg_nt / _nn, at the model's shapes:
//   - k_gemm_lean_* / k_gemm_lean2_*: the engine's product as it is (the producer copies raw slices and splits
//     them), its producer's addresses written as one base and constant offsets: 145 registers where the engine
//     takes 158-168; lean2 with two fragments a consumer (slice k + 1's wgmmas issued before slice k's are added),
//     the registers moved to the consumers by setmaxnreg (producer 72, consumers 216). What two fragments are
//     worth with no pass before the product;
//   - k_gemm_ps_b: B arrives split (a weight: split, and transposed to K-major where the product reads it N-major,
//     once a step after AdamW, 2-9 MB), A is copied and split by the producer as in the engine; every product
//     whose B is a weight (the forwards and the dX products, two thirds of the step's FLOPs) could take it with
//     no pass over an activation;
//   - k_gemm_ps_ab (now the engine's k_gemm_wg_split, run here as "split A and B"), k_gemm_ps_ab2: both arrive
//     split and the producer only copies (3 stages of 64 KB); ab2 with two fragments (producer 40, consumers
//     232). The bound for a product fed split operands, to be weighed against the split passes it needs (timed
//     here too).
// All run the engine's wgmmas on the engine's hi and lo in the engine's order, so C must be the engine's bits
// (checked, on fresh inputs and a poisoned C, at odd shapes as well). The split operands are padded with zeros
// to whole tiles (rows to 128, K to 32), as the engine's copies zero-fill, so the main loop checks no bounds.
//
//     nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I cuda -o /tmp/gemm_presplit \
//         dev/cuda/gemm_presplit.cu && /tmp/gemm_presplit
//
// H200, 2026-12-01 (dev/NOTES.md has the table): every kernel the engine's bits at every shape. A and B split:
// 1.33-1.93x the engine's kernel (95-122 TFLOP/s), 1.2-1.6x with a split pass for each operand; B alone 1.09-1.21x;
// the lean producer 1.02-1.10x (0.91x on lm_head's unaligned dX); two fragments no faster than one, either way.
// Taken into the engine as k_gemm_wg_split and the k_tf32_split passes. Written while no GPU was lent; a
// reviewing helper's model of the barriers (1 to 12 slices, random thread orders) found no deadlock, no stage
// overwritten while read and no stale slice, and its run found the lean2 kernel's first register split hanging.
//
// Two fragments, which the first try (2026-11-30, in the engine) found slower because ptxas spilled and serialized
// the wgmmas (C7514), compile cleanly here (ptxas -v): setmaxnreg is honoured once each warpgroup's part is one
// branch of an if / else; the producer fits its share once its copies' addresses are one base and constant
// offsets (an address held for each copy spilled at 40-128 registers: the engine's producer under setmaxnreg
// spills 76-640 bytes in its 128-wide kernels at every split of the 64K tried); and the wgmmas stay asynchronous
// once every way out of the consumers' loop waits for all groups (a loop leaving by its own condition with a
// group in flight gave C7517 and C7514).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "tf32_split.cuh"  // the split passes (and matmul_tc.cuh)

#include "probe.cuh"  // CK, time_graph_ms

// k_gemm_ps_ab2's stages and shared memory are k_gemm_wg_split's (WG_SPLIT_STAGES, TC_SPLIT_SMEM_BYTES): its producer
// is the engine's wg_copy_split_slices. k_gemm_ps_b's raw stages:
constexpr int PS_STAGES = 3;
constexpr int PS_B_SMEM = WG_BUFS * 2 * WG_SPLIT * 4 + PS_STAGES * 3 * WG_SPLIT * 4 + 2 * WG_BUFS * 8;
static_assert(PS_B_SMEM <= 227 * 1024, "shared memory");

// The split passes: the engine's k_tf32_split and k_tf32_split_t (cuda/tf32_split.cuh), this probe's first ones.

// ---------------------------------------------------------------------------------------------- the products
// copy_split_slice: the engine's (cuda/matmul_tc.cuh), which this probe's first version was.

// A slice's tiles' descriptors, and the barrier to arrive on once it is multiplied. The slice's wgmmas, the add
// after a full wait and the store are the engine's (wg_slice_products, wg_add_slice, wg_store).
struct SliceDescs {
    uint64_t a_hi, a_lo, b_hi, b_lo, *empty;
};
__device__ __forceinline__ void slice_products(float (&part)[64], const SliceDescs& d) {
    wg_slice_products(part, d.a_hi, d.a_lo, d.b_hi, d.b_lo);
}

// wg_add_slice without its wait: the two-fragment consumer waits for one group of two, not for all
__device__ __forceinline__ void add_fragment(float (&acc)[64], float (&part)[64], uint64_t* empty) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(part[i])::"memory");  // read only after the wait
    mbar_arrive(empty);
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] += part[i];
}

// The engine's consumer: one fragment, each slice's wgmmas waited for before its add.
template <class Slice>
__device__ __forceinline__ void consume(float (&acc)[64], int n_tiles, Slice slice) {
    float part[64];
    for (int kt = 0; kt < n_tiles; kt++) {
        const SliceDescs d = slice(kt);  // waits for the slice
        slice_products(part, d);
        wg_add_slice(acc, part, d.empty);
    }
}

// Two fragments: slice kt + 1's wgmmas are issued before slice kt's are waited for and added, so that the tensor
// cores have the next group while the FP32 adds run. The same adds in the same order: the same bits.
template <class Slice>
__device__ __forceinline__ void consume2(float (&acc)[64], int n_tiles, Slice slice) {
    if (n_tiles <= 0) return;
    float p0[64], p1[64];
    SliceDescs d0 = slice(0), d1;
    slice_products(p0, d0);
    // p0 holds slice kt, in flight, at the top of each turn; every way out waits for all groups first (a loop
    // leaving by its own condition with a group in flight made ptxas wait after every wgmma: C7514)
    for (int kt = 0;; kt += 2) {
        if (kt + 1 == n_tiles) {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            add_fragment(acc, p0, d0.empty);
            break;
        }
        d1 = slice(kt + 1);
        slice_products(p1, d1);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // slice kt's group
        add_fragment(acc, p0, d0.empty);
        if (kt + 2 == n_tiles) {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            add_fragment(acc, p1, d1.empty);
            break;
        }
        d0 = slice(kt + 2);
        slice_products(p0, d0);
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // slice kt + 1's group
        add_fragment(acc, p1, d1.empty);
    }
}

// C (M x N) = A @ B^T from split A (M_pad x K_pad) and split B (N_pad x K_pad), as the engine's k_gemm_wg_split (the
// same producer) with two-fragment consumers, the registers moved to them (setmaxnreg: 128 x 40 + 256 x 232;
// ptxas honours it only where each warpgroup's part is one branch of a single if/else, and says so when not).
// setmaxnreg moves registers within the block's pool, which is what the launch got at entry: 168 a thread (64K
// over 384 threads, rounded down to 8), so 64,512 in all, not 65,536. Asked for more, a consumer warp waits in
// setmaxnreg.inc forever (the first run of k_gemm_lean2_* at 80 / 216 hung).
constexpr int WG_REG_POOL = TC_WG_THREADS * (65536 / TC_WG_THREADS / 8 * 8);
constexpr int PS_PRODUCER_REGS = 40, PS_CONSUMER_REGS = 232;
static_assert(WG_PRODUCERS * PS_PRODUCER_REGS + (TC_WG_THREADS - WG_PRODUCERS) * PS_CONSUMER_REGS <= WG_REG_POOL,
              "regs");
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_ps_ab2(float* C, const uint32_t* a_hi, const uint32_t* a_lo, const uint32_t* b_hi, const uint32_t* b_lo,
                  int M, int N, int K_pad, int ldc) {
    extern __shared__ __align__(1024) float ps_smem[];
    float* stage = ps_smem;  // [WG_SPLIT_STAGES][A hi, A lo, B hi, B lo][128 x 32]
    uint64_t* full = reinterpret_cast<uint64_t*>(ps_smem + WG_SPLIT_STAGES * 4 * WG_SPLIT);
    uint64_t* empty = full + WG_SPLIT_STAGES;
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128, n_tiles = K_pad / WG_BK;
    if (threadIdx.x == 0)
        for (int s = 0; s < WG_SPLIT_STAGES; s++) {
            mbar_init(&full[s], WG_PRODUCERS);
            mbar_init(&empty[s], TC_WG_THREADS - WG_PRODUCERS);
        }
    __syncthreads();
    if (threadIdx.x < WG_PRODUCERS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(PS_PRODUCER_REGS));
        wg_copy_split_slices(stage, full, empty, a_hi, a_lo, b_hi, b_lo, m0, n0, K_pad, n_tiles);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(PS_CONSUMER_REGS));
        const uint64_t d = wg_desc(stage);
        const int half = threadIdx.x / 128 - 1;
        auto slice = [&](int kt) {
            const int s = kt % WG_SPLIT_STAGES;
            mbar_wait(&full[s], (kt / WG_SPLIT_STAGES) & 1);
            SliceDescs r;
            r.a_hi = d + (s * 4 * WG_SPLIT + half * 64 * WG_BK) / 4, r.a_lo = r.a_hi + WG_SPLIT / 4;
            r.b_hi = d + (s * 4 + 2) * WG_SPLIT / 4, r.b_lo = r.b_hi + WG_SPLIT / 4;
            r.empty = &empty[s];
            return r;
        };
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        consume2(acc, n_tiles, slice);
        wg_store(C, acc, m0 + half * 64, n0, M, N, ldc, nullptr, 1.0f, 0.0f, CAUSAL_NONE, 0.0f);
    }
}

// C (M x N) = A @ B^T from A as it lies (M x K, lda, K-contiguous: the engine's NN and NT products) and split B
// (N_pad x K_pad). The producer copies A raw and B split into raw stage kt % S, splits A into buffer kt % 2 as the
// engine does, and copies slice kt + S - 1 once the consumers are done with slice kt - 1 (whose B it overwrites).
extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)
    k_gemm_ps_b(float* C, const float* A, const uint32_t* b_hi, const uint32_t* b_lo, int M, int N, int K, int lda,
                int K_pad, int ldc) {
    using RawA = TcTile<true, 128, WG_BK, 0>;
    static_assert(RawA::FLOATS == WG_SPLIT, "a raw A slice is a tile");
    extern __shared__ __align__(1024) float psb_smem[];
    float* split = psb_smem;                             // [WG_BUFS][A hi, A lo]
    float* raw = psb_smem + WG_BUFS * 2 * WG_SPLIT;      // [PS_STAGES][A raw, B hi, B lo]
    uint64_t* full = reinterpret_cast<uint64_t*>(raw + PS_STAGES * 3 * WG_SPLIT);
    uint64_t* empty = full + WG_BUFS;
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128, n_tiles = K_pad / WG_BK;
    if (threadIdx.x == 0)
        for (int b = 0; b < WG_BUFS; b++) {
            mbar_init(&full[b], WG_PRODUCERS);
            mbar_init(&empty[b], TC_WG_THREADS - WG_PRODUCERS);
        }
    __syncthreads();
    if (threadIdx.x < WG_PRODUCERS) {
        const int tid = threadIdx.x;
        const bool vec_a = aligned16(A, lda);
        auto load = [&](int j) {
            float* r = raw + (j % PS_STAGES) * 3 * WG_SPLIT;
            RawA::template load<WG_PRODUCERS>(r, A, lda, m0, j * WG_BK, M, K, vec_a, tid);
            copy_split_slice(r + WG_SPLIT, b_hi, n0, K_pad, j * WG_BK, tid);
            copy_split_slice(r + 2 * WG_SPLIT, b_lo, n0, K_pad, j * WG_BK, tid);
        };
#pragma unroll
        for (int i = 0; i < PS_STAGES - 1; i++) {
            if (i < n_tiles) load(i);
            cp_async_commit();
        }
        for (int kt = 0; kt < n_tiles; kt++) {
            cp_async_wait<PS_STAGES - 2>();
            asm volatile("bar.sync 1, %0;" ::"n"(WG_PRODUCERS) : "memory");  // every producer's copies; split kt-1 done
            const int buf = kt % WG_BUFS;
            mbar_wait(&empty[buf], ((kt / WG_BUFS) & 1) ^ 1);  // the consumers are done with slice kt - 2
            const float* ra = raw + (kt % PS_STAGES) * 3 * WG_SPLIT;
            float* s = split + buf * 2 * WG_SPLIT;
#pragma unroll
            for (int q = 0; q < 128 * WG_BK / 4 / WG_PRODUCERS; q++) {
                const int e = tid + q * WG_PRODUCERS, mn = e / 8, k4 = (e % 8) * 4;
                tf32_split_store(s, s + WG_SPLIT, wg_swizzled(mn, k4), RawA::k_quad(ra, mn, k4));
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the split, and B's landed copies
            mbar_arrive(&full[buf]);
            const int next = kt + PS_STAGES - 1;
            if (next < n_tiles) {
                if (kt >= 1) mbar_wait(&empty[(kt - 1) % WG_BUFS], ((kt - 1) / WG_BUFS) & 1);  // slice kt-1's B read
                load(next);
            }
            cp_async_commit();
        }
        return;
    }
    const uint64_t d_split = wg_desc(split), d_raw = wg_desc(raw);
    const int half = threadIdx.x / 128 - 1;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    consume(acc, n_tiles, [&](int kt) {
        const int buf = kt % WG_BUFS, s = kt % PS_STAGES;
        mbar_wait(&full[buf], (kt / WG_BUFS) & 1);
        SliceDescs r;
        r.a_hi = d_split + (buf * 2 * WG_SPLIT + half * 64 * WG_BK) / 4, r.a_lo = r.a_hi + WG_SPLIT / 4;
        r.b_hi = d_raw + (s * 3 + 1) * WG_SPLIT / 4, r.b_lo = r.b_hi + WG_SPLIT / 4;
        r.empty = &empty[buf];
        return r;
    });
    wg_store(C, acc, m0 + half * 64, n0, M, N, ldc, nullptr, 1.0f, 0.0f, CAUSAL_NONE, 0.0f);
}

// ---------------------------------------------------------------------------------------------- the engine, lean
// The engine's product as it is (raw copies, the split by the producer, WG_BUFS split buffers), A K-contiguous (its
// NN and NT products), with the producer's addresses written out: each thread's copies and split quads are rows
// tid / 8 + 16 q (or tid / 32 + 4 q) of one base address, where the engine's loops over e = tid + 128 q divide e
// by the row's chunks (signed: the compiler cannot take tid's rows out of the division), and ptxas holds an
// address a copy. Tiles at the matrices' edges, and unaligned rows, take the engine's TcTile::load. TWO: the
// two-fragment consumers, registers moved by setmaxnreg (LEAN_PRODUCER_REGS / LEAN_CONSUMER_REGS).
#ifndef LEAN_PRODUCER_REGS
#define LEAN_PRODUCER_REGS 72
#endif
#ifndef LEAN_CONSUMER_REGS
#define LEAN_CONSUMER_REGS 216
#endif
static_assert(WG_PRODUCERS * LEAN_PRODUCER_REGS + (TC_WG_THREADS - WG_PRODUCERS) * LEAN_CONSUMER_REGS <= WG_REG_POOL,
              "regs");

// 128 x 32 of a K-contiguous operand (rows r0.., columns c0..) raw into s (rows of 32): chunk tid % 8 of rows
// tid / 8 + 16 i
__device__ __forceinline__ void lean_load_k(float* s, const float* p, int ld, int r0, int c0, int row_end,
                                            int col_end, bool vec, int tid) {
    if (vec && r0 + 128 <= row_end && c0 + WG_BK <= col_end) {
        const int r = tid >> 3, c = (tid & 7) * 4;
        const float* from = p + (long long)(r0 + r) * ld + c0 + c;
        float* to = s + r * WG_BK + c;
        const long long step = 16LL * ld;
#pragma unroll
        for (int i = 0; i < 8; i++) cp_async16(to + i * 16 * WG_BK, from + i * step, 16);
    } else {
        TcTile<true, 128, WG_BK, 0>::template load<WG_PRODUCERS>(s, p, ld, r0, c0, row_end, col_end, vec, tid);
    }
}

// 32 x 128 of an N-contiguous operand (rows k0.. along K, columns n0..) raw into s (rows of 128): chunk tid % 32
// of rows tid / 32 + 4 i
__device__ __forceinline__ void lean_load_n(float* s, const float* p, int ld, int k0, int n0, int k_end, int n_end,
                                            bool vec, int tid) {
    if (vec && k0 + WG_BK <= k_end && n0 + 128 <= n_end) {
        const int r = tid >> 5, c = (tid & 31) * 4;
        const float* from = p + (long long)(k0 + r) * ld + n0 + c;
        float* to = s + r * 128 + c;
        const long long step = 4LL * ld;
#pragma unroll
        for (int i = 0; i < 8; i++) cp_async16(to + i * 4 * 128, from + i * step, 16);
    } else {
        TcTile<false, 128, WG_BK, 0>::template load<WG_PRODUCERS>(s, p, ld, k0, n0, k_end, n_end, vec, tid);
    }
}

// A raw K-contiguous 128 x 32 slice split into the swizzled hi and lo tiles: quads (tid / 8 + 16 q, 4 (tid % 8))
__device__ __forceinline__ void lean_split_k(float* hi, const float* raw, int tid) {
    const int r = tid >> 3, k4 = (tid & 7) * 4, at = wg_swizzled(r, k4);
    const float* from = raw + r * WG_BK + k4;
#pragma unroll
    for (int q = 0; q < 8; q++)
        tf32_split_store(hi, hi + WG_SPLIT, at + q * 16 * WG_BK, *reinterpret_cast<const float4*>(from + q * 16 * WG_BK));
}

// A raw N-contiguous 32 x 128 slice (B of an NN product) split K-major: quads (tid, 4 q), four rows of raw apart
__device__ __forceinline__ void lean_split_n(float* hi, const float* raw, int tid) {
    const float* from = raw + tid;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const float* f = from + 4 * q * 128;
        tf32_split_store(hi, hi + WG_SPLIT, tid * WG_BK + ((q ^ (tid & 7)) << 2),
                         make_float4(f[0], f[128], f[256], f[384]));
    }
}

template <bool TB, bool TWO>
__device__ __forceinline__ void gemm_lean(float* C, const float* A, const float* B, int M, int N, int K, int lda,
                                          int ldb, int ldc) {
    extern __shared__ __align__(1024) float lean_smem[];
    constexpr int RAW = 2 * WG_SPLIT;  // A raw, B raw: 128 x 32 and 128 x 32 (or 32 x 128)
    float* split = lean_smem;                            // [WG_BUFS][A hi, A lo, B hi, B lo]
    float* raw = lean_smem + WG_BUFS * 4 * WG_SPLIT;     // [WG_RAW][A raw, B raw]
    uint64_t* full = reinterpret_cast<uint64_t*>(raw + WG_RAW * RAW);
    uint64_t* empty = full + WG_BUFS;
    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128, n_tiles = (K + WG_BK - 1) / WG_BK;
    if (threadIdx.x == 0)
        for (int b = 0; b < WG_BUFS; b++) {
            mbar_init(&full[b], WG_PRODUCERS);
            mbar_init(&empty[b], TC_WG_THREADS - WG_PRODUCERS);
        }
    __syncthreads();
    if (threadIdx.x < WG_PRODUCERS) {
        if (TWO) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(LEAN_PRODUCER_REGS));
        const int tid = threadIdx.x;
        const bool vec_a = aligned16(A, lda), vec_b = aligned16(B, ldb);
        auto load = [&](int stage, int k0) {
            float *ra = raw + stage * RAW, *rb = ra + WG_SPLIT;
            lean_load_k(ra, A, lda, m0, k0, M, K, vec_a, tid);
            if (TB) lean_load_k(rb, B, ldb, n0, k0, N, K, vec_b, tid);
            else lean_load_n(rb, B, ldb, k0, n0, K, N, vec_b, tid);
        };
#pragma unroll
        for (int i = 0; i < WG_RAW - 1; i++) {
            if (i < n_tiles) load(i, i * WG_BK);
            cp_async_commit();
        }
        for (int kt = 0; kt < n_tiles; kt++) {  // the engine's order
            cp_async_wait<WG_RAW - 2>();
            asm volatile("bar.sync 1, %0;" ::"n"(WG_PRODUCERS) : "memory");
            const int next = kt + WG_RAW - 1;
            if (next < n_tiles) load(next % WG_RAW, next * WG_BK);
            cp_async_commit();
            const int buf = kt % WG_BUFS;
            mbar_wait(&empty[buf], ((kt / WG_BUFS) & 1) ^ 1);
            const float* ra = raw + (kt % WG_RAW) * RAW;
            float* s = split + buf * 4 * WG_SPLIT;
            lean_split_k(s, ra, tid);
            if (TB) lean_split_k(s + 2 * WG_SPLIT, ra + WG_SPLIT, tid);
            else lean_split_n(s + 2 * WG_SPLIT, ra + WG_SPLIT, tid);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mbar_arrive(&full[buf]);
        }
    } else {
        if (TWO) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(LEAN_CONSUMER_REGS));
        const uint64_t d = wg_desc(split);
        const int half = threadIdx.x / 128 - 1;
        auto slice = [&](int kt) {
            const int buf = kt % WG_BUFS;
            mbar_wait(&full[buf], (kt / WG_BUFS) & 1);
            SliceDescs r;
            r.a_hi = d + (buf * 4 * WG_SPLIT + half * 64 * WG_BK) / 4, r.a_lo = r.a_hi + WG_SPLIT / 4;
            r.b_hi = d + (buf * 4 + 2) * WG_SPLIT / 4, r.b_lo = r.b_hi + WG_SPLIT / 4;
            r.empty = &empty[buf];
            return r;
        };
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        if (TWO)
            consume2(acc, n_tiles, slice);
        else
            consume(acc, n_tiles, slice);
        wg_store(C, acc, m0 + half * 64, n0, M, N, ldc, nullptr, 1.0f, 0.0f, CAUSAL_NONE, 0.0f);
    }
}

#define LEAN_KERNEL(name, TB, TWO)                                                                             \
    extern "C" __global__ void __launch_bounds__(TC_WG_THREADS, 1)                                             \
        name(float* C, const float* A, const float* B, int M, int N, int K, int lda, int ldb, int ldc) {       \
        gemm_lean<TB, TWO>(C, A, B, M, N, K, lda, ldb, ldc);                                                    \
    }
LEAN_KERNEL(k_gemm_lean_nt, true, false)
LEAN_KERNEL(k_gemm_lean_nn, false, false)
LEAN_KERNEL(k_gemm_lean2_nt, true, true)
LEAN_KERNEL(k_gemm_lean2_nn, false, true)

// ---------------------------------------------------------------------------------------------- the harness
static cudaEvent_t e0, e1;

template <class F>
static float time_ms(F f, int iters = 20) {
    for (int i = 0; i < 3; i++) f();
    CK(cudaGetLastError());
    float best = 1e30f;
    for (int set = 0; set < 3; set++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < iters; i++) f();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms / iters);
    }
    return best;
}

static std::vector<float> host(const float* d, size_t n) {
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

struct Shape {
    const char* name;
    int M, N, K;
    bool b_n_major;  // B given K x N (the engine's NN: a dX product's W), else N x K (NT: a forward's W)
    bool timed;
};

static int failures = 0;

static void run(const Shape& s) {
    const int M = s.M, N = s.N, K = s.K;
    const int M_pad = (M + 127) / 128 * 128, N_pad = (N + 127) / 128 * 128, K_pad = (K + WG_BK - 1) / WG_BK * WG_BK;
    constexpr int V = 6;  // the engine, its lean producer (one fragment, two), then the three fed split operands
    const char* names[V] = {"engine", "lean", "lean, two fragments", "split B", "split A and B",
                            "split A and B, two fragments"};
    float *A, *B, *C[V];
    uint32_t *ahi, *alo, *bhi, *blo;
    CK(cudaMalloc(&A, (size_t)M * K * 4));
    CK(cudaMalloc(&B, (size_t)N * K * 4));
    for (auto& c : C) CK(cudaMalloc(&c, (size_t)M * N * 4));
    // each operand's hi then lo, as the engine's k_gemm_wg_split reads them
    CK(cudaMalloc(&ahi, 2 * (size_t)M_pad * K_pad * 4));
    CK(cudaMalloc(&bhi, 2 * (size_t)N_pad * K_pad * 4));
    alo = ahi + (size_t)M_pad * K_pad, blo = bhi + (size_t)N_pad * K_pad;
    std::vector<float> ha((size_t)M * K), hb((size_t)N * K);
    for (auto& v : ha) v = (float)rand() / RAND_MAX * 2 - 1;
    for (auto& v : hb) v = (float)rand() / RAND_MAX * 2 - 1;
    CK(cudaMemcpy(A, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
    const int ldb = s.b_n_major ? N : K;
    auto split_a = [&] {
        const long long quads = (long long)M_pad * K_pad / 4;
        k_tf32_split<<<(unsigned)((quads + 255) / 256), 256>>>(ahi, alo, A, M, K, K, K_pad, quads);
    };
    auto split_b = [&] {
        if (s.b_n_major) {
            k_tf32_split_t<<<dim3(K_pad / 32, N_pad / 32), 256>>>(bhi, blo, B, N, K, ldb, K_pad);
        } else {
            const long long quads = (long long)N_pad * K_pad / 4;
            k_tf32_split<<<(unsigned)((quads + 255) / 256), 256>>>(bhi, blo, B, N, K, ldb, K_pad, quads);
        }
    };
    const dim3 grid((N + 127) / 128, (M + 127) / 128);
    auto product = [&](int v) {
        if (v == 0)
            (s.b_n_major ? k_gemm_wg_nn : k_gemm_wg_nt)<<<grid, TC_WG_THREADS, TC_WG_SMEM_BYTES>>>(
                C[0], A, B, nullptr, M, N, K, K, ldb, N, 0, 0, 0, 1.0f, 0.0f, CAUSAL_NONE, 0.0f, nullptr);
        else if (v <= 2)
            (v == 1 ? (s.b_n_major ? k_gemm_lean_nn : k_gemm_lean_nt) : (s.b_n_major ? k_gemm_lean2_nn : k_gemm_lean2_nt))
                <<<grid, TC_WG_THREADS, TC_WG_SMEM_BYTES>>>(C[v], A, B, M, N, K, K, ldb, N);
        else if (v == 3)
            k_gemm_ps_b<<<grid, TC_WG_THREADS, PS_B_SMEM>>>(C[v], A, bhi, blo, M, N, K, K, K_pad, N);
        else if (v == 4)  // the engine's, which k_gemm_ps_ab was
            k_gemm_wg_split<<<grid, TC_WG_THREADS, TC_SPLIT_SMEM_BYTES>>>(C[v], ahi, bhi, nullptr, M, N, K_pad, N, 1.0f,
                                                                           0.0f);
        else
            k_gemm_ps_ab2<<<grid, TC_WG_THREADS, TC_SPLIT_SMEM_BYTES>>>(C[v], ahi, alo, bhi, blo, M, N, K_pad, N);
    };

    for (auto& c : C) CK(cudaMemset(c, 0xFF, (size_t)M * N * 4));  // NaN: a C element not stored shows
    CK(cudaMemset(ahi, 0xFF, 2 * (size_t)M_pad * K_pad * 4));      // and a split element not written
    CK(cudaMemset(bhi, 0xFF, 2 * (size_t)N_pad * K_pad * 4));
    split_a();
    split_b();
    for (int v = 0; v < V; v++) product(v);
    CK(cudaDeviceSynchronize());
    const std::vector<float> ce = host(C[0], (size_t)M * N);
    // the engine against float64 at sampled elements, so that equally wrong results do not pass
    double worst = 0.0, scale = 0.0;
    for (int i = 0; i < 512; i++) {
        const int m = rand() % M, n = rand() % N;
        double ref = 0.0;
        for (int k = 0; k < K; k++)
            ref += (double)ha[(size_t)m * K + k] * (s.b_n_major ? hb[(size_t)k * N + n] : hb[(size_t)n * K + k]);
        const double err = std::fabs(ce[(size_t)m * N + n] - ref);
        if (!(err <= worst)) worst = err;  // NaN too: an element no kernel stored
        scale = std::max(scale, std::fabs(ref));
    }
    bool ok = worst <= 1e-5 * scale;
    printf("%-10s %5d x %5d x %5d %s  engine vs float64 %.2e%s", s.name, M, N, K, s.b_n_major ? "NN" : "NT",
           worst / scale, ok ? "" : " FAIL");
    for (int v = 1; v < V; v++) {
        const bool same = memcmp(ce.data(), host(C[v], (size_t)M * N).data(), ce.size() * 4) == 0;
        ok = ok && same;
        printf(" | %s: %s", names[v], same ? "same bits" : "DIFFERENT");
    }
    printf("\n");
    failures += !ok;
    if (s.timed && ok) {
        const double tflop = 2.0 * M * N * K / 1e12;
        float t[V];
        for (int v = 0; v < V; v++) t[v] = time_ms([&] { product(v); });
        printf("   ");
        for (int v = 0; v < V; v++)
            printf(" %s %.3f ms (%.1f TFLOP/s, %.2fx) |", names[v], t[v], tflop / t[v] * 1e3, t[0] / t[v]);
        printf(" splitting A %.3f ms, B %.3f ms\n", time_ms(split_a), time_ms(split_b));
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    for (auto& c : C) CK(cudaFree(c));
    CK(cudaFree(ahi));
    CK(cudaFree(bhi));
}

int main() {
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaFuncSetAttribute(k_gemm_wg_nt, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_WG_SMEM_BYTES));
    CK(cudaFuncSetAttribute(k_gemm_wg_nn, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_WG_SMEM_BYTES));
    for (auto k : {k_gemm_lean_nt, k_gemm_lean_nn, k_gemm_lean2_nt, k_gemm_lean2_nn})
        CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_WG_SMEM_BYTES));
    CK(cudaFuncSetAttribute(k_gemm_ps_b, cudaFuncAttributeMaxDynamicSharedMemorySize, PS_B_SMEM));
    CK(cudaFuncSetAttribute(k_gemm_wg_split, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SPLIT_SMEM_BYTES));
    CK(cudaFuncSetAttribute(k_gemm_ps_ab2, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SPLIT_SMEM_BYTES));
    const Shape shapes[] = {
        {"short K", 200, 130, 8, false, false},     {"short K", 200, 130, 32, true, false},
        {"short K", 100, 260, 64, false, false},    {"short K", 300, 70, 96, true, false},
        {"odd", 1000, 333, 300, false, false},      {"odd", 1000, 333, 300, true, false},
        {"tall", 4099, 130, 772, false, false},     {"tall", 4099, 130, 772, true, false},
        {"qkv", 8192, 2304, 768, false, true},      {"attn.proj", 8192, 768, 768, false, true},
        {"mlp.fc", 8192, 3072, 768, false, true},   {"mlp.proj", 8192, 768, 3072, false, true},
        {"lm_head", 8192, 8449, 768, false, true},  {"fc dX", 8192, 768, 3072, true, true},
        {"proj dX", 8192, 3072, 768, true, true},   {"qkv dX", 8192, 768, 2304, true, true},
        {"lm_h dX", 8192, 768, 8449, true, true},
    };
    for (const Shape& s : shapes) run(s);
    printf(failures ? "%d shapes FAILED\n" : "every shape the engine's bits\n", failures);
    return failures != 0;
}
