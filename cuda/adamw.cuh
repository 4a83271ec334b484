// The optimiser: the global gradient norm (for clipping) and AdamW, as torch.optim.AdamW computes them.
#pragma once
#include "common.cuh"

// Blocks of k_global_norm that have finished; the last one resets it for the next launch.
__device__ unsigned int norm_blocks_done = 0;

// Adds the sum of squares of g (n) into *sumsq (a double the caller zeroes first, or not, to
// accumulate over several tensors). Deterministic: each thread sums a grid-stride slice in order, each
// block reduces its threads into partials[blockIdx.x], and the last block to finish adds the partials
// in block order, so a run repeats bit for bit.
extern "C" __global__ void k_global_norm(double* sumsq, double* partials, const float* g, long long n) {
    __shared__ float warp_sums[32];
    __shared__ bool last_block;
    float s = 0.0f;
    for (long long i = thread_index(); i < n; i += (long long)gridDim.x * blockDim.x) s += g[i] * g[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffff, s, off);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_sums[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double block_sum = 0.0;
        for (int w = 0; w < (blockDim.x + 31) / 32; w++) block_sum += warp_sums[w];
        partials[blockIdx.x] = block_sum;
        __threadfence();  // the partial is visible to every block before this block counts as done
        last_block = atomicAdd(&norm_blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last_block && threadIdx.x == 0) {
        __threadfence();
        double total = 0.0;
        for (unsigned int b = 0; b < gridDim.x; b++) total += ((volatile double*)partials)[b];
        *sumsq += total;
        norm_blocks_done = 0;
    }
}

// One AdamW step on n parameters, one thread each. bias_correction1/2 are 1 - beta^t. Weight decay
// applies where decay_mask[i] is nonzero (the 2-D tensors), or everywhere when it is NULL, so that one
// launch covers the whole flat parameter vector. When sumsq is not
// NULL the gradient is first clipped as torch.nn.utils.clip_grad_norm_(max_norm) does, and the clipped
// value is written back, so the gradients read afterwards are torch's.
extern "C" __global__ void k_adamw(float* params, float* grads, float* m, float* v, long long n,
                                   float lr, float beta1, float beta2, float eps, float weight_decay,
                                   const unsigned char* decay_mask, float bias_correction1, float bias_correction2,
                                   const double* sumsq, float max_norm) {
    long long i = thread_index();
    if (i >= n) return;
    float g = grads[i];
    if (sumsq != nullptr) {
        float coef = (float)fmin(1.0, max_norm / (sqrt(*sumsq) + 1e-6));
        g *= coef;
        grads[i] = g;
    }
    float wd = (decay_mask == nullptr || decay_mask[i]) ? weight_decay : 0.0f;
    float p = params[i] * (1.0f - lr * wd);  // decoupled weight decay
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    params[i] = p - lr * (mi / bias_correction1) / (sqrtf(vi / bias_correction2) + eps);
}
