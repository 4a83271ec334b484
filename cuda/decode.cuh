// Sampling with a key-value cache: one new position a sequence through every layer, its query against the
// keys and values cached for the positions before it. Forward only (nothing trains through these).
// The position p is read from device memory (pos[0]), so the per-token launches are recorded once and
// replayed for every token.
#pragma once
#include "common.cuh"
#include "rows_fast.cuh"  // warp_sum, warp_max
#include "matmul_tc.cuh"  // copy_to_shared, cp_async_commit, cp_async_wait

// one thread per element of x (B, 1, C): x[b, 0, :] = wte[tokens[b], :] + wpe[p, :]
extern "C" __global__ void k_embed_decode(float* x, const int* tokens, const float* wte, const float* wpe,
                                          const int* pos, int B, int C) {
    long long i = thread_index();
    if (i >= (long long)B * C) return;
    int b = i / C, c = i % C;
    x[i] = wte[(long long)tokens[b] * C + c] + wpe[(long long)pos[0] * C + c];
}

// one thread per element of src (BH, T, d_k): cache (BH, T_max, d_k)[:, :T] = src, a prefilled prompt's keys or
// values
extern "C" __global__ void k_kv_store(float* cache, const float* src, int BH, int T, int T_max, int d_k) {
    long long i = thread_index();
    long long per_head = (long long)T * d_k;
    if (i >= BH * per_head) return;
    cache[i / per_head * T_max * d_k + i % per_head] = src[i];
}

// The attention of the new position p = pos[0] of every sequence, split over the cached positions as flash
// decoding splits them: one block per chunk of DECODE_CHUNK positions of one head, so that a long cache keeps
// every SM busy even at B = 1; the last of a head's blocks to finish adds its chunks.
enum DecodeLaunch : int {
    DECODE_CHUNK = 64,  // cached positions per block of k_attention_decode (read by microgpt/kernels/decode.py)
};
#define DECODE_PARTIAL(d_k) ((d_k) + 2)  // a chunk's partial: its weighted values (d_k), its max, its sum

// y[b, 0, h * d_k + d] = the chunks' weighted values, each scaled by exp(its max - the largest), over the sum of
// their sums so scaled: softmax(scores) V, the chunks added in order. part: the head's `used` partials, read past
// L1 (other blocks wrote them).
__device__ void attention_decode_merge(float* out, const float* part, int used, int d_k) {
    float m = -INFINITY;
    for (int c = 0; c < used; c++) m = fmaxf(m, __ldcg(part + c * DECODE_PARTIAL(d_k) + d_k));
    float sum = 0.0f;
    for (int c = 0; c < used; c++) {
        const float* pc = part + c * DECODE_PARTIAL(d_k);
        sum += __ldcg(pc + d_k + 1) * expf(__ldcg(pc + d_k) - m);
    }
    for (int d = threadIdx.x; d < d_k; d += blockDim.x) {
        float s = 0.0f;
        for (int c = 0; c < used; c++) {
            const float* pc = part + c * DECODE_PARTIAL(d_k);
            s += __ldcg(pc + d) * expf(__ldcg(pc + d_k) - m);
        }
        out[d] = s / sum;
    }
}

// d_k rounded up to 4 floats: the query's and each warp's weighted values' length in shared memory.
__host__ __device__ constexpr int decode_pad(int d_k) { return (d_k + 3) / 4 * 4; }

// A row of the staged keys and values in shared memory: decode_pad(d_k), then up to 16 past a multiple of 32
// floats, so that rows stay 16-byte aligned and the 8 lanes of a quarter-warp (two rows, four lanes a row, a float4
// each) read 32 different banks.
__host__ __device__ constexpr int decode_row(int d_k) { return (decode_pad(d_k) + 15) / 32 * 32 + 16; }

// k_attention_decode's dynamic shared memory in floats, for blocks of `threads`: the chunk's keys and values, the
// query, and each warp's weighted values, max and sum. The launcher's copy is decode_shared_bytes (decode.py);
// tests/test_cuda_source.py holds the two equal.
__host__ __device__ constexpr int decode_shared_floats(int d_k, int threads) {
    return 2 * DECODE_CHUNK * decode_row(d_k) + (threads / 32 + 1) * decode_pad(d_k) + 2 * (threads / 32);
}

// The block's query and its new row p (from qkv, after the wait) and its chunk's scores and products.
template <typename Vec>
__device__ void attention_decode_chunk(float* y, float* partial, unsigned* done, float* k_cache, float* v_cache,
                                       const float* qkv, int p, int NH, int d_k, int T_max) {
    constexpr int WIDTH = sizeof(Vec) / sizeof(float);
    extern __shared__ float4 decode_smem[];
    const int KS = decode_row(d_k), DP = decode_pad(d_k), start = blockIdx.x * DECODE_CHUNK;
    const int warps = blockDim.x / 32, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float* ks = reinterpret_cast<float*>(decode_smem);  // DECODE_CHUNK x KS: the chunk's keys
    float* vs = ks + DECODE_CHUNK * KS;                   // and values
    float* q = vs + DECODE_CHUNK * KS;                    // DP
    float* wv = q + DP;                                   // warps x DP: each warp's weighted values
    float* wm = wv + warps * DP;                          // warps x 2: each warp's max and sum
    __shared__ bool last;
    const int n = min(DECODE_CHUNK, p + 1 - start);  // the chunk's positions, start .. start + n - 1
    const bool holds_p = p < start + DECODE_CHUNK;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, C = NH * d_k;
    const float* row = qkv + (long long)b * 3 * C + h * d_k;
    float* k_h = k_cache + (long long)bh * T_max * d_k;
    float* v_h = v_cache + (long long)bh * T_max * d_k;
    // the chunk's cached keys and values (the rows before p, which earlier steps wrote) into shared memory while
    // the launch before finishes
    const int cached = n - holds_p, per_row = d_k / WIDTH;
    for (int i = threadIdx.x; i < cached * per_row; i += blockDim.x) {
        const int r = i / per_row, d = i % per_row * WIDTH;
        copy_to_shared<Vec>(ks + r * KS + d, k_h + (long long)(start + r) * d_k + d);
        copy_to_shared<Vec>(vs + r * KS + d, v_h + (long long)(start + r) * d_k + d);
    }
    cp_async_commit();
    pdl_wait();
    for (int d = threadIdx.x; d < d_k; d += blockDim.x) {
        q[d] = row[d];
        if (holds_p) {
            const float k = row[C + d], v = row[2 * C + d];
            k_h[(long long)p * d_k + d] = k, v_h[(long long)p * d_k + d] = v;
            ks[(p - start) * KS + d] = k, vs[(p - start) * KS + d] = v;
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // the query, the chunk's keys and values, row p among them, for every thread of the block

    // Each warp takes 8 rows at a time, 4 lanes a row: lane (row, sub) sums d in [sub WIDTH, (sub + 1) WIDTH),
    // then 4 WIDTH on, in order, and two shuffles add the 4 lanes. The warp keeps its rows' running max m and
    // sum of exp(score - m), and its weighted values, rescaled as m grows (online softmax), with no barrier.
    const int sub = lane % 4;
    float m = -INFINITY, sum = 0.0f;
    float* acc = wv + warp * DP;
    for (int row0 = warp * 8; row0 < n; row0 += warps * 8) {
        const int j = row0 + lane / 4;
        const float* k_j = ks + min(j, n - 1) * KS;  // every lane computes, so that the shuffles see all 32
        float dot = 0.0f;
        for (int d = sub * WIDTH; d < d_k; d += 4 * WIDTH) {
            const Vec kv = *reinterpret_cast<const Vec*>(k_j + d), qv = *reinterpret_cast<const Vec*>(q + d);
            const float* kf = reinterpret_cast<const float*>(&kv);
            const float* qf = reinterpret_cast<const float*>(&qv);
#pragma unroll
            for (int w = 0; w < WIDTH; w++) dot += qf[w] * kf[w];
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        const float score = j < n ? dot * (1.0f / sqrtf(d_k)) : -INFINITY;
        const float m_new = fmaxf(m, warp_max(score));
        // m_new is -inf only where every score so far is (infinite inputs): then e and scale are 0, not NaN
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float e = j < n ? expf(score - m_use) : 0.0f, scale = expf(m - m_use);  // 0 for the first rows
        sum = sum * scale + warp_sum(sub == 0 ? e : 0.0f);
        float e_r[8];
#pragma unroll
        for (int r = 0; r < 8; r++) e_r[r] = __shfl_sync(0xffffffffu, e, 4 * r);
        const int rows = min(8, n - row0);
        for (int d = lane; d < d_k; d += 32) {
            float a = row0 == warp * 8 ? 0.0f : acc[d] * scale;
#pragma unroll
            for (int r = 0; r < 8; r++)
                if (r < rows) a += e_r[r] * vs[(row0 + r) * KS + d];
            acc[d] = a;
        }
        m = m_new;
    }
    if (lane == 0) wm[2 * warp] = m, wm[2 * warp + 1] = sum;
    __syncthreads();

    // the warps' parts, each scaled by exp(its max - the largest), added in warp order: into y directly where the
    // chunk is the head's only one, else into its partial
    float M = -INFINITY, S = 0.0f;
    for (int w = 0; w < warps; w++) M = fmaxf(M, wm[2 * w]);
    for (int w = 0; w < warps && w * 8 < n; w++)  // the warps that had rows (whose max is -inf if they were NaN)
        S += wm[2 * w + 1] * expf(wm[2 * w] - M);
    const int used = p / DECODE_CHUNK + 1;
    float* head = partial + (long long)bh * gridDim.x * DECODE_PARTIAL(d_k);
    float* out = used == 1 ? y + (long long)b * C + h * d_k : head + blockIdx.x * DECODE_PARTIAL(d_k);
    for (int d = threadIdx.x; d < d_k; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < warps && w * 8 < n; w++) v += wv[w * DP + d] * expf(wm[2 * w] - M);
        out[d] = used == 1 ? v / S : v;
    }
    if (used == 1) return;
    if (threadIdx.x == 0) out[d_k] = M, out[d_k + 1] = S;

    __threadfence();  // this block's partial, visible to the block that merges
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(done + bh, 1u) == (unsigned)used - 1;
        if (last) done[bh] = 0;  // every block of the head has counted itself: ready for the next launch
    }
    __syncthreads();
    if (last) attention_decode_merge(y + (long long)b * C + h * d_k, head, used, d_k);
}

// Grid (chunks, B * NH), blockIdx.y = b * NH + h; a block whose chunk starts past p does nothing. Before its wait
// the block copies its chunk's cached keys and values (rows before p) into shared memory; after it, the block
// holding p writes the new key and value from qkv (B, 1, 3C) into the caches (B, NH, T_max, d_k) at row p (and
// into its copy). Then, for the chunk's rows j <= p (no mask needed), scores[j] = dot(Q, K[j]) * (1.0f / sqrtf(d_k)),
// and the chunk's partial = (sum_j e_j V[j], m, sum_j e_j), e_j = exp(scores[j] - m), m its largest score, into
// partial (B * NH, chunks, DECODE_PARTIAL(d_k)), each warp's 8 rows at a time with the warps' parts added in warp
// order. The last of the head's p / DECODE_CHUNK + 1 blocks to count itself in done[bh] writes y (B, 1, C), heads
// side by side, and sets done[bh] back to zero for the next launch; where the head has one chunk (p <
// DECODE_CHUNK), its block writes y itself, sum_j e_j V[j] / sum_j e_j. Blocks of a multiple of 32 threads; dynamic
// shared memory: decode_shared_floats(d_k, blockDim.x) floats. vec4: d_k % 4 == 0 and the caches 16-byte aligned
// (the launcher checks). A p outside [0, T_max) writes nothing (the caller keeps it in range).
extern "C" __global__ void k_attention_decode(float* y, float* partial, unsigned* done, float* k_cache, float* v_cache,
                                              const float* qkv, const int* pos, int NH, int d_k, int T_max,
                                              int vec4) {
    // W_O's product may start now: it reads only its weights and bias before its wait, so it stages them while this
    // launch waits for the qkv product, not only under the attention's own chain
    pdl_launch_dependents();
    const int p = pos[0];  // copied in before the step: no launch of it writes pos
    if (p < 0 || p >= T_max || (int)blockIdx.x * DECODE_CHUNK > p) return;
    if (vec4) attention_decode_chunk<float4>(y, partial, done, k_cache, v_cache, qkv, p, NH, d_k, T_max);
    else attention_decode_chunk<float>(y, partial, done, k_cache, v_cache, qkv, p, NH, d_k, T_max);
}
