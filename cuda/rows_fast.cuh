// Fast variants of the row-wise kernels: a warp per row (softmax, layernorm) or a block per row (the
// cross-entropy over the vocabulary), so that a warp reads a row in coalesced 128-byte lines and the
// reductions run in registers. Each reduction has a fixed order, so results repeat bit for bit.
// Tested against the one-thread-per-row reference kernels.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, off));
    return v;
}

// the row of this warp in a 1-D launch of 32 threads a row
__device__ __forceinline__ long long warp_row() { return thread_index() / 32; }

extern "C" __global__ void k_softmax_fwd_fast(float* probs, const float* x, int rows, int cols) {
    long long r = warp_row();
    int lane = threadIdx.x % 32;
    if (r >= rows) return;  // the whole warp leaves together
    const float* xr = x + r * cols;
    float* pr = probs + r * cols;
    float m = -INFINITY;
    for (int j = lane; j < cols; j += 32) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < cols; j += 32) sum += expf(xr[j] - m);
    sum = warp_sum(sum);
    for (int j = lane; j < cols; j += 32) pr[j] = expf(xr[j] - m) / sum;
}

extern "C" __global__ void k_softmax_bwd_fast(float* dx, const float* dprobs, const float* probs, int rows, int cols) {
    long long r = warp_row();
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float* dp = dprobs + r * cols;
    const float* p = probs + r * cols;
    float d = 0.0f;
    for (int j = lane; j < cols; j += 32) d += dp[j] * p[j];
    d = warp_sum(d);
    for (int j = lane; j < cols; j += 32) dx[r * cols + j] = p[j] * (dp[j] - d);
}

// Row n of x normalised, from its sum m (x's row read again for the variance and the output: the warp's
// own recent reads and writes, served from the caches).
__device__ __forceinline__ void layernorm_row(float* out, float* mean, float* rstd, const float* x, const float* w,
                                              const float* b, long long n, int C, float m) {
    int lane = threadIdx.x % 32;
    const float* xr = x + n * C;
    m = warp_sum(m) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = xr[c] - m;
        var += d * d;
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + LN_EPS);
    float* o = out + n * C;
    for (int c = lane; c < C; c += 32) o[c] = (xr[c] - m) * s * w[c] + b[c];
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

extern "C" __global__ void k_layernorm_fwd_fast(float* out, float* mean, float* rstd, const float* x,
                                                const float* w, const float* b, int N, int C) {
    long long n = warp_row();
    int lane = threadIdx.x % 32;
    if (n >= N) return;
    const float* xr = x + n * C;
    float m = 0.0f;
    for (int c = lane; c < C; c += 32) m += xr[c];
    layernorm_row(out, mean, rstd, x, w, b, n, C, m);
}

// The residual add and the layernorm that reads its sum, in one pass over the row: x = resid + branch
// (written: the next residual add and the backward read it), out = layernorm(x). The same roundings as
// k_residual_fwd then k_layernorm_fwd_fast.
extern "C" __global__ void k_residual_layernorm_fwd_fast(float* x, float* out, float* mean, float* rstd,
                                                         const float* resid, const float* branch, const float* w,
                                                         const float* b, int N, int C) {
    long long n = warp_row();
    int lane = threadIdx.x % 32;
    if (n >= N) return;
    float* xr = x + n * C;
    float m = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float v = resid[n * C + c] + branch[n * C + c];
        xr[c] = v;
        m += v;
    }
    layernorm_row(out, mean, rstd, x, w, b, n, C, m);
}

// dx only (written, or added into where accumulate != 0, as k_layernorm_bwd), a warp per row; dw and db come
// from k_layernorm_bwd_fast_wb.
extern "C" __global__ void k_layernorm_bwd_fast(float* dx, const float* dout, const float* x, const float* w,
                                                const float* mean, const float* rstd, int N, int C,
                                                int accumulate) {
    long long n = warp_row();
    int lane = threadIdx.x % 32;
    if (n >= N) return;
    const float* xr = x + n * C;
    const float* dr = dout + n * C;
    float m = mean[n], s = rstd[n];
    float mean_dxhat = 0.0f, mean_dxhat_xhat = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dxhat = dr[c] * w[c];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * (xr[c] - m) * s;
    }
    mean_dxhat = warp_sum(mean_dxhat) / C;
    mean_dxhat_xhat = warp_sum(mean_dxhat_xhat) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (xr[c] - m) * s;
        float v = s * (dr[c] * w[c] - mean_dxhat - xhat * mean_dxhat_xhat);
        dx[n * C + c] = accumulate ? __fadd_rn(dx[n * C + c], v) : v;  // _rn: no FMA with the product above
    }
}

// Pass 1 of dw, db: per (group of 32 columns, chunk of rows), as k_colsum_partial; k_colsum_reduce adds
// the chunks into dw and db.
extern "C" __global__ void k_layernorm_bwd_fast_wb(float* dw_partials, float* db_partials, const float* dout,
                                                   const float* x, const float* mean, const float* rstd,
                                                   int N, int C, int rows_per_chunk) {
    __shared__ float part_w[8][32], part_b[8][32];
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    int c = blockIdx.x * 32 + tx;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sw = 0.0f, sb = 0.0f;
    if (c < C)
        for (int r = r0 + ty; r < r1; r += 8) {
            float d = dout[(long long)r * C + c];
            sw += d * (x[(long long)r * C + c] - mean[r]) * rstd[r];
            sb += d;
        }
    part_w[ty][tx] = sw;
    part_b[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 1; k < 8; k++) {
            sw += part_w[k][tx];
            sb += part_b[k][tx];
        }
        dw_partials[(long long)blockIdx.y * C + c] = sw;
        db_partials[(long long)blockIdx.y * C + c] = sb;
    }
}

// Sum of the block's threads, in a fixed order; every thread gets it. `scratch` holds 32 floats.
__device__ float block_reduce(float v, float* scratch, bool is_max) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = (blockDim.x + 31) / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

// a block per position (row of logits (N, V))
extern "C" __global__ void k_crossentropy_fwd_fast(float* losses, float* probs, const float* logits,
                                                   const int* targets, int N, int V) {
    __shared__ float scratch[32];
    long long n = blockIdx.x;
    if (n >= N) return;
    const float* lr = logits + n * V;
    float m = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, lr[v]);
    m = block_reduce(m, scratch, true);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum += expf(lr[v] - m);
    sum = block_reduce(sum, scratch, false);
    float* pr = probs + n * V;
    for (int v = threadIdx.x; v < V; v += blockDim.x) pr[v] = expf(lr[v] - m) / sum;
    if (threadIdx.x == 0) losses[n] = logf(sum) + m - lr[targets[n]];
}
