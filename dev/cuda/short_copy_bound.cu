// What a pass that reads 25 MB and writes 25 MB can reach (the layernorm forward and the head merge at
// andrea-120m's shapes, B=8, T=1024, C=768), against the 2 GB copy tools/profile_kernels.py takes as 100%:
// cudaMemcpy and copy kernels of the same bytes, launched one by one, as one CUDA graph, and with programmatic
// dependent launch (PDL: the next launch's blocks start as the last one's finish, waiting in griddepcontrol.wait
// for its memory); then the engine's k_layernorm_fwd_fast and head merges, and other forms of them. Every timing
// is the mean of 30 launches back to back, rotating three sets of arrays (the 50 MB L2 holds no repeat), the
// median of 7 such.
//
//     nvcc -O3 -arch=sm_90a -std=c++17 -I cuda -o /tmp/short_copy dev/cuda/short_copy_bound.cu && /tmp/short_copy
//
// H200, 2026-12-01 (% of the 2 GB copy's 4.25-4.28 TB/s; one by one / in a graph):
// - cudaMemcpy of 25 MB 78-79% (of 75 MB 92%): a pass this short does not reach the long copy's rate.
// - copy kernels: a 16-byte chunk a thread 77% / 86%, evict-first both ways 81% / 87% (PDL: 88%); 4 chunks a
//   thread looping over the array 74-80% / 82-86%, fewer blocks better. A graph or PDL saves about 1.2 us a launch.
// - the layernorm forward (a warp a row, 60 registers, 32 warps an SM): 73-74% / 78-79% in blocks of 64 to 256
//   threads, 71% / 77% in blocks of one warp; held to 48 registers (spills) 62% / 65%; the warps looping over the
//   rows with the next row's loads ahead (16 warps an SM) 69-71% / 74-77%; x and out both plain 70% / 76%, x alone
//   evict-first 71% / 78%, out alone 69% / 76%, both (the engine's) 74% / 79%; held to 8 to 24 warps an SM
//   (blocks of 128 held back by shared memory) 47-67% / 49-70%: its warps in flight are what it lacks, and a row
//   of C floats in registers holds it to 60 registers, 32 warps.
// - the head merge: the split's copy of (T, d_k) matrices in tiles of 64 rows, 4 a thread, 72-73% / 80%; a block a
//   (B, T, C) row, each thread one 16-byte chunk, evict-first (the engine's since), 77-78% / 82-84% (backward
//   79-80% / 85%); the same with constant shapes (no divisions) over the whole of y 81% / 87%.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "heads_fast.cuh"
#include "layernorm_fast.cuh"

#include "probe.cuh"  // CK, time_graph_ms

constexpr int B = 8, T = 1024, NH = 12, DK = 64, C = NH * DK, N = B * T;
constexpr long long ELEMS = (long long)N * C;  // 6.3M floats, 25 MB

// PDL: wait for the previous grid's memory before the first load (as a kernel reading its output must), and let
// the next grid's blocks launch as this one's leave.
template <bool PDL>
__device__ __forceinline__ void pdl_begin() {
    if constexpr (PDL) asm volatile("griddepcontrol.wait;\n griddepcontrol.launch_dependents;" ::: "memory");
}

// U float4 a thread in flight, grid-stride; CS: loads and stores evict-first
template <int U, bool CS, bool PDL>
__global__ void __launch_bounds__(256) k_copy(float4* out, const float4* in, long long n4) {
    pdl_begin<PDL>();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += U * stride) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + u * stride < n4) v[u] = CS ? __ldcs(in + i + u * stride) : in[i + u * stride];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + u * stride < n4) {
                if (CS)
                    __stcs(out + i + u * stride, v[u]);
                else
                    out[i + u * stride] = v[u];
            }
    }
}

// The engine's kernels, each wrapped so that PDL can go in front
template <bool PDL>
__global__ void __launch_bounds__(256) k_ln_engine(float* out, float* mean, float* rstd, const float* x,
                                                   const float* w, const float* b, int n_rows, int cols) {
    pdl_begin<PDL>();
    long long n = warp_row();
    if (n >= n_rows) return;
    layernorm_fwd_row<4>(out + n * cols, mean, rstd, x + n * cols, w, b, n, cols);
}

// The engine's row with its cache hints chosen: x loaded evict-first (LCS), out stored evict-first (SCS)
template <bool LCS, bool SCS>
__global__ void __launch_bounds__(128) k_ln_hints(float* out, float* mean, float* rstd, const float* x,
                                                  const float* w, const float* b, int n_rows, int cols) {
    constexpr int CHUNKS = ROW_REGS / 4;
    const long long n = warp_row();
    if (n >= n_rows) return;
    float v[CHUNKS][4] = {};
#pragma unroll
    for (int k = 0; k < CHUNKS; k++)
        if (chunk_col<4>(k) < cols) load_vec<4, LCS>(v[k], x + n * cols + chunk_col<4>(k));
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < CHUNKS; k++)
#pragma unroll
        for (int e = 0; e < 4; e++) sum += v[k][e];
    layernorm_regs_out<4, SCS>(out + n * cols, mean, rstd, v, sum, w, b, n, cols);
}

// A warp a row, the warps looping over the rows, the next row's loads issued before this row's sums and stores
template <bool PDL>
__global__ void __launch_bounds__(256, 2) k_ln_pipe(float* out, float* mean, float* rstd, const float* x,
                                                    const float* w, const float* b, int n_rows, int cols) {
    pdl_begin<PDL>();
    constexpr int CHUNKS = ROW_REGS / 4;
    const long long W = (long long)gridDim.x * (blockDim.x / 32);
    long long n = warp_row();
    float nx[CHUNKS][4] = {};
    if (n < n_rows)
#pragma unroll
        for (int k = 0; k < CHUNKS; k++)
            if (chunk_col<4>(k) < cols) load_vec<4, true>(nx[k], x + n * cols + chunk_col<4>(k));
    for (; n < n_rows; n += W) {
        float v[CHUNKS][4];
#pragma unroll
        for (int k = 0; k < CHUNKS; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) v[k][e] = nx[k][e];
        if (n + W < n_rows)
#pragma unroll
            for (int k = 0; k < CHUNKS; k++)
                if (chunk_col<4>(k) < cols) load_vec<4, true>(nx[k], x + (n + W) * cols + chunk_col<4>(k));
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CHUNKS; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) sum += v[k][e];
        layernorm_regs_out<4, true>(out + n * cols, mean, rstd, v, sum, w, b, n, cols);
    }
}

// the merges as they were: the split's copy of (T, d_k) matrices in tiles of 64 rows, 4 rows a thread
template <bool PDL, bool TO_HEADS = false>
__global__ void __launch_bounds__(256, 4) k_merge_engine(float* y, const float* heads, int b_, int t_, int nh, int dk) {
    pdl_begin<PDL>();
    const int C_ = nh * dk, BH = b_ * nh;
    for (long long bh = blockIdx.x; bh < BH; bh += gridDim.x) {
        const int b = bh / nh, h = bh % nh;
        if (TO_HEADS)  // y: dy, heads: dheads
            copy_head(const_cast<float*>(heads) + (long long)bh * t_ * dk, dk, y + (long long)b * t_ * C_ + h * dk, C_,
                      t_, dk, true);
        else
            copy_head(y + (long long)b * t_ * C_ + h * dk, C_, heads + (long long)bh * t_ * dk, dk, t_, dk, true);
    }
}

// The merge as a flat copy over y's float4s in order (so the writes stream), each finding its head's chunk
template <int U, bool PDL>
__global__ void __launch_bounds__(256) k_merge_flat(float4* y, const float4* heads, long long n4) {
    pdl_begin<PDL>();
    constexpr int C4 = C / 4, D4 = DK / 4;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += U * stride) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            long long j = i + u * stride;
            if (j < n4) {
                long long bt = j / C4;
                int c4 = j % C4, h = c4 / D4, d4 = c4 % D4;
                long long b = bt / T, t = bt % T;
                v[u] = __ldcs(heads + ((b * NH + h) * T + t) * D4 + d4);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (i + u * stride < n4) y[i + u * stride] = v[u];
    }
}

// The merge a 16-byte chunk a thread over the whole of y, evict-first both ways, as the fastest copy above
__global__ void __launch_bounds__(256) k_merge_one(float4* y, const float4* heads, long long n4) {
    constexpr int C4 = C / 4, D4 = DK / 4;
    const long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (j >= n4) return;
    const long long bt = j / C4;
    const int c4 = j % C4, h = c4 / D4, d4 = c4 % D4;
    const long long b = bt / T, t = bt % T;
    __stcs(y + j, __ldcs(heads + ((b * NH + h) * T + t) * D4 + d4));
}

// The engine's row held to 48 registers: 10 warps an SM more
__global__ void __launch_bounds__(128, 10) k_ln_regs48(float* out, float* mean, float* rstd, const float* x,
                                                       const float* w, const float* b, int n_rows, int cols) {
    long long n = warp_row();
    if (n >= n_rows) return;
    layernorm_fwd_row<4>(out + n * cols, mean, rstd, x + n * cols, w, b, n, cols);
}

static cudaEvent_t e0, e1;

template <typename F>
double time_ms(F f) {  // f(set): queue one launch on stream 0
    for (int i = 0; i < 6; i++) f(i % 3);
    CK(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < 30; i++) f(i % 3);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms / 30);
    }
    std::sort(t.begin(), t.end());
    return t[3];
}


template <typename Kern, typename... Args>
void launch(bool pdl, Kern k, int grid, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}

static double copy_gbs;

static void report(const char* name, double bytes, double ms) {
    printf("%-58s %8.4f ms %7.0f GB/s %6.1f%%\n", name, ms, bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / copy_gbs);
}

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    {  // the ceiling profile_kernels takes
        const size_t big = 2ull << 30;
        void *s, *d;
        CK(cudaMalloc(&s, big));
        CK(cudaMalloc(&d, big));
        CK(cudaMemset(s, 0, big));
        copy_gbs = 2.0 * big / time_ms([&](int) { CK(cudaMemcpyAsync(d, s, big, cudaMemcpyDeviceToDevice)); }) / 1e6;
        printf("2 GB cudaMemcpy: %.0f GB/s (100%%), %d SMs\n", copy_gbs, sms);
        CK(cudaFree(s));
        CK(cudaFree(d));
    }
    std::vector<float*> in(3), out(3), mean(3), rstd(3);
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc(&in[i], ELEMS * 4 * 3));  // room for the 75 MB copies too
        CK(cudaMalloc(&out[i], ELEMS * 4 * 3));
        CK(cudaMalloc(&mean[i], N * 4));
        CK(cudaMalloc(&rstd[i], N * 4));
        std::vector<float> h(ELEMS * 3);
        for (auto& v : h) v = (float)rand() / RAND_MAX - 0.5f;
        CK(cudaMemcpy(in[i], h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
    float *w, *bias;
    CK(cudaMalloc(&w, C * 4));
    CK(cudaMalloc(&bias, C * 4));
    {
        std::vector<float> h(C, 1.0f);
        CK(cudaMemcpy(w, h.data(), C * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(bias, 0, C * 4));
    }
    const double bytes = 2.0 * ELEMS * 4;
    char name[96];
    for (long long mult : {1, 3}) {
        snprintf(name, sizeof name, "cudaMemcpy %lld MB", mult * ELEMS * 4 >> 20);
        report(name, mult * bytes, time_ms([&](int s) {
                   CK(cudaMemcpyAsync(out[s], in[s], mult * ELEMS * 4, cudaMemcpyDeviceToDevice));
               }));
    }
    const long long n4 = ELEMS / 4;
    auto copies = [&](auto kern, const char* what, int grid) {
        for (bool pdl : {false, true}) {
            snprintf(name, sizeof name, "%s, %d blocks%s", what, grid, pdl ? ", PDL" : "");
            report(name, bytes, time_ms([&](int s) {
                       launch(pdl, kern, grid, 0, (float4*)out[s], (const float4*)in[s], n4);
                   }));
        }
        snprintf(name, sizeof name, "%s, %d blocks, graph", what, grid);
        report(name, bytes, time_graph_ms([&](int s, cudaStream_t st) {
                   launch(false, kern, grid, st, (float4*)out[s], (const float4*)in[s], n4);
               }));
    };
    const int full = (int)((n4 + 255) / 256);
    copies(k_copy<1, false, false>, "copy U1", full);
    copies(k_copy<1, true, false>, "copy U1 cs", full);
    for (int per_sm : {4, 8, 16}) {
        copies(k_copy<4, false, false>, "copy U4", sms * per_sm);
        copies(k_copy<4, true, false>, "copy U4 cs", sms * per_sm);
    }
    copies(k_copy<2, false, false>, "copy U2", sms * 8);
    copies(k_copy<8, false, false>, "copy U8", sms * 4);
    // PDL variants need their own instantiation to wait
    for (int per_sm : {8, 16}) {
        snprintf(name, sizeof name, "copy U4 waiting, %d blocks, PDL", sms * per_sm);
        report(name, bytes, time_ms([&](int s) {
                   launch(true, k_copy<4, false, true>, sms * per_sm, 0, (float4*)out[s], (const float4*)in[s], n4);
               }));
    }
    snprintf(name, sizeof name, "copy U1 waiting, full grid, PDL");
    report(name, bytes, time_ms([&](int s) {
               launch(true, k_copy<1, false, true>, full, 0, (float4*)out[s], (const float4*)in[s], n4);
           }));

    // plain and as a graph of the same 30 launches: f(set, stream)
    auto both = [&](const char* what, double nbytes, auto f) {
        report(what, nbytes, time_ms([&](int s) { f(s, (cudaStream_t)0); }));
        char graphed[sizeof name + 8];
        snprintf(graphed, sizeof graphed, "%s, graph", what);
        report(graphed, nbytes, time_graph_ms(f));
    };
    // the layernorm forward: 25 MB in, 25 MB out
    for (int threads : {256, 128, 64, 32}) {
        snprintf(name, sizeof name, "layernorm engine, blocks of %d", threads);
        both(name, bytes, [&](int s, cudaStream_t st) {
            k_ln_engine<false><<<N * 32 / threads, threads, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
        });
    }
    both("layernorm, blocks of 128, plain loads and stores", bytes, [&](int s, cudaStream_t st) {
        k_ln_hints<false, false><<<N * 32 / 128, 128, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
    both("layernorm, blocks of 128, x evict-first", bytes, [&](int s, cudaStream_t st) {
        k_ln_hints<true, false><<<N * 32 / 128, 128, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
    both("layernorm, blocks of 128, out evict-first", bytes, [&](int s, cudaStream_t st) {
        k_ln_hints<false, true><<<N * 32 / 128, 128, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
    both("layernorm, blocks of 128, both evict-first (the engine's)", bytes, [&](int s, cudaStream_t st) {
        k_ln_hints<true, true><<<N * 32 / 128, 128, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
    // fewer warps an SM at once (dynamic shared memory taken to hold the blocks back): more waves of rows
    CK(cudaFuncSetAttribute(k_ln_engine<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, 120 << 10));
    for (int per_sm : {2, 3, 4, 6}) {
        const int smem = ((227 << 10) / per_sm) - (2 << 10);
        snprintf(name, sizeof name, "layernorm engine, blocks of 128, %d an SM", per_sm);
        both(name, bytes, [&](int s, cudaStream_t st) {
            k_ln_engine<false><<<N * 32 / 128, 128, smem, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
        });
    }
    snprintf(name, sizeof name, "layernorm engine, 48 registers");
    both(name, bytes, [&](int s, cudaStream_t st) {
        k_ln_regs48<<<N * 32 / 128, 128, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
    });
    for (int per_sm : {2, 3}) {
        snprintf(name, sizeof name, "layernorm next row ahead, %d blocks", sms * per_sm);
        both(name, bytes, [&](int s, cudaStream_t st) {
            k_ln_pipe<false><<<sms * per_sm, 256, 0, st>>>(out[s], mean[s], rstd[s], in[s], w, bias, N, C);
        });
    }
    {  // the other forms must be the engine's bits
        std::vector<float> a(ELEMS), bb(ELEMS);
        auto same = [&](const char* what, auto f) {
            CK(cudaMemset(out[0], 0xFF, ELEMS * 4));
            f();
            CK(cudaMemcpy(bb.data(), out[0], ELEMS * 4, cudaMemcpyDeviceToHost));
            printf("%s: %s the engine's bits\n", what, a == bb ? "the same as" : "NOT");
        };
        k_ln_engine<false><<<N * 32 / 256, 256>>>(out[0], mean[0], rstd[0], in[0], w, bias, N, C);
        CK(cudaMemcpy(a.data(), out[0], ELEMS * 4, cudaMemcpyDeviceToHost));
        same("layernorm next row ahead", [&] {
            k_ln_pipe<false><<<sms * 3, 256>>>(out[0], mean[0], rstd[0], in[0], w, bias, N, C);
        });
        same("layernorm 48 registers", [&] {
            k_ln_regs48<<<N * 32 / 128, 128>>>(out[0], mean[0], rstd[0], in[0], w, bias, N, C);
        });
        k_merge_engine<false><<<dim3(B * NH, (T + 63) / 64), 256>>>(out[0], in[0], B, T, NH, DK);
        CK(cudaMemcpy(a.data(), out[0], ELEMS * 4, cudaMemcpyDeviceToHost));
        same("merge heads flat U4", [&] {
            k_merge_flat<4, false><<<sms * 8, 256>>>((float4*)out[0], (const float4*)in[0], n4);
        });
        same("merge heads engine (a block a row)", [&] {
            k_merge_heads_fwd_fast<<<B * T, C / 4>>>(out[0], in[0], B, T, NH, DK);
        });
        same("merge heads a chunk a thread", [&] {
            k_merge_one<<<(n4 + 255) / 256, 256>>>((float4*)out[0], (const float4*)in[0], n4);
        });
    }

    // the head merge: 25 MB in, 25 MB out
    both("merge heads as it was", bytes, [&](int s, cudaStream_t st) {
        k_merge_engine<false><<<dim3(B * NH, (T + 63) / 64), 256, 0, st>>>(out[s], in[s], B, T, NH, DK);
    });
    both("merge heads engine (a block a row)", bytes, [&](int s, cudaStream_t st) {
        k_merge_heads_fwd_fast<<<B * T, C / 4, 0, st>>>(out[s], in[s], B, T, NH, DK);
    });
    both("merge heads backward as it was", bytes, [&](int s, cudaStream_t st) {
        k_merge_engine<false, true><<<dim3(B * NH, (T + 63) / 64), 256, 0, st>>>(in[s], out[s], B, T, NH, DK);
    });
    both("merge heads backward engine (a block a row)", bytes, [&](int s, cudaStream_t st) {
        k_merge_heads_bwd_fast<<<B * T, C / 4, 0, st>>>(out[s], in[s], B, T, NH, DK);
    });
    for (int per_sm : {8, 16}) {
        snprintf(name, sizeof name, "merge heads flat U4, %d blocks", sms * per_sm);
        both(name, bytes, [&](int s, cudaStream_t st) {
            k_merge_flat<4, false><<<sms * per_sm, 256, 0, st>>>((float4*)out[s], (const float4*)in[s], n4);
        });
    }
    both("merge heads a chunk a thread", bytes, [&](int s, cudaStream_t st) {
        k_merge_one<<<(n4 + 255) / 256, 256, 0, st>>>((float4*)out[s], (const float4*)in[s], n4);
    });
    both("copy U1 cs (for the same run)", bytes, [&](int s, cudaStream_t st) {
        k_copy<1, true, false><<<(n4 + 255) / 256, 256, 0, st>>>((float4*)out[s], (const float4*)in[s], n4);
    });
    CK(cudaDeviceSynchronize());
    return 0;
}
