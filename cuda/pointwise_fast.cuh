// Fast GELU, forward and backward: each thread handles 4 * MB_UNROLL elements, loaded 16 bytes at a time
// where every pointer is 16-byte aligned (one float at a time otherwise), all its loads issued before its first
// store. Each element uses k_gelu_fwd's / k_gelu_bwd's expression, so the results are the reference kernels' bits.
#pragma once
#include "pointwise.cuh"  // GELU_K
#include "rows_fast.cuh"  // load_vec, store_vec, all_aligned16, MB_UNROLL

// The expressions of cuda/pointwise.cuh, character for character: the same contractions into FMAs, so the
// same bits (tests/test_gpu_kernels.py holds the two kernels equal bit for bit).
__device__ __forceinline__ float gelu_fwd_of(float xi) {
    return 0.5f * xi * (1.0f + tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi)));
}

__device__ __forceinline__ float gelu_bwd_of(float d, float xi) {
    float th = tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi));
    float du = GELU_K * (1.0f + 3.0f * 0.044715f * xi * xi);
    return d * (0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du);
}

struct GeluFwd {
    static constexpr bool BINARY = false;
    __device__ float operator()(float xi, float) const { return gelu_fwd_of(xi); }
};
struct GeluBwd {
    static constexpr bool BINARY = true;  // (dout, x)
    __device__ float operator()(float d, float xi) const { return gelu_bwd_of(d, xi); }
};

// out[i] = op(a[i], b[i]) over chunks [0, chunks) of VEC floats. Each thread takes MB_UNROLL chunks, blockDim.x
// apart, then moves on by gridDim.x * blockDim.x * MB_UNROLL. All of a thread's loads come before its stores,
// so out may be a or b (each chunk is read and written by one thread).
template <int VEC, class Op>
__device__ __forceinline__ void map_chunks(float* out, const float* a, const float* b, long long chunks, Op op) {
    const long long step = (long long)gridDim.x * blockDim.x * MB_UNROLL;
    for (long long i0 = (long long)blockIdx.x * blockDim.x * MB_UNROLL + threadIdx.x; i0 < chunks; i0 += step) {
        float va[MB_UNROLL][VEC], vb[MB_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i < chunks) {
                load_vec<VEC>(va[u], a + i * VEC);
                if constexpr (Op::BINARY) load_vec<VEC>(vb[u], b + i * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < MB_UNROLL; u++) {
            long long i = i0 + (long long)u * blockDim.x;
            if (i < chunks) {
#pragma unroll
                for (int e = 0; e < VEC; e++) va[u][e] = op(va[u][e], Op::BINARY ? vb[u][e] : 0.0f);
                store_vec<VEC>(out + i * VEC, va[u]);
            }
        }
    }
}

template <class Op>
__device__ __forceinline__ void map_pointwise(float* out, const float* a, const float* b, long long n, Op op) {
    if (all_aligned16(out, a, Op::BINARY ? b : nullptr)) {
        map_chunks<4>(out, a, b, n / 4, op);
        // the last n % 4 elements, by the grid's first threads
        for (long long i = n / 4 * 4 + thread_index(); i < n; i += (long long)gridDim.x * blockDim.x)
            out[i] = op(a[i], Op::BINARY ? b[i] : 0.0f);
    } else {
        map_chunks<1>(out, a, b, n, op);
    }
}

// Grid: ceil(n / (256 * 4 * MB_UNROLL)) blocks, each thread 16 elements in 4 loads; any grid covers the work
// (threads loop), a smaller one only runs slower. At least four blocks per SM: at most 64 registers per thread,
// where the backward would otherwise take 79.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_gelu_fwd_fast(float* out, const float* x, long long n) {
    map_pointwise(out, x, nullptr, n, GeluFwd{});
}

// Grid: as k_gelu_fwd_fast.
extern "C" __global__ void __launch_bounds__(256, 4)
    k_gelu_bwd_fast(float* dx, const float* dout, const float* x, long long n) {
    map_pointwise(dx, dout, x, n, GeluBwd{});
}
