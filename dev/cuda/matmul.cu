// The linear layer's product, out = inp @ weight^T + bias (inp M x K, weight N x K, bias N: the NT layout of the
// engine's GEMM), by the engine's kernels (cuda/matmul.cuh, matmul_fast.cuh, matmul_tc.cuh, tf32_split.cuh), each
// checked against the CPU's float64 product at an odd shape, then timed at andrea-120m's mlp.fc forward.
//
//   make -C dev/cuda && dev/cuda/build/matmul    # every version
//   dev/cuda/build/matmul 4                      # one of them
//
//   1  k_matmul_fwd: a thread an output (the reference kernel)
//   2  k_sgemm_nt: SIMT SGEMM, 128 x 128 tiles through shared memory, 8 x 8 outputs a thread
//   3  k_gemm_tc_nt: 3xTF32 on mma.sync (sm_80): each operand split into TF32 hi + lo as its fragment is read,
//      lo*hi + hi*lo + hi*hi of each k8 step into a zeroed fragment, then added into an FP32 running sum
//   4  k_gemm_wg_nt: 3xTF32 on wgmma (sm_90a): a producer warpgroup copies and splits each 32-wide slice of K
//      into swizzled shared memory, two consumer warpgroups multiply it, 12 wgmma a slice, FP32 adds between
//   5  k_tf32_split of the weight, then k_gemm_wg_areg (sm_90a) on a block a tile: 4's product with the weight split
//      before it, so that the producer only copies, and inp copied raw and split by the consumers into the registers
//      wgmma takes A from, so that no pass splits it; the same bits as 4. Timed with the weight's split pass, which
//      the engine makes once a forward for every product, and without.
//   6  5 on a block an SM, each taking every SM-count-th tile (as the engine launches it): a block copies its next
//      tile's first slices while it stores the last one's; the same bits as 4.
// Versions 3-6 are as accurate as FP32 (their error is printed beside the others'), not TF32's.
#include "common.h"

#include "../../cuda/matmul.cuh"
#include "../../cuda/matmul_fast.cuh"
#include "../../cuda/tf32_split.cuh"  // and matmul_tc.cuh

// ---------------------------------------------------------------------------------------------- CPU reference
void matmul_forward_cpu(double* out, const float* inp, const float* weight, const float* bias, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *a = inp + (size_t)m * K, *w = weight + (size_t)n * K;
            double s = bias[n];
            for (int k = 0; k < K; k++) s += (double)a[k] * w[k];
            out[(size_t)m * N + n] = s;
        }
}

// ---------------------------------------------------------------------------------------------- the versions
// Versions 5 and 6: the weight's hi then lo, each rows_pad x K_pad in the products' 128 x 32 tiles (split_at), zero
// past the matrix; and the GPU's SMs, the most blocks version 6 launches.
struct Splits {
    uint32_t* b;
    int sms;
};
int rows_pad(int rows) { return ceil_div(rows, (int)TC_SPLIT_ROWS) * TC_SPLIT_ROWS; }
int k_pad(int K) { return ceil_div(K, (int)TC_SPLIT_K) * TC_SPLIT_K; }

void matmul_forward1(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K,
                     Splits) {
    k_matmul_fwd<<<(unsigned)ceil_div((long long)M * N, 256LL), 256>>>(out, inp, weight, bias, M, K, N, N);
}

// the GEMM kernels' common arguments (GEMM_KERNEL in matmul_fast.cuh): C = A @ B^T + bias, no batch, no causal
// skipping, on a grid of 128 x 128 tiles
template <class Kernel>
void gemm_nt(Kernel* kernel, int threads, int shared, float* out, const float* inp, const float* weight,
             const float* bias, int M, int N, int K) {
    const dim3 grid(ceil_div(N, 128), ceil_div(M, 128));
    kernel<<<grid, threads, shared>>>(out, inp, weight, bias, M, N, K, K, K, N, 0, 0, 0, 1.0f, 0.0f, CAUSAL_NONE,
                                      0.0f, nullptr);
}

void matmul_forward2(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K,
                     Splits) {
    gemm_nt(k_sgemm_nt, GEMM_THREADS, 0, out, inp, weight, bias, M, N, K);
}

void matmul_forward3(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K,
                     Splits) {
    gemm_nt(k_gemm_tc_nt, TC_THREADS, TC_SMEM_BYTES, out, inp, weight, bias, M, N, K);
}

void matmul_forward4(float* out, const float* inp, const float* weight, const float* bias, int M, int N, int K,
                     Splits) {
    gemm_nt(k_gemm_wg_nt, TC_WG_THREADS, TC_WG_SMEM_BYTES, out, inp, weight, bias, M, N, K);
}

// rows x K at src (ld = K) into hi and lo at split, a thread a quad of K
void split_operand(uint32_t* split, const float* src, int rows, int K) {
    const long long plane = (long long)rows_pad(rows) * k_pad(K), quads = plane / 4;
    k_tf32_split<<<(unsigned)ceil_div(quads, 256LL), 256>>>(split, split + plane, src, rows, K, K, k_pad(K), quads);
}

// k_gemm_wg_areg: a block a tile (version 5), or a block an SM (6)
void matmul_product56(int version, float* out, const float* inp, const float* bias, int M, int N, int K, Splits s) {
    const int tiles = ceil_div(N, 128) * ceil_div(M, 128), blocks = version == 5 ? tiles : std::min(tiles, s.sms);
    k_gemm_wg_areg<<<blocks, TC_WG_THREADS, TC_AREG_STORE_SMEM_BYTES>>>(out, inp, nullptr, s.b, bias, M, N, K, K,
                                                                         k_pad(K), N, 1.0f, 0.0f);
}

void matmul_forward56(int version, float* out, const float* inp, const float* weight, const float* bias, int M,
                      int N, int K, Splits s) {
    split_operand(s.b, weight, N, K);  // op(B)^T = weight, N x K as it lies
    matmul_product56(version, out, inp, bias, M, N, K, s);
}

void matmul_forward(int version, float* out, const float* inp, const float* weight, const float* bias, int M, int N,
                    int K, Splits s) {
    switch (version) {
        case 1: matmul_forward1(out, inp, weight, bias, M, N, K, s); break;
        case 2: matmul_forward2(out, inp, weight, bias, M, N, K, s); break;
        case 3: matmul_forward3(out, inp, weight, bias, M, N, K, s); break;
        case 4: matmul_forward4(out, inp, weight, bias, M, N, K, s); break;
        case 5:
        case 6: matmul_forward56(version, out, inp, weight, bias, M, N, K, s); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- main
struct Problem {
    int M, N, K;
    float *inp, *weight, *bias, *out;
    Splits s;
    Problem(int M_, int N_, int K_, int sms) : M(M_), N(N_), K(K_) {
        s.sms = sms;
        inp = to_device(make_random_float((size_t)M * K));
        weight = to_device(make_random_float((size_t)N * K));
        bias = to_device(make_random_float(N));
        out = device_nan((size_t)M * N);
        cudaCheck(cudaMalloc(&s.b, 2 * sizeof(uint32_t) * rows_pad(N) * k_pad(K)));
    }
    void run(int version) { matmul_forward(version, out, inp, weight, bias, M, N, K, s); }
};

int main(int argc, char** argv) {
    const Gpu gpu = setup_main();
    const int only = version_arg(argc, argv, 1);
    if (gpu.arch >= 800) allow_shared(k_gemm_tc_nt, TC_SMEM_BYTES);
    if (gpu.wgmma) {
        allow_shared(k_gemm_wg_nt, TC_WG_SMEM_BYTES);
        allow_shared(k_gemm_wg_areg, TC_AREG_STORE_SMEM_BYTES);
    }

    // checked at a shape of partial tiles (version 6 on 7 blocks: 6 or 7 tiles each), timed at mlp.fc's forward
    // (B * T = 8192, C = 768, 4 C = 3072)
    Problem check(1000, 700, 768, 7), bench(8192, 3072, 768, gpu.prop.multiProcessorCount);
    std::vector<float> h_inp((size_t)check.M * check.K), h_weight((size_t)check.N * check.K), h_bias(check.N);
    cudaCheck(cudaMemcpy(h_inp.data(), check.inp, h_inp.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_weight.data(), check.weight, h_weight.size() * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(h_bias.data(), check.bias, h_bias.size() * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> out_ref((size_t)check.M * check.N);
    matmul_forward_cpu(out_ref.data(), h_inp.data(), h_weight.data(), h_bias.data(), check.M, check.N, check.K);

    printf("\nchecked at %d x %d x %d, timed at %d x %d x %d (M x N x K)\n", check.M, check.N, check.K, bench.M,
           bench.N, bench.K);
    std::vector<float> out4;  // version 4's output, whose bits versions 5 and 6 give
    for (int v = 1; v <= 6; v++) {
        if (only && v != only) continue;
        char name[32];
        snprintf(name, sizeof(name), "version %d", v);
        if (v == 3 && !runs_here(name, gpu.arch >= 800, "sm_80 (mma.sync TF32)")) continue;
        if (v >= 4 && !runs_here(name, gpu.wgmma, "the sm_90a build on compute capability 9.0 (wgmma)")) continue;
        printf("%s\n", name);
        poison(check.out, (size_t)check.M * check.N);
        check.run(v);
        validate_result(check.out, out_ref.data(), "out", out_ref.size(), 1e-4);
        if (v >= 4) {
            std::vector<float> out(out_ref.size());
            cudaCheck(cudaMemcpy(out.data(), check.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
            if (v == 4) out4 = out;
            else if (!out4.empty())
                printf("  bits: %s version 4's\n",
                       memcmp(out.data(), out4.data(), out.size() * sizeof(float)) ? "differ from" : "the same as");
        }
        const int repeats = v == 1 ? 5 : 50;
        const float ms = benchmark_kernel(repeats, [&] { bench.run(v); });
        const double flops = 2.0 * bench.M * bench.N * bench.K;
        printf("  time %.4f ms, %.1f TFLOP/s", ms, flops / ms / 1e9);
        if (v >= 5) {
            const float product = benchmark_kernel(repeats, [&] {
                matmul_product56(v, bench.out, bench.inp, bench.bias, bench.M, bench.N, bench.K, bench.s);
            });
            printf("; the product alone %.4f ms, %.1f TFLOP/s", product, flops / product / 1e9);
        }
        printf("\n");
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
