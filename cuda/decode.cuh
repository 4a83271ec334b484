// Sampling with a key-value cache: one new position a sequence through every layer, its query against the
// keys and values cached for the positions before it. Forward only (nothing trains through these).
// The position p is read from device memory (pos[0]), so the per-token launches are recorded once and
// replayed for every token.
#pragma once
#include "common.cuh"
#include "rows_fast.cuh"  // block_reduce

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

// One block per (b, h) (blockIdx.x = b * NH + h) for the new position p = pos[0] of every sequence:
//   - its key and value (qkv (B, 1, 3C) holds q, k, v side by side, head h at columns h * d_k of each, as
//     split_heads reads them) go into the caches (B, NH, T_max, d_k) at row p;
//   - scores[j] = dot(Q, K[j]) * (1.0f / sqrtf(d_k)) for j = 0 .. p (no mask: every cached row is at or
//     before p), probs = exp(scores - max) / sum, as the pipeline's kernels compute them;
//   - y[b, 0, h * d_k + d] = sum_j probs[j] * V[j][d], where merge_heads puts head h.
// Dynamic shared memory: T_max + d_k + blockDim.x floats (the probabilities, the query, the partial sums).
// A p outside [0, T_max) writes nothing (the caller keeps it in range).
extern "C" __global__ void k_attention_decode(float* y, float* k_cache, float* v_cache, const float* qkv,
                                              const int* pos, int NH, int d_k, int T_max) {
    extern __shared__ float decode_smem[];
    __shared__ float red[32];
    float* probs = decode_smem;
    float* q = probs + T_max;
    float* part = q + d_k;
    const int p = pos[0];
    if (p < 0 || p >= T_max) return;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, C = NH * d_k;
    const float* row = qkv + (long long)b * 3 * C + h * d_k;
    float* k_h = k_cache + (long long)bh * T_max * d_k;
    float* v_h = v_cache + (long long)bh * T_max * d_k;
    for (int d = threadIdx.x; d < d_k; d += blockDim.x) {
        q[d] = row[d];
        k_h[(long long)p * d_k + d] = row[C + d];
        v_h[(long long)p * d_k + d] = row[2 * C + d];
    }
    __syncthreads();  // the query and row p of the caches, for every thread of the block

    Row Q{q, d_k};
    Matrix K{k_h, d_k};
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= p; j += blockDim.x) {
        probs[j] = dot(Q, K[j]) * (1.0f / sqrtf(d_k));
        m = fmaxf(m, probs[j]);
    }
    m = block_reduce(m, red, true);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= p; j += blockDim.x) sum += expf(probs[j] - m);
    sum = block_reduce(sum, red, false);
    for (int j = threadIdx.x; j <= p; j += blockDim.x) probs[j] = expf(probs[j] - m) / sum;
    __syncthreads();

    float* out = y + (long long)b * C + h * d_k;
    const int G = blockDim.x / d_k;  // groups of d_k threads, each summing every G-th row
    if (G > 1) {
        const int g = threadIdx.x / d_k, d = threadIdx.x % d_k;
        if (g < G) {
            float s = 0.0f;
            for (int j = g; j <= p; j += G) s += probs[j] * v_h[(long long)j * d_k + d];
            part[threadIdx.x] = s;
        }
        __syncthreads();
        if (threadIdx.x < d_k) {
            float s = 0.0f;
            for (int k = 0; k < G; k++) s += part[k * d_k + threadIdx.x];
            out[threadIdx.x] = s;
        }
    } else {
        for (int d = threadIdx.x; d < d_k; d += blockDim.x) {
            float s = 0.0f;
            for (int j = 0; j <= p; j++) s += probs[j] * v_h[(long long)j * d_k + d];
            out[d] = s;
        }
    }
}
