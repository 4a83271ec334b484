// LayerNorm over the last axis (C), biased variance, eps 1e-5; saves mean and 1/std per row for backward.
#pragma once
#include "common.cuh"

// one thread per row of x (N, C)
extern "C" __global__ void k_layernorm_fwd(float* out, float* mean, float* rstd, const float* x,
                                           const float* w, const float* b, int N, int C) {
    long long n = thread_index();
    if (n >= N) return;
    const float* xr = x + n * C;
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += xr[c];
    m /= C;
    float var = 0.0f;
    for (int c = 0; c < C; c++) {
        float d = xr[c] - m;
        var += d * d;
    }
    var /= C;
    float s = 1.0f / sqrtf(var + LN_EPS);
    float* o = out + n * C;
    for (int c = 0; c < C; c++) o[c] = (xr[c] - m) * s * w[c] + b[c];
    mean[n] = m;
    rstd[n] = s;
}

// blockIdx.y == 0: one thread per row writes dx; blockIdx.y == 1: one thread per column adds into dw, db.
// dx written, or added into (accumulate != 0: the residual stream's gradient, the same rounding as a separate
// k_residual_fwd); dw, db added into.
extern "C" __global__ void k_layernorm_bwd(float* dx, float* dw, float* db, const float* dout,
                                           const float* x, const float* w, const float* mean,
                                           const float* rstd, int N, int C, int accumulate) {
    long long i = thread_index();
    if (blockIdx.y == 0) {
        if (i >= N) return;
        const float* xr = x + i * C;
        const float* dr = dout + i * C;
        float m = mean[i], s = rstd[i];
        // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w
        float mean_dxhat = 0.0f, mean_dxhat_xhat = 0.0f;
        for (int c = 0; c < C; c++) {
            float dxhat = dr[c] * w[c];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * (xr[c] - m) * s;
        }
        mean_dxhat /= C;
        mean_dxhat_xhat /= C;
        float* o = dx + i * C;
        for (int c = 0; c < C; c++) {
            float xhat = (xr[c] - m) * s;
            float v = s * (dr[c] * w[c] - mean_dxhat - xhat * mean_dxhat_xhat);
            o[c] = accumulate ? __fadd_rn(o[c], v) : v;  // _rn: no FMA with the product above
        }
    } else {
        if (i >= C) return;
        float sw = 0.0f, sb = 0.0f;
        for (long long n = 0; n < N; n++) {
            float d = dout[n * C + i];
            sw += d * (x[n * C + i] - mean[n]) * rstd[n];
            sb += d;
        }
        dw[i] += sw;
        db[i] += sb;
    }
}
