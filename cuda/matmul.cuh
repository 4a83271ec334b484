// Linear layer: out = inp @ weight^T + bias, weight (OUT, IN) as torch.nn.Linear; bias may be NULL
// (the tied output projection has none).
#pragma once
#include "common.cuh"

// one thread per element of out (N, OUT; its rows ldo floats apart)
extern "C" __global__ void k_matmul_fwd(float* out, const float* inp, const float* weight, const float* bias,
                                        int N, int IN, int OUT, int ldo) {
    long long i = thread_index();
    if (i >= (long long)N * OUT) return;
    long long n = i / OUT;
    int o = i % OUT;
    const float* x = inp + n * IN;
    const float* wr = weight + (long long)o * IN;
    float s = bias != nullptr ? bias[o] : 0.0f;
    for (int k = 0; k < IN; k++) s += x[k] * wr[k];
    out[n * ldo + o] = s;
}

// blockIdx.y selects the gradient, one thread per element of it (dout (N, OUT): its rows ldo floats apart):
//   0: dinp (N, IN) = dout @ weight, written;
//   1: dweight (OUT, IN) += dout^T @ inp;
//   2: dbias (OUT) += column sums of dout (skipped when dbias is NULL).
extern "C" __global__ void k_matmul_bwd(float* dinp, float* dweight, float* dbias, const float* dout,
                                        const float* inp, const float* weight, int N, int IN, int OUT, int ldo) {
    long long i = thread_index();
    if (blockIdx.y == 0) {
        if (i >= (long long)N * IN) return;
        long long n = i / IN;
        int k = i % IN;
        float s = 0.0f;
        for (int o = 0; o < OUT; o++) s += dout[n * ldo + o] * weight[(long long)o * IN + k];
        dinp[i] = s;
    } else if (blockIdx.y == 1) {
        if (i >= (long long)OUT * IN) return;
        int o = i / IN, k = i % IN;
        float s = 0.0f;
        for (long long n = 0; n < N; n++) s += dout[n * ldo + o] * inp[n * IN + k];
        dweight[i] += s;
    } else {
        if (dbias == nullptr || i >= OUT) return;
        float s = 0.0f;
        for (long long n = 0; n < N; n++) s += dout[n * ldo + i];
        dbias[i] += s;
    }
}
