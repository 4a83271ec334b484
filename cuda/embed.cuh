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

// Adds into dwte (V, C) and dwpe (T_max, C), deterministically (no atomics: a training run repeats bit
// for bit). blockIdx.y == 0: `order` lists the B*T positions sorted by token id, stably, so each token's
// positions form one run; the thread of (run start, c) adds that run's dx[:, c] in order into its row.
// blockIdx.y == 1: one thread per (t, c) of dwpe, summing over the batch.
extern "C" __global__ void k_embed_bwd(float* dwte, float* dwpe, const float* dx, const int* idx,
                                       const int* order, int B, int T, int C) {
    long long i = thread_index();
    long long N = (long long)B * T;
    if (blockIdx.y == 0) {
        if (i >= N * C) return;
        int c = i % C;
        long long k = i / C;
        int token = idx[order[k]];
        if (k > 0 && idx[order[k - 1]] == token) return;  // not the start of this token's run
        float s = 0.0f;
        for (long long r = k; r < N && idx[order[r]] == token; r++) s += dx[(long long)order[r] * C + c];
        dwte[(long long)token * C + c] += s;
    } else {
        if (i >= (long long)T * C) return;
        int t = i / C, c = i % C;
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dx[((long long)b * T + t) * C + c];
        dwpe[i] += s;
    }
}
