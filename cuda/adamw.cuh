// The optimiser: the global gradient norm (for clipping) and AdamW, as torch.optim.AdamW computes them.
#pragma once
#include "common.cuh"
#include "rows_fast.cuh"

// Blocks of k_global_norm that have finished; the last one resets it for the next launch.
__device__ unsigned int norm_blocks_done = 0;

// The 16-byte loads each thread of k_global_norm has in flight: 64 bytes, 128 KB per SM at 8 blocks of 256.
constexpr int NORM_UNROLL = 4;

__device__ __forceinline__ float sumsq4(float4 v) {
    return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, v.x * v.x)));
}

// Adds the sum of squares of g (n) into *sumsq, a double the caller zeroes first (or not, to accumulate over
// several tensors). Deterministic: each thread adds its share in double and in order, a shuffle tree and the warps
// in order give partials[blockIdx.x], and the last block to finish adds the partials the same way. The orders
// depend only on the grid and on g's offset from 16 bytes. blockDim: a multiple of 32 (the launcher's 256).
// At most 32 registers (30 on sm_90a), so that 8 blocks fit an SM and the launcher's grid is resident at once.
extern "C" __global__ void __launch_bounds__(256)
    k_global_norm(double* sumsq, double* partials, const float* g, long long n) {
    __shared__ double warp_sums[32];
    __shared__ bool last_block;
    const long long t = thread_index(), stride = (long long)gridDim.x * blockDim.x;
    const long long head = min(n, (long long)((16 - (unsigned long long)g % 16) % 16 / 4));
    const long long n4 = (n - head) / 4, tail = head + 4 * n4;  // tail: where the scalars after the float4s start
    double s = 0.0;
    if (t < head) s = g[t] * g[t];
    // A warp's batch: NORM_UNROLL * 32 float4s side by side, each load 512 contiguous bytes after the last (an
    // immediate offset: one address per thread, so that all its loads fit in flight in 32 registers).
    const float4* p = reinterpret_cast<const float4*>(g + head) + t / 32 * (32 * NORM_UNROLL) + t % 32;
    const float4* end = reinterpret_cast<const float4*>(g + head) + n4;
    for (; p + 32 * (NORM_UNROLL - 1) < end; p += stride * NORM_UNROLL) {  // whole batches, loads unconditional
        float4 v[NORM_UNROLL];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; u++) v[u] = p[32 * u];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; u++) s += sumsq4(v[u]);
    }
    {  // the last batch, partial
        float4 v[NORM_UNROLL - 1];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL - 1; u++)
            if (p + 32 * u < end) v[u] = p[32 * u];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL - 1; u++)
            if (p + 32 * u < end) s += sumsq4(v[u]);
    }
    if (tail + t < n) s += g[tail + t] * g[tail + t];

    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
    s = warp_sum(s);  // lane 0, the one that stores, adds the pairs a down-shuffle tree adds, in its order
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double block_sum = 0.0;
        for (int w = 0; w < warps; w++) block_sum += warp_sums[w];
        partials[blockIdx.x] = block_sum;
        __threadfence();  // the partial is visible to every block before this block counts as done
        last_block = atomicAdd(&norm_blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return;  // the whole block leaves together
    __threadfence();
    // Each thread adds partials threadIdx.x, + blockDim.x, ... in order, NORM_UNROLL of them loaded together: the
    // launcher's 1024 blocks are one batch of loads per thread, not one thread's chain of 1024 dependent loads.
    const volatile double* part = partials;
    double total = 0.0;
    for (unsigned int b0 = threadIdx.x; b0 < gridDim.x; b0 += NORM_UNROLL * blockDim.x) {
        double v[NORM_UNROLL];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; u++)
            if (b0 + u * blockDim.x < gridDim.x) v[u] = part[b0 + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < NORM_UNROLL; u++)
            if (b0 + u * blockDim.x < gridDim.x) total += v[u];
    }
    total = warp_sum(total);
    if (lane == 0) warp_sums[warp] = total;  // thread 0 read the block's warp sums before the last barrier
    __syncthreads();
    if (threadIdx.x == 0) {
        total = 0.0;
        for (int w = 0; w < warps; w++) total += warp_sums[w];
        *sumsq += total;
        norm_blocks_done = 0;
    }
}

// One parameter's AdamW step: p, m and v updated in place from its gradient g (clipped already), with decoupled
// weight decay wd; bc1 and bc2 are 1 - beta^t.
__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float g, float wd, float lr, float beta1,
                                          float beta2, float eps, float bc1, float bc2) {
    const float decayed = p * (1.0f - lr * wd);
    m = beta1 * m + (1.0f - beta1) * g;
    v = beta2 * v + (1.0f - beta2) * g * g;
    p = decayed - lr * (m / bc1) / (sqrtf(v / bc2) + eps);
}

// One AdamW step on n parameters, four a thread (thread t: 4t .. 4t + 3), by 16-byte loads where the arrays allow
// (params, grads, m and v 16-byte aligned, decay_mask 4-byte), one at a time otherwise; each parameter's arithmetic
// is adamw_one's either way. bias_correction1/2 are 1 - beta^t. Weight decay applies where decay_mask[i] is nonzero
// (the 2-D tensors), or everywhere when it is NULL. When sumsq is not NULL the gradient is first clipped as
// torch.nn.utils.clip_grad_norm_(max_norm) does, and the clipped value written back (where the coefficient is 1
// the gradient is left as it is, unwritten: the same values).
extern "C" __global__ void k_adamw(float* params, float* grads, float* m, float* v, long long n,
                                   float lr, float beta1, float beta2, float eps, float weight_decay,
                                   const unsigned char* decay_mask, float bias_correction1, float bias_correction2,
                                   const double* sumsq, float max_norm) {
    const long long i0 = 4 * thread_index();
    if (i0 >= n) return;
    const float coef = sumsq == nullptr ? 1.0f : (float)fmin(1.0, max_norm / (sqrt(*sumsq) + 1e-6));
    if (i0 + 4 <= n && all_aligned16(params, grads, m, v) && (unsigned long long)decay_mask % 4 == 0) {
        float p4[4], g4[4], m4[4], v4[4];
        load_vec<4>(p4, params + i0), load_vec<4>(g4, grads + i0), load_vec<4>(m4, m + i0), load_vec<4>(v4, v + i0);
        const uchar4 mask = decay_mask == nullptr ? make_uchar4(1, 1, 1, 1)
                                                  : *reinterpret_cast<const uchar4*>(decay_mask + i0);
        const unsigned char decays[4] = {mask.x, mask.y, mask.z, mask.w};
        if (coef != 1.0f) {
#pragma unroll
            for (int j = 0; j < 4; j++) g4[j] *= coef;
            store_vec<4>(grads + i0, g4);
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
            adamw_one(p4[j], m4[j], v4[j], g4[j], decays[j] ? weight_decay : 0.0f, lr, beta1, beta2, eps,
                      bias_correction1, bias_correction2);
        store_vec<4>(params + i0, p4), store_vec<4>(m + i0, m4), store_vec<4>(v + i0, v4);
        return;
    }
    for (long long i = i0; i < min(n, i0 + 4); i++) {
        float g = grads[i];
        if (coef != 1.0f) {
            g *= coef;
            grads[i] = g;
        }
        float p = params[i], mi = m[i], vi = v[i];
        adamw_one(p, mi, vi, g, decay_mask == nullptr || decay_mask[i] ? weight_decay : 0.0f, lr, beta1, beta2,
                  eps, bias_correction1, bias_correction2);
        params[i] = p, m[i] = mi, v[i] = vi;
    }
}
