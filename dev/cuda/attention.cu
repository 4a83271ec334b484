// Causal self-attention over the QKV projection's output, forward and backward, by the engine's kernels
// (cuda/attention.cuh, cuda/flash_attention.cuh), each checked against the CPU's float64 attention at a shape of
// partial tiles, then timed at andrea-120m's (B 8, T 1024, 12 heads of d_k 64).
//
//   make -C dev/cuda && dev/cuda/build/attention    # every version of both
//   dev/cuda/build/attention bwd 2                  # one version (fwd or bwd, then its number)
//
// qkv (B, T, 3C): head h's Q at columns h d_k .., its K at C + h d_k, its V at 2C + h d_k; y (B, T, C): the heads
// side by side; lse (B, NH, T): each row's log-sum-exp, all the backward keeps of the softmax.
// forward: y and lse
//   1  the reference pipeline, a kernel a stage: split heads, scores, causal mask, softmax, P V, merge heads, with
//      T x T scores and probabilities in memory (lse not written)
//   2  k_fused_attention_fwd: a thread a query row, every score recomputed by the literal line (the reference)
//   3  k_flash_fwd_d64: flash attention, 3xTF32 mma.sync (sm_80): a block of query rows streams 64-key tiles
//      through shared memory with an online softmax; no T x T buffer
//   4  k_flash_fwd_wg_d64: the same on wgmma (sm_90a): a producer warpgroup splits each tile of K and V into
//      wgmma's B layout, two consumer warpgroups of 64 query rows take Q and P as A from registers
// backward: dqkv (B, T, 3C) from dy (B, T, C), the forward's y and lse
//   1  k_fused_attention_bwd_dq, k_fused_attention_bwd_dkdv: a thread a query row, then a thread a key row
//   2  flash attention's backward (sm_80): delta (a row's sum of p dp) by k_flash_bwd_delta_rows and
//      k_flash_bwd_delta_d64, then k_flash_bwd_d64: a block of key tiles against the query tiles from the last down
//      to the diagonal, dK and dV in registers, dQ added in global memory in a fixed order behind counters
//   3  the same delta kernels, then k_flash_bwd_wg_d64 on wgmma (sm_90a): a producer warpgroup splits each step's 32
//      queries of Q and dO into wgmma's B layouts (as they lie, and transposed), two consumer warpgroups of 64 keys
//      each take K, V, P^T and dS^T as A; dQ by mma.sync over the block's 128 keys, behind the same counters
#include "common.h"

#include "../../cuda/attention.cuh"
#include "../../cuda/flash_attention.cuh"

constexpr int D_K = 64;  // the flash kernels of width 64

unsigned grid_for(long long threads) { return (unsigned)ceil_div(threads, 256LL); }

// ---------------------------------------------------------------------------------------------- CPU reference
// y, lse and dqkv (written whole) from qkv and dy, in float64
void attention_cpu(double* y, double* lse, double* dqkv, const float* qkv, const float* dy, int B, int T, int NH,
                   int d_k) {
    const int C = NH * d_k;
    const double scale = 1.0 / std::sqrt((double)d_k);
    std::fill(dqkv, dqkv + (size_t)B * T * 3 * C, 0.0);
    std::vector<double> p(T), dp(T);
    auto dot = [&](const float* a, const float* b) {
        double s = 0.0;
        for (int d = 0; d < d_k; d++) s += (double)a[d] * b[d];
        return s;
    };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t head = (size_t)b * T * 3 * C + h * d_k;  // of qkv and dqkv
            auto row = [&](int t) { return head + (size_t)t * 3 * C; };  // Q's row t; K's at + C, V's at + 2C
            for (int t = 0; t < T; t++) {
                const float* q = qkv + row(t);
                double m = -INFINITY, l = 0.0;
                for (int j = 0; j <= t; j++) m = std::max(m, p[j] = dot(q, qkv + row(j) + C) * scale);
                for (int j = 0; j <= t; j++) l += p[j] = std::exp(p[j] - m);
                double* yr = y + ((size_t)b * T + t) * C + h * d_k;
                std::fill(yr, yr + d_k, 0.0);
                for (int j = 0; j <= t; j++) {
                    p[j] /= l;
                    for (int d = 0; d < d_k; d++) yr[d] += p[j] * qkv[row(j) + 2 * C + d];
                }
                lse[((size_t)b * NH + h) * T + t] = m + std::log(l);
                // the backward of row t: ds = p (dp - delta), dp = dO V^T, delta = the row's sum of p dp
                const float* dout = dy + ((size_t)b * T + t) * C + h * d_k;
                double delta = 0.0;
                for (int j = 0; j <= t; j++) delta += p[j] * (dp[j] = dot(dout, qkv + row(j) + 2 * C));
                for (int j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - delta) * scale;
                    for (int d = 0; d < d_k; d++) {
                        dqkv[row(t) + d] += ds * qkv[row(j) + C + d];  // dQ
                        dqkv[row(j) + C + d] += ds * q[d];             // dK
                        dqkv[row(j) + 2 * C + d] += p[j] * dout[d];    // dV
                    }
                }
            }
        }
}

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
// tile. Every 32-long slice of a wgmma product into a zeroed fragment, added in FP32.
#define FB_WG_Q 32    // queries a step
#define FB_WG_BUFS 2  // split buffers
#define FB_WG_RAWS 2  // raw stages
constexpr int FB_WG_QN = FB_WG_Q * 32;  // floats of a natural tile: 32 queries x one 32-slice of d
constexpr int FB_WG_QT = 64 * FB_WG_Q;  // a transposed tile: 64 of d x 32 queries
// a split buffer: Q hi (2 slices of d), Q lo, dO hi, dO lo, then Q^T hi, Q^T lo, dO^T hi, dO^T lo; each tile 1024-
// byte aligned
constexpr int FB_WG_BUF = 8 * FB_WG_QN + 4 * FB_WG_QT;
constexpr int FB_WG_RAW = 2 * FB_WG_Q * 64 + 2 * FB_WG_Q;  // Q, dO (32 x 64, as they lie), lse, delta
constexpr int FB_WG_KS_LD = 64 + 4;                       // the block's K (128 keys x 64), rows 68 floats apart
constexpr int FB_WG_KS = 2 * FA_KEYS * FB_WG_KS_LD;
constexpr int FB_WG_DS_LD = 128 + 8;                       // dS (32 queries x 128 keys), rows 136 floats apart
constexpr int FB_WG_DS = FB_WG_Q * FB_WG_DS_LD;
// floats, then the full and empty barriers of each buffer and the ticket (4 floats)
constexpr int FB_WG_FLOATS =
    FB_WG_BUFS * FB_WG_BUF + FB_WG_RAWS * FB_WG_RAW + FB_WG_KS + FB_WG_DS + FB_WG_BUFS * 2 * FB_WG_Q;
constexpr int FA_BWD_WG_BYTES = FB_WG_FLOATS * 4 + 2 * FB_WG_BUFS * 8 + 16;
static_assert(FA_BWD_WG_BYTES <= 232448, "the opt-in limit of shared memory a block (227 KB)");
static_assert(FB_WG_BUF % 256 == 0 && (FB_WG_BUFS * FB_WG_BUF + FB_WG_RAWS * FB_WG_RAW) % 4 == 0, "alignment");

// K's element (key, d) in the block's resident tile. Rows 68 floats apart: both its readers are free of bank
// conflicts (S^T's A fragments: keys g, g + 8, d t, t + 4 of a k8 step; dQ's mma.sync B fragments: keys 2t, 2t + 1,
// d g), and every address is a lane's base and a constant (an XOR swizzle's, hoisted out of the loop, spilled)
__device__ __forceinline__ int fb_ks_at(int key, int d) { return key * FB_WG_KS_LD + d; }

// d = one 32-long slice of A @ B over the warpgroup's 64 rows (fa_wg_slice's, for a fragment of FRAG = N / 2 of
// m64nNk8): A's raw fragments a[K0 .. K0 + 3] split here, B's hi and lo at descriptors b_hi, b_lo. TRANS: the small
// terms in the other order (hi*lo, lo*hi, hi*hi), so that A B computed as (B^T A^T)^T sums the same terms
template <int K0, int N, int FRAG, bool TRANS>
__device__ __forceinline__ void fb_wg_slice(float (&d)[FRAG], const float (&a)[N][4], uint64_t b_hi, uint64_t b_lo) {
#if WG_AVAILABLE
    uint32_t hi[4][4], lo[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(a[K0 + kk][r], hi[kk][r], lo[kk][r]);
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
        wgmma_tf32_rs(d, hi[kk], b_hi + 2 * kk, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < FRAG; i++) asm volatile("" : "+f"(d[i])::"memory");  // read only after the wait
#endif
}

// rows r0 .. r0 + ROWS - 1 of a head (ld floats apart) into s (ROWS x 64, as they lie) by producer thread tid, zero
// past T and d_k
template <int ROWS>
__device__ __forceinline__ void fb_wg_load(float* s, const float* p, int r0, int T, int d_k, int ld, bool vec,
                                           int tid) {
    if (vec) {
#pragma unroll
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

// out = the warp's 16 query rows of the staged dS (a: its row 0, rows FB_WG_DS_LD apart: the float2 reads of a
// quarter warp fall on distinct banks; the stores from the accumulators two to a bank)
// times key tile kt's 64 rows of K (ks, fb_ks_at), columns c0 + 8n + (0..7) of d: fa_dq_part's products (keys 2t,
// 2t + 1 of each k8 step as logical k t, t + 4 on both sides)
template <int NQ>
__device__ __forceinline__ void fb_wg_dq_part(float (&out)[NQ][4], const float* a, const float* ks, int kt, int c0) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int c = 0; c < NQ; c++)
#pragma unroll
        for (int r = 0; r < 4; r++) out[c][r] = 0.0f;
#pragma unroll
    for (int kb = 0; kb < 8; kb++) {
        const int key = FA_KEYS * kt + 8 * kb + 2 * t;
        const float2 u = *reinterpret_cast<const float2*>(a + g * FB_WG_DS_LD + key);
        const float2 w = *reinterpret_cast<const float2*>(a + (g + 8) * FB_WG_DS_LD + key);
        const float av[4] = {u.x, w.x, u.y, w.y};
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int r = 0; r < 4; r++) tf32_split(av[r], a_hi[r], a_lo[r]);
#pragma unroll
        for (int c = 0; c < NQ; c++) {
            const int d = c0 + 8 * c + g;
            fa_mma3(out[c], a_hi, a_lo, ks[fb_ks_at(key, d)], ks[fb_ks_at(key + 1, d)]);
        }
    }
}

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
        const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 && fa_aligned(qh, doh, qh);
        auto load = [&](int stage, int q0) {
            float* r = raw + stage * FB_WG_RAW;
            fb_wg_load<FB_WG_Q>(r, qh, q0, T, d_k, ld_in, vec, tid);
            fb_wg_load<FB_WG_Q>(r + FB_WG_Q * 64, doh, q0, T, d_k, ld_out, vec, tid);
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
        if (d_k % 4 == 0 && ld_in % 4 == 0 && fa_aligned(kh, kh, kh)) {
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
                    fb_wg_slice<0, 4, 16, true>(st, kf, qn_hi, qn_lo);
                } else {
                    float p2[16];
                    fb_wg_slice<0, 4, 16, true>(p2, kf, qn_hi + FB_WG_QN / 4, qn_lo + FB_WG_QN / 4);
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
            float af[4][4];  // P^T as A fragments: queries 8kb + 2t (logical t) and 8kb + 2t + 1 (logical t + 4)
#pragma unroll
            for (int kb = 0; kb < 4; kb++) {
                af[kb][0] = st[4 * kb], af[kb][1] = st[4 * kb + 2];
                af[kb][2] = st[4 * kb + 1], af[kb][3] = st[4 * kb + 3];
            }
            fb_wg_slice<0, 4, 32, false>(part, af, dt_hi, dt_lo);  // dV += P^T dO
#pragma unroll
            for (int r = 0; r < 32; r++) acc_v[r] += part[r];
            // dP^T = V dO^T: d 0 .. 31, then 32 .. 63; dS^T = P^T (dP^T - delta). V's split is made a step's
            // work: hoisted out of the loop, its 64 registers of hi and lo spilled
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
#pragma unroll
                for (int r = 0; r < 4; r++) asm volatile("" : "+f"(vf[kk][r]));
            float dp[16], p2[16];
            fb_wg_slice<0, 8, 16, true>(dp, vf, dn_hi, dn_lo);
            fb_wg_slice<4, 8, 16, true>(p2, vf, dn_hi + FB_WG_QN / 4, dn_lo + FB_WG_QN / 4);
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
#pragma unroll
            for (int kb = 0; kb < 4; kb++) {
                af[kb][0] = st[4 * kb], af[kb][1] = st[4 * kb + 2];
                af[kb][2] = st[4 * kb + 1], af[kb][3] = st[4 * kb + 3];
            }
            fb_wg_slice<0, 4, 32, false>(part, af, qt_hi, qt_lo);  // dK += dS^T Q
#pragma unroll
            for (int r = 0; r < 32; r++) acc_k[r] += part[r];
        }
        mbar_arrive(&empty[buf]);  // its tiles read (each slice waited for its wgmmas), and its lse and delta
        asm volatile("bar.sync 2, 256;" ::: "memory");  // dS is whole

        // dQ's rows q0 + rq + g (+ 8), columns c0 .. c0 + 15 (warp cw of the 8) += dS K over the block's key tiles
        // in order, after block m - 1's add to tile i: key tile 0 writes, key tile i scales (k_flash_bwd_d64's order)
        const int cw = 4 * (wg - 1) + warp, rq = 16 * (cw % 2), c0 = 16 * (cw / 2);
        const int row_a = q0 + rq + g, row_b = row_a + 8;
        const int tiles = min(2, i - j0 + 1);  // the block's key tiles that see query tile i
        if (q0 + rq < T) {
            float* dq_h = dq + in;
            if (m > 0)
                while (fa_load_acquire(sync + bh * n + i) != m) __nanosleep(100);
            float x[2][4];  // the sum so far, loaded before the product, to land while it runs
            if (m > 0)
#pragma unroll
                for (int c = 0; c < 2; c++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int d = c0 + 8 * c + 2 * t + e;
                        x[c][e] = __ldcg(row_a < T && d < d_k ? dq_h + (long long)row_a * ld_in + d : dq_h);
                        x[c][2 + e] = __ldcg(row_b < T && d < d_k ? dq_h + (long long)row_b * ld_in + d : dq_h);
                    }
#pragma unroll
            for (int kt = 0; kt < 2; kt++) {
                if (kt >= tiles) break;
                float part[2][4];
                fb_wg_dq_part<2>(part, ds + rq * FB_WG_DS_LD, ks, kt, c0);
#pragma unroll
                for (int c = 0; c < 2; c++)
#pragma unroll
                    for (int r = 0; r < 4; r++) x[c][r] = m > 0 || kt > 0 ? x[c][r] + part[c][r] : part[c][r];
            }
#pragma unroll
            for (int c = 0; c < 2; c++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int d = c0 + 8 * c + 2 * t + e;
                    if (d >= d_k) continue;
                    float x_a = x[c][e], x_b = x[c][2 + e];
                    if (i < j0 + 2) x_a *= scale, x_b *= scale;  // key tile i is the block's
                    if (row_a < T) __stcg(dq_h + (long long)row_a * ld_in + d, x_a);
                    if (row_b < T) __stcg(dq_h + (long long)row_b * ld_in + d, x_b);
                }
        }
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
#pragma unroll
    for (int r = 0; r < 32; r++) {
        const int d = 8 * (r / 4) + 2 * t + r % 2, key = r % 4 < 2 ? key_a : key_b;
        if (d < d_k && key < T) {
            dk[(long long)key * ld_in + d] = acc_k[r] * scale;
            dv[(long long)key * ld_in + d] = acc_v[r];
        }
    }
#else
    __trap();  // the launcher chooses this kernel on sm_90a only
#endif
}

// ---------------------------------------------------------------------------------------------- buffers
struct Attention {
    int B, T, NH, d_k, C, BH;
    float *qkv, *dy, *y, *lse, *dqkv;
    float *y_in, *lse_in;                        // the backward's y and lse (set), as the forward leaves them
    float *q, *k, *v, *heads, *scores, *probs;  // the pipeline's (B, NH, T, d_k) and (B, NH, T, T)
    float* delta;                                // (B, NH, T)
    int* sync;                                   // the flash backward's counters, a (b, h, query tile), and ticket
    Attention(int B_, int T_, int NH_, int d_k_) : B(B_), T(T_), NH(NH_), d_k(d_k_), C(NH_ * d_k_), BH(B_ * NH_) {
        const size_t rows = (size_t)B * T, heads_n = (size_t)BH * T * d_k, scores_n = (size_t)BH * T * T;
        qkv = to_device(make_random_float(rows * 3 * C));
        dy = to_device(make_random_float(rows * C));
        y_in = device_nan(rows * C), lse_in = device_nan((size_t)BH * T);
        y = device_nan(rows * C), lse = device_nan((size_t)BH * T), dqkv = device_nan(rows * 3 * C);
        q = device_nan(heads_n), k = device_nan(heads_n), v = device_nan(heads_n), heads = device_nan(heads_n);
        scores = device_nan(scores_n), probs = device_nan(scores_n), delta = device_nan((size_t)BH * T);
        const size_t counters = (size_t)BH * ceil_div(T, (int)FA_KEYS_A_TILE) + 1;
        cudaCheck(cudaMalloc(&sync, counters * sizeof(int)));
        cudaCheck(cudaMemset(sync, 0, counters * sizeof(int)));
    }
    double forward_flops() const { return 2.0 * BH * T * T * d_k; }  // two products, the causal half of each
};

// ---------------------------------------------------------------------------------------------- forward
void attention_forward1(Attention& a) {
    const long long heads_n = (long long)a.BH * a.T * a.d_k, scores_n = (long long)a.BH * a.T * a.T;
    k_split_heads_fwd<<<grid_for(heads_n), 256>>>(a.q, a.k, a.v, a.qkv, a.B, a.T, a.NH, a.d_k);
    k_attn_scores_fwd<<<grid_for(scores_n), 256>>>(a.scores, a.q, a.k, a.BH, a.T, a.d_k);
    k_causal_mask_fwd<<<grid_for(scores_n), 256>>>(a.scores, a.scores, a.BH, a.T);
    k_softmax_fwd<<<grid_for((long long)a.BH * a.T), 256>>>(a.probs, a.scores, a.BH * a.T, a.T);
    k_attn_values_fwd<<<grid_for(heads_n), 256>>>(a.heads, a.probs, a.v, a.BH, a.T, a.d_k);
    k_merge_heads_fwd<<<grid_for(heads_n), 256>>>(a.y, a.heads, a.B, a.T, a.NH, a.d_k);
}

void attention_forward2(Attention& a) {
    k_fused_attention_fwd<<<grid_for((long long)a.BH * a.T), 256>>>(a.y, a.lse, a.qkv, a.B, a.T, a.NH, a.d_k);
}

void attention_forward3(Attention& a) {
    const dim3 grid(ceil_div(a.T, 16 * FA_FWD_W64), a.NH, a.B);  // 16 query rows a warp
    k_flash_fwd_d64<<<grid, 32 * FA_FWD_W64, FA_FWD_BYTES64>>>(a.y, a.lse, a.qkv, a.qkv + a.C, a.qkv + 2 * a.C, a.T,
                                                              a.d_k, 3 * a.C, a.C);
}

void attention_forward4(Attention& a) {
    const dim3 grid(ceil_div(a.T, (int)FA_FWD_WG_ROWS), a.NH, a.B);
    k_flash_fwd_wg_d64<<<grid, TC_WG_THREADS, FA_FWD_WG_BYTES>>>(a.y, a.lse, a.qkv, a.qkv + a.C, a.qkv + 2 * a.C, a.T,
                                                                a.d_k, 3 * a.C, a.C);
}

void attention_forward(int version, Attention& a) {
    switch (version) {
        case 1: attention_forward1(a); break;
        case 2: attention_forward2(a); break;
        case 3: attention_forward3(a); break;
        case 4: attention_forward4(a); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- backward
void attention_backward1(Attention& a) {
    const unsigned grid = grid_for((long long)a.BH * a.T);
    k_fused_attention_bwd_dq<<<grid, 256>>>(a.dqkv, a.delta, a.dy, a.qkv, a.lse_in, a.B, a.T, a.NH, a.d_k);
    k_fused_attention_bwd_dkdv<<<grid, 256>>>(a.dqkv, a.dy, a.qkv, a.lse_in, a.delta, a.B, a.T, a.NH, a.d_k);
}

// as microgpt/kernels/flash_attention.py launches it: delta of the first FA_PASS_TILES query tiles by a pass over P
// and dP, of the rows past them from dO * O (a warp a (b, t) row); both zero the counters the backward then uses
void attention_backward2(Attention& a) {
    const int tiles = ceil_div(a.T, (int)FA_KEYS_A_TILE), pass = std::min(tiles, (int)FA_PASS_TILES);
    const long long rows = (long long)a.B * (a.T - pass * FA_KEYS_A_TILE);
    const float *q = a.qkv, *k = a.qkv + a.C, *v = a.qkv + 2 * a.C;
    if (rows > 0)
        k_flash_bwd_delta_rows<<<grid_for(32 * rows), 256>>>(a.delta, a.sync, a.y_in, a.dy, a.B, a.NH, a.T, a.d_k, a.C);
    k_flash_bwd_delta_d64<<<dim3(pass, a.NH, a.B), 32 * FA_DELTA_W, FA_DELTA_BYTES64>>>(
        a.delta, a.sync, q, k, v, a.dy, a.lse_in, a.T, a.d_k, 3 * a.C, a.C);
    k_flash_bwd_d64<<<dim3(ceil_div(tiles, (int)FA_BWD_KT64), a.NH, a.B), 32 * FA_BWD_W64, FA_BWD_BYTES64>>>(
        a.dqkv, a.dqkv + a.C, a.dqkv + 2 * a.C, a.sync, q, k, v, a.dy, a.lse_in, a.delta, a.T, a.d_k, 3 * a.C, a.C);
}

// the same delta kernels, then the backward on wgmma (sm_90a)
void attention_backward3(Attention& a) {
    const int tiles = ceil_div(a.T, (int)FA_KEYS_A_TILE), pass = std::min(tiles, (int)FA_PASS_TILES);
    const long long rows = (long long)a.B * (a.T - pass * FA_KEYS_A_TILE);
    const float *q = a.qkv, *k = a.qkv + a.C, *v = a.qkv + 2 * a.C;
    if (rows > 0)
        k_flash_bwd_delta_rows<<<grid_for(32 * rows), 256>>>(a.delta, a.sync, a.y_in, a.dy, a.B, a.NH, a.T, a.d_k, a.C);
    k_flash_bwd_delta_d64<<<dim3(pass, a.NH, a.B), 32 * FA_DELTA_W, FA_DELTA_BYTES64>>>(
        a.delta, a.sync, q, k, v, a.dy, a.lse_in, a.T, a.d_k, 3 * a.C, a.C);
    k_flash_bwd_wg_d64<<<dim3(ceil_div(tiles, 2), a.NH, a.B), TC_WG_THREADS, FA_BWD_WG_BYTES>>>(
        a.dqkv, a.dqkv + a.C, a.dqkv + 2 * a.C, a.sync, q, k, v, a.dy, a.lse_in, a.delta, a.T, a.d_k, 3 * a.C, a.C);
}

void attention_backward(int version, Attention& a) {
    switch (version) {
        case 1: attention_backward1(a); break;
        case 2: attention_backward2(a); break;
        case 3: attention_backward3(a); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- main
std::vector<float> to_host(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

int main(int argc, char** argv) {
    const Gpu gpu = setup_main();
    const char* dir = argc > 1 ? argv[1] : "all";
    const int only = version_arg(argc, argv, 2);
    const int flash_shared = std::max({(int)FA_FWD_BYTES64, (int)FA_DELTA_BYTES64, (int)FA_BWD_BYTES64});
    const bool flash = gpu.arch >= 800 && flash_shared <= (int)gpu.prop.sharedMemPerBlockOptin;
    char flash_needs[96];
    snprintf(flash_needs, sizeof(flash_needs), "sm_80 (mma.sync TF32) and %d KB of shared memory a block",
             flash_shared / 1024);
    const bool flash_wg = gpu.wgmma && FA_FWD_WG_BYTES <= (int)gpu.prop.sharedMemPerBlockOptin;
    if (flash_wg) allow_shared(k_flash_fwd_wg_d64, FA_FWD_WG_BYTES);
    const bool flash_wg_bwd = gpu.wgmma && flash && FA_BWD_WG_BYTES <= (int)gpu.prop.sharedMemPerBlockOptin;
    if (flash_wg_bwd) allow_shared(k_flash_bwd_wg_d64, FA_BWD_WG_BYTES);
    if (flash) {
        allow_shared(k_flash_fwd_d64, FA_FWD_BYTES64);
        allow_shared(k_flash_bwd_delta_d64, FA_DELTA_BYTES64);
        allow_shared(k_flash_bwd_d64, FA_BWD_BYTES64);
    }

    Attention check(2, 200, 4, D_K), bench(8, 1024, 12, D_K);
    const size_t rows = (size_t)check.B * check.T, C = check.C;
    const std::vector<float> qkv = to_host(check.qkv, rows * 3 * C), dy = to_host(check.dy, rows * C);
    std::vector<double> y_ref(rows * C), lse_ref((size_t)check.BH * check.T), dqkv_ref(rows * 3 * C);
    attention_cpu(y_ref.data(), lse_ref.data(), dqkv_ref.data(), qkv.data(), dy.data(), check.B, check.T, check.NH,
                  check.d_k);
    // the backward starts from the CPU's y and lse
    const std::vector<float> y = to_float(y_ref), lse = to_float(lse_ref);
    cudaCheck(cudaMemcpy(check.y_in, y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(check.lse_in, lse.data(), lse.size() * sizeof(float), cudaMemcpyHostToDevice));
    attention_forward(2, bench);  // ... and at the timed shape from the reference kernel's
    cudaCheck(cudaMemcpy(bench.y_in, bench.y, (size_t)bench.B * bench.T * bench.C * sizeof(float), cudaMemcpyDefault));
    cudaCheck(cudaMemcpy(bench.lse_in, bench.lse, (size_t)bench.BH * bench.T * sizeof(float), cudaMemcpyDefault));
    printf("\nchecked at B %d, T %d, %d heads, timed at B %d, T %d, %d heads; d_k %d\n", check.B, check.T, check.NH,
           bench.B, bench.T, bench.NH, D_K);

    if (strcmp(dir, "all") == 0 || strcmp(dir, "fwd") == 0)
        for (int v = 1; v <= 4; v++) {
            if (only && v != only) continue;
            char name[32];
            snprintf(name, sizeof(name), "forward %d", v);
            if (v == 3 && !runs_here(name, flash, flash_needs)) continue;
            if (v == 4 && !runs_here(name, flash_wg, "sm_90a (wgmma) and 224 KB of shared memory a block")) continue;
            printf("%s\n", name);
            poison(check.y, rows * C), poison(check.lse, lse_ref.size());
            attention_forward(v, check);
            validate_result(check.y, y_ref.data(), "y", y_ref.size(), 1e-4);
            if (v > 1) validate_result(check.lse, lse_ref.data(), "lse", lse_ref.size(), 1e-4);
            const float ms = benchmark_kernel(v >= 3 ? 50 : 5, [&] { attention_forward(v, bench); });
            printf("  time %.4f ms, %.1f TFLOP/s\n", ms, bench.forward_flops() / ms / 1e9);
        }
    if (strcmp(dir, "all") == 0 || strcmp(dir, "bwd") == 0)
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            char name[32];
            snprintf(name, sizeof(name), "backward %d", v);
            if (v == 2 && !runs_here(name, flash, flash_needs)) continue;
            if (v == 3 && !runs_here(name, flash_wg_bwd, "sm_90a (wgmma) and 227 KB of shared memory a block")) continue;
            printf("%s\n", name);
            poison(check.dqkv, dqkv_ref.size());
            attention_backward(v, check);
            validate_result(check.dqkv, dqkv_ref.data(), "dqkv", dqkv_ref.size(), 1e-4);
            const float ms = benchmark_kernel(v >= 2 ? 50 : 5, [&] { attention_backward(v, bench); });
            printf("  time %.4f ms, %.1f TFLOP/s (5 products to the forward's 2)\n", ms,
                   2.5 * bench.forward_flops() / ms / 1e9);
        }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
