// The decode step's products, out (M, N) = epilogue(prologue(inp) (M, K) @ W (N, K)^T + bias) for M <= 8 rows (one
// position a sequence), by the engine's kernels, each checked against the CPU's float64 result at odd shapes (every
// M, K not a multiple of 4, a last block of fewer columns), then timed as a step runs them: andrea-120m's 12 layers
// of four products and the tied lm_head, one CUDA graph, at M = 1 and 8.
//
//   make -C dev/cuda && dev/cuda/build/matvec     # every version
//   dev/cuda/build/matvec 2                       # one of them
//   ncu -k regex:k_matvec_1 -c 4 dev/cuda/build/matvec 2 once    # the step's products launched once, untimed
//   compute-sanitizer --tool racecheck dev/cuda/build/matvec 2 check  # version 2's checks alone
//
//   1  the readable kernels one after the other: k_layernorm_fwd, k_matmul_fwd (a thread an output), k_gelu_fwd,
//      k_residual_fwd
//   2  k_matvec_<R>: a block's columns of W staged in shared memory by cp.async before pdl_wait(), the layernorm in
//      its prologue, bias, GELU and the residual add in its epilogue; launched as programmatic dependents. Timed
//      also with other MATVEC_CHUNK sizes, without the dependent launch, and with other MATVEC_BLOCKS counts
#include "common.h"

#include <numeric>  // std::gcd

#include "../../cuda/layernorm.cuh"
#include "../../cuda/matmul.cuh"
#include "../../cuda/matvec.cuh"
#include "../../cuda/pointwise.cuh"

// ---------------------------------------------------------------------------------------------- CPU reference
void matvec_cpu(double* out, const float* inp, const float* W, const float* bias, const float* ln_w,
                const float* ln_b, const float* resid, int M, int K, int N, bool gelu) {
    std::vector<double> x(K);
    for (int r = 0; r < M; r++) {
        const float* in = inp + (size_t)r * K;
        double mean = 0.0, var = 0.0;
        for (int k = 0; k < K; k++) mean += in[k];
        mean /= K;
        for (int k = 0; k < K; k++) var += (in[k] - mean) * (in[k] - mean);
        const double rstd = 1.0 / std::sqrt(var / K + LN_EPS);
        for (int k = 0; k < K; k++) x[k] = ln_w ? (in[k] - mean) * rstd * ln_w[k] + ln_b[k] : in[k];
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            for (int k = 0; k < K; k++) s += x[k] * W[(size_t)n * K + k];
            if (gelu) s = 0.5 * s * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (s + 0.044715 * s * s * s)));
            out[(size_t)r * N + n] = s + (resid ? resid[(size_t)r * N + n] : 0.0);
        }
    }
}

// ---------------------------------------------------------------------------------------------- the versions
// One product of the step: its arrays on the device; ln_w, ln_b, bias and resid null where it has none.
struct Product {
    float *out, *inp, *W, *bias, *ln_w, *ln_b, *resid, *scratch;
    int M, K, N;
    bool gelu;
};

// microgpt/kernels/matvec.py plan(): k_matvec_<R>, columns a block, parts of K, dynamic shared bytes
struct Plan {
    int R, cols, parts, shared;
};
Plan matvec_plan(int M, int K, int N, bool ln, int chunk, int blocks = MATVEC_BLOCKS) {
    Plan p;
    p.R = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8;
    const int group = matvec_cols(p.R), fit = std::max(1, chunk / (4 * K));
    p.cols = std::min({fit, N, group * ceil_div(ceil_div(N, blocks), group)});
    if (p.cols >= 4 * group) p.cols -= p.cols % (4 * group);
    else if (p.cols > 2 * group) p.cols = 2 * group;
    const int groups = ceil_div(p.cols, group);
    p.parts = 4 / std::gcd(groups, 4);
    p.shared = 4 * (p.cols * K + (ln ? M * K : 0) + groups * p.parts * group * p.R);
    return p;
}

void product1(const Product& p, cudaStream_t s) {
    const float* x = p.inp;
    if (p.ln_w) {  // scratch: M * K layernormed rows, then M means and M rstds
        float* ln = p.scratch;
        k_layernorm_fwd<<<ceil_div(p.M, 256), 256, 0, s>>>(ln, ln + p.M * p.K, ln + p.M * p.K + p.M, p.inp, p.ln_w,
                                                           p.ln_b, p.M, p.K);
        x = ln;
    }
    float* y = p.resid ? p.scratch + p.M * p.K + 2 * p.M : p.out;
    const long long n = (long long)p.M * p.N;
    k_matmul_fwd<<<(unsigned)ceil_div(n, 256LL), 256, 0, s>>>(y, x, p.W, p.bias, p.M, p.K, p.N, p.N);
    if (p.gelu) k_gelu_fwd<<<(unsigned)ceil_div(n, 256LL), 256, 0, s>>>(y, y, n);
    if (p.resid) k_residual_fwd<<<(unsigned)ceil_div(n, 256LL), 256, 0, s>>>(p.out, p.resid, y, n);
}

void product2(const Product& p, cudaStream_t s, int chunk = MATVEC_CHUNK, bool dependent = true,
              int blocks = MATVEC_BLOCKS) {
    static void* kernels[] = {(void*)k_matvec_1, (void*)k_matvec_2, (void*)k_matvec_4, (void*)k_matvec_8};
    Plan plan = matvec_plan(p.M, p.K, p.N, p.ln_w, chunk, blocks);
    void* kernel = kernels[plan.R == 1 ? 0 : plan.R == 2 ? 1 : plan.R == 4 ? 2 : 3];
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.shared));
    int gelu = p.gelu, vec4 = p.K % 4 == 0;
    void* args[] = {(void*)&p.out, (void*)&p.inp, (void*)&p.W, (void*)&p.bias, (void*)&p.ln_w, (void*)&p.ln_b,
                    (void*)&p.resid, (void*)&p.M, (void*)&p.K, (void*)&p.N, &gelu, &plan.cols, &plan.parts, &vec4};
    launch_ex(kernel, dim3(ceil_div(p.N, plan.cols)), dim3(MATVEC_THREADS), plan.shared, s, args, dependent);
}

// ---------------------------------------------------------------------------------------------- main
struct Host {  // a product's inputs on the host and the device
    std::vector<float> inp, W, bias, ln_w, ln_b, resid;
    Product d;
};

Host make_product(int M, int K, int N, bool ln, bool gelu, bool resid, bool bias) {
    Host h;
    h.inp = make_random_float((size_t)M * K), h.W = make_random_float((size_t)N * K);
    h.d = Product{device_nan((size_t)M * N), to_device(h.inp), to_device(h.W), nullptr, nullptr, nullptr, nullptr,
                  device_nan((size_t)M * K + 2 * M + (size_t)M * N), M, K, N, gelu};
    if (bias) h.bias = make_random_float(N), h.d.bias = to_device(h.bias);
    if (ln) {
        h.ln_w = make_random_float(K, 0.5f, 1.5f), h.ln_b = make_random_float(K, -0.1f, 0.1f);
        h.d.ln_w = to_device(h.ln_w), h.d.ln_b = to_device(h.ln_b);
    }
    if (resid) h.resid = make_random_float((size_t)M * N), h.d.resid = h.d.out;  // x += ...: in place
    return h;
}

// andrea-120m's decode step without its attention: per layer qkv = ln1(x) W_qkv^T + b, x += y W_o^T + b,
// h = gelu(ln2(x) W_fc^T + b), x += h W_proj^T + b; then logits = lnf(x) wte^T. Each layer its own weights, so
// that the step reads them all from memory, as a step does.
std::vector<Product> decode_step(int M) {
    const int C = 768, V = 8449, layers = 12;
    float* x = to_device(make_random_float((size_t)M * C));
    float *qkv = device_nan((size_t)M * 3 * C), *y = to_device(make_random_float((size_t)M * C));
    float *h = device_nan((size_t)M * 4 * C), *logits = device_nan((size_t)M * V);
    auto weights = [](int N, int K) { return to_device(make_random_float((size_t)N * K, -0.05f, 0.05f)); };
    auto vec = [](int n, float lo, float hi) { return to_device(make_random_float(n, lo, hi)); };
    std::vector<Product> step;
    for (int l = 0; l < layers; l++) {
        step.push_back({qkv, x, weights(3 * C, C), vec(3 * C, -.1f, .1f), vec(C, .5f, 1.5f), vec(C, -.1f, .1f),
                        nullptr, nullptr, M, C, 3 * C, false});
        step.push_back({x, y, weights(C, C), vec(C, -.1f, .1f), nullptr, nullptr, x, nullptr, M, C, C, false});
        step.push_back({h, x, weights(4 * C, C), vec(4 * C, -.1f, .1f), vec(C, .5f, 1.5f), vec(C, -.1f, .1f),
                        nullptr, nullptr, M, C, 4 * C, true});
        step.push_back({x, h, weights(C, 4 * C), vec(C, -.1f, .1f), nullptr, nullptr, x, nullptr, M, 4 * C, C, false});
    }
    step.push_back({logits, x, weights(V, C), nullptr, vec(C, .5f, 1.5f), vec(C, -.1f, .1f), nullptr, nullptr, M, C,
                    V, false});
    for (Product& p : step) p.scratch = device_nan((size_t)M * p.K + 2 * M + (size_t)M * p.N);
    return step;
}

// The mean time in us of one replay of the step, captured once as a graph (its launches as launch() queues them).
template <class Launch>
float time_step(const std::vector<Product>& step, Launch launch) {
    return graph_us([&](cudaStream_t s) {
        for (const Product& p : step) launch(p, s);
    });
}

int main(int argc, char** argv) {
    setup_main();
    const int only = version_arg(argc, argv, 1);
    if (argc > 2 && !strcmp(argv[2], "once")) {  // for a profiler: the step's products at M 1, then 8, launched once
        for (int M : {1, 8})
            for (const Product& p : decode_step(M)) product2(p, 0);
        cudaCheck(cudaDeviceSynchronize());
        return 0;
    }
    // (M, K, N, layernorm, GELU, residual, bias): every row count, K odd and short, a last block of fewer columns
    const int cases[][7] = {{1, 768, 2304, 1, 0, 0, 1}, {2, 771, 1001, 1, 1, 0, 1}, {3, 3072, 768, 0, 0, 1, 1},
                            {5, 384, 1537, 1, 1, 0, 0}, {8, 768, 8449, 1, 0, 0, 0}, {7, 1029, 333, 0, 0, 1, 1},
                            {8, 3, 65, 1, 1, 1, 1}};
    for (int v = 1; v <= 2; v++) {
        if (only && v != only) continue;
        printf("\nversion %d\n", v);
        for (const auto& c : cases) {
            Host h = make_product(c[0], c[1], c[2], c[3], c[4], c[5], c[6]);
            const Product& p = h.d;
            std::vector<double> ref((size_t)p.M * p.N);
            matvec_cpu(ref.data(), h.inp.data(), h.W.data(), c[6] ? h.bias.data() : nullptr,
                       c[3] ? h.ln_w.data() : nullptr, c[3] ? h.ln_b.data() : nullptr,
                       c[5] ? h.resid.data() : nullptr, p.M, p.K, p.N, p.gelu);
            if (c[5]) cudaCheck(cudaMemcpy(p.out, h.resid.data(), ref.size() * sizeof(float), cudaMemcpyHostToDevice));
            v == 1 ? product1(p, 0) : product2(p, 0);
            cudaCheck(cudaGetLastError());
            printf("  M %d, K %d, N %d%s%s%s\n", p.M, p.K, p.N, c[3] ? ", layernorm" : "", c[4] ? ", GELU" : "",
                   c[5] ? ", residual" : "");
            validate_result(p.out, ref.data(), "out", ref.size(), 1e-4);
        }
    }
    if (argc > 2 && !strcmp(argv[2], "check")) return 0;  // the checks alone (for compute-sanitizer)
    printf("\nandrea-120m's decode step, its products alone (%.0f MB of weights), us a step:\n",
           4.0 * (12 * 12 * 768 * 768 + 12 * 9 * 768 + 8449 * 768) / 1e6);
    for (int M : {1, 8}) {
        const std::vector<Product> step = decode_step(M);
        const double bytes = 4.0 * (12 * 12 * 768 * 768 + 8449 * 768);
        auto report = [&](const char* what, float us) {
            printf("  M %d  %-40s %8.1f us  %6.0f GB/s\n", M, what, us, bytes / us / 1e3);
        };
        if (!only || only == 1) report("version 1", time_step(step, [](const Product& p, cudaStream_t s) {
            product1(p, s);
        }));
        if (!only || only == 2) {
            for (int chunk : {6144, 12288, 24576, 49152, 98304}) {
                char what[64];
                snprintf(what, sizeof(what), "version 2, %d KB a block%s", chunk / 1024,
                         chunk == MATVEC_CHUNK ? " (MATVEC_CHUNK)" : "");
                report(what, time_step(step, [chunk](const Product& p, cudaStream_t s) { product2(p, s, chunk); }));
            }
            report("version 2, not a dependent launch", time_step(step, [](const Product& p, cudaStream_t s) {
                product2(p, s, MATVEC_CHUNK, false);
            }));
            for (int blocks : {132, 264, 528, 1056}) {
                char what[64];
                snprintf(what, sizeof(what), "version 2, at least %d blocks a product", blocks);
                report(what, time_step(step, [blocks](const Product& p, cudaStream_t s) {
                    product2(p, s, MATVEC_CHUNK, true, blocks);
                }));
            }
        }
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
