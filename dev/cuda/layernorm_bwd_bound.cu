// Where the layernorm backward's bandwidth goes, at andrea-120m's rows (N = 8192, C = 768): simple kernels that
// move the same bytes, timed alone, against a copy kernel of the same size (GB/s counting bytes read and written).
// The engine's k_layernorm_bwd_fast reads dout and x and writes dx (75 MB); tools/profile_kernels.py holds it to
// a 2 GB device copy (4.28 TB/s on the H200), which short kernels do not reach.
//
//     nvcc -O3 -arch=sm_90a -std=c++17 -o /tmp/ln_bound dev/cuda/layernorm_bwd_bound.cu && /tmp/ln_bound
//
// H200, 2026-12-01 (GB/s; % of the 2 GB copy's 4.28 TB/s): a copy kernel of 25 MB 3080-3330 (72-78%); dout * x
// streamed, 2 reads and a write, 3580-3640 (84-85%); a warp a row, dx with its two row sums, 3430-3570 (80-83%);
// the same adding each lane's columns of dw and db in registers, then the block's partial row, 2930-3360 (68-78%,
// best at 264 blocks), before any reduction of the partial rows. The engine's kernel: 2742 (64%).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e = (x);                                                                                   \
        if (e != cudaSuccess) {                                                                                \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                                                     \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

constexpr int N = 8192, C = 768;

__device__ __forceinline__ float wsum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
    return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}
__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float sum4(float4 a) { return a.x + a.y + a.z + a.w; }

__global__ void k_copy(float4* out, const float4* in, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        out[i] = in[i];
}
__global__ void k_stream21(float4* dx, const float4* a, const float4* b, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
        dx[i] = mul4(a[i], b[i]);
}

// A warp a row (rows w, w + W, ... for warp w of W): dx from dout and x with the row's two sums; DWDB: each lane
// also adds its columns of dout * xhat and dout into registers, and the block's 8 warps' shares make one partial
// row (partials[blockIdx.x]: dw's C, then db's), as the engine's reduction would take them.
template <bool DWDB>
__global__ void __launch_bounds__(256, 2) k_warprow(float* dx, float* partials, const float* dout, const float* x,
                                                    const float* w, const float* mean, const float* rstd) {
    constexpr int K = C / 128;  // float4 chunks a lane
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float4 aw[K], ab[K];
    for (int k = 0; k < K; k++) aw[k] = ab[k] = make_float4(0, 0, 0, 0);
    for (long long n = blockIdx.x * 8LL + warp; n < N; n += gridDim.x * 8LL) {
        const float4* dr = reinterpret_cast<const float4*>(dout + n * C);
        const float4* xr = reinterpret_cast<const float4*>(x + n * C);
        float4 g[K], h[K];
        for (int k = 0; k < K; k++) g[k] = dr[lane + 32 * k], h[k] = xr[lane + 32 * k];
        const float m = mean[n], s = rstd[n];
        float s1 = 0, s2 = 0;
        for (int k = 0; k < K; k++) {
            h[k] = make_float4((h[k].x - m) * s, (h[k].y - m) * s, (h[k].z - m) * s, (h[k].w - m) * s);
            if (DWDB) aw[k] = add4(aw[k], mul4(g[k], h[k])), ab[k] = add4(ab[k], g[k]);
            g[k] = mul4(g[k], reinterpret_cast<const float4*>(w)[lane + 32 * k]);
            s1 += sum4(g[k]);
            s2 += sum4(mul4(g[k], h[k]));
        }
        s1 = wsum(s1) / C, s2 = wsum(s2) / C;
        float4* o = reinterpret_cast<float4*>(dx + n * C);
        for (int k = 0; k < K; k++)
            o[lane + 32 * k] = make_float4(s * (g[k].x - s1 - h[k].x * s2), s * (g[k].y - s1 - h[k].y * s2),
                                           s * (g[k].z - s1 - h[k].z * s2), s * (g[k].w - s1 - h[k].w * s2));
    }
    if (DWDB) {
        __shared__ float4 sh[8][C / 4];
        for (int half = 0; half < 2; half++) {
            for (int k = 0; k < K; k++) sh[warp][lane + 32 * k] = half ? ab[k] : aw[k];
            __syncthreads();
            float4* out = reinterpret_cast<float4*>(partials + (blockIdx.x * 2LL + half) * C);
            for (int u = threadIdx.x; u < C / 4; u += 256) {
                float4 t = sh[0][u];
                for (int q = 1; q < 8; q++) t = add4(t, sh[q][u]);
                out[u] = t;
            }
            __syncthreads();
        }
    }
}

int main() {
    const long long n = (long long)N * C;
    const int SETS = 3;  // copies of the arrays, rotated: the 50 MB L2 holds no repeat
    std::vector<float*> a(SETS), b(SETS), o(SETS);
    float *w, *mean, *rstd, *partials;
    for (int i = 0; i < SETS; i++) {
        CK(cudaMalloc(&a[i], n * 4));
        CK(cudaMalloc(&b[i], n * 4));
        CK(cudaMalloc(&o[i], n * 4));
        CK(cudaMemset(a[i], 0, n * 4));
        CK(cudaMemset(b[i], 0, n * 4));
    }
    CK(cudaMalloc(&w, C * 4));
    CK(cudaMalloc(&mean, N * 4));
    CK(cudaMalloc(&rstd, N * 4));
    CK(cudaMalloc(&partials, 4096 * 2 * C * 4));
    CK(cudaMemset(w, 0, C * 4));
    CK(cudaMemset(mean, 0, N * 4));
    CK(cudaMemset(rstd, 0, N * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto time = [&](const char* name, double bytes, auto f) {
        for (int i = 0; i < 3; i++) f(i % SETS);
        CK(cudaDeviceSynchronize());
        const int reps = 30;
        CK(cudaEventRecord(e0));
        for (int i = 0; i < reps; i++) f(i % SETS);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        printf("%-42s %8.4f ms %7.0f GB/s\n", name, ms, bytes / ms / 1e6);
    };
    for (int blocks : {1056, 8192}) {
        char name[64];
        snprintf(name, sizeof name, "copy, %d blocks", blocks);
        time(name, 2.0 * n * 4, [&](int s) { k_copy<<<blocks, 256>>>((float4*)o[s], (const float4*)a[s], n / 4); });
        snprintf(name, sizeof name, "dout * x streamed, %d blocks", blocks);
        time(name, 3.0 * n * 4, [&](int s) {
            k_stream21<<<blocks, 256>>>((float4*)o[s], (const float4*)a[s], (const float4*)b[s], n / 4);
        });
    }
    for (int blocks : {1024, 528, 396, 264, 132}) {
        char name[64];
        snprintf(name, sizeof name, "warp a row, %d blocks", blocks);
        time(name, 3.0 * n * 4,
             [&](int s) { k_warprow<false><<<blocks, 256>>>(o[s], partials, a[s], b[s], w, mean, rstd); });
        snprintf(name, sizeof name, "warp a row, dw and db too, %d blocks", blocks);
        time(name, 3.0 * n * 4,
             [&](int s) { k_warprow<true><<<blocks, 256>>>(o[s], partials, a[s], b[s], w, mean, rstd); });
    }
    return 0;
}
