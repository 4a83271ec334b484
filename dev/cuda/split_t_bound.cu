// The transposing split of the tensor cores' operands (k_tf32_split_t, cuda/tf32_split.cuh: a weight W (OUT x IN) as
// the dX product reads it, W^T's rows split into TF32 hi and lo, K-major, padded to whole tiles), at andrea-120m's
// four linear layers, against the copy bandwidth. In the step (tools/profile_step.py, H200, 2026-12-01) its 49 launches a
// backward took about 11 us each, about 49% of the copy rate for the bytes they move: the one split pass under the
// 80% bar. Variants, each checked for the engine's bits, then timed as 30 launches in one CUDA graph (the model's
// passes are graphs) rotating three sets of arrays, the median of 7:
//
// - engine: k_tf32_split_t (a 32 x 32 tile of shared memory, a float a thread each way, 4 a thread);
// - t64: a 64 x 64 tile, each thread 4 16-byte loads along W's rows and 4 16-byte stores of hi and of lo along
//   W^T's: a quarter of the blocks, a quarter of the memory instructions.
// - copy: a copy kernel moving the same bytes (16 bytes a thread, a graph of 30), what a pass this short reaches.
//
//     nvcc -O3 -arch=sm_90a -std=c++17 -I cuda -o /tmp/split_t dev/cuda/split_t_bound.cu && /tmp/split_t
//
// H200, 2026-12-02 (of the 4.27 TB/s copy): engine 67.2 / 55.2 / 71.9 / 72.7% (qkv, attn.proj, mlp.fc, mlp.proj),
// t64 74.9 / 56.5 / 80.5 / 80.6%, the copy 133 / 87 / 145 / 145% (its bytes stay in L2). A launch a weight stays
// short whatever its tile: the engine now splits every weight of a pass in one launch (k_tf32_split_batch, t64's
// tile), 85.5% as the forward reads them, 83.8% transposed.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "tf32_split.cuh"  // k_tf32_split_t, tf32_split_store

#include "probe.cuh"  // CK, time_graph_ms, copy_bandwidth_gbs

// src stored K x rows (ld = rows); hi, lo: rows_pad x K_pad. A block a 64 x 64 tile: grid (ceil(K_pad / 64),
// rows_pad / 64), 256 threads.
__global__ void __launch_bounds__(256) k_split_t64(uint32_t* hi, uint32_t* lo, const float* src, int rows, int K,
                                                   int K_pad) {
    __shared__ float t[64][65];
    const int k0 = blockIdx.x * 64, r0 = blockIdx.y * 64, tid = threadIdx.x;
    const bool vec = rows % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {  // src's rows k0 + kk, 16 float4 a row
        const int kk = tid / 16 + 16 * i, rr = (tid % 16) * 4, k = k0 + kk, r = r0 + rr;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (k < K && r < rows) {
            const float* p = src + (long long)k * rows + r;
            if (vec)
                v = *reinterpret_cast<const float4*>(p);
            else
                v = make_float4(p[0], r + 1 < rows ? p[1] : 0.0f, r + 2 < rows ? p[2] : 0.0f,
                                r + 3 < rows ? p[3] : 0.0f);
        }
        t[kk][rr] = v.x, t[kk][rr + 1] = v.y, t[kk][rr + 2] = v.z, t[kk][rr + 3] = v.w;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; i++) {  // the output's rows r0 + rr, 16 float4 a row
        const int rr = tid / 16 + 16 * i, kq = (tid % 16) * 4, k = k0 + kq;
        if (k >= K_pad) continue;  // K_pad % 32 == 0: a float4 is all in or all out
        const float4 v = make_float4(t[kq][rr], t[kq + 1][rr], t[kq + 2][rr], t[kq + 3][rr]);
        tf32_split_store(hi, lo, (r0 + rr) * K_pad + k, v);
    }
}

__global__ void k_copy(float4* out, const float4* in, long long n4) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) out[i] = in[i];
}

int main() {
    const double copy_gbs = copy_bandwidth_gbs();
    printf("copy bandwidth (2 GB each way): %.0f GB/s\n", copy_gbs);
    const int C = 768;
    const struct { const char* name; int rows, K; } shapes[] = {
        {"qkv (768 x 2304)", C, 3 * C}, {"attn.proj (768 x 768)", C, C}, {"mlp.fc (768 x 3072)", C, 4 * C},
        {"mlp.proj (3072 x 768)", 4 * C, C}, {"odd (770 x 301)", 770, 301}};
    for (auto sh : shapes) {
        const int rows = sh.rows, K = sh.K, K_pad = (K + 31) / 32 * 32, rows_pad = (rows + 127) / 128 * 128;
        const size_t n_src = (size_t)K * rows, n_out = (size_t)rows_pad * K_pad;
        std::vector<float> h(n_src);
        for (size_t i = 0; i < n_src; i++) h[i] = (float)((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
        float* src[3];
        uint32_t* out[3][2];
        for (int s = 0; s < 3; s++) {
            CK(cudaMalloc(&src[s], n_src * 4));
            CK(cudaMemcpy(src[s], h.data(), n_src * 4, cudaMemcpyHostToDevice));
            for (int j = 0; j < 2; j++) CK(cudaMalloc(&out[s][j], n_out * 4));
        }
        auto engine = [&](int s, cudaStream_t st) {
            k_tf32_split_t<<<dim3(K_pad / 32, rows_pad / 32), 256, 0, st>>>(out[s][0], out[s][1], src[s], rows, K,
                                                                           rows, K_pad);
        };
        auto t64 = [&](int s, cudaStream_t st) {
            k_split_t64<<<dim3((K_pad + 63) / 64, rows_pad / 64), 256, 0, st>>>(out[s][0], out[s][1], src[s], rows,
                                                                               K, K_pad);
        };
        // the engine's bits, then t64's
        std::vector<uint32_t> want(2 * n_out), got(2 * n_out);
        engine(0, 0);
        CK(cudaDeviceSynchronize());
        for (int j = 0; j < 2; j++)
            CK(cudaMemcpy(want.data() + j * n_out, out[0][j], n_out * 4, cudaMemcpyDeviceToHost));
        for (int j = 0; j < 2; j++) CK(cudaMemset(out[0][j], 0xff, n_out * 4));
        t64(0, 0);
        CK(cudaDeviceSynchronize());
        for (int j = 0; j < 2; j++)
            CK(cudaMemcpy(got.data() + j * n_out, out[0][j], n_out * 4, cudaMemcpyDeviceToHost));
        const bool same = memcmp(want.data(), got.data(), 2 * n_out * 4) == 0;
        const double bytes = 4.0 * n_src + 8.0 * n_out;
        auto report = [&](const char* what, double t) {
            printf("%-24s %-8s %8.4f ms %7.0f GB/s %6.1f%%\n", sh.name, what, t, bytes / t / 1e6,
                   100.0 * bytes / t / 1e6 / copy_gbs);
        };
        report("engine", time_graph_ms(engine));
        report(same ? "t64" : "t64 WRONG", time_graph_ms(t64));
        const long long n4 = (long long)(bytes / 2) / 16;  // half the bytes read, half written
        float4 *cin, *cout;
        CK(cudaMalloc(&cin, n4 * 16));
        CK(cudaMalloc(&cout, n4 * 16));
        report("copy", time_graph_ms([&](int, cudaStream_t st) {
                   k_copy<<<(unsigned)((n4 + 255) / 256), 256, 0, st>>>(cout, cin, n4);
               }));
        CK(cudaFree(cin));
        CK(cudaFree(cout));
        for (int s = 0; s < 3; s++) {
            CK(cudaFree(src[s]));
            for (int j = 0; j < 2; j++) CK(cudaFree(out[s][j]));
        }
    }
    return 0;
}
