// Flash attention's delta of the rows past the first two query tiles (k_flash_bwd_delta_rows, cuda/flash_attention.cuh:
// delta = the FP64 sum over d of dO * O, and those query tiles' counters set to 0), at andrea-120m's shape, against a
// copy of the same bytes. Until 2026-12-02 the engine ran a warp a (row, head) (head below): 24.9 us a layer in the
// step for 44 MB, 41% of the copy bandwidth, the one memory-bound launch of the tc path under the 80% bar. Variants,
// each checked against the words (delta and counters) of the kernel that sums in the same order, then timed as 30
// launches in one CUDA graph rotating three sets of arrays (the model's passes are graphs), the median of 7:
//
// - engine: today's k_flash_bwd_delta_rows, a warp a (b, t) row, 16-byte loads, two groups of heads ahead of sums;
// - head: the old engine, a warp a (row, head), 86K warps of 2 loads a lane of each array, in blocks of 8 warps;
// - row: a warp a (b, t) row, every head: NH * d_k / 32 loads a lane of each array in flight, then each head's sum
//   in head's order and its shuffle tree (the same bits);
// - stride: head's warp a (row, head), as many warps as fit the GPU at once, each looping over the (row, head)s, the
//   next one's loads issued before this one's sums;
// - row4 N: a warp a row, 16-byte loads, N float4 of each array a lane ahead of the sums (the engine's order);
//   "(8 blocks)": register-capped to 32 for 8 blocks an SM (it spills), "resident": as many warps as fit, looping;
//   row4b: with 32-bit index math (fewer registers), "nc" through the read-only path;
// - copy: a copy kernel moving the same bytes (16 bytes a thread), over three sets of arrays as well.
//
//     nvcc -O3 -arch=sm_90a -std=c++17 -I cuda -o /tmp/delta_rows dev/cuda/delta_rows_bound.cu && /tmp/delta_rows
//
// H200, 2026-12-02, B 8 T 1024 / B 2 T 4096, % of the copy bandwidth (4275 GB/s): head 50 / 51, row 67 / 67, stride
// 40 / 41, row4 6 71 / 72, row4 3 75 / 78, row4 2 76 / 78, row4 1 72 / 76, (8 blocks) 53-65, row4 2 resident 78 / 80,
// row4b 2 77 / 80, row4b 3 78 / 79, nc no better; the copy of the same bytes 87 / 87. Every row4 gave the old
// engine's words on these inputs (another order, the same floats). The engine took row4b 2's shape, its widths
// (V, P) decided at run time for any d_k up to 128 and alignment: 74 / 76 (the same run's row4b 2: 77 / 80).
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "flash_attention.cuh"  // k_flash_bwd_delta_rows, FA_DELTA_PASS_TILES, FA_KEYS

#include "probe.cuh"  // CK, time_graph_ms, copy_bandwidth_gbs

constexpr int T0 = FA_DELTA_PASS_TILES * FA_KEYS;  // the rows before it: the pass kernel's

// delta and the counter of the tile of (b, h, t), where lane 0 holds the head's sum, as the engine writes them
__device__ __forceinline__ void put_delta(float* delta, int* sync, double sum, long long b, int h, int NH, long long t,
                                          int T) {
    const long long bh = b * NH + h;
    delta[bh * T + t] = (float)sum;
    if (t % FA_KEYS == 0) sync[bh * ((T - 1) / FA_KEYS + 1) + t / FA_KEYS] = 0;
}

// the engine's order: lane l adds d = l, l + 32, ..., then the shuffle tree
template <int LOADS>
__device__ __forceinline__ double head_sum(const float (&x)[LOADS], const float (&y)[LOADS], int lane, int d_k) {
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < LOADS; i++)
        if (lane + 32 * i < d_k) sum += (double)x[i] * y[i];
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) sum += __shfl_xor_sync(0xffffffff, sum, m);
    return sum;
}

// the engine's kernel until 2026-12-02: a warp a (row, head), lane l d = l, l + 32, ..., all its loads before its sums
__global__ void __launch_bounds__(256) k_delta_head(float* delta, int* sync, const float* o, const float* d_o, int B,
                                                    int NH, int T, int d_k, int ld) {
    const long long w = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, rows = T - T0;
    if (w >= (long long)B * rows * NH) return;
    const int lane = threadIdx.x % 32, h = (int)(w % NH);
    const long long bt = w / NH, b = bt / rows, t = T0 + bt % rows;
    const long long at = (b * T + t) * ld + (long long)h * d_k;
    float x[4], y[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int d = lane + 32 * i;
        x[i] = d < d_k ? d_o[at + d] : 0.0f;
        y[i] = d < d_k ? o[at + d] : 0.0f;
    }
    const double sum = head_sum<4>(x, y, lane, d_k);
    if (lane == 0) put_delta(delta, sync, sum, b, h, NH, t, T);
}

// a warp a (b, t) row, all NH heads (d_k <= 32 LOADS)
template <int NH, int LOADS>
__global__ void __launch_bounds__(256) k_delta_row(float* delta, int* sync, const float* o, const float* d_o, int B,
                                                   int T, int d_k, int ld) {
    const long long w = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, rows = T - T0;
    if (w >= (long long)B * rows) return;
    const int lane = threadIdx.x % 32;
    const long long b = w / rows, t = T0 + w % rows, at = (b * T + t) * ld;
    float x[NH][LOADS], y[NH][LOADS];
#pragma unroll
    for (int h = 0; h < NH; h++)
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const int d = lane + 32 * i;
            x[h][i] = d < d_k ? d_o[at + h * d_k + d] : 0.0f;
            y[h][i] = d < d_k ? o[at + h * d_k + d] : 0.0f;
        }
#pragma unroll
    for (int h = 0; h < NH; h++) {
        const double sum = head_sum<LOADS>(x[h], y[h], lane, d_k);
        if (lane == 0) put_delta(delta, sync, sum, b, h, NH, t, T);
    }
}

// the engine's warp a (row, head), each warp striding over them, the next one's loads ahead of this one's sums
template <int LOADS>
__global__ void __launch_bounds__(256) k_delta_stride(float* delta, int* sync, const float* o, const float* d_o, int B,
                                                      int NH, int T, int d_k, int ld) {
    const long long rows = T - T0, items = (long long)B * rows * NH;
    const long long step = (long long)gridDim.x * (blockDim.x / 32);
    long long w = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    auto load = [&](long long item, float (&x)[LOADS], float (&y)[LOADS]) {
        const long long bt = item / NH, at = (bt / rows * T + T0 + bt % rows) * ld + (item % NH) * d_k;
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const int d = lane + 32 * i;
            const bool in = item < items && d < d_k;
            x[i] = in ? d_o[at + d] : 0.0f;
            y[i] = in ? o[at + d] : 0.0f;
        }
    };
    float x[LOADS], y[LOADS];
    load(w, x, y);
    for (; w < items; w += step) {
        float nx[LOADS], ny[LOADS];
        load(w + step, nx, ny);
        const double sum = head_sum<LOADS>(x, y, lane, d_k);
        if (lane == 0) {
            const long long bt = w / NH;
            put_delta(delta, sync, sum, bt / rows, (int)(w % NH), NH, T0 + bt % rows, T);
        }
#pragma unroll
        for (int i = 0; i < LOADS; i++) x[i] = nx[i], y[i] = ny[i];
    }
}

// A lane's four products of d_o and o (x, y: its float4s) summed in FP64 in d's order, then the head's SEG lanes'
// sums by a shuffle tree: the head's sum, in each of its lanes
template <int SEG>
__device__ __forceinline__ double quad_head_sum(float4 x, float4 y) {
    double s = (double)x.x * y.x;
    s += (double)x.y * y.y;
    s += (double)x.z * y.z;
    s += (double)x.w * y.w;
#pragma unroll
    for (int m = SEG / 2; m >= 1; m /= 2) s += __shfl_xor_sync(0xffffffff, s, m);
    return s;
}

// a warp a (b, t) row, 16-byte loads: lane l takes float4 f = l + 32 i of the row (d = 4 f .. 4 f + 3 of head
// f / SEG, d_k = 4 SEG), its four products summed in FP64 in d's order, then the SEG lanes of a head by a shuffle
// tree (another order than the engine's: the same value but for a rounding of FP64 sums, rarely another float)
template <int SEG, int ITERS, int MIN_BLOCKS = 1>
__global__ void __launch_bounds__(256, MIN_BLOCKS) k_delta_row4(float* delta, int* sync, const float* o,
                                                                const float* d_o, int B, int NH, int T, int ld) {
    const long long rows = T - T0, step = (long long)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32, n4 = NH * SEG;
    for (long long w = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; w < B * rows; w += step) {
        const long long b = w / rows, t = T0 + w % rows, at = (b * T + t) * ld;
        const float4* x4 = reinterpret_cast<const float4*>(d_o + at);
        const float4* y4 = reinterpret_cast<const float4*>(o + at);
        for (int f0 = 0; f0 < n4; f0 += 32 * ITERS) {
            float4 x[ITERS], y[ITERS];
#pragma unroll
            for (int i = 0; i < ITERS; i++) {
                const int f = f0 + lane + 32 * i;
                x[i] = f < n4 ? x4[f] : make_float4(0, 0, 0, 0);
                y[i] = f < n4 ? y4[f] : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < ITERS; i++) {
                const int f = f0 + lane + 32 * i;
                if (f0 + 32 * i >= n4) break;  // the whole warp
                const double s = quad_head_sum<SEG>(x[i], y[i]);
                if (f < n4 && lane % SEG == 0) put_delta(delta, sync, s, b, f / SEG, NH, t, T);
            }
        }
    }
}

// row4 with 32-bit index math (the 64-bit divisions took registers), NC: loads through the read-only path
template <int SEG, int ITERS, bool NC>
__global__ void __launch_bounds__(256) k_delta_row4b(float* delta, int* sync, const float* o, const float* d_o, int B,
                                                     int NH, int T, int ld) {
    const int rows = T - T0, n_rows = B * rows, lane = threadIdx.x % 32, n4 = NH * SEG;
    const int tiles = (T - 1) / FA_KEYS + 1, step = gridDim.x * (blockDim.x / 32);
    for (int w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; w < n_rows; w += step) {
        const int b = w / rows, t = T0 + w - b * rows;
        const long long at = ((long long)b * T + t) * ld;
        const float4* x4 = reinterpret_cast<const float4*>(d_o + at);
        const float4* y4 = reinterpret_cast<const float4*>(o + at);
        for (int f0 = 0; f0 < n4; f0 += 32 * ITERS) {
            float4 x[ITERS], y[ITERS];
#pragma unroll
            for (int i = 0; i < ITERS; i++) {
                const int f = f0 + lane + 32 * i;
                const float4 z = make_float4(0, 0, 0, 0);
                x[i] = f < n4 ? (NC ? __ldg(x4 + f) : x4[f]) : z;
                y[i] = f < n4 ? (NC ? __ldg(y4 + f) : y4[f]) : z;
            }
#pragma unroll
            for (int i = 0; i < ITERS; i++) {
                const int f = f0 + lane + 32 * i;
                if (f0 + 32 * i >= n4) break;  // the whole warp
                const double s = quad_head_sum<SEG>(x[i], y[i]);
                if (f < n4 && lane % SEG == 0) {
                    const long long bh = (long long)b * NH + f / SEG;
                    delta[bh * T + t] = (float)s;
                    if (t % FA_KEYS == 0) sync[bh * tiles + t / FA_KEYS] = 0;
                }
            }
        }
    }
}

__global__ void k_copy(float4* out, const float4* in, long long n4) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n4) out[i] = in[i];
}

int main() {
    const double copy_gbs = copy_bandwidth_gbs();
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("copy bandwidth (2 GB each way): %.0f GB/s; %d SMs\n", copy_gbs, sms);

    constexpr int NH = 12, d_k = 64, LOADS = 2;  // andrea-120m
    const int C = NH * d_k;
    const struct { int B, T; } shapes[] = {{8, 1024}, {2, 4096}};
    for (auto sh : shapes) {
        const int B = sh.B, T = sh.T, tiles = (T - 1) / FA_KEYS + 1;
        const long long rows = T - T0, n = (long long)B * T * C, n_delta = (long long)B * NH * T;
        const long long n_sync = (long long)B * NH * tiles;
        std::vector<float> h(n);
        for (long long i = 0; i < n; i++) h[i] = (float)((i * 2654435761u) % 1000003) / 1000003.0f - 0.5f;
        float *o[3], *d_o[3], *delta[3];
        int* sync[3];
        for (int s = 0; s < 3; s++) {
            CK(cudaMalloc(&o[s], n * 4));
            CK(cudaMalloc(&d_o[s], n * 4));
            CK(cudaMemcpy(o[s], h.data(), n * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d_o[s], h.data() + 7, (n - 7) * 4, cudaMemcpyHostToDevice));
            CK(cudaMalloc(&delta[s], n_delta * 4));
            CK(cudaMalloc(&sync[s], n_sync * 4));
        }
        const long long items = B * rows * NH;
        auto engine = [&](int s, cudaStream_t st) {
            k_flash_bwd_delta_rows<<<(unsigned)((32 * B * rows + 255) / 256), 256, 0, st>>>(
                delta[s], sync[s], o[s], d_o[s], B, NH, T, d_k, C);
        };
        auto head = [&](int s, cudaStream_t st) {
            k_delta_head<<<(unsigned)((32 * items + 255) / 256), 256, 0, st>>>(delta[s], sync[s], o[s], d_o[s], B,
                                                                               NH, T, d_k, C);
        };
        auto row = [&](int s, cudaStream_t st) {
            k_delta_row<NH, LOADS><<<(unsigned)((32 * B * rows + 255) / 256), 256, 0, st>>>(
                delta[s], sync[s], o[s], d_o[s], B, T, d_k, C);
        };
        auto stride = [&](int s, cudaStream_t st) {
            k_delta_stride<LOADS><<<8 * sms, 256, 0, st>>>(delta[s], sync[s], o[s], d_o[s], B, NH, T, d_k, C);
        };
        using Row4 = void (*)(float*, int*, const float*, const float*, int, int, int, int);
        // a warp a row (resident = false), or as many warps as are resident at once, each looping over the rows
        auto row4 = [&](Row4 kernel, bool resident) {
            int grid = (int)((32 * B * rows + 255) / 256), per_sm;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0));
            if (resident) grid = std::min(grid, per_sm * sms);
            return [&, kernel, grid](int s, cudaStream_t st) {
                kernel<<<grid, 256, 0, st>>>(delta[s], sync[s], o[s], d_o[s], B, NH, T, C);
            };
        };
        const struct {
            const char* name;
            Row4 kernel;
            bool resident;
        } row4s[] = {{"row4 6", k_delta_row4<d_k / 4, 6>, false},
                     {"row4 3", k_delta_row4<d_k / 4, 3>, false},
                     {"row4 2", k_delta_row4<d_k / 4, 2>, false},
                     {"row4 1", k_delta_row4<d_k / 4, 1>, false},
                     {"row4 3 (8 blocks)", k_delta_row4<d_k / 4, 3, 8>, false},
                     {"row4 2 (8 blocks)", k_delta_row4<d_k / 4, 2, 8>, false},
                     {"row4 1 (8 blocks)", k_delta_row4<d_k / 4, 1, 8>, false},
                     {"row4 6 resident", k_delta_row4<d_k / 4, 6>, true},
                     {"row4 3 resident", k_delta_row4<d_k / 4, 3>, true},
                     {"row4 2 resident", k_delta_row4<d_k / 4, 2>, true},
                     {"row4 1 resident", k_delta_row4<d_k / 4, 1>, true},
                     {"row4 1 (8) resident", k_delta_row4<d_k / 4, 1, 8>, true},
                     {"row4b 1", k_delta_row4b<d_k / 4, 1, false>, false},
                     {"row4b 2", k_delta_row4b<d_k / 4, 2, false>, false},
                     {"row4b 3", k_delta_row4b<d_k / 4, 3, false>, false},
                     {"row4b 6", k_delta_row4b<d_k / 4, 6, false>, false},
                     {"row4b 2 resident", k_delta_row4b<d_k / 4, 2, false>, true},
                     {"row4b 3 resident", k_delta_row4b<d_k / 4, 3, false>, true},
                     {"row4b 2 nc", k_delta_row4b<d_k / 4, 2, true>, false},
                     {"row4b 3 nc", k_delta_row4b<d_k / 4, 3, true>, false},
                     {"row4b 6 nc", k_delta_row4b<d_k / 4, 6, true>, false}};
        // the engine's delta and counters (poisoned first), then each variant's
        auto result = [&](auto f) {
            CK(cudaMemset(delta[0], 0xff, n_delta * 4));
            CK(cudaMemset(sync[0], 0xff, n_sync * 4));
            f(0, 0);
            CK(cudaDeviceSynchronize());
            std::vector<uint32_t> out(n_delta + n_sync);
            CK(cudaMemcpy(out.data(), delta[0], n_delta * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out.data() + n_delta, sync[0], n_sync * 4, cudaMemcpyDeviceToHost));
            return out;
        };
        // how many of delta's and the counters' words differ from those of the kernel of the same order, by how
        // many ulps at most: row and stride against the old engine's (head), the row4s against today's
        const std::vector<uint32_t> want = result(engine), want_head = result(head);
        auto differ = [&](auto f, const char* what, const std::vector<uint32_t>& against) {
            const std::vector<uint32_t> got = result(f);
            long long n_diff = 0, ulps = 0;
            for (long long i = 0; i < n_delta + n_sync; i++)
                if (got[i] != against[i])
                    n_diff++, ulps = std::max(ulps, std::llabs((long long)got[i] - against[i]));
            printf("%s: %lld of %lld words differ, by %lld ulps at most\n", what, n_diff, n_delta + n_sync, ulps);
        };
        differ(head, "head vs engine", want);
        differ(row, "row", want_head);
        differ(stride, "stride", want_head);
        for (auto v : row4s) differ(row4(v.kernel, v.resident), v.name, want);
        const double bytes = 8.0 * B * rows * C + 4.0 * B * rows * NH;  // dO and O read, delta written
        char name[32];
        snprintf(name, sizeof name, "B %d, T %d", B, T);
        auto report = [&](const char* what, double t) {
            printf("%-16s %-18s %8.4f ms %7.0f GB/s %6.1f%%\n", name, what, t, bytes / t / 1e6,
                   100.0 * bytes / t / 1e6 / copy_gbs);
        };
        report("engine", time_graph_ms(engine));
        report("head", time_graph_ms(head));
        report("row", time_graph_ms(row));
        report("stride", time_graph_ms(stride));
        for (auto v : row4s) report(v.name, time_graph_ms(row4(v.kernel, v.resident)));
        const long long n4 = (long long)(bytes / 2) / 16;  // half the bytes read, half written
        float4 *cin[3], *cout[3];
        for (int s = 0; s < 3; s++) {
            CK(cudaMalloc(&cin[s], n4 * 16));
            CK(cudaMalloc(&cout[s], n4 * 16));
        }
        report("copy", time_graph_ms([&](int s, cudaStream_t st) {
                   k_copy<<<(unsigned)((n4 + 255) / 256), 256, 0, st>>>(cout[s], cin[s], n4);
               }));
        for (int s = 0; s < 3; s++) {
            CK(cudaFree(cin[s]));
            CK(cudaFree(cout[s]));
            CK(cudaFree(o[s]));
            CK(cudaFree(d_o[s]));
            CK(cudaFree(delta[s]));
            CK(cudaFree(sync[s]));
        }
    }
    return 0;
}
