// A run of a decode step's launches as one kernel: its blocks stay resident for the whole run and take each
// launch's blocks in turn, so that a launch boundary costs a count in global memory, not a kernel's end and the
// next one's start. A step is one folded launch (k_embed_decode, k_matvec_<R> or k_attention_decode) with its own
// grid and arguments: each of its blocks runs the same device function with the same arguments as that kernel, so
// the run writes the same bits as its launches one after the other.
#pragma once
#include "decode.cuh"
#include "matvec.cuh"

enum PersistentLaunch : int {  // read by microgpt/kernels/persistent.py
    STEP_EMBED = 0,            // a step that is k_embed_decode's launch
    STEP_MATVEC = 1,           // k_matvec_<R>'s, R the kernel's
    STEP_ATTENTION = 2,        // k_attention_decode's
    STEP_SLOTS = 8,            // a step holds up to this many pointer arguments, and as many int ones
};
static_assert(DECODE_THREADS == MATVEC_THREADS, "a persistent block runs the attention's blocks and k_matvec's");

// One folded launch: its kind, its grid (grid_x by grid_y blocks; k_embed_decode's counted in blocks of
// MATVEC_THREADS), the block of the persistent grid that takes its block 0, and its kernel's arguments, the pointers
// in order in p and the ints in order in a.
struct Step {
    int kind, grid_x, grid_y, first;
    void* p[STEP_SLOTS];
    int a[STEP_SLOTS];
};
static_assert(sizeof(Step) == 112, "microgpt/kernels/persistent.py packs a Step in 112 bytes");

// Thread 0 waits until *count reaches target, and the block's later reads see what the counted blocks wrote
// before they counted (acquire at gpu scope, which also drops the SM's L1 lines, then the block's barrier).
__device__ __forceinline__ void step_wait(const unsigned* count, unsigned target) {
    if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        unsigned seen;
        while (true) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            if (seen >= target) break;
            __nanosleep(32);
        }
#else
        while (*(volatile const unsigned*)count < target) {}
        __threadfence();
#endif
    }
    __syncthreads();
}

// Once every thread of the block is done with its block of a step: one more in *count (release at gpu scope, what
// the block wrote before it).
__device__ __forceinline__ void step_count(unsigned* count) {
    __syncthreads();
    if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
#else
        __threadfence();
        atomicAdd(count, 1u);
#endif
    }
}

// Block i of the launch takes blocks v = i - first (mod gridDim.x), v + gridDim.x, ... of each step in turn: with
// `first` after the blocks of the step before, consecutive steps fall to different blocks, which copy their next
// step's weights while the step before runs. Its first block of step s waits (before its reads of what earlier steps
// write, after its staged reads of what they do not: weights, cached rows) until count[s - 1] holds every block of
// step s - 1; every block counts itself in count[s] when done, and every step has a block that waited (a chunk at or
// before p, or each block), so that count[s] full means every step before s is done. count: n + 1 zeros; the last
// block to finish counts itself in count[n] and sets them all back to zero for the next launch. Every block must be
// resident at once (the launcher sizes the grid so, and launches it cooperatively).
template <int ROWS>
__device__ void persistent_steps(const Step* steps, int n, unsigned* count) {
    for (int s = 0; s < n; s++) {
        const Step& st = steps[s];
        const int kind = st.kind, gx = st.grid_x, blocks = st.grid_x * st.grid_y;
        const unsigned before = s > 0 ? (unsigned)(steps[s - 1].grid_x * steps[s - 1].grid_y) : 0u;
        bool waited = s == 0;
        auto wait = [&] {
            if (!waited) step_wait(count + s - 1, before);
            waited = true;
        };
        float* const* p = reinterpret_cast<float* const*>(st.p);
        const int* a = st.a;
        for (int v = (blockIdx.x + gridDim.x - st.first) % gridDim.x; v < blocks; v += gridDim.x) {
            if (kind == STEP_MATVEC) {  // (out, inp, W, bias, ln_w, ln_b, resid; M, K, N, gelu, cols, parts, vec4)
                if (a[6])
                    matvec_block<ROWS, float4>(p[0], p[1], p[2], p[3], p[4], p[5], p[6], a[0], a[1], a[2], a[3], a[4],
                                               a[5], v, wait);
                else
                    matvec_block<ROWS, float>(p[0], p[1], p[2], p[3], p[4], p[5], p[6], a[0], a[1], a[2], a[3], a[4],
                                              a[5], v, wait);
            } else if (kind == STEP_ATTENTION) {  // (y, partial, done, k_cache, v_cache, qkv, pos; NH, d_k, T_max,
                                                  // vec4)
                const int pos = *reinterpret_cast<const int*>(p[6]), chunk = v % gx, bh = v / gx;
                unsigned* done = reinterpret_cast<unsigned*>(p[2]);
                if (pos < 0 || pos >= a[2]) wait();  // no chunk to wait: each block waits
                else if (chunk * DECODE_CHUNK <= pos) {
                    if (a[3])
                        attention_decode_chunk<float4>(p[0], p[1], done, p[3], p[4], p[5], pos, a[0], a[1], a[2],
                                                       chunk, bh, gx, wait);
                    else
                        attention_decode_chunk<float>(p[0], p[1], done, p[3], p[4], p[5], pos, a[0], a[1], a[2],
                                                      chunk, bh, gx, wait);
                }
            } else {  // STEP_EMBED (x, tokens, wte, wpe, pos; B, C)
                wait();
                embed_decode_at((long long)v * MATVEC_THREADS + threadIdx.x, p[0], reinterpret_cast<const int*>(p[1]),
                                p[2], p[3], reinterpret_cast<const int*>(p[4]), a[0], a[1]);
            }
            step_count(count + s);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(count + n, 1u) == gridDim.x - 1) {  // every block is past its last wait
            for (int s = 0; s <= n; s++) count[s] = 0;
            __threadfence();
        }
    }
}

// Grid: as many blocks of MATVEC_THREADS as are resident at once (or fewer); dynamic shared memory: the most any
// folded launch takes. steps: n Steps in device memory, whose k_matvec launches are all k_matvec_<R>'s; count: n + 1
// unsigned zeros, left zero.
#define PERSISTENT_KERNEL(R, MIN_BLOCKS)                                                                            \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, MIN_BLOCKS)                                        \
        k_persistent_##R(const Step* steps, int n, unsigned* count) {                                               \
        persistent_steps<R>(steps, n, count);                                                                       \
    }
PERSISTENT_KERNEL(1, 4)  // MIN_BLOCKS: a step's shared memory (a k_matvec chunk of W, 48 KB) leaves room for 4 an SM
PERSISTENT_KERNEL(2, 4)
PERSISTENT_KERNEL(4, 4)
PERSISTENT_KERNEL(8, 4)
