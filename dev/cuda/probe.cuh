// What the dev/cuda probes share (as llm.c's dev/cuda/common.h): CK, a CUDA call checked, its file and line named
// where it fails; time_graph_ms, a launch's time as the model's passes run it, in a CUDA graph.
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
