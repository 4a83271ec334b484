// Elementwise layers: GELU (GPT-2's tanh form) and the residual add. One thread per element.
#pragma once
#include "common.cuh"

#define GELU_K 0.7978845608028654f  // sqrt(2 / pi)

extern "C" __global__ void k_gelu_fwd(float* out, const float* x, long long n) {
    long long i = thread_index();
    if (i >= n) return;
    float xi = x[i];
    out[i] = 0.5f * xi * (1.0f + tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi)));
}

extern "C" __global__ void k_gelu_bwd(float* dx, const float* dout, const float* x, long long n) {
    long long i = thread_index();
    if (i >= n) return;
    float xi = x[i];
    float th = tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi));
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * xi * xi);
    dx[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
}

extern "C" __global__ void k_residual_fwd(float* out, const float* a, const float* b, long long n) {
    long long i = thread_index();
    if (i >= n) return;
    out[i] = a[i] + b[i];
}

// the gradient of a sum reaches both addends unchanged
extern "C" __global__ void k_residual_bwd(float* da, float* db, const float* dout, long long n) {
    long long i = thread_index();
    if (i >= n) return;
    da[i] = dout[i];
    db[i] = dout[i];
}
