// Token + position embedding. x[b,t,:] = wte[idx[b,t],:] + wpe[t,:]
#pragma once
#include "common.cuh"

// one thread per element of x (B, T, C)
extern "C" __global__ void k_embed_fwd(float* x, const int* idx, const float* wte, const float* wpe,
                                       int B, int T, int C) {
    long long i = thread_index();
    if (i >= (long long)B * T * C) return;
    int c = i % C;
    long long bt = i / C;
    int t = bt % T;
    x[i] = wte[(long long)idx[bt] * C + c] + wpe[(long long)t * C + c];
}

// Adds into dwte (V, C) and dwpe (T_max, C). blockIdx.y == 0: one thread per element of dx, scattered
// into its token's row with atomics (a token may repeat); blockIdx.y == 1: one thread per (t, c) of dwpe,
// summing over the batch.
extern "C" __global__ void k_embed_bwd(float* dwte, float* dwpe, const float* dx, const int* idx,
                                       int B, int T, int C) {
    long long i = thread_index();
    if (blockIdx.y == 0) {
        if (i >= (long long)B * T * C) return;
        int c = i % C;
        long long bt = i / C;
        atomicAdd(&dwte[(long long)idx[bt] * C + c], dx[i]);
    } else {
        if (i >= (long long)T * C) return;
        int t = i / C, c = i % C;
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dx[((long long)b * T + t) * C + c];
        dwpe[i] += s;
    }
}
