// The decode step's attention, k_attention_decode (cuda/decode.cuh): the new position p of each sequence against
// its cached keys and values, checked against the CPU's float64 softmax(q K^T / sqrt(d_k)) V at odd shapes (d_k 18
// and 64, p on either side of a chunk's edge, B 3), then timed as a step runs it: andrea-120m's 12 layers (B 1, 12
// heads of 64, caches of 1024 positions), one CUDA graph of dependent launches, at p 16, 200 and 1000.
//
//   make -C dev/cuda && dev/cuda/build/decode
//   compute-sanitizer --tool racecheck dev/cuda/build/decode 1 check    # version 1's checks alone
//
// The versions are the block's size (the kernel takes any): 1 256 threads (BLOCK, the engine's), 2 128, 3 64.
// With fewer threads a block's barriers wait for fewer warps, and each thread sums more rows of the chunk.
#include "common.h"

#include "../../cuda/decode.cuh"

constexpr int THREADS[] = {256, 128, 64};

// y (B, 1, C) in float64: each head's query against its cached rows before p and the new row p (from qkv)
void attention_cpu(double* y, const float* qkv, const float* kc, const float* vc, int B, int NH, int d_k, int T_max,
                   int p) {
    const int C = NH * d_k;
    std::vector<double> s(p + 1);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float* q = qkv + (size_t)b * 3 * C + h * d_k;
            auto row = [&](const float* cache, int which, int j) {  // key or value j of (b, h)
                return j < p ? cache + (((size_t)b * NH + h) * T_max + j) * d_k : qkv + (size_t)b * 3 * C + which * C +
                                                                                      h * d_k;
            };
            double m = -INFINITY, sum = 0.0;
            for (int j = 0; j <= p; j++) {
                const float* k = row(kc, 1, j);
                double dot = 0.0;
                for (int d = 0; d < d_k; d++) dot += (double)q[d] * k[d];
                s[j] = dot / std::sqrt((double)d_k);
                m = std::max(m, s[j]);
            }
            for (int j = 0; j <= p; j++) sum += s[j] = std::exp(s[j] - m);
            for (int d = 0; d < d_k; d++) {
                double acc = 0.0;
                for (int j = 0; j <= p; j++) acc += s[j] * row(vc, 2, j)[d];
                y[(size_t)b * C + h * d_k + d] = acc / sum;
            }
        }
}

struct Layer {  // one layer's arrays on the device
    float *y, *partial, *kc, *vc, *qkv;
    unsigned* done;
    int *pos, B, NH, d_k, T_max;
};

Layer make_layer(int B, int NH, int d_k, int T_max, const std::vector<float>& kc, const std::vector<float>& vc,
                 const std::vector<float>& qkv, int p) {
    const int chunks = ceil_div(T_max, (int)DECODE_CHUNK);
    Layer l{device_nan((size_t)B * NH * d_k), device_nan((size_t)B * NH * chunks * DECODE_PARTIAL(d_k)),
            to_device(kc), to_device(vc), to_device(qkv), nullptr, nullptr, B, NH, d_k, T_max};
    cudaCheck(cudaMalloc(&l.done, B * NH * sizeof(unsigned)));
    cudaCheck(cudaMemset(l.done, 0, B * NH * sizeof(unsigned)));
    cudaCheck(cudaMalloc(&l.pos, sizeof(int)));
    cudaCheck(cudaMemcpy(l.pos, &p, sizeof(int), cudaMemcpyHostToDevice));
    return l;
}

void attention(const Layer& l, int threads, cudaStream_t s) {
    const int shared = 4 * decode_shared_floats(l.d_k, threads);
    allow_shared(k_attention_decode, shared);
    int vec4 = l.d_k % 4 == 0;
    void* args[] = {(void*)&l.y, (void*)&l.partial, (void*)&l.done, (void*)&l.kc, (void*)&l.vc, (void*)&l.qkv,
                    (void*)&l.pos, (void*)&l.NH, (void*)&l.d_k, (void*)&l.T_max, &vec4};
    const dim3 grid(ceil_div(l.T_max, (int)DECODE_CHUNK), l.B * l.NH);
    launch_ex((void*)k_attention_decode, grid, dim3(threads), shared, s, args);
}

// The mean time in us of one replay of the layers' launches, captured once as a graph.
float time_layers(const std::vector<Layer>& layers, int threads) {
    return graph_us([&](cudaStream_t s) {
        for (const Layer& l : layers) attention(l, threads, s);
    });
}

int main(int argc, char** argv) {
    setup_main();
    const int only = version_arg(argc, argv, 1);
    // (B, NH, d_k, T_max, p): a chunk's first, last and next positions, d_k not a multiple of 4, p = T_max - 1
    const int cases[][5] = {{3, 2, 18, 200, 0}, {3, 2, 64, 200, 63}, {3, 2, 64, 200, 64}, {1, 3, 18, 200, 199},
                            {2, 4, 64, 1024, 700}};
    for (int v = 1; v <= 3; v++) {
        if (only && v != only) continue;
        printf("\nversion %d (%d threads a block)\n", v, THREADS[v - 1]);
        for (const auto& c : cases) {
            const int B = c[0], NH = c[1], d_k = c[2], T_max = c[3], p = c[4], C = NH * d_k;
            const std::vector<float> kc = make_random_float((size_t)B * NH * T_max * d_k),
                                     vc = make_random_float((size_t)B * NH * T_max * d_k),
                                     qkv = make_random_float((size_t)B * 3 * C, -2.0f, 2.0f);
            Layer l = make_layer(B, NH, d_k, T_max, kc, vc, qkv, p);
            std::vector<double> ref((size_t)B * C);
            attention_cpu(ref.data(), qkv.data(), kc.data(), vc.data(), B, NH, d_k, T_max, p);
            attention(l, THREADS[v - 1], 0);
            cudaCheck(cudaGetLastError());
            printf("  B %d, %d heads of %d, T_max %d, p %d\n", B, NH, d_k, T_max, p);
            validate_result(l.y, ref.data(), "y", ref.size(), 1e-5);
            std::vector<double> row_p(d_k);  // the new key of (b, h) = (B - 1, NH - 1), now row p of the cache
            for (int d = 0; d < d_k; d++) row_p[d] = qkv[(size_t)(B - 1) * 3 * C + C + (NH - 1) * d_k + d];
            validate_result(l.kc + (((size_t)B * NH - 1) * T_max + p) * d_k, row_p.data(), "k row p", d_k, 0.0);
        }
    }
    if (argc > 2 && !strcmp(argv[2], "check")) return 0;  // the checks alone (for compute-sanitizer)
    printf("\nandrea-120m's decode attention, 12 layers (B 1, 12 heads of 64, T_max 1024), us a step:\n");
    for (int p : {16, 200, 1000}) {
        std::vector<Layer> layers;
        for (int i = 0; i < 12; i++)
            layers.push_back(make_layer(1, 12, 64, 1024, make_random_float((size_t)12 * 1024 * 64),
                                        make_random_float((size_t)12 * 1024 * 64), make_random_float(3 * 768), p));
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            const float us = time_layers(layers, THREADS[v - 1]);
            printf("  p %4d  version %d (%3d threads)  %7.1f us  %5.2f us a launch\n", p, v, THREADS[v - 1], us,
                   us / 12);
        }
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
