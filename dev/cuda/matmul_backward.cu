// The linear layer's backward products (out = inp @ weight^T + bias): dinp = dout @ weight (dx) and dweight +=
// dout^T @ inp with dbias += the column sums of dout (dw), by the engine's wgmma kernels (cuda/matmul_tc.cuh,
// tf32_split.cuh), each checked against the CPU's float64 products at an odd shape, then timed at andrea-120m's
// linear layers (B * T = 8192 rows; lm_head's vocabulary of 8449).
//
//   make -C dev/cuda && dev/cuda/build/matmul_backward    # both products, every version
//   dev/cuda/build/matmul_backward dw 2                   # one product (dx or dw), then its version
//
// dx: M = the rows, N = C_in, K = C_out
//   1  k_gemm_tc_nn: 3xTF32 on mma.sync, each operand split as its fragment is read (sm_80)
//   2  k_gemm_wg_nn: 3xTF32 on wgmma, the producer warpgroup copying and splitting both operands (sm_90a)
//   3  k_gemm_wg_areg: dout read raw and split by the consumers into the registers wgmma takes A from, the weight
//      split transposed beforehand, as the engine's backward splits its weights once a pass (not timed), a block an
//      SM as the engine launches it; 2's bits
// dw: M = C_out, N = C_in, K = the rows
//   1  k_gemm_tc_tn: mma.sync; dbias is not summed (the engine adds it by a column-sum pass there); K cut into slices
//      where the tiles are few, as the engine's gemm() cuts it (products.Gemm.splits), k_splitk_reduce adding them
//   2  k_gemm_wg_tn_n64: wgmma on 128 x 64 tiles, the producer splitting and transposing both; dbias from the dout
//      it splits; split-K as 1 (Gemm.splits for one block an SM)
//   3  k_gemm_wg_areg_tn: the consumers split dout in registers as they read it, the producer only inp; dbias summed
//      by the consumers; a block an SM, each tile's K in parts (matmul_tc.tn_parts) that the blocks take in turn and
//      add into dweight in order (no partials, no reduction); then timed at other counts of parts
// All are as accurate as FP32 (their errors are printed), not TF32's. Version 3's outputs at the odd shapes are
// hashed (FNV-1a of their bits): two builds print the same hashes where a change keeps the bits.
#include "common.h"

#include "../../cuda/tf32_split.cuh"  // and matmul_tc.cuh, matmul_fast.cuh

// ---------------------------------------------------------------------------------------------- CPU reference
// dinp (rows x C_in) = dout (rows x C_out) @ weight (C_out x C_in)
void matmul_dx_cpu(double* dinp, const float* dout, const float* weight, int rows, int C_out, int C_in) {
    std::vector<double> row(C_in);
    for (int m = 0; m < rows; m++) {
        std::fill(row.begin(), row.end(), 0.0);
        for (int o = 0; o < C_out; o++) {
            const double d = dout[(size_t)m * C_out + o];
            const float* w = weight + (size_t)o * C_in;
            for (int i = 0; i < C_in; i++) row[i] += d * w[i];
        }
        std::copy(row.begin(), row.end(), dinp + (size_t)m * C_in);
    }
}

// dweight = dweight0 + dout^T @ inp, dbias = dbias0 + the column sums of dout
void matmul_dw_cpu(double* dweight, double* dbias, const float* dweight0, const float* dbias0, const float* dout,
                   const float* inp, int rows, int C_out, int C_in) {
    for (size_t e = 0; e < (size_t)C_out * C_in; e++) dweight[e] = dweight0[e];
    for (int o = 0; o < C_out; o++) dbias[o] = dbias0[o];
    for (int m = 0; m < rows; m++)
        for (int o = 0; o < C_out; o++) {
            const double d = dout[(size_t)m * C_out + o];
            const float* x = inp + (size_t)m * C_in;
            double* w = dweight + (size_t)o * C_in;
            for (int i = 0; i < C_in; i++) w[i] += d * x[i];
            dbias[o] += d;
        }
}

// ---------------------------------------------------------------------------------------------- the versions
int rows_pad(int rows) { return ceil_div(rows, (int)TC_SPLIT_ROWS) * TC_SPLIT_ROWS; }
int k_pad(int K) { return ceil_div(K, (int)TC_SPLIT_K) * TC_SPLIT_K; }

// products.Gemm.splits for one block an SM: of 1, 2, 4, 8 slices (each at least 256 of K, K divisible), the count
// whose last wave of sm_count blocks is fullest, less 0.02 a halving (each costs a pass of partials); fewer on a tie
int splits_for(int M, int N, int K, int sm_count) {
    const long long tiles = (long long)ceil_div(N, 128) * ceil_div(M, 128);
    int best = 1;
    double best_score = -1.0;
    for (int s : {1, 2, 4, 8}) {
        if (s > 1 && (K % s != 0 || K / s < 256)) continue;
        const double slots = (double)ceil_div(tiles * s, (long long)sm_count) * sm_count;
        const double score = std::round((tiles * s / slots - 0.02 * std::log2((double)s)) * 1e6) / 1e6;
        if (score > best_score) best = s, best_score = score;
    }
    return best;
}

constexpr int MAX_SPLITS = 8;  // splits_for's most

// matmul_tc.tn_parts: of 1 .. ceil(K / 32) / 8 parts of each tile's K, the count whose busiest block (sm_count
// blocks taking the parts in turn) ends soonest, a part costing its slices of 32 and TN_STORE_SLICES more
constexpr int TN_STORE_SLICES = 4;
// the busiest block's jobs (parts of tiles), and a job's slices of 32
long long tn_jobs(int M, int N, int sm_count, int parts) {
    const long long tiles = (long long)ceil_div(N, 128) * ceil_div(M, 128);
    return ceil_div(tiles * parts, (long long)sm_count);
}
int tn_job_slices(int K, int parts) { return ceil_div(ceil_div(K, 32), parts); }
long long tn_busiest(int M, int N, int K, int sm_count, int parts) {
    return tn_jobs(M, N, sm_count, parts) * (tn_job_slices(K, parts) + TN_STORE_SLICES);
}
int tn_parts(int M, int N, int K, int sm_count) {
    int best = 1;
    for (int parts = 2; parts <= std::max(1, ceil_div(K, 32) / 8); parts++)
        if (tn_busiest(M, N, K, sm_count, parts) < tn_busiest(M, N, K, sm_count, best)) best = parts;
    return best;
}

struct Problem {
    const char* name;
    int rows, C_out, C_in, splits, parts, sms;
    float *dout, *inp, *weight, *dinp, *dweight, *dbias, *partials;
    int* flags;  // version 3's, 2 a tile: zero, and left zero by every launch
    uint32_t* weight_split;  // hi then lo: weight^T (C_in x C_out), as the engine's backward splits it
    Problem(const char* name_, int rows_, int C_out_, int C_in_, int sm_count)
        : name(name_), rows(rows_), C_out(C_out_), C_in(C_in_), splits(splits_for(C_out_, C_in_, rows_, sm_count)),
          parts(tn_parts(C_out_, C_in_, rows_, sm_count)), sms(sm_count) {
        dout = to_device(make_random_float((size_t)rows * C_out));
        inp = to_device(make_random_float((size_t)rows * C_in));
        weight = to_device(make_random_float((size_t)C_out * C_in));
        dinp = device_nan((size_t)rows * C_in);
        dweight = to_device(make_random_float((size_t)C_out * C_in));
        dbias = to_device(make_random_float(C_out));
        partials = device_nan((size_t)MAX_SPLITS * ((size_t)C_out * C_in + C_out));  // any count the sweep tries
        cudaCheck(cudaMalloc(&weight_split, 2 * sizeof(uint32_t) * rows_pad(C_in) * k_pad(C_out)));
        const size_t n_flags = 2 * (size_t)ceil_div(C_in, 128) * ceil_div(C_out, 128);
        cudaCheck(cudaMalloc(&flags, n_flags * sizeof(int)));
        cudaCheck(cudaMemset(flags, 0, n_flags * sizeof(int)));
        const long long plane = (long long)rows_pad(C_in) * k_pad(C_out);
        const dim3 grid(k_pad(C_out) / 32, rows_pad(C_in) / 32);  // weight stored K x N: transposed on the way
        k_tf32_split_t<<<grid, 256>>>(weight_split, weight_split + plane, weight, C_in, C_out, C_in, k_pad(C_out));
        cudaCheck(cudaGetLastError());
    }
    ~Problem() {
        for (void* p : {(void*)dout, (void*)inp, (void*)weight, (void*)dinp, (void*)dweight, (void*)dbias,
                        (void*)partials, (void*)weight_split, (void*)flags})
            cudaCheck(cudaFree(p));
    }

    // dx = dout @ weight: dout stored M x K, weight K x N
    void dx(int version) {
        const int M = rows, N = C_in, K = C_out;
        const dim3 grid(ceil_div(N, 128), ceil_div(M, 128));
        if (version == 1)
            k_gemm_tc_nn<<<grid, TC_THREADS, TC_SMEM_BYTES>>>(dinp, dout, weight, nullptr, M, N, K, K, N, N, 0, 0, 0,
                                                              1.0f, 0.0f, CAUSAL_NONE, 0.0f, nullptr);
        else if (version == 2)
            k_gemm_wg_nn<<<grid, TC_WG_THREADS, TC_WG_SMEM_BYTES>>>(dinp, dout, weight, nullptr, M, N, K, K, N, N, 0, 0,
                                                                    0, 1.0f, 0.0f, CAUSAL_NONE, 0.0f, nullptr);
        else
            k_gemm_wg_areg<<<std::min((int)(grid.x * grid.y), sms), TC_WG_THREADS, TC_AREG_STORE_SMEM_BYTES>>>(
                dinp, dout, nullptr, weight_split, nullptr, M, N, K, K, k_pad(K), N, 1.0f, 0.0f);  // a block an SM
        cudaCheck(cudaGetLastError());
    }

    // dw: M = C_out, N = C_in, K = rows; A = dout stored K x M, B = inp stored K x N; split-K as the engine's gemm()
    void dw(int version) {
        if (version == 3) {  // no partials: each part adds into dweight and dbias in order
            const int M = C_out, N = C_in, tiles = ceil_div(N, 128) * ceil_div(M, 128);
            k_gemm_wg_areg_tn<<<std::min(tiles * parts, sms), TC_WG_THREADS, TC_AREG_TN_SMEM_BYTES>>>(
                dweight, dout, inp, nullptr, M, N, rows, M, N, N, 0, 0, 0, 1.0f, 1.0f, CAUSAL_NONE, 0.0f, dbias, 1,
                parts, flags);
            cudaCheck(cudaGetLastError());
            return;
        }
        const int M = C_out, N = C_in, K = rows, k_slice = K / splits;
        const long long MN = (long long)M * N;
        float* out = splits == 1 ? dweight : partials;
        float* sums = version == 1 ? nullptr : splits == 1 ? dbias : partials + splits * MN;
        const float beta = splits == 1 ? 1.0f : 0.0f;
        const long long stride_a = (long long)k_slice * M, stride_b = (long long)k_slice * N, stride_c = MN;
        const dim3 grid(ceil_div(N, version == 2 ? 64 : 128), ceil_div(M, 128), splits);
        if (version == 1)
            k_gemm_tc_tn<<<grid, TC_THREADS, TC_SMEM_BYTES>>>(out, dout, inp, nullptr, M, N, k_slice, M, N, N, stride_a,
                                                              stride_b, stride_c, 1.0f, beta, CAUSAL_NONE, 0.0f, sums);
        else
            k_gemm_wg_tn_n64<<<grid, TC_WG_THREADS, TC_WG_SMEM_BYTES>>>(out, dout, inp, nullptr, M, N, k_slice, M, N, N,
                                                                        stride_a, stride_b, stride_c, 1.0f, beta,
                                                                        CAUSAL_NONE, 0.0f, sums);
        if (splits > 1) {  // the slices' bias sums too, where the product took them (as the engine: M 0 where not)
            const int M_sums = sums ? M : 0;
            k_splitk_reduce<<<(unsigned)ceil_div(MN + M_sums, 256LL), 256>>>(dweight, partials, splits, MN, 1.0f,
                                                                             sums ? dbias : nullptr, M_sums);
        }
        cudaCheck(cudaGetLastError());
    }
};

// ---------------------------------------------------------------------------------------------- main
int main(int argc, char** argv) {
    const Gpu gpu = setup_main();
    const char* dir = argc > 1 ? argv[1] : "all";
    const int only = version_arg(argc, argv, 2);
    if (strcmp(dir, "all") != 0 && strcmp(dir, "dx") != 0 && strcmp(dir, "dw") != 0) {
        printf("usage: %s [dx|dw] [version]\n", argv[0]);
        return EXIT_FAILURE;
    }
    if (gpu.arch >= 800) {
        allow_shared(k_gemm_tc_nn, TC_SMEM_BYTES);
        allow_shared(k_gemm_tc_tn, TC_SMEM_BYTES);
    }
    if (gpu.wgmma) {
        allow_shared(k_gemm_wg_nn, TC_WG_SMEM_BYTES);
        allow_shared(k_gemm_wg_tn_n64, TC_WG_SMEM_BYTES);
        allow_shared(k_gemm_wg_areg, TC_AREG_STORE_SMEM_BYTES);
        allow_shared(k_gemm_wg_areg_tn, TC_AREG_TN_SMEM_BYTES);
    }
    const int sms = gpu.prop.multiProcessorCount;
    auto runs = [&](const char* what, int v) {  // whether version v runs here; if not, says why
        char name[32];
        snprintf(name, sizeof(name), "%s %d", what, v);
        return v == 1 ? runs_here(name, gpu.arch >= 800, "sm_80 (mma.sync TF32)")
                      : runs_here(name, gpu.wgmma, "the sm_90a build on compute capability 9.0 (wgmma)");
    };

    // checked at odd sizes, partial tiles everywhere: 1000 rows (K of dw, which split-K cuts in two) and dout's rows of
    // C_out = 700 16-byte aligned; 1001 rows (one slice, the product adding into dw and dbias itself) and C_out = 701
    // (the copies' unaligned path)
    for (int odd = 0; odd < 2; odd++) {
        Problem p("check", 1000 + odd, 700 + odd, 300, sms);
        p.sms = 5;  // dx 3 on 5 blocks, 4 or 5 tiles each
        const size_t dx_n = (size_t)p.rows * p.C_in, dw_n = (size_t)p.C_out * p.C_in;
        const std::vector<float> dout = to_host(p.dout, (size_t)p.rows * p.C_out);
        const std::vector<float> inp = to_host(p.inp, (size_t)p.rows * p.C_in), weight = to_host(p.weight, dw_n);
        const std::vector<float> dweight0 = to_host(p.dweight, dw_n), dbias0 = to_host(p.dbias, p.C_out);
        std::vector<double> dx_ref(dx_n), dw_ref(dw_n), db_ref(p.C_out);
        matmul_dx_cpu(dx_ref.data(), dout.data(), weight.data(), p.rows, p.C_out, p.C_in);
        matmul_dw_cpu(dw_ref.data(), db_ref.data(), dweight0.data(), dbias0.data(), dout.data(), inp.data(), p.rows,
                      p.C_out, p.C_in);
        printf("\nchecked at %d rows, C_out %d, C_in %d (dw 1, 2 in %d slices of K; dw 3 in %d parts on %d blocks)\n",
               p.rows, p.C_out, p.C_in, p.splits, p.parts, p.sms);
        std::vector<float> dx2;  // version 2's, whose bits version 3 gives
        for (int v = 1; v <= 3; v++) {
            if (only && v != only) continue;
            if (strcmp(dir, "dw") != 0 && runs("dx", v)) {
                printf("dx %d\n", v);
                poison(p.dinp, dx_n);
                p.dx(v);
                validate_result(p.dinp, dx_ref.data(), "dinp", dx_n, 1e-4);
                const std::vector<float> dx = to_host(p.dinp, dx_n);
                if (v == 2) dx2 = dx;
                if (v == 3 && !dx2.empty())
                    printf("  bits: %s dx 2's\n", same_bits(dx, dx2) ? "the same as" : "differ from");
                if (v == 3) printf("  bits: hash %016llx\n", bits_hash({&dx}));
            }
            if (strcmp(dir, "dx") != 0 && runs("dw", v)) {
                printf("dw %d\n", v);
                cudaCheck(cudaMemcpy(p.dweight, dweight0.data(), dw_n * sizeof(float), cudaMemcpyHostToDevice));
                cudaCheck(cudaMemcpy(p.dbias, dbias0.data(), p.C_out * sizeof(float), cudaMemcpyHostToDevice));
                poison(p.partials, (size_t)p.splits * (dw_n + p.C_out));
                p.dw(v);
                validate_result(p.dweight, dw_ref.data(), "dweight", dw_n, 1e-4);  // sums over 1000 rows
                if (v > 1) validate_result(p.dbias, db_ref.data(), "dbias", p.C_out, 1e-4);
                if (v == 3) {  // again from the same start: the parts added in the same order
                    const std::vector<float> dw = to_host(p.dweight, dw_n), db = to_host(p.dbias, p.C_out);
                    cudaCheck(cudaMemcpy(p.dweight, dweight0.data(), dw_n * sizeof(float), cudaMemcpyHostToDevice));
                    cudaCheck(cudaMemcpy(p.dbias, dbias0.data(), p.C_out * sizeof(float), cudaMemcpyHostToDevice));
                    p.dw(v);
                    const bool same = same_bits(dw, to_host(p.dweight, dw_n)) &&
                                      same_bits(db, to_host(p.dbias, p.C_out));
                    printf("  bits: %s on a second run, hash %016llx\n", same ? "the same" : "DIFFERENT",
                           bits_hash({&dw, &db}));
                    if (!same) exit(EXIT_FAILURE);
                }
            }
        }
    }

    // timed at andrea-120m's linear layers, B * T = 8192 rows; lm_head/4 is the lm_head with its vocabulary padded
    // to a multiple of 4, whose dout rows are 16-byte aligned (8449's take the copies' 4-byte path)
    struct Shape {
        const char* name;
        int C_out, C_in;
    };
    const Shape shapes[] = {{"attn.qkv", 2304, 768}, {"attn.proj", 768, 768}, {"mlp.fc", 3072, 768},
                            {"mlp.proj", 768, 3072}, {"lm_head", 8449, 768},  {"lm_head/4", 8452, 768}};
    printf("\ntimed at 8192 rows; ms (TFLOP/s) of each version, and the last's speed-up over the one before\n");
    for (const Shape& s : shapes) {
        Problem p(s.name, 8192, s.C_out, s.C_in, sms);
        const double flops = 2.0 * p.rows * p.C_out * p.C_in;
        for (int pass = 0; pass < 2; pass++) {
            const bool is_dx = pass == 0;
            if (strcmp(dir, is_dx ? "dw" : "dx") == 0) continue;
            printf("%-10s %s", s.name, is_dx ? "dx" : "dw");
            if (!is_dx) printf(" (1, 2: %d slices; 3: %d parts)", p.splits, p.parts);
            float before = 0.0f;
            for (int v = 1; v <= 3; v++) {
                if ((only && v != only) || (v == 1 ? gpu.arch < 800 : !gpu.wgmma)) continue;
                const float ms = benchmark_kernel(20, [&] { is_dx ? p.dx(v) : p.dw(v); });
                printf("   %d: %.4f (%.1f)", v, ms, flops / ms / 1e9);
                if (v == 3 && before > 0.0f) printf(" %.2fx", before / ms);
                before = ms;
            }
            printf("\n");
        }
    }
    // dw 3 at other counts of parts, the one tn_parts picks marked: how well its cost (the busiest block's slices,
    // TN_STORE_SLICES more a part) stands for the time. Then the least-squares fit of time = jobs x (slices x a
    // slice's cost + a job's fixed cost), jobs and slices the busiest block's: what a job costs beyond its slices.
    if (gpu.wgmma && strcmp(dir, "dx") != 0 && (!only || only == 3)) {
        printf("\ndw 3 by parts of K, ms (TFLOP/s); * tn_parts's choice on %d SMs\n", sms);
        for (const Shape& s : shapes) {
            Problem p(s.name, 8192, s.C_out, s.C_in, sms);
            const double flops = 2.0 * p.rows * p.C_out * p.C_in;
            std::vector<double> xs, ys, ts;  // the busiest block's slices and jobs, and the time (us)
            const int chosen = p.parts;
            printf("%-10s", s.name);
            for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 16}) {
                p.parts = n;
                const float ms = benchmark_kernel(20, [&] { p.dw(3); });
                printf("   %d%s: %.4f (%.1f)", n, n == chosen ? "*" : "", ms, flops / ms / 1e9);
                const double jobs = (double)tn_jobs(p.C_out, p.C_in, sms, n);
                xs.push_back(jobs * tn_job_slices(p.rows, n)), ys.push_back(jobs), ts.push_back(1000.0 * ms);
            }
            p.parts = chosen;
            double sxx = 0, sxy = 0, syy = 0, sxt = 0, syt = 0;
            for (size_t i = 0; i < ts.size(); i++)
                sxx += xs[i] * xs[i], sxy += xs[i] * ys[i], syy += ys[i] * ys[i], sxt += xs[i] * ts[i],
                    syt += ys[i] * ts[i];
            const double det = sxx * syy - sxy * sxy;
            const double slice_us = (sxt * syy - syt * sxy) / det, job_us = (sxx * syt - sxy * sxt) / det;
            double misfit = 0;
            for (size_t i = 0; i < ts.size(); i++)
                misfit = std::max(misfit, std::fabs(xs[i] * slice_us + ys[i] * job_us - ts[i]) / ts[i]);
            printf("\n%-10s fit: a slice %.3f us, a job %.2f us more (worst misfit %.1f%%)\n", "", slice_us, job_us,
                   100.0 * misfit);
        }
    }
    printf("\nevery version run matches the CPU\n");
    return 0;
}
