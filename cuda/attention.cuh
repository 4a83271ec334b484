// The attention pipeline, one stage per kernel; BH = B * NH, and the kernels index heads by bh = b * NH + h:
//   qkv (B, T, 3C) -> split into heads q, k, v (B, NH, T, d_k)
//   scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k))    (B, NH, T, T), causal mask: -1e9 where j > i
//   row softmax -> probabilities A; out[i] = sum_j A[i][j] * V[j]    (B, NH, T, d_k)
//   heads concatenated -> (B, T, C), then W_O (a matmul).
#pragma once
#include "common.cuh"

// one thread per element of q (B, NH, T, d_k), writing q, k and v. Head h of Q is columns
// h*d_k : (h+1)*d_k of the first C columns of qkv; K and V follow at C and 2C.
extern "C" __global__ void k_split_heads_fwd(float* q, float* k, float* v, const float* qkv,
                                             int B, int T, int NH, int d_k) {
    long long i = thread_index();
    if (i >= (long long)B * NH * T * d_k) return;
    int d = i % d_k;
    int t = (i / d_k) % T;
    int h = (i / ((long long)d_k * T)) % NH;
    int b = i / ((long long)d_k * T * NH);
    int C = NH * d_k;
    const float* row = qkv + ((long long)b * T + t) * 3 * C + h * d_k + d;
    q[i] = row[0];
    k[i] = row[C];
    v[i] = row[2 * C];
}

// one thread per element of dqkv (B, T, 3C)
extern "C" __global__ void k_split_heads_bwd(float* dqkv, const float* dq, const float* dk, const float* dv,
                                             int B, int T, int NH, int d_k) {
    long long i = thread_index();
    int C = NH * d_k;
    if (i >= (long long)B * T * 3 * C) return;
    int col = i % (3 * C);
    long long bt = i / (3 * C);
    int b = bt / T, t = bt % T;
    int which = col / C, h = (col % C) / d_k, d = col % d_k;
    long long src = (((long long)b * NH + h) * T + t) * d_k + d;
    dqkv[i] = which == 0 ? dq[src] : which == 1 ? dk[src] : dv[src];
}

// one thread per score (bh, i, j)
extern "C" __global__ void k_attn_scores_fwd(float* s, const float* q, const float* k,
                                             int BH, int T, int d_k) {
    long long idx = thread_index();
    if (idx >= (long long)BH * T * T) return;
    int j = idx % T;
    int i = (idx / T) % T;
    long long bh = idx / ((long long)T * T);
    Matrix Q{q + bh * T * d_k, d_k}, K{k + bh * T * d_k, d_k};
    MutMatrix scores{s + bh * T * T, T};
    scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k));
}

// blockIdx.y == 0: dQ[i][d] = sum_j dS[i][j] * K[j][d] * (1.0f / sqrtf(d_k)), one thread per (bh, i, d);
// blockIdx.y == 1: dK[j][d] = sum_i dS[i][j] * Q[i][d] * (1.0f / sqrtf(d_k)), one thread per (bh, j, d).
// Both written.
extern "C" __global__ void k_attn_scores_bwd(float* dq, float* dk, const float* dscores, const float* q,
                                             const float* k, int BH, int T, int d_k) {
    long long idx = thread_index();
    if (idx >= (long long)BH * T * d_k) return;
    int d = idx % d_k;
    int r = (idx / d_k) % T;  // i for dQ, j for dK
    long long bh = idx / ((long long)T * d_k);
    Matrix dS{dscores + bh * T * T, T}, Q{q + bh * T * d_k, d_k}, K{k + bh * T * d_k, d_k};
    const float scale = 1.0f / sqrtf(d_k);
    float s = 0.0f;
    if (blockIdx.y == 0) {
        int i = r;
        for (int j = 0; j < T; j++) s += dS[i][j] * K[j][d];
        dq[idx] = s * scale;
    } else {
        int j = r;
        for (int i = 0; i < T; i++) s += dS[i][j] * Q[i][d];
        dk[idx] = s * scale;
    }
}

// one thread per score; out may be the scores themselves (masking in place)
extern "C" __global__ void k_causal_mask_fwd(float* out, const float* scores, int BH, int T) {
    long long idx = thread_index();
    if (idx >= (long long)BH * T * T) return;
    int j = idx % T, i = (idx / T) % T;
    out[idx] = j > i ? MASK_VALUE : scores[idx];
}

// the masked positions were constants: no gradient flows through them
extern "C" __global__ void k_causal_mask_bwd(float* dscores, const float* dout, int BH, int T) {
    long long idx = thread_index();
    if (idx >= (long long)BH * T * T) return;
    int j = idx % T, i = (idx / T) % T;
    dscores[idx] = j > i ? 0.0f : dout[idx];
}

// one thread per row of x (rows, cols): probs = exp(x - max) / sum
extern "C" __global__ void k_softmax_fwd(float* probs, const float* x, int rows, int cols) {
    long long r = thread_index();
    if (r >= rows) return;
    const float* xr = x + r * cols;
    float* pr = probs + r * cols;
    float m = xr[0];
    for (int j = 1; j < cols; j++) m = fmaxf(m, xr[j]);
    float sum = 0.0f;
    for (int j = 0; j < cols; j++) sum += expf(xr[j] - m);
    for (int j = 0; j < cols; j++) pr[j] = expf(xr[j] - m) / sum;
}

// one thread per row: dx = probs * (dprobs - sum_j dprobs[j] * probs[j])
extern "C" __global__ void k_softmax_bwd(float* dx, const float* dprobs, const float* probs, int rows, int cols) {
    long long r = thread_index();
    if (r >= rows) return;
    const float* dp = dprobs + r * cols;
    const float* p = probs + r * cols;
    float dot_dp_p = 0.0f;
    for (int j = 0; j < cols; j++) dot_dp_p += dp[j] * p[j];
    for (int j = 0; j < cols; j++) dx[r * cols + j] = p[j] * (dp[j] - dot_dp_p);
}

// one thread per element of out (bh, i, d): out[i] = sum_j A[i][j] * V[j]
extern "C" __global__ void k_attn_values_fwd(float* out, const float* probs, const float* v,
                                             int BH, int T, int d_k) {
    long long idx = thread_index();
    if (idx >= (long long)BH * T * d_k) return;
    int d = idx % d_k;
    int i = (idx / d_k) % T;
    long long bh = idx / ((long long)T * d_k);
    Matrix A{probs + bh * T * T, T}, V{v + bh * T * d_k, d_k};
    float s = 0.0f;
    for (int j = 0; j < T; j++) s += A[i][j] * V[j][d];
    out[idx] = s;
}

// blockIdx.y == 0: dprobs (bh, i, j) = dot(dout[i], V[j]), one thread per element;
// blockIdx.y == 1: dv (bh, j, d) = sum_i A[i][j] * dout[i][d], one thread per element. Both written.
extern "C" __global__ void k_attn_values_bwd(float* dprobs, float* dv, const float* dout, const float* probs,
                                             const float* v, int BH, int T, int d_k) {
    long long idx = thread_index();
    if (blockIdx.y == 0) {
        if (idx >= (long long)BH * T * T) return;
        int j = idx % T, i = (idx / T) % T;
        long long bh = idx / ((long long)T * T);
        Matrix dO{dout + bh * T * d_k, d_k}, V{v + bh * T * d_k, d_k};
        dprobs[idx] = dot(dO[i], V[j]);
    } else {
        if (idx >= (long long)BH * T * d_k) return;
        int d = idx % d_k, j = (idx / d_k) % T;
        long long bh = idx / ((long long)T * d_k);
        Matrix A{probs + bh * T * T, T}, dO{dout + bh * T * d_k, d_k};
        float s = 0.0f;
        for (int i = 0; i < T; i++) s += A[i][j] * dO[i][d];
        dv[idx] = s;
    }
}

// one thread per element of y (B, T, C): heads side by side, head h at columns h*d_k : (h+1)*d_k
extern "C" __global__ void k_merge_heads_fwd(float* y, const float* heads, int B, int T, int NH, int d_k) {
    long long i = thread_index();
    int C = NH * d_k;
    if (i >= (long long)B * T * C) return;
    int c = i % C;
    long long bt = i / C;
    int b = bt / T, t = bt % T, h = c / d_k, d = c % d_k;
    y[i] = heads[(((long long)b * NH + h) * T + t) * d_k + d];
}

// one thread per element of dheads (B, NH, T, d_k)
extern "C" __global__ void k_merge_heads_bwd(float* dheads, const float* dy, int B, int T, int NH, int d_k) {
    long long i = thread_index();
    if (i >= (long long)B * NH * T * d_k) return;
    int d = i % d_k;
    int t = (i / d_k) % T;
    int h = (i / ((long long)d_k * T)) % NH;
    int b = i / ((long long)d_k * T * NH);
    dheads[i] = dy[((long long)b * T + t) * NH * d_k + h * d_k + d];
}

// ---------------------------------------------------------------------------------------------------------------
// The same attention fused, the readable reference of flash attention: heads read from qkv (B, T, 3C) and written
// to y (B, T, C), one log-sum-exp per row (lse (B, NH, T)) kept for the backward in place of the probabilities.
// One thread per query row (forward, dQ) or key row (dK, dV); every score recomputed by the literal line.

// Q of head h of batch row b (K at + C, V at + 2C): row t of each t * 3C floats on
__device__ __forceinline__ const float* qkv_head(const float* qkv, int b, int h, int T, int C, int d_k) {
    return qkv + (long long)b * T * 3 * C + h * d_k;
}

__device__ __forceinline__ float head_dot(const float* x, const float* y, int d_k) {
    float s = 0.0f;
    for (int d = 0; d < d_k; d++) s += x[d] * y[d];
    return s;
}

// row i = (b * NH + h) * T + t: y's row t of head h = sum over j <= t of softmax(scores)[j] * V[j]
extern "C" __global__ void k_fused_attention_fwd(float* y, float* lse, const float* qkv, int B, int T, int NH,
                                                 int d_k) {
    long long i = thread_index();
    if (i >= (long long)B * NH * T) return;
    int t = i % T, h = (i / T) % NH, b = i / ((long long)T * NH), C = NH * d_k;
    const float* Q = qkv_head(qkv, b, h, T, C, d_k);
    const float *K = Q + C, *V = Q + 2 * C;
    const long long ld = 3LL * C;
    float* o = y + ((long long)b * T + t) * C + h * d_k;
    float m = -INFINITY;
    for (int j = 0; j <= t; j++) m = fmaxf(m, head_dot(Q + t * ld, K + j * ld, d_k) * (1.0f / sqrtf(d_k)));
    float l = 0.0f;
    for (int j = 0; j <= t; j++) l += expf(head_dot(Q + t * ld, K + j * ld, d_k) * (1.0f / sqrtf(d_k)) - m);
    for (int d = 0; d < d_k; d++) o[d] = 0.0f;
    for (int j = 0; j <= t; j++) {
        float p = expf(head_dot(Q + t * ld, K + j * ld, d_k) * (1.0f / sqrtf(d_k)) - m) / l;
        for (int d = 0; d < d_k; d++) o[d] += p * V[j * ld + d];
    }
    lse[i] = m + logf(l);
}

// dQ of query row i (into dqkv's Q columns), and delta[i] = sum over j of p dp (the softmax backward's row sum)
// for the dK, dV kernel: p = exp(score - lse), dp = dot(dO[i], V[j]), ds = p (dp - delta)
extern "C" __global__ void k_fused_attention_bwd_dq(float* dqkv, float* delta, const float* dy, const float* qkv,
                                                    const float* lse, int B, int T, int NH, int d_k) {
    long long i = thread_index();
    if (i >= (long long)B * NH * T) return;
    int t = i % T, h = (i / T) % NH, b = i / ((long long)T * NH), C = NH * d_k;
    const float* Q = qkv_head(qkv, b, h, T, C, d_k);
    const float *K = Q + C, *V = Q + 2 * C;
    const long long ld = 3LL * C, row = (long long)b * T + t;
    const float* dO = dy + row * C + h * d_k;
    float* dq = dqkv + row * ld + h * d_k;
    float sum = 0.0f;
    for (int j = 0; j <= t; j++) {
        float p = expf(head_dot(Q + t * ld, K + j * ld, d_k) * (1.0f / sqrtf(d_k)) - lse[i]);
        sum += p * head_dot(dO, V + j * ld, d_k);
    }
    for (int d = 0; d < d_k; d++) dq[d] = 0.0f;
    for (int j = 0; j <= t; j++) {
        float p = expf(head_dot(Q + t * ld, K + j * ld, d_k) * (1.0f / sqrtf(d_k)) - lse[i]);
        float ds = p * (head_dot(dO, V + j * ld, d_k) - sum);
        for (int d = 0; d < d_k; d++) dq[d] += ds * K[j * ld + d] * (1.0f / sqrtf(d_k));
    }
    delta[i] = sum;
}

// dK and dV of key row j = (b * NH + h) * T + t (into dqkv's K and V columns): sums over the query rows i >= t
extern "C" __global__ void k_fused_attention_bwd_dkdv(float* dqkv, const float* dy, const float* qkv,
                                                      const float* lse, const float* delta, int B, int T, int NH,
                                                      int d_k) {
    long long j = thread_index();
    if (j >= (long long)B * NH * T) return;
    int t = j % T, h = (j / T) % NH, b = j / ((long long)T * NH), C = NH * d_k;
    const float* Q = qkv_head(qkv, b, h, T, C, d_k);
    const float *K = Q + C, *V = Q + 2 * C;
    const long long ld = 3LL * C, row = (long long)b * T + t, rows = j - t;  // rows: lse's index of query row 0
    float* dk = dqkv + row * ld + C + h * d_k;
    float* dv = dk + C;
    for (int d = 0; d < d_k; d++) dk[d] = 0.0f, dv[d] = 0.0f;
    for (int i = t; i < T; i++) {
        const float* dO = dy + ((long long)b * T + i) * C + h * d_k;
        float p = expf(head_dot(Q + i * ld, K + t * ld, d_k) * (1.0f / sqrtf(d_k)) - lse[rows + i]);
        float ds = p * (head_dot(dO, V + t * ld, d_k) - delta[rows + i]);
        for (int d = 0; d < d_k; d++) {
            dv[d] += p * dO[d];
            dk[d] += ds * Q[i * ld + d] * (1.0f / sqrtf(d_k));
        }
    }
}
