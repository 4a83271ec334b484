// LayerNorm over the rows of x (N, C), forward and backward: the engine's kernels (cuda/layernorm.cuh,
// cuda/layernorm_fast.cuh), each checked against the CPU reference, then timed, at andrea-120m's rows.
//
//   make -C dev/cuda && dev/cuda/build/layernorm    # every version of both
//   dev/cuda/build/layernorm fwd 3                  # one version (fwd or bwd, then its number)
//
// forward: out = (x - mean) * rstd * w + b; mean and rstd (N) saved for the backward
//   1  k_layernorm_fwd: a thread a row (the reference kernel)
//   2  k_layernorm_fwd_fast: a warp a row, held in registers
//   3  k_layernorm_fwd_staged: a warp a row, staged through shared memory by cp.async (sm_80; C % 4 == 0, C <= 1024)
// backward: dx written; dw, db added into
//   1  k_layernorm_bwd: a thread a row for dx, a thread a column for dw and db (the reference kernel)
//   2  k_layernorm_bwd_fast_wide: a block takes rows one at a time, each thread 4 columns of every 4096, its
//      shares of dw and db kept in the block's partial row (the path of rows longer than 4096)
//   3  k_layernorm_bwd_fast: a block spans a row, each thread 4 columns, its shares of dw and db in registers
//   2 and 3 write a partial row of dw and db a block; the launch's last blocks add them, in a fixed order.
#include "common.h"

#include "../../cuda/layernorm.cuh"
#include "../../cuda/layernorm_fast.cuh"

// microgpt/kernels/layernorm_fast.py's BWD_BLOCKS: the backward's grid aims at this many blocks, a constant so
// that which rows a block adds, and so every bit of dw and db, does not depend on the GPU
constexpr int BWD_BLOCKS = 512;

// ---------------------------------------------------------------------------------------------- CPU reference
void layernorm_forward_cpu(double* out, double* mean, double* rstd, const float* x, const float* w, const float* b,
                           int N, int C) {
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        const double s = 1.0 / std::sqrt(v / C + LN_EPS);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (xr[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w; dw, db the column sums of
// dout * xhat and dout (written: the GPU's are added into zeros)
void layernorm_backward_cpu(double* dx, double* dw, double* db, const float* dout, const float* x, const float* w,
                            const float* mean, const float* rstd, int N, int C) {
    std::fill(dw, dw + C, 0.0);
    std::fill(db, db + C, 0.0);
    for (int n = 0; n < N; n++) {
        const float *dr = dout + (size_t)n * C, *xr = x + (size_t)n * C;
        double mean_g = 0.0, mean_gh = 0.0;
        for (int c = 0; c < C; c++) {
            const double xhat = ((double)xr[c] - mean[n]) * rstd[n];
            mean_g += (double)dr[c] * w[c];
            mean_gh += (double)dr[c] * w[c] * xhat;
            dw[c] += dr[c] * xhat;
            db[c] += dr[c];
        }
        mean_g /= C, mean_gh /= C;
        for (int c = 0; c < C; c++) {
            const double xhat = ((double)xr[c] - mean[n]) * rstd[n];
            dx[(size_t)n * C + c] = rstd[n] * ((double)dr[c] * w[c] - mean_g - xhat * mean_gh);
        }
    }
}

// ---------------------------------------------------------------------------------------------- forward
void layernorm_forward1(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                        int C) {
    k_layernorm_fwd<<<ceil_div(N, 256), 256>>>(out, mean, rstd, x, w, b, N, C);
}

void layernorm_forward2(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                        int C) {
    k_layernorm_fwd_fast<<<ceil_div(N * 32, 256), 256>>>(out, mean, rstd, x, w, b, N, C);
}

void layernorm_forward3(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int N,
                        int C) {
    const int warps = LN_STAGED_WARPS, shared = warps * C * (int)sizeof(float);  // a row a warp
    k_layernorm_fwd_staged<<<ceil_div(N, warps), 32 * warps, shared>>>(out, mean, rstd, x, w, b, N, C);
}

void layernorm_forward(int version, float* out, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int N, int C) {
    switch (version) {
        case 1: layernorm_forward1(out, mean, rstd, x, w, b, N, C); break;
        case 2: layernorm_forward2(out, mean, rstd, x, w, b, N, C); break;
        case 3: layernorm_forward3(out, mean, rstd, x, w, b, N, C); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- backward
struct BwdScratch {
    float* partials;         // a partial row of dw and db (2 C) for each block
    unsigned int* counters;  // 2, zero before the first launch; each launch leaves them zero
};

void layernorm_backward1(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                         const float* mean, const float* rstd, int N, int C, BwdScratch) {
    k_layernorm_bwd<<<dim3(ceil_div(std::max(N, C), 256), 2), 256>>>(dx, dw, db, dout, x, w, mean, rstd, N, C, 0);
}

// k_layernorm_bwd_fast and _wide as microgpt/kernels/layernorm_fast.py launches them: rows_per_block a multiple
// of LN_BWD_ROWS for at most BWD_BLOCKS blocks, and as many reducers as strips of 2 C, at most a quarter of the
// blocks the GPU holds at once (they wait in place for the others)
template <class Kernel>
void layernorm_backward_fast(Kernel* kernel, int threads, int shared, float* dx, float* dw, float* db,
                             const float* dout, const float* x, const float* w, const float* mean, const float* rstd,
                             int N, int C, BwdScratch s) {
    const int rows_per_block = LN_BWD_ROWS * std::max(1, ceil_div(N, BWD_BLOCKS * (int)LN_BWD_ROWS));
    const int blocks = ceil_div(N, rows_per_block), strips = ceil_div(2 * C, (int)LN_BWD_REDUCE_COLS);
    int per_sm = 0, sms = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared));
    cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int reducers = std::max(1, std::min({strips, blocks, per_sm * sms / 4}));
    kernel<<<blocks, threads, shared>>>(dx, dw, db, s.partials, s.counters, dout, x, w, mean, rstd, N, C,
                                        rows_per_block, 0, reducers);
}

void layernorm_backward2(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                         const float* mean, const float* rstd, int N, int C, BwdScratch s) {
    const int threads = LN_BWD_THREADS, shared = 16 * threads;  // the reduction's group sums
    layernorm_backward_fast(k_layernorm_bwd_fast_wide, threads, shared, dx, dw, db, dout, x, w, mean, rstd, N, C, s);
}

void layernorm_backward3(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                         const float* mean, const float* rstd, int N, int C, BwdScratch s) {
    const int threads = 32 * ceil_div(C, 4 * 32), shared = 2 * 16 * threads;  // each thread's dw and db shares
    layernorm_backward_fast(k_layernorm_bwd_fast, threads, shared, dx, dw, db, dout, x, w, mean, rstd, N, C, s);
}

void layernorm_backward(int version, float* dx, float* dw, float* db, const float* dout, const float* x,
                        const float* w, const float* mean, const float* rstd, int N, int C, BwdScratch s) {
    switch (version) {
        case 1: layernorm_backward1(dx, dw, db, dout, x, w, mean, rstd, N, C, s); break;
        case 2: layernorm_backward2(dx, dw, db, dout, x, w, mean, rstd, N, C, s); break;
        case 3: layernorm_backward3(dx, dw, db, dout, x, w, mean, rstd, N, C, s); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- main
int main(int argc, char** argv) {
    const Gpu gpu = setup_main();
    const char* dir = argc > 1 ? argv[1] : "all";
    const int only = version_arg(argc, argv, 2);
    const int B = 8, T = 1024, C = 768, N = B * T;  // andrea-120m
    const size_t NC = (size_t)N * C;

    std::vector<float> x = make_random_float(NC), w = make_random_float(C), b = make_random_float(C);
    std::vector<float> dout = make_random_float(NC);
    std::vector<double> out_ref(NC), mean_ref(N), rstd_ref(N), dx_ref(NC), dw_ref(C), db_ref(C);
    layernorm_forward_cpu(out_ref.data(), mean_ref.data(), rstd_ref.data(), x.data(), w.data(), b.data(), N, C);
    const std::vector<float> mean = to_float(mean_ref), rstd = to_float(rstd_ref);  // the backward's inputs
    layernorm_backward_cpu(dx_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), x.data(), w.data(), mean.data(),
                           rstd.data(), N, C);

    float *d_x = to_device(x), *d_w = to_device(w), *d_b = to_device(b), *d_dout = to_device(dout);
    float *d_mean_in = to_device(mean), *d_rstd_in = to_device(rstd);
    float *d_out = device_nan(NC), *d_mean = device_nan(N), *d_rstd = device_nan(N), *d_dx = device_nan(NC);
    float *d_dw = device_nan(C), *d_db = device_nan(C);
    BwdScratch s{device_nan((size_t)BWD_BLOCKS * 2 * C), nullptr};
    cudaCheck(cudaMalloc(&s.counters, 2 * sizeof(unsigned int)));
    cudaCheck(cudaMemset(s.counters, 0, 2 * sizeof(unsigned int)));

    if (strcmp(dir, "all") == 0 || strcmp(dir, "fwd") == 0) {
        printf("\nforward, N = %d rows of C = %d\n", N, C);
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            char name[32];
            snprintf(name, sizeof(name), "forward %d", v);
            if (v == 3 && !runs_here(name, gpu.arch >= 800 && C % 4 == 0 && C <= LN_STAGED_MAX_C,
                                     "sm_80 (cp.async) and rows of 16-byte chunks up to 1024 columns"))
                continue;
            printf("%s\n", name);
            poison(d_out, NC), poison(d_mean, N), poison(d_rstd, N);
            layernorm_forward(v, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
            validate_result(d_out, out_ref.data(), "out", NC, 1e-5);
            validate_result(d_mean, mean_ref.data(), "mean", N, 1e-5);
            validate_result(d_rstd, rstd_ref.data(), "rstd", N, 1e-5);
            const float ms =
                benchmark_kernel(100, [&] { layernorm_forward(v, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C); });
            const double bytes = (2.0 * NC + 2.0 * N) * sizeof(float);  // x in, out, mean, rstd out
            printf("  time %.4f ms, %.0f GB/s\n", ms, bytes / ms / 1e6);
        }
    }
    if (strcmp(dir, "all") == 0 || strcmp(dir, "bwd") == 0) {
        printf("\nbackward, N = %d rows of C = %d\n", N, C);
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            printf("backward %d\n", v);
            poison(d_dx, NC);
            cudaCheck(cudaMemset(d_dw, 0, C * sizeof(float)));
            cudaCheck(cudaMemset(d_db, 0, C * sizeof(float)));
            layernorm_backward(v, d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean_in, d_rstd_in, N, C, s);
            validate_result(d_dx, dx_ref.data(), "dx", NC, 1e-5);
            validate_result(d_dw, dw_ref.data(), "dw", C, 1e-4);  // sums over N rows
            validate_result(d_db, db_ref.data(), "db", C, 1e-4);
            const float ms = benchmark_kernel(100, [&] {
                layernorm_backward(v, d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean_in, d_rstd_in, N, C, s);
            });
            const double bytes = (3.0 * NC + 2.0 * N) * sizeof(float);  // dout, x, mean, rstd in, dx out
            printf("  time %.4f ms, %.0f GB/s\n", ms, bytes / ms / 1e6);
        }
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
