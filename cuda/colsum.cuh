// Deterministic column sums, for the gradients of biases and layernorm weights: a sum over the N = B * T
// rows in a fixed order (no atomics), so a training run repeats bit for bit. Used by the fast variants.
#pragma once
#include "common.cuh"

// Rows each warp has in flight at once: the sum over them stays in row order, only the loads run ahead of it.
constexpr int COLSUM_UNROLL = 8;

// Pass 1 of the column sums of x (N, C; its rows ldx floats apart): block (column group, row chunk blockIdx.y) sums
// its rows into partials[chunk][c], its 8 warps taking every 8th row, then warp 0 adding the 8 in order. A lane owns
// VEC adjacent columns (VEC = 4: x 16-byte aligned, C % 4 == 0 and ldx % 4 == 0), each summed in the same order
// either way.
template <int VEC>
__device__ __forceinline__ void colsum_partial(float* partials, const float* x, int N, int C, int ldx,
                                               int rows_per_chunk) {
    __shared__ float part[8][32 * VEC];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int c = (blockIdx.x * 32 + lane) * VEC;
    const int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float s[VEC] = {};
    if (c < C) {  // VEC = 4: C % 4 == 0, so all four columns
        int r = r0 + warp;
        for (; r + 8 * (COLSUM_UNROLL - 1) < r1; r += 8 * COLSUM_UNROLL) {
            float t[COLSUM_UNROLL][VEC];
#pragma unroll
            for (int u = 0; u < COLSUM_UNROLL; u++) {
                const float* p = x + (long long)(r + 8 * u) * ldx + c;
                if constexpr (VEC == 4) {
                    float4 q = *reinterpret_cast<const float4*>(p);
                    t[u][0] = q.x, t[u][1] = q.y, t[u][2] = q.z, t[u][3] = q.w;
                } else {
                    t[u][0] = *p;
                }
            }
#pragma unroll
            for (int u = 0; u < COLSUM_UNROLL; u++)
#pragma unroll
                for (int e = 0; e < VEC; e++) s[e] += t[u][e];
        }
        for (; r < r1; r += 8)
#pragma unroll
            for (int e = 0; e < VEC; e++) s[e] += x[(long long)r * ldx + c + e];
    }
#pragma unroll
    for (int e = 0; e < VEC; e++) part[warp][lane * VEC + e] = s[e];
    __syncthreads();
    if (warp == 0 && c < C)
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            float t = s[e];
            for (int w = 1; w < 8; w++) t += part[w][lane * VEC + e];
            partials[(long long)blockIdx.y * C + c + e] = t;
        }
}

extern "C" __global__ void k_colsum_partial(float* partials, const float* x, int N, int C, int ldx,
                                            int rows_per_chunk, int vec4) {
    if (vec4)
        colsum_partial<4>(partials, x, N, C, ldx, rows_per_chunk);
    else
        colsum_partial<1>(partials, x, N, C, ldx, rows_per_chunk);
}

// Loads in flight at a time while adding a column's chunks.
constexpr int COLSUM_BATCH = 16;
// The sum of column c of the chunks' partial sums (chunks, C), in chunk order, read from L2 (__ldcg: each is read
// once).
__device__ __forceinline__ float colsum_chunks(const float* partials, int chunks, int C, long long c) {
    float s = 0.0f;
    int k = 0;
    for (; k + COLSUM_BATCH <= chunks; k += COLSUM_BATCH) {
        float t[COLSUM_BATCH];
#pragma unroll
        for (int u = 0; u < COLSUM_BATCH; u++) t[u] = __ldcg(partials + (long long)(k + u) * C + c);
#pragma unroll
        for (int u = 0; u < COLSUM_BATCH; u++) s += t[u];
    }
    for (; k < chunks; k++) s += __ldcg(partials + (long long)k * C + c);
    return s;
}

// Pass 2: one thread per column adds the chunks in order into out[c] (+=).
extern "C" __global__ void k_colsum_reduce(float* out, const float* partials, int chunks, int C) {
    long long c = thread_index();
    if (c >= C) return;
    out[c] += colsum_chunks(partials, chunks, C, c);
}
