// Fast embedding backward: k_embed_bwd's contract and order of additions, element for element (so its bits).
// Each warp covers a span of EB_COLS columns, four per lane: one 16-byte chunk where C % 4 == 0 and the arrays
// are 16-byte aligned, else four floats 32 apart. One launch holds two parts, the token part's blocks first:
// - dwte: one warp per (window of EB_WINDOW sorted slots of `order`, column span) adds each run of one token that
//   starts in its window, in order from 0, into the token's row; a run belongs to one warp, so no atomics.
// - dwpe: one warp per (position t < T, column span) sums dx[b, t] over b in order and adds that into dwpe[t].
#pragma once
#include "rows_fast.cuh"  // load_vec, store_vec, rows_vec4

// Mirrored in microgpt/kernels/embed_fast.py (the grid).
enum EmbedBwdLaunch : int {
    EB_WINDOW = 32,  // sorted slots per warp of the token part (it owns the runs that start among them)
    EB_COLS = 128,   // columns per warp, four per lane
    EB_UNROLL = 8,   // rows of dx each lane has in flight
};

// The lane's four columns of the span from cs: one 16-byte chunk (VEC 4), or four floats 32 apart (VEC 1);
// those at or past C are neither read nor written.
template <int VEC>
__device__ __forceinline__ void load_quad(float (&v)[4], const float* row, int cs, int C) {
    const int lane = threadIdx.x % 32;
    if constexpr (VEC == 4) {
        if (cs + 4 * lane < C) load_vec<4>(v, row + cs + 4 * lane);  // C % 4 == 0: the whole chunk is there
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (cs + lane + 32 * e < C) v[e] = row[cs + lane + 32 * e];
    }
}

template <int VEC>
__device__ __forceinline__ void store_quad(float* row, const float (&v)[4], int cs, int C) {
    const int lane = threadIdx.x % 32;
    if constexpr (VEC == 4) {
        if (cs + 4 * lane < C) store_vec<4>(row + cs + 4 * lane, v);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (cs + lane + 32 * e < C) row[cs + lane + 32 * e] = v[e];
    }
}

// Adds slots [lo, hi) of the window (lane j holds slot j's position p and token tok; bit j of ends: slot j ends
// its run) in order into the running sums s, and at each run's end s into the token's row of dwte, then s = 0.
// lo and hi must be the same in every lane (the shuffles need the whole warp).
template <int VEC>
__device__ __forceinline__ void add_slots(float* dwte, const float* dx, int p, int tok, unsigned ends, int lo,
                                          int hi, float (&s)[4], int C, int cs) {
    for (int j0 = lo; j0 < hi;) {
        // inside a run (no end among the next 2 * EB_UNROLL slots): twice as many loads per batch; j0 <= 16
        if (hi - j0 >= 2 * EB_UNROLL && ((ends >> j0) & ((1u << 2 * EB_UNROLL) - 1)) == 0) {
            float v[2 * EB_UNROLL][4] = {};
#pragma unroll
            for (int u = 0; u < 2 * EB_UNROLL; u++)
                load_quad<VEC>(v[u], dx + (long long)__shfl_sync(0xffffffff, p, j0 + u) * C, cs, C);
#pragma unroll
            for (int u = 0; u < 2 * EB_UNROLL; u++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[e] += v[u][e];
            j0 += 2 * EB_UNROLL;
            continue;
        }
        float v[EB_UNROLL][4] = {}, d[EB_UNROLL][4] = {};
        int row[EB_UNROLL];
#pragma unroll
        for (int u = 0; u < EB_UNROLL; u++) {
            const int j = j0 + u;
            const int pj = __shfl_sync(0xffffffff, p, j % 32);
            row[u] = __shfl_sync(0xffffffff, tok, j % 32);
            if (j < hi) {
                load_quad<VEC>(v[u], dx + (long long)pj * C, cs, C);
                if ((ends >> j) & 1) load_quad<VEC>(d[u], dwte + (long long)row[u] * C, cs, C);
            }
        }
#pragma unroll
        for (int u = 0; u < EB_UNROLL; u++) {
            const int j = j0 + u;
            if (j < hi) {
#pragma unroll
                for (int e = 0; e < 4; e++) s[e] += v[u][e];
                if ((ends >> j) & 1) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        d[u][e] += s[e];
                        s[e] = 0.0f;
                    }
                    store_quad<VEC>(dwte + (long long)row[u] * C, d[u], cs, C);
                }
            }
        }
        j0 += EB_UNROLL;
    }
}

// The runs that start among sorted slots [k0, k0 + 32), columns [cs, cs + 128); a run that goes past the window
// is followed into the next ones. Token -1 stands for "no slot" (before the first, after the last).
template <int VEC>
__device__ __forceinline__ void token_runs(float* dwte, const float* dx, const int* idx, const int* order,
                                           long long N, int C, long long k0, int cs) {
    const int lane = threadIdx.x % 32;
    long long k = k0 + lane;
    int p = k < N ? order[k] : 0;
    const int before = k0 > 0 ? idx[order[k0 - 1]] : -1;
    int next = k0 + 32 < N ? idx[order[k0 + 32]] : -1;  // the token after the window (all three loads at once)
    int tok = k < N ? idx[p] : -1;
    int prev = __shfl_up_sync(0xffffffff, tok, 1);
    if (lane == 0) prev = before;
    const unsigned starts = __ballot_sync(0xffffffff, k < N && tok != prev);
    if (starts == 0) return;  // every slot goes on with a run begun before the window: its warp adds it
    int lo = __ffs(starts) - 1;
    bool carried = false;  // a window past the first: only the run carried into it is ours
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    while (true) {
        int after = __shfl_down_sync(0xffffffff, tok, 1);
        if (lane == 31) after = next;
        const unsigned ends = __ballot_sync(0xffffffff, k < N && tok != after);
        int hi = (int)min(32LL, N - k0);
        if (carried && ends) hi = min(hi, __ffs(ends));  // up to the end of the carried run
        const bool goes_on = !((ends >> (hi - 1)) & 1);  // the last slot added does not end its run
        int p_next = 0, after_next = -1;  // the next window's positions, asked for before this window's rows
        if (goes_on) {
            p_next = k + 32 < N ? order[k + 32] : 0;
            after_next = k0 + 64 < N ? order[k0 + 64] : -1;
        }
        add_slots<VEC>(dwte, dx, p, tok, ends, lo, hi, s, C, cs);
        if (!goes_on) return;
        k0 += 32;  // the last run goes on into the next window
        k = k0 + lane;
        p = p_next;
        next = after_next >= 0 ? idx[after_next] : -1;
        tok = k < N ? idx[p] : -1;
        lo = 0;
        carried = true;
    }
}

// dwpe[t] += sum over b, in order from 0, of dx[b, t]: columns [cs, cs + 128).
template <int VEC>
__device__ __forceinline__ void position_sums(float* dwpe, const float* dx, int B, int T, int C, int t, int cs) {
    float* out = dwpe + (long long)t * C;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4] = {};
    load_quad<VEC>(d, out, cs, C);
    for (int b0 = 0; b0 < B; b0 += EB_UNROLL) {
        float v[EB_UNROLL][4] = {};
#pragma unroll
        for (int u = 0; u < EB_UNROLL; u++)
            if (b0 + u < B) load_quad<VEC>(v[u], dx + ((long long)(b0 + u) * T + t) * C, cs, C);
#pragma unroll
        for (int u = 0; u < EB_UNROLL; u++)
            if (b0 + u < B)
#pragma unroll
                for (int e = 0; e < 4; e++) s[e] += v[u][e];
    }
#pragma unroll
    for (int e = 0; e < 4; e++) d[e] += s[e];
    store_quad<VEC>(out, d, cs, C);
}

// Grid: ceil(ceil(N / EB_WINDOW) * S / W) blocks of the token part, then ceil(T * S / W) of the position part;
// S = ceil(C / EB_COLS) column spans, W warps per block, N = B * T. Each part takes its 16-byte path where
// C % 4 == 0 and its two arrays are 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256, 2)
    k_embed_bwd_fast(float* dwte, float* dwpe, const float* dx, const int* idx, const int* order, int B, int T,
                     int C) {
    const long long N = (long long)B * T;
    const int spans = (C + EB_COLS - 1) / EB_COLS, warps = blockDim.x / 32;
    const long long token_warps = (N + EB_WINDOW - 1) / EB_WINDOW * spans;
    const long long token_blocks = (token_warps + warps - 1) / warps;
    if (blockIdx.x < token_blocks) {
        const long long w = (long long)blockIdx.x * warps + threadIdx.x / 32;
        if (w >= token_warps) return;  // the whole warp leaves together
        const long long k0 = w / spans * EB_WINDOW;
        const int cs = (int)(w % spans) * EB_COLS;
        if (rows_vec4(C, dwte, dx))
            token_runs<4>(dwte, dx, idx, order, N, C, k0, cs);
        else
            token_runs<1>(dwte, dx, idx, order, N, C, k0, cs);
    } else {
        const long long w = (blockIdx.x - token_blocks) * warps + threadIdx.x / 32;
        if (w >= (long long)T * spans) return;
        const int t = (int)(w / spans), cs = (int)(w % spans) * EB_COLS;
        if (rows_vec4(C, dwpe, dx))
            position_sums<4>(dwpe, dx, B, T, C, t, cs);
        else
            position_sums<1>(dwpe, dx, B, T, C, t, cs);
    }
}
