// Column sums of x (N, C), added into out (C): a linear layer's bias gradient from its dout, and the layernorm
// weights' gradients, deterministically (every sum in a fixed order, no atomics), by the engine's kernels
// (cuda/colsum.cuh), each checked against the CPU's float64 sums, then timed, at mlp.fc's dout (N 8192, C 3072).
//
//   make -C dev/cuda && dev/cuda/build/colsum     # every version
//   dev/cuda/build/colsum 3                       # one of them
//
//   1  k_colsum_naive (here): a thread a column, its N rows in order
//   2  k_colsum_partial, then k_colsum_reduce: blocks of 32 columns by N / 32 rows, 8 warps a block taking every
//      8th row, 8 rows a warp in flight; then a thread a column adds the 32 chunks in order. A lane one column a
//      row
//   3  the same, a lane 4 columns a row in one 16-byte load (C % 4 == 0, x 16-byte aligned)
#include "common.h"

#include "../../cuda/colsum.cuh"

// microgpt/kernels/colsum.py's REDUCE_BLOCK and chunks(): 32 chunks of at least 8 rows, a function of N alone
constexpr int REDUCE_BLOCK = 64;
int rows_per_chunk(int N) { return std::max(8, ceil_div(N, 32)); }

__global__ void k_colsum_naive(float* out, const float* x, int N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int n = 0; n < N; n++) s += x[(long long)n * C + c];
    out[c] += s;
}

void colsum_cpu(double* out, const float* x, int N, int C) {
    std::fill(out, out + C, 0.0);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) out[c] += x[(size_t)n * C + c];
}

// partials: a row of C for each chunk
void colsum(int version, float* out, float* partials, const float* x, int N, int C) {
    if (version == 1) {
        k_colsum_naive<<<ceil_div(C, 256), 256>>>(out, x, N, C);
    } else {
        const int vec = version == 3 ? 4 : 1, rows = rows_per_chunk(N), chunks = ceil_div(N, rows);
        k_colsum_partial<<<dim3(ceil_div(C, 32 * vec), chunks), 256>>>(partials, x, N, C, C, rows, vec == 4);
        k_colsum_reduce<<<ceil_div(C, REDUCE_BLOCK), REDUCE_BLOCK>>>(out, partials, chunks, C);
    }
    cudaCheck(cudaGetLastError());
}

int main(int argc, char** argv) {
    setup_main();
    const int only = version_arg(argc, argv, 1);
    const int N = 8192, C = 3072;
    const std::vector<float> x = make_random_float((size_t)N * C);
    std::vector<double> out_ref(C);
    colsum_cpu(out_ref.data(), x.data(), N, C);
    float *d_x = to_device(x), *d_out = device_nan(C), *d_partials = device_nan((size_t)32 * C);
    printf("\nN = %d rows of C = %d\n", N, C);
    for (int v = 1; v <= 3; v++) {
        if (only && v != only) continue;
        printf("version %d\n", v);
        cudaCheck(cudaMemset(d_out, 0, C * sizeof(float)));  // added into
        colsum(v, d_out, d_partials, d_x, N, C);
        // the naive kernel's one running sum of N terms in [-1, 1] errs by about u * N (u = 2^-24), so it is held to
        // a few times that; the engine's kernels, summing short chunks, to 1e-4 as every other bench
        validate_result(d_out, out_ref.data(), "out", C, v == 1 ? 8 * std::ldexp(1.0, -24) * N : 1e-4);
        const float ms = benchmark_kernel(100, [&] { colsum(v, d_out, d_partials, d_x, N, C); });
        printf("  time %.4f ms, %.0f GB/s\n", ms, (double)N * C * sizeof(float) / ms / 1e6);
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
