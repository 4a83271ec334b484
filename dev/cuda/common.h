// What every dev/cuda/<op>.cu shares: checked CUDA calls, the GPU on hand, random inputs, the check of a kernel's
// output against the CPU reference, and its time. The kernels themselves come from the engine's headers in cuda/.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include <cuda_runtime.h>

// ---------------------------------------------------------------------------------------------- CUDA calls
inline void cuda_check(cudaError_t error, const char* file, int line) {
    if (error != cudaSuccess) {
        printf("[CUDA ERROR] %s:%d: %s\n", file, line, cudaGetErrorString(error));
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(call) cuda_check((call), __FILE__, __LINE__)

template <class T>
T ceil_div(T a, T b) {
    return (a + b - 1) / b;
}

// A kernel's dynamic shared memory beyond the default 48 KB must be asked for.
template <class Kernel>
void allow_shared(Kernel* kernel, int bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// A launch of kernel with args on stream s; dependent: as a programmatic dependent launch (the kernel waits for the
// one before at its griddepcontrol.wait, as the engine's launches do), else an ordinary one.
inline void launch_ex(const void* kernel, dim3 grid, dim3 block, int shared, cudaStream_t s, void** args,
                      bool dependent = true) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared;
    config.stream = s;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = dependent ? 1 : 0;
    cudaCheck(cudaLaunchKernelExC(&config, kernel, args));
}

// ---------------------------------------------------------------------------------------------- the GPU on hand
// What the code loaded for this GPU was built for: out[0] its __CUDA_ARCH__ (800, 900, ...), out[1] 1 where it
// is the sm_90a build, the only one whose wgmma kernels run (the others trap).
__global__ void k_built_for(int* out) {
#ifdef __CUDA_ARCH__
    out[0] = __CUDA_ARCH__;
#endif
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    out[1] = 1;
#else
    out[1] = 0;
#endif
}

struct Gpu {
    cudaDeviceProp prop;
    int arch = 0;        // __CUDA_ARCH__ of the code that runs here: 800 and on have cp.async and mma.sync TF32
    bool wgmma = false;  // the sm_90a code runs here
};

inline Gpu setup_main() {
    Gpu gpu;
    cudaCheck(cudaSetDevice(0));
    cudaCheck(cudaGetDeviceProperties(&gpu.prop, 0));
    int* d;
    int h[2] = {0, 0};
    cudaCheck(cudaMalloc(&d, sizeof(h)));
    k_built_for<<<1, 1>>>(d);
    cudaError_t launched = cudaGetLastError();
    if (launched == cudaErrorNoKernelImageForDevice) {
        printf("%s (sm_%d%d): this build has no code for it (make GENCODE=...)\n", gpu.prop.name, gpu.prop.major,
               gpu.prop.minor);
        exit(EXIT_FAILURE);
    }
    cudaCheck(launched);
    cudaCheck(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
    cudaCheck(cudaFree(d));
    gpu.arch = h[0];
    gpu.wgmma = h[1] == 1;
    printf("%s: %d SMs, code built for sm_%d%s\n", gpu.prop.name, gpu.prop.multiProcessorCount, gpu.arch / 10,
           gpu.wgmma ? "a" : "");
    return gpu;
}

// Whether a version runs here; if not, says why and that it is skipped.
inline bool runs_here(const char* name, bool ok, const char* needs) {
    if (!ok) printf("%s: skipped, it needs %s\n", name, needs);
    return ok;
}

// The command line: [direction] [version], each optional; 0 for every version.
inline int version_arg(int argc, char** argv, int at) { return argc > at ? atoi(argv[at]) : 0; }

// ---------------------------------------------------------------------------------------------- inputs
// n floats uniform in [lo, hi), from a fixed seed: every run draws the same inputs.
inline std::vector<float> make_random_float(size_t n, float lo = -1.0f, float hi = 1.0f) {
    static uint64_t state = 0x853c49e6748fea9bull;
    std::vector<float> v(n);
    for (float& x : v) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x = lo + (hi - lo) * (float)((state >> 40) * 0x1p-24);
    }
    return v;
}

inline float* to_device(const std::vector<float>& h) {
    float* d;
    cudaCheck(cudaMalloc(&d, h.size() * sizeof(float)));
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

inline std::vector<float> to_host(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// n floats set to NaN: an output a kernel leaves unwritten fails the check
inline void poison(float* d, size_t n) { cudaCheck(cudaMemset(d, 0xff, n * sizeof(float))); }

inline float* device_nan(size_t n) {
    float* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(float)));
    poison(d, n);
    return d;
}

inline std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// ---------------------------------------------------------------------------------------------- checks, times
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// FNV-1a of the floats' bits, printed so that two builds' outputs can be compared bit for bit
inline unsigned long long bits_hash(std::initializer_list<const std::vector<float>*> outputs) {
    unsigned long long h = 1469598103934665603ULL;
    for (const std::vector<float>* v : outputs)
        for (const float f : *v) {
            uint32_t u;
            memcpy(&u, &f, sizeof(u));
            h = (h ^ u) * 1099511628211ULL;
        }
    return h;
}

// The n floats at d_out against the CPU's reference: every element within tol * (1 + |ref|), none NaN. Prints the
// norm-wise error ||out - ref|| / ||ref||, the project's measure of accuracy; exits at the first output that fails.
inline void validate_result(const float* d_out, const double* ref, const char* name, size_t n, double tol) {
    std::vector<float> out(n);
    cudaCheck(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
    double err2 = 0.0, ref2 = 0.0;
    int faults = 0;
    for (size_t i = 0; i < n; i++) {
        const double diff = std::fabs(out[i] - ref[i]);
        err2 += diff * diff;
        ref2 += ref[i] * ref[i];
        if (!(diff <= tol * (1.0 + std::fabs(ref[i])))) {  // NaN fails too
            if (faults < 5) printf("  %s[%zu]: %.9g, the CPU %.9g\n", name, i, out[i], ref[i]);
            faults++;
        }
    }
    printf("  %-6s error %.2e%s\n", name, std::sqrt(err2 / std::max(ref2, 1e-300)),
           faults ? "" : " (every element within tolerance)");
    if (faults) {
        printf("  %s: %d of %zu elements off by more than %.0e (1 + |ref|)\n", name, faults, n, tol);
        exit(EXIT_FAILURE);
    }
}

// The mean time in ms of `repeats` calls of launch() (one or a few kernel launches) after one unmeasured call,
// each call after a write of twice the L2, so that it finds none of its inputs there. The write also keeps the
// GPU busy while the host queues the start event and the launches, whose host time is then not counted.
template <class Launch>
float benchmark_kernel(int repeats, Launch launch) {
    int l2 = 0;
    cudaCheck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    const size_t flush_bytes = 2 * (size_t)std::max(l2, 1);
    void* flush;
    cudaCheck(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    launch();
    float total = 0.0f;
    for (int i = 0; i < repeats; i++) {
        cudaCheck(cudaMemsetAsync(flush, i & 0xff, flush_bytes));
        cudaCheck(cudaEventRecord(start));
        launch();
        cudaCheck(cudaEventRecord(stop));
        cudaCheck(cudaEventSynchronize(stop));
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, start, stop));
        total += ms;
    }
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaFree(flush));
    return total / repeats;
}

// The mean time in us of one replay of the launches record(s) queues on a stream s, captured once as a graph: a
// decode step as the engine replays it, launch gaps included, after one unmeasured replay.
template <class Record>
float graph_us(Record record) {
    cudaStream_t s;
    cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaCheck(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    record(s);
    cudaCheck(cudaStreamEndCapture(s, &graph));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    const int repeats = 50;
    cudaCheck(cudaGraphLaunch(exec, s));
    cudaCheck(cudaEventRecord(start, s));
    for (int i = 0; i < repeats; i++) cudaCheck(cudaGraphLaunch(exec, s));
    cudaCheck(cudaEventRecord(stop, s));
    cudaCheck(cudaEventSynchronize(stop));
    float ms;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaGraphDestroy(graph));
    cudaCheck(cudaStreamDestroy(s));
    return 1000.0f * ms / repeats;
}
