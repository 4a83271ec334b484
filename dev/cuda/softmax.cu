// The row softmax of attention's causal scores (B * NH * T rows of T, masked to MASK_VALUE above the diagonal as
// k_causal_mask_fwd leaves them), forward and backward, by the engine's kernels (cuda/attention.cuh,
// cuda/rows_fast.cuh), each checked against the CPU's float64 softmax, then timed, at andrea-120m's scores.
//
//   make -C dev/cuda && dev/cuda/build/softmax     # every version of both
//   dev/cuda/build/softmax fwd 3                   # one version (fwd or bwd, then its number)
//
// forward: probs = exp(x - max) / sum, a row at a time
//   1  k_softmax_fwd: a thread a row (the reference kernel)
//   2  k_softmax_fwd_fast: a warp a row, held in registers (16-byte loads where aligned), whole rows
//   3  k_softmax_fwd_fast, causal: row i reads its first i + 1 columns only and writes the rest 0
// backward: dx = probs * (dprobs - the row's sum of dprobs * probs)
//   1  k_softmax_bwd, 2  k_softmax_bwd_fast, 3  k_softmax_bwd_fast causal, as the forward's
#include "common.h"

#include "../../cuda/attention.cuh"
#include "../../cuda/rows_fast.cuh"

// ---------------------------------------------------------------------------------------------- CPU reference
void softmax_forward_cpu(double* probs, const float* x, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float* xr = x + (size_t)r * cols;
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j < cols; j++) m = std::max(m, (double)xr[j]);
        for (int j = 0; j < cols; j++) sum += std::exp(xr[j] - m);
        for (int j = 0; j < cols; j++) probs[(size_t)r * cols + j] = std::exp(xr[j] - m) / sum;
    }
}

void softmax_backward_cpu(double* dx, const float* dprobs, const float* probs, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *dp = dprobs + (size_t)r * cols, *p = probs + (size_t)r * cols;
        double d = 0.0;
        for (int j = 0; j < cols; j++) d += (double)dp[j] * p[j];
        for (int j = 0; j < cols; j++) dx[(size_t)r * cols + j] = p[j] * (dp[j] - d);
    }
}

// ---------------------------------------------------------------------------------------------- the versions
unsigned grid_for(long long threads) { return (unsigned)ceil_div(threads, 256LL); }

void softmax_forward(int version, float* probs, const float* x, int rows, int cols) {
    switch (version) {
        case 1: k_softmax_fwd<<<grid_for(rows), 256>>>(probs, x, rows, cols); break;
        case 2: k_softmax_fwd_fast<<<grid_for(32LL * rows), 256>>>(probs, x, rows, cols, 0); break;  // a warp a row
        case 3: k_softmax_fwd_fast<<<grid_for(32LL * rows), 256>>>(probs, x, rows, cols, 1); break;
    }
    cudaCheck(cudaGetLastError());
}

void softmax_backward(int version, float* dx, const float* dprobs, const float* probs, int rows, int cols) {
    switch (version) {
        case 1: k_softmax_bwd<<<grid_for(rows), 256>>>(dx, dprobs, probs, rows, cols); break;
        case 2: k_softmax_bwd_fast<<<grid_for(32LL * rows), 256>>>(dx, dprobs, probs, rows, cols, 0); break;
        case 3: k_softmax_bwd_fast<<<grid_for(32LL * rows), 256>>>(dx, dprobs, probs, rows, cols, 1); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- main
int main(int argc, char** argv) {
    setup_main();
    const char* dir = argc > 1 ? argv[1] : "all";
    const int only = version_arg(argc, argv, 2);
    const int B = 8, NH = 12, T = 1024, rows = B * NH * T;  // andrea-120m's scores, (B, NH, T, T)
    const size_t n = (size_t)rows * T;

    std::vector<float> x = make_random_float(n, -4.0f, 4.0f), dprobs = make_random_float(n);
    for (size_t i = 0; i < n; i++)
        if (i % T > i / T % T) x[i] = MASK_VALUE;  // column j > row i of its (T, T) matrix
    std::vector<double> probs_ref(n), dx_ref(n);
    softmax_forward_cpu(probs_ref.data(), x.data(), rows, T);
    const std::vector<float> probs = to_float(probs_ref);  // the backward's input
    softmax_backward_cpu(dx_ref.data(), dprobs.data(), probs.data(), rows, T);
    float *d_x = to_device(x), *d_dprobs = to_device(dprobs), *d_probs_in = to_device(probs);
    float *d_probs = device_nan(n), *d_dx = device_nan(n);
    // bytes an array of scores, and its lower triangles (all a causal row reads)
    const double full = (double)n * sizeof(float), lower = (double)(rows / T) * T * (T + 1) / 2 * sizeof(float);

    if (strcmp(dir, "all") == 0 || strcmp(dir, "fwd") == 0) {
        printf("\nforward, %d rows of %d\n", rows, T);
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            printf("forward %d\n", v);
            poison(d_probs, n);
            softmax_forward(v, d_probs, d_x, rows, T);
            validate_result(d_probs, probs_ref.data(), "probs", n, 1e-6);
            const float ms = benchmark_kernel(20, [&] { softmax_forward(v, d_probs, d_x, rows, T); });
            const double bytes = v == 3 ? lower + full : 2 * full;  // x read, probs written
            printf("  time %.4f ms, %.0f GB/s\n", ms, bytes / ms / 1e6);
        }
    }
    if (strcmp(dir, "all") == 0 || strcmp(dir, "bwd") == 0) {
        printf("\nbackward, %d rows of %d\n", rows, T);
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            printf("backward %d\n", v);
            poison(d_dx, n);
            softmax_backward(v, d_dx, d_dprobs, d_probs_in, rows, T);
            validate_result(d_dx, dx_ref.data(), "dx", n, 1e-6);
            const float ms = benchmark_kernel(20, [&] { softmax_backward(v, d_dx, d_dprobs, d_probs_in, rows, T); });
            const double bytes = v == 3 ? 2 * lower + full : 3 * full;  // dprobs and probs read, dx written
            printf("  time %.4f ms, %.0f GB/s\n", ms, bytes / ms / 1e6);
        }
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
