// The flash forward's operand split, two ways, side by side: the engine's k_flash_fwd_d64, whose block splits each
// tile of K and V into TF32 hi and lo once in shared memory (FA_FWD_SPLIT), against the same forward with each warp
// splitting the fragments it reads (the engine's before, two blocks an SM at 128 registers), and the split tiles
// with 16 warps a block. The same products in the same order: every O and lse must be the same bits, which this
// checks before it times them (B = 8, 12 heads, d_k 64; T = 1024, 2048, 4096).
//
//     nvcc -O3 -arch=sm_90a -std=c++17 -Icuda -o /tmp/fa_split dev/cuda/flash_attention_split.cu && /tmp/fa_split
//
// H200, 2026-12-01 (ms): T = 1024: split 0.376, per warp 0.422, split with 16 warps 0.437; T = 2048: 1.282, 1.377,
// 1.363; T = 4096: 4.681, 4.941, 4.784. (A first version, which split each tile at the end of the last one's
// products rather than at the start of its own, took 0.392 / 1.326 / 4.842.)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flash_attention.cuh"

#include "probe.cuh"  // CK, time_graph_ms

constexpr int D = 64, NH = 12, B = 8, C = NH * D;

// each warp splits as it reads: the forward as the engine ran it before FA_FWD_SPLIT
__global__ void __launch_bounds__(256, 2) k_fwd_per_warp(float* o, float* lse, const float* q, const float* k,
                                                         const float* v, int T, int d_k, int ld_in, int ld_out) {
    flash_fwd<D, 8, false>(o, lse, q, k, v, T, d_k, ld_in, ld_out);
}
__global__ void __launch_bounds__(512, 1) k_fwd_split16(float* o, float* lse, const float* q, const float* k,
                                                        const float* v, int T, int d_k, int ld_in, int ld_out) {
    flash_fwd<D, 16, true>(o, lse, q, k, v, T, d_k, ld_in, ld_out);
}

template <class Kernel>
void run(Kernel kernel, int warps, bool split, int T, float* o, float* lse, const float* qkv) {
    const int bytes = FA_SMEM_FWD(D, warps, split) * 4;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    dim3 grid((T + 16 * warps - 1) / (16 * warps), NH, B);
    kernel<<<grid, 32 * warps, bytes>>>(o, lse, qkv, qkv + C, qkv + 2 * C, T, D, 3 * C, C);
}

int main() {
    struct Way {
        const char* name;
        void (*kernel)(float*, float*, const float*, const float*, const float*, int, int, int, int);
        int warps;
        bool split;
    } ways[] = {{"engine: split tiles, 8 warps", k_flash_fwd_d64, FA_FWD_W64, FA_FWD_SPLIT(64) == 1},
                {"each warp splits, 8 warps", k_fwd_per_warp, 8, false},
                {"split tiles, 16 warps", k_fwd_split16, 16, true}};
    for (int T : {1024, 2048, 4096}) {
        const size_t n_qkv = (size_t)B * T * 3 * C, n_o = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
        std::vector<float> h(n_qkv);
        srand(T);
        for (auto& x : h) x = (rand() / (float)RAND_MAX - 0.5f) * 4.0f;
        float *qkv, *o, *lse;
        CK(cudaMalloc(&qkv, n_qkv * 4));
        CK(cudaMalloc(&o, n_o * 4));
        CK(cudaMalloc(&lse, n_lse * 4));
        CK(cudaMemcpy(qkv, h.data(), n_qkv * 4, cudaMemcpyHostToDevice));
        std::vector<float> o0(n_o), lse0(n_lse), o1(n_o), lse1(n_lse);
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        for (const Way& w : ways) {
            CK(cudaMemset(o, 0xff, n_o * 4));  // NaN
            CK(cudaMemset(lse, 0xff, n_lse * 4));
            run(w.kernel, w.warps, w.split, T, o, lse, qkv);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(o1.data(), o, n_o * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(lse1.data(), lse, n_lse * 4, cudaMemcpyDeviceToHost));
            if (&w == ways) {
                o0 = o1, lse0 = lse1;
                for (float x : o1)
                    if (x != x) {
                        printf("T=%d %s: NaN in O\n", T, w.name);
                        return 1;
                    }
            } else if (memcmp(o0.data(), o1.data(), n_o * 4) || memcmp(lse0.data(), lse1.data(), n_lse * 4)) {
                printf("T=%d %s: not the same bits as the engine's\n", T, w.name);
                return 1;
            }
            for (int i = 0; i < 3; i++) run(w.kernel, w.warps, w.split, T, o, lse, qkv);
            const int reps = 20;
            CK(cudaEventRecord(e0));
            for (int i = 0; i < reps; i++) run(w.kernel, w.warps, w.split, T, o, lse, qkv);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            printf("T=%d %-30s %.4f ms (same bits)\n", T, w.name, ms / reps);
        }
        CK(cudaFree(qkv));
        CK(cudaFree(o));
        CK(cudaFree(lse));
    }
    return 0;
}
