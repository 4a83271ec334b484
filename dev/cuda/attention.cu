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
// backward: dqkv (B, T, 3C) from dy (B, T, C), the forward's y and lse
//   1  k_fused_attention_bwd_dq, k_fused_attention_bwd_dkdv: a thread a query row, then a thread a key row
//   2  flash attention's backward (sm_80): delta (a row's sum of p dp) by k_flash_bwd_delta_rows and
//      k_flash_bwd_delta_d64, then k_flash_bwd_d64: a block of key tiles against the query tiles from the last down
//      to the diagonal, dK and dV in registers, dQ added in global memory in a fixed order behind counters
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

// ---------------------------------------------------------------------------------------------- forward 4 (sm_90a)
// Flash attention's forward on wgmma (a prototype, d_k <= 64): a block of 128 query rows of one head, two consumer
// warpgroups of 64 rows and a producer warpgroup. The producer copies each 64-key tile of K and V raw (cp.async,
// FW_RAWS deep) and splits it into hi and lo where wgmma reads B: K as it lies (keys x d, 32 of d a tile), V
// transposed (d x keys, 32 keys a tile), each 8 keys relabelled (logical k t = key 2t, t + 4 = key 2t + 1) so that
// P, from S's accumulators, is wgmma's A fragment unmoved. Q and P are A from registers, split by each consumer.
// Every 32-long slice of a product goes into a zeroed fragment added in FP32, as in the tensor-core products.
constexpr int FW_KEYS = 64, FW_ROWS = 128, FW_BUFS = 2, FW_RAWS = 3;
constexpr int FW_TILE = 64 * 32;                                // a split tile: 64 rows x 32, 128B-swizzled
constexpr int FW_BUF = 8 * FW_TILE;                             // K hi (2 tiles of d), K lo, V^T hi (2 of keys), V^T lo
constexpr int FW_RAW = 2 * FW_KEYS * 64;                        // K, then V, 64 x 64 as they lie
constexpr int FW_BYTES = (FW_BUFS * FW_BUF + FW_RAWS * FW_RAW) * 4 + 2 * FW_BUFS * 8;

// d (+)= a @ b over one k8 step, the warpgroup's 64 x 64 tile, a from registers as wg_load_a lays it out
__device__ __forceinline__ void wgmma_tf32_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate) {
#if WG_AVAILABLE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
#endif
}

// d = one 32-long slice of A @ B: A's raw fragments a[K0 .. K0 + 3] (a[kk][v]: rows g, g + 8, g, g + 8 of the warp's
// 16, k t, t, t + 4, t + 4) split here, B's hi and lo tiles at descriptors b_hi, b_lo; lo*hi, hi*lo, hi*hi of each k8
// step, waited for
template <int K0, int N>
__device__ __forceinline__ void fw_slice(float (&d)[32], const float (&a)[N][4], uint64_t b_hi, uint64_t b_lo) {
    uint32_t hi[4][4], lo[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int v = 0; v < 4; v++) tf32_split(a[K0 + kk][v], hi[kk][v], lo[kk][v]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        wgmma_tf32_rs(d, lo[kk], b_hi + 2 * kk, kk > 0);
        wgmma_tf32_rs(d, hi[kk], b_lo + 2 * kk, 1);
        wgmma_tf32_rs(d, hi[kk], b_hi + 2 * kk, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");  // read only after the wait
}

// rows r0 .. r0 + 63 of a head (ld floats apart) into s (64 x 64, as they lie) by the producer's thread tid, zero
// past T and d_k
__device__ __forceinline__ void fw_load(float* s, const float* p, int r0, int T, int d_k, int ld, bool vec, int tid) {
    if (vec) {
#pragma unroll 2
        for (int i = 0; i < FW_KEYS * 64 / 4 / 128; i++) {
            const int e = tid + 128 * i, r = e / 16, d = e % 16 * 4;
            const bool in = r0 + r < T && d < d_k;
            cp_async16(s + r * 64 + d, in ? p + (long long)(r0 + r) * ld + d : p, in ? 16 : 0);
        }
    } else {
        for (int i = 0; i < FW_KEYS * 64 / 128; i++) {
            const int e = tid + 128 * i, r = e / 64, d = e % 64;
            const bool in = r0 + r < T && d < d_k;
            cp_async4(s + r * 64 + d, in ? p + (long long)(r0 + r) * ld + d : p, in ? 4 : 0);
        }
    }
}

// a raw stage (K, V) split into a buffer (K hi, K lo, V^T hi, V^T lo) by the producer's thread tid
__device__ __forceinline__ void fw_split(float* buf, const float* raw, int tid) {
    const float* vr = raw + FW_KEYS * 64;
#pragma unroll 1
    for (int i = 0; i < FW_KEYS * 64 / 4 / 128; i++) {  // K: key e / 16, d 4 (e % 16) ..: a row's chunks across lanes
        const int e = tid + 128 * i, key = e / 16, d4 = e % 16 * 4;
        const int at = d4 / 32 * FW_TILE + wg_swizzled(key, d4 % 32);
        tf32_split_store(buf, buf + 2 * FW_TILE, at, *reinterpret_cast<const float4*>(raw + key * 64 + d4));
    }
#pragma unroll 1
    for (int i = 0; i < FW_KEYS * 64 / 4 / 128; i++) {  // V^T: row d = e % 64 (across lanes), logical keys c4 ..
        const int e = tid + 128 * i, d = e % 64, c4 = e / 64 * 4;
        const int key = (c4 & ~7) + (c4 & 4 ? 1 : 0);  // logical c4 .. c4 + 3: keys key, key + 2, key + 4, key + 6
        const float4 x = make_float4(vr[key * 64 + d], vr[(key + 2) * 64 + d], vr[(key + 4) * 64 + d],
                                     vr[(key + 6) * 64 + d]);
        tf32_split_store(buf + 4 * FW_TILE, buf + 6 * FW_TILE, c4 / 32 * FW_TILE + wg_swizzled(d, c4 % 32), x);
    }
}

extern "C" __global__ void __launch_bounds__(384, 1)
    k_flash_fwd_wg_d64(float* o, float* lse, const float* q, const float* k, const float* v, int T, int d_k,
                       int ld_in, int ld_out) {
#if WG_AVAILABLE
    extern __shared__ __align__(1024) float fw_smem[];
    float* split = fw_smem;                     // [FW_BUFS][FW_BUF]
    float* raw = split + FW_BUFS * FW_BUF;      // [FW_RAWS][FW_RAW]
    uint64_t* full = reinterpret_cast<uint64_t*>(raw + FW_RAWS * FW_RAW);
    uint64_t* empty = full + FW_BUFS;
    const long long in = fa_head(T, d_k, ld_in);
    q += in, k += in, v += in;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FW_ROWS;   // the longest rows first
    const int n_tiles = (min(q0 + FW_ROWS, T) - 1) / FW_KEYS + 1;
    wg_init_barriers(full, empty, FW_BUFS);
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;

    if (wg == 0) {  // ------------------------------------------------ the producer: copy and split K and V
        asm volatile("setmaxnreg.dec.sync.aligned.u32 72;" ::: "memory");  // 128 x 72 + 256 x 216: the 384 x 168
        const bool vec = d_k % 4 == 0 && ld_in % 4 == 0 && fa_aligned(k, v, k);
        auto load = [&](int stage, int k0) {
            fw_load(raw + stage * FW_RAW, k, k0, T, d_k, ld_in, vec, tid);
            fw_load(raw + stage * FW_RAW + FW_KEYS * 64, v, k0, T, d_k, ld_in, vec, tid);
        };
#pragma unroll
        for (int i = 0; i < FW_RAWS - 1; i++) {
            if (i < n_tiles) load(i, i * FW_KEYS);
            cp_async_commit();
        }
        for (int kt = 0; kt < n_tiles; kt++) {
            cp_async_wait<FW_RAWS - 2>();  // this thread's copies of tile kt have landed
            asm volatile("bar.sync 1, 128;" ::: "memory");  // ... every producer's, and all are done splitting kt - 1
            const int next = kt + FW_RAWS - 1;
            if (next < n_tiles) load(next % FW_RAWS, next * FW_KEYS);
            cp_async_commit();
            const int buf = kt % FW_BUFS;
            mbar_wait(&empty[buf], ((kt / FW_BUFS) & 1) ^ 1);  // the consumers are done with its last tile
            fw_split(split + buf * FW_BUF, raw + (kt % FW_RAWS) * FW_RAW, tid);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // what was stored, the tensor cores read
            mbar_arrive(&full[buf]);
        }
        return;
    }

    // ---------------------------------------------------------------- the consumers: 64 query rows each
    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;" ::: "memory");  // ptxas gives the block, shared anew
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
        const int buf = kt % FW_BUFS, k0 = kt * FW_KEYS;
        mbar_wait(&full[buf], (kt / FW_BUFS) & 1);
        if (k0 > first + 63 || first >= T) {  // every key of the tile masked, or no row of the warpgroup's
            mbar_arrive(&empty[buf]);
            continue;
        }
        const uint64_t k_hi = desc + buf * FW_BUF / 4, k_lo = k_hi + 2 * FW_TILE / 4;
        const uint64_t v_hi = k_hi + 4 * FW_TILE / 4, v_lo = k_hi + 6 * FW_TILE / 4;
        float s[32], part[32];
        fw_slice<0>(s, qf, k_hi, k_lo);  // S = Q K^T: d 0 .. 31, then 32 .. 63
        fw_slice<4>(part, qf, k_hi + FW_TILE / 4, k_lo + FW_TILE / 4);
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] += part[i];

        // scale, as the literal line does, and mask; the online softmax of rows a (i % 4 < 2) and b
        const bool whole = k0 + FW_KEYS - 1 <= warp_first && k0 + FW_KEYS <= T;  // no key hidden from any row
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int key = k0 + 8 * (i / 4) + 2 * t + i % 2;
            const bool b = i % 4 >= 2;
            s[i] = (whole || (key <= (b ? row_b : row_a) && key < T)) ? s[i] * scale : -INFINITY;
            if (b) mx_b = fmaxf(mx_b, s[i]);
            else mx_a = fmaxf(mx_a, s[i]);
        }
        const float new_a = fmaxf(m_a, fa_quad_max(mx_a)), new_b = fmaxf(m_b, fa_quad_max(mx_b));
        const float alpha_a = expf(m_a - new_a), alpha_b = expf(m_b - new_b);
        float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const bool b = i % 4 >= 2;
            s[i] = expf(s[i] - (b ? new_b : new_a));
            if (b) sum_b += s[i];
            else sum_a += s[i];
        }
        l_a = l_a * alpha_a + fa_quad_sum(sum_a);
        l_b = l_b * alpha_b + fa_quad_sum(sum_b);
        m_a = new_a, m_b = new_b;
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] *= i % 4 < 2 ? alpha_a : alpha_b;

        float pf[8][4];  // P as A fragments: keys 8kb + 2t (logical t) and 8kb + 2t + 1 (logical t + 4)
#pragma unroll
        for (int kb = 0; kb < 8; kb++)
            pf[kb][0] = s[4 * kb], pf[kb][1] = s[4 * kb + 2], pf[kb][2] = s[4 * kb + 1], pf[kb][3] = s[4 * kb + 3];
        fw_slice<0>(part, pf, v_hi, v_lo);  // O += P V: keys 0 .. 31, then 32 .. 63
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] += part[i];
        fw_slice<4>(part, pf, v_hi + FW_TILE / 4, v_lo + FW_TILE / 4);
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
    __trap();  // wgmma is sm_90a's
#endif
}

void attention_forward4(Attention& a) {
    if (a.d_k > 64) {
        printf("forward 4 takes d_k <= 64, not %d\n", a.d_k);
        exit(EXIT_FAILURE);
    }
    const dim3 grid(ceil_div(a.T, FW_ROWS), a.NH, a.B);
    k_flash_fwd_wg_d64<<<grid, 384, FW_BYTES>>>(a.y, a.lse, a.qkv, a.qkv + a.C, a.qkv + 2 * a.C, a.T, a.d_k,
                                               3 * a.C, a.C);
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

void attention_backward(int version, Attention& a) {
    switch (version) {
        case 1: attention_backward1(a); break;
        case 2: attention_backward2(a); break;
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
    const bool flash_wg = gpu.wgmma && FW_BYTES <= (int)gpu.prop.sharedMemPerBlockOptin;
    if (flash_wg) allow_shared(k_flash_fwd_wg_d64, FW_BYTES);
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
        for (int v = 1; v <= 2; v++) {
            if (only && v != only) continue;
            char name[32];
            snprintf(name, sizeof(name), "backward %d", v);
            if (v == 2 && !runs_here(name, flash, flash_needs)) continue;
            printf("%s\n", name);
            poison(check.dqkv, dqkv_ref.size());
            attention_backward(v, check);
            validate_result(check.dqkv, dqkv_ref.data(), "dqkv", dqkv_ref.size(), 1e-4);
            const float ms = benchmark_kernel(v == 2 ? 50 : 5, [&] { attention_backward(v, bench); });
            printf("  time %.4f ms, %.1f TFLOP/s (5 products to the forward's 2)\n", ms,
                   2.5 * bench.forward_flops() / ms / 1e9);
        }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
