// What the dev/cuda probes share (as llm.c's dev/cuda/common.h): CK, a CUDA call checked, its file and line named
// where it fails; time_graph_ms, a launch's time as the model's passes run it, in a CUDA graph; copy_bandwidth_gbs,
// the copy bandwidth a probe's figures are shares of.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e = (x);                                                                                   \
        if (e != cudaSuccess) {                                                                                \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));                           \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

// f(set, stream) queues one launch on stream; 30 of them, rotating three sets of arrays (so that the 50 MB L2
// holds no repeat), captured once as a graph and launched twice to warm up; the mean of the 30 launches, the
// median of 7 graph launches
template <typename F>
double time_graph_ms(F f) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 30; i++) f(i % 3, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 2; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    std::vector<float> t;
    for (int r = 0; r < 7; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms / 30);
    }
    std::sort(t.begin(), t.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(s));
    return t[3];
}

// The copy bandwidth tools/profile_kernels.py takes as 100%: GB/s, bytes read and written, of device-to-device copies
// of 2 GB each way (3 to warm up, then 5 timed)
inline double copy_bandwidth_gbs() {
    const size_t big = 2ull << 30;
    void *s, *d;
    CK(cudaMalloc(&s, big));
    CK(cudaMalloc(&d, big));
    CK(cudaMemset(s, 0, big));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++) CK(cudaMemcpyAsync(d, s, big, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(d, s, big, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(s));
    CK(cudaFree(d));
    return 2.0 * big * 5 / ms / 1e6;
}
