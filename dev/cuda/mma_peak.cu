// The ceiling of mma.sync m16n8k8 TF32 on this GPU: each warp runs 8 independent accumulation chains on
// register operands, nothing loaded. dev/matmul_tc.py reports it beside the kernels it measures.
#include <cstdint>

extern "C" __global__ void k_mma_tf32_peak(float* out, int iters) {
    uint32_t a[4], b[2];
    for (int r = 0; r < 4; r++) a[r] = __float_as_uint(1.0f + threadIdx.x * 1e-3f + r);
    for (int r = 0; r < 2; r++) b[r] = __float_as_uint(1.0f - threadIdx.x * 1e-3f + r);
    float d[8][4] = {};
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int c = 0; c < 8; c++)
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                         "{%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
    for (int c = 0; c < 8; c++)
        for (int r = 0; r < 4; r++) s += d[c][r];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
