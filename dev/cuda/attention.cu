// Causal self-attention over the QKV projection's output, forward and backward, by the engine's kernels
// (cuda/attention.cuh, cuda/flash_attention.cuh), each checked against the CPU's float64 attention at a shape of
// partial tiles, then timed at andrea-120m's (B 8, T 1024, 12 heads of d_k 64).
//
//   make -C dev/cuda && dev/cuda/build/attention    # every version of both
//   dev/cuda/build/attention bwd 2                  # one version (fwd or bwd, then its number)
//
// qkv (B, T, 3C): head h's Q at columns h d_k .., its K at C + h d_k, its V at 2C + h d_k; y (B, T, C): the heads
// side by side; lse (B, NH, T): each row's log-sum-exp, all the backward keeps of the softmax.
// forward: y and lse
//   1  the reference pipeline, a kernel a stage: split heads, scores, causal mask, softmax, P V, merge heads, with
//      T x T scores and probabilities in memory (lse not written)
//   2  k_fused_attention_fwd: a thread a query row, every score recomputed by the literal line (the reference)
//   3  k_flash_fwd_d64: flash attention, 3xTF32 mma.sync (sm_80): a block of query rows streams 64-key tiles
//      through shared memory with an online softmax; no T x T buffer
//   4  k_flash_fwd_wg_d64: the same on wgmma (sm_90a): a producer warpgroup splits each tile of K and V into
//      wgmma's B layout, two consumer warpgroups of 64 query rows take Q and P as A from registers
// backward: dqkv (B, T, 3C) from dy (B, T, C), the forward's y and lse
//   1  k_fused_attention_bwd_dq, k_fused_attention_bwd_dkdv: a thread a query row, then a thread a key row
//   2  flash attention's backward (sm_80): delta (a row's sum of p dp) by k_flash_bwd_delta_rows and
//      k_flash_bwd_delta_d64, then k_flash_bwd_d64: a block of key tiles against the query tiles from the last down
//      to the diagonal, dK and dV in registers, dQ added in global memory in a fixed order behind counters
//   3  on wgmma (sm_90a): k_flash_bwd_delta_rows, then the pass over P and dP (k_flash_bwd_delta_wg_d64, p and dp
//      bit for bit as the backward recomputes them) and k_flash_bwd_wg_d64: a producer warpgroup splits each step's
//      32 queries of Q and dO into wgmma's B layouts (as they lie, and transposed), two consumer warpgroups of 64
//      keys each take K, V, P^T and dS^T as A; dQ by mma.sync over the block's 128 keys, behind the same counters
// Each version's outputs are hashed (FNV-1a of their bits; the backward's at both shapes): two builds print the
// same hashes where a change keeps the bits.
#include "common.h"

#include "../../cuda/attention.cuh"
#include "../../cuda/flash_attention.cuh"

constexpr int D_K = 64;  // the flash kernels of width 64

unsigned grid_for(long long threads) { return (unsigned)ceil_div(threads, 256LL); }

// ---------------------------------------------------------------------------------------------- CPU reference
// y, lse and dqkv (written whole) from qkv and dy, in float64
void attention_cpu(double* y, double* lse, double* dqkv, const float* qkv, const float* dy, int B, int T, int NH,
                   int d_k) {
    const int C = NH * d_k;
    const double scale = 1.0 / std::sqrt((double)d_k);
    std::fill(dqkv, dqkv + (size_t)B * T * 3 * C, 0.0);
    std::vector<double> p(T), dp(T);
    auto dot = [&](const float* a, const float* b) {
        double s = 0.0;
        for (int d = 0; d < d_k; d++) s += (double)a[d] * b[d];
        return s;
    };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t head = (size_t)b * T * 3 * C + h * d_k;  // of qkv and dqkv
            auto row = [&](int t) { return head + (size_t)t * 3 * C; };  // Q's row t; K's at + C, V's at + 2C
            for (int t = 0; t < T; t++) {
                const float* q = qkv + row(t);
                double m = -INFINITY, l = 0.0;
                for (int j = 0; j <= t; j++) m = std::max(m, p[j] = dot(q, qkv + row(j) + C) * scale);
                for (int j = 0; j <= t; j++) l += p[j] = std::exp(p[j] - m);
                double* yr = y + ((size_t)b * T + t) * C + h * d_k;
                std::fill(yr, yr + d_k, 0.0);
                for (int j = 0; j <= t; j++) {
                    p[j] /= l;
                    for (int d = 0; d < d_k; d++) yr[d] += p[j] * qkv[row(j) + 2 * C + d];
                }
                lse[((size_t)b * NH + h) * T + t] = m + std::log(l);
                // the backward of row t: ds = p (dp - delta), dp = dO V^T, delta = the row's sum of p dp
                const float* dout = dy + ((size_t)b * T + t) * C + h * d_k;
                double delta = 0.0;
                for (int j = 0; j <= t; j++) delta += p[j] * (dp[j] = dot(dout, qkv + row(j) + 2 * C));
                for (int j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - delta) * scale;
                    for (int d = 0; d < d_k; d++) {
                        dqkv[row(t) + d] += ds * qkv[row(j) + C + d];  // dQ
                        dqkv[row(j) + C + d] += ds * q[d];             // dK
                        dqkv[row(j) + 2 * C + d] += p[j] * dout[d];    // dV
                    }
                }
            }
        }
}

// ---------------------------------------------------------------------------------------------- buffers
struct Attention {
    int B, T, NH, d_k, C, BH;
    float *qkv, *dy, *y, *lse, *dqkv;
    float *y_in, *lse_in;                        // the backward's y and lse (set), as the forward leaves them
    float *q, *k, *v, *heads, *scores, *probs;  // the pipeline's (B, NH, T, d_k) and (B, NH, T, T)
    float* delta;                                // (B, NH, T)
    int* sync;                                   // the flash backward's counters, a (b, h, query tile), and ticket
    Attention(int B_, int T_, int NH_, int d_k_) : B(B_), T(T_), NH(NH_), d_k(d_k_), C(NH_ * d_k_), BH(B_ * NH_) {
        const size_t rows = (size_t)B * T, heads_n = (size_t)BH * T * d_k, scores_n = (size_t)BH * T * T;
        qkv = to_device(make_random_float(rows * 3 * C));
        dy = to_device(make_random_float(rows * C));
        y_in = device_nan(rows * C), lse_in = device_nan((size_t)BH * T);
        y = device_nan(rows * C), lse = device_nan((size_t)BH * T), dqkv = device_nan(rows * 3 * C);
        q = device_nan(heads_n), k = device_nan(heads_n), v = device_nan(heads_n), heads = device_nan(heads_n);
        scores = device_nan(scores_n), probs = device_nan(scores_n), delta = device_nan((size_t)BH * T);
        const size_t counters = (size_t)BH * ceil_div(T, (int)FA_KEYS_A_TILE) + 1;
        cudaCheck(cudaMalloc(&sync, counters * sizeof(int)));
        cudaCheck(cudaMemset(sync, 0, counters * sizeof(int)));
    }
    double forward_flops() const { return 2.0 * BH * T * T * d_k; }  // two products, the causal half of each
};

// ---------------------------------------------------------------------------------------------- forward
void attention_forward1(Attention& a) {
    const long long heads_n = (long long)a.BH * a.T * a.d_k, scores_n = (long long)a.BH * a.T * a.T;
    k_split_heads_fwd<<<grid_for(heads_n), 256>>>(a.q, a.k, a.v, a.qkv, a.B, a.T, a.NH, a.d_k);
    k_attn_scores_fwd<<<grid_for(scores_n), 256>>>(a.scores, a.q, a.k, a.BH, a.T, a.d_k);
    k_causal_mask_fwd<<<grid_for(scores_n), 256>>>(a.scores, a.scores, a.BH, a.T);
    k_softmax_fwd<<<grid_for((long long)a.BH * a.T), 256>>>(a.probs, a.scores, a.BH * a.T, a.T);
    k_attn_values_fwd<<<grid_for(heads_n), 256>>>(a.heads, a.probs, a.v, a.BH, a.T, a.d_k);
    k_merge_heads_fwd<<<grid_for(heads_n), 256>>>(a.y, a.heads, a.B, a.T, a.NH, a.d_k);
}

void attention_forward2(Attention& a) {
    k_fused_attention_fwd<<<grid_for((long long)a.BH * a.T), 256>>>(a.y, a.lse, a.qkv, a.B, a.T, a.NH, a.d_k);
}

void attention_forward3(Attention& a) {
    const dim3 grid(ceil_div(a.T, 16 * FA_FWD_W64), a.NH, a.B);  // 16 query rows a warp
    k_flash_fwd_d64<<<grid, 32 * FA_FWD_W64, FA_FWD_BYTES64>>>(a.y, a.lse, a.qkv, a.qkv + a.C, a.qkv + 2 * a.C, a.T,
                                                              a.d_k, 3 * a.C, a.C);
}

void attention_forward4(Attention& a) {
    const dim3 grid(ceil_div(a.T, (int)FA_FWD_WG_ROWS), a.NH, a.B);
    k_flash_fwd_wg_d64<<<grid, TC_WG_THREADS, FA_FWD_WG_BYTES>>>(a.y, a.lse, a.qkv, a.qkv + a.C, a.qkv + 2 * a.C, a.T,
                                                                a.d_k, 3 * a.C, a.C);
}

void attention_forward(int version, Attention& a) {
    switch (version) {
        case 1: attention_forward1(a); break;
        case 2: attention_forward2(a); break;
        case 3: attention_forward3(a); break;
        case 4: attention_forward4(a); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- backward
void attention_backward1(Attention& a) {
    const unsigned grid = grid_for((long long)a.BH * a.T);
    k_fused_attention_bwd_dq<<<grid, 256>>>(a.dqkv, a.delta, a.dy, a.qkv, a.lse_in, a.B, a.T, a.NH, a.d_k);
    k_fused_attention_bwd_dkdv<<<grid, 256>>>(a.dqkv, a.dy, a.qkv, a.lse_in, a.delta, a.B, a.T, a.NH, a.d_k);
}

// as microgpt/kernels/flash_attention.py launches it, before either pass over P and dP: delta of the rows past the
// first FA_PASS_TILES query tiles from dO * O (a warp a (b, t) row), their counters zeroed; returns the query tiles
int flash_delta_rows(Attention& a) {
    const int tiles = ceil_div(a.T, (int)FA_KEYS_A_TILE), pass = std::min(tiles, (int)FA_PASS_TILES);
    const long long rows = (long long)a.B * (a.T - pass * FA_KEYS_A_TILE);
    if (rows > 0)
        k_flash_bwd_delta_rows<<<grid_for(32 * rows), 256>>>(a.delta, a.sync, a.y_in, a.dy, a.B, a.NH, a.T, a.d_k, a.C);
    return tiles;
}

// flash_delta_rows, then delta of the first FA_PASS_TILES query tiles by a pass over P and dP (zeroing the counters
// the backward then uses), and the backward
void attention_backward2(Attention& a) {
    const int tiles = flash_delta_rows(a), pass = std::min(tiles, (int)FA_PASS_TILES);
    const float *q = a.qkv, *k = a.qkv + a.C, *v = a.qkv + 2 * a.C;
    k_flash_bwd_delta_d64<<<dim3(pass, a.NH, a.B), 32 * FA_DELTA_W, FA_DELTA_BYTES64>>>(
        a.delta, a.sync, q, k, v, a.dy, a.lse_in, a.T, a.d_k, 3 * a.C, a.C);
    k_flash_bwd_d64<<<dim3(ceil_div(tiles, (int)FA_BWD_KT64), a.NH, a.B), 32 * FA_BWD_W64, FA_BWD_BYTES64>>>(
        a.dqkv, a.dqkv + a.C, a.dqkv + 2 * a.C, a.sync, q, k, v, a.dy, a.lse_in, a.delta, a.T, a.d_k, 3 * a.C, a.C);
}

// flash_delta_rows, then the pass and the backward on wgmma (sm_90a)
void attention_backward3(Attention& a) {
    const int tiles = flash_delta_rows(a);
    const float *q = a.qkv, *k = a.qkv + a.C, *v = a.qkv + 2 * a.C;
    k_flash_bwd_delta_wg_d64<<<dim3(1, a.NH, a.B), FA_DELTA_WG_BLOCK, FA_DELTA_WG_BYTES>>>(
        a.delta, a.sync, q, k, v, a.dy, a.lse_in, a.T, a.d_k, 3 * a.C, a.C);
    k_flash_bwd_wg_d64<<<dim3(ceil_div(tiles, (int)FA_BWD_KT64), a.NH, a.B), TC_WG_THREADS, FA_BWD_WG_BYTES>>>(
        a.dqkv, a.dqkv + a.C, a.dqkv + 2 * a.C, a.sync, q, k, v, a.dy, a.lse_in, a.delta, a.T, a.d_k, 3 * a.C, a.C);
}

void attention_backward(int version, Attention& a) {
    switch (version) {
        case 1: attention_backward1(a); break;
        case 2: attention_backward2(a); break;
        case 3: attention_backward3(a); break;
    }
    cudaCheck(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------- main
int main(int argc, char** argv) {
    const Gpu gpu = setup_main();
    const char* dir = argc > 1 ? argv[1] : "all";
    const int only = version_arg(argc, argv, 2);
    const int flash_shared = std::max({(int)FA_FWD_BYTES64, (int)FA_DELTA_BYTES64, (int)FA_BWD_BYTES64});
    const bool flash = gpu.arch >= 800 && flash_shared <= (int)gpu.prop.sharedMemPerBlockOptin;
    char flash_needs[96];
    snprintf(flash_needs, sizeof(flash_needs), "sm_80 (mma.sync TF32) and %d KB of shared memory a block",
             flash_shared / 1024);
    const bool flash_wg = gpu.wgmma && FA_FWD_WG_BYTES <= (int)gpu.prop.sharedMemPerBlockOptin;
    if (flash_wg) allow_shared(k_flash_fwd_wg_d64, FA_FWD_WG_BYTES);
    const bool flash_wg_bwd = gpu.wgmma && flash && FA_BWD_WG_BYTES <= (int)gpu.prop.sharedMemPerBlockOptin;
    if (flash_wg_bwd) {
        allow_shared(k_flash_bwd_delta_wg_d64, FA_DELTA_WG_BYTES);
        allow_shared(k_flash_bwd_wg_d64, FA_BWD_WG_BYTES);
    }
    if (flash) {
        allow_shared(k_flash_fwd_d64, FA_FWD_BYTES64);
        allow_shared(k_flash_bwd_delta_d64, FA_DELTA_BYTES64);
        allow_shared(k_flash_bwd_d64, FA_BWD_BYTES64);
    }

    Attention check(2, 200, 4, D_K), bench(8, 1024, 12, D_K);
    const size_t rows = (size_t)check.B * check.T, C = check.C;
    const std::vector<float> qkv = to_host(check.qkv, rows * 3 * C), dy = to_host(check.dy, rows * C);
    std::vector<double> y_ref(rows * C), lse_ref((size_t)check.BH * check.T), dqkv_ref(rows * 3 * C);
    attention_cpu(y_ref.data(), lse_ref.data(), dqkv_ref.data(), qkv.data(), dy.data(), check.B, check.T, check.NH,
                  check.d_k);
    // the backward starts from the CPU's y and lse
    const std::vector<float> y = to_float(y_ref), lse = to_float(lse_ref);
    cudaCheck(cudaMemcpy(check.y_in, y.data(), y.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(check.lse_in, lse.data(), lse.size() * sizeof(float), cudaMemcpyHostToDevice));
    attention_forward(2, bench);  // ... and at the timed shape from the reference kernel's
    cudaCheck(cudaMemcpy(bench.y_in, bench.y, (size_t)bench.B * bench.T * bench.C * sizeof(float), cudaMemcpyDefault));
    cudaCheck(cudaMemcpy(bench.lse_in, bench.lse, (size_t)bench.BH * bench.T * sizeof(float), cudaMemcpyDefault));
    printf("\nchecked at B %d, T %d, %d heads, timed at B %d, T %d, %d heads; d_k %d\n", check.B, check.T, check.NH,
           bench.B, bench.T, bench.NH, D_K);

    if (strcmp(dir, "all") == 0 || strcmp(dir, "fwd") == 0)
        for (int v = 1; v <= 4; v++) {
            if (only && v != only) continue;
            char name[32];
            snprintf(name, sizeof(name), "forward %d", v);
            if (v == 3 && !runs_here(name, flash, flash_needs)) continue;
            if (v == 4 && !runs_here(name, flash_wg, "sm_90a (wgmma) and 224 KB of shared memory a block")) continue;
            printf("%s\n", name);
            poison(check.y, rows * C), poison(check.lse, lse_ref.size());
            attention_forward(v, check);
            validate_result(check.y, y_ref.data(), "y", y_ref.size(), 1e-4);
            if (v > 1) validate_result(check.lse, lse_ref.data(), "lse", lse_ref.size(), 1e-4);
            const std::vector<float> y_out = to_host(check.y, y_ref.size());
            const std::vector<float> lse_out = to_host(check.lse, lse_ref.size());
            const float ms = benchmark_kernel(v >= 3 ? 50 : 5, [&] { attention_forward(v, bench); });
            printf("  time %.4f ms, %.1f TFLOP/s\n", ms, bench.forward_flops() / ms / 1e9);
            printf("  bits: hash %016llx (checked y and lse)\n", bits_hash({&y_out, &lse_out}));
        }
    if (strcmp(dir, "all") == 0 || strcmp(dir, "bwd") == 0)
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            char name[32];
            snprintf(name, sizeof(name), "backward %d", v);
            if (v == 2 && !runs_here(name, flash, flash_needs)) continue;
            const char* wg_needs = "sm_90a (wgmma) and 227 KB of shared memory a block";
            if (v == 3 && !runs_here(name, flash_wg_bwd, wg_needs)) continue;
            printf("%s\n", name);
            poison(check.dqkv, dqkv_ref.size());
            attention_backward(v, check);
            validate_result(check.dqkv, dqkv_ref.data(), "dqkv", dqkv_ref.size(), 1e-4);
            const std::vector<float> dqkv = to_host(check.dqkv, dqkv_ref.size());
            const float ms = benchmark_kernel(v >= 2 ? 50 : 5, [&] { attention_backward(v, bench); });
            printf("  time %.4f ms, %.1f TFLOP/s (5 products to the forward's 2)\n", ms,
                   2.5 * bench.forward_flops() / ms / 1e9);
            const std::vector<float> timed = to_host(bench.dqkv, (size_t)bench.B * bench.T * 3 * bench.C);
            printf("  bits: hash %016llx (checked), %016llx (timed)\n", bits_hash({&dqkv}), bits_hash({&timed}));
        }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
