// Deterministic column sums, for the gradients of biases and layernorm weights: a sum over the N = B * T
// rows in a fixed order (no atomics), so a training run repeats bit for bit. Used by the fast variants.
#pragma once
#include "common.cuh"

// Deterministic column sums of x (N, C), in two passes. Pass 1: block (column group of 32, row chunk
// blockIdx.y) sums its rows; 8 warps take every 8th row, then warp 0 adds the 8 in order into
// partials[chunk][c]. Pass 2: one thread per column adds the chunks in order into out[c] (+=).
extern "C" __global__ void k_colsum_partial(float* partials, const float* x, int N, int C, int rows_per_chunk) {
    __shared__ float part[8][32];
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float s = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += 8) s += x[(long long)r * C + c];
    part[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int w = 1; w < 8; w++) s += part[w][tx];
        partials[(long long)blockIdx.y * C + c] = s;
    }
}

extern "C" __global__ void k_colsum_reduce(float* out, const float* partials, int chunks, int C) {
    long long c = thread_index();
    if (c >= C) return;
    float s = 0.0f;
    for (int k = 0; k < chunks; k++) s += partials[(long long)k * C + c];
    out[c] += s;
}
