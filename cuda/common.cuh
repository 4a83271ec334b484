// Shared by every layer: thread indexing, the model's constants, and the small row/matrix views that let
// the attention kernels read as the maths does: scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k)).
#pragma once

// Mirrored once in Python (microgpt/reference.py MASK_VALUE, LN_EPS; tests/test_cuda_source.py holds
// the two equal): the launchers and the reference engine use the same numbers as the kernels.
#define MASK_VALUE (-1e9f)   // what the causal mask writes where j > i
#define LN_EPS 1e-5f

// Global index of this thread in a 1-D launch; 64-bit so that B*NH*T*T never wraps.
__device__ __forceinline__ long long thread_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}

// A read-only row of n floats, and a row-major matrix whose [i] is such a row.
struct Row {
    const float* p;
    int n;
    __device__ float operator[](int j) const { return p[j]; }
};
struct Matrix {
    const float* p;
    int cols;
    __device__ Row operator[](int i) const { return Row{p + (long long)i * cols, cols}; }
};
// A writable row-major matrix: M[i][j] is a float lvalue.
struct MutMatrix {
    float* p;
    int cols;
    __device__ float* operator[](int i) const { return p + (long long)i * cols; }
};

__device__ __forceinline__ float dot(Row a, Row b) {
    float s = 0.0f;
    for (int d = 0; d < a.n; d++) s += a.p[d] * b.p[d];
    return s;
}

// Programmatic dependent launch (sm_90 on; no-ops elsewhere, and where the kernel was launched without it). A kernel
// launched with it may start while the kernel before it on the stream still runs: pdl_wait() returns once that
// kernel has finished and its writes are visible, so a kernel reads nothing the one before writes, and writes
// nothing it reads, before pdl_wait(). pdl_launch_dependents() lets the next such kernel start its own blocks. Most
// kernels call it after pdl_wait(), so that only the next kernel waits beside a running one; a kernel that calls
// it before (the decode attention, the residual products) lets the next one start while it waits itself, so what
// that one reads before its own wait must be written by no launch that may still run.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
