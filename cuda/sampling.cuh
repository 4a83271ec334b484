// Choosing the next token on the GPU: k_sample applies microgpt/sampling.py's choose() (greedy, temperature,
// top-k, top-p, then the first token whose cumulative probability passes u * the total) to one row of logits per
// block. Every step after reading a logit is in double, as on the host, and every rule is order-free (decided by
// comparisons of sums, never by a sort's order), so kernel and host choose the same token unless a draw lands
// within rounding of a boundary. Top-k and top-p are thresholds on the logits, found without sorting by a radix
// search over an order-preserving 32-bit key of each logit (order_key), four bits per pass.
#pragma once
#include "common.cuh"
#include "rows_fast.cuh"  // warp_min, warp_max

// One block per row, SAMPLE_THREADS threads: the rows are few (one new token per sequence), so a row's work is
// spread wide. 512, not 1024: a thread needs more than the 64 registers a 1024-thread block allows (its 16
// buckets are doubles, as is the exp). Read by microgpt/kernels/sampling.py.
enum SampleLaunch : int {
    SAMPLE_THREADS = 512,
    SAMPLE_BUCKETS = 16,    // candidate thresholds per pass: 4 bits of the key
    SAMPLE_IN_FLIGHT = 8,   // loads of the row a thread has in flight in the first pass
};
constexpr int SAMPLE_WARPS = SAMPLE_THREADS / 32;
constexpr int SAMPLE_BITS = 4;  // log2(SAMPLE_BUCKETS)
static_assert(SAMPLE_WARPS <= 32, "the scans and reductions give each warp of the block a lane of one warp");

// The unsigned order of the keys is the order of the floats (the negative ones flipped below the positive
// ones). -0.0 becomes +0.0 first: the host compares them equal, so they must tie here too.
__device__ __forceinline__ unsigned order_key(float f) {
    if (f == 0.0f) f = 0.0f;
    unsigned bits = __float_as_uint(f);
    return bits >= 0x80000000u ? ~bits : bits | 0x80000000u;
}

// A token's weight before normalising, p * (the total): exp(z) with z = (l - max) / temperature, as choose()
// computes it (max z is 0, so its exp(z - max z) is this).
__device__ __forceinline__ double unnormalised(float l, double m, double temperature) {
    return exp(((double)l - m) / temperature);
}

// ------------------------------------------------------------------------------ fixed-order block reductions
// the larger of two (logit, index) pairs; of equal logits the smaller index (numpy's argmax takes the first)
__device__ __forceinline__ void argmax_pair(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

struct SampleShared {
    double part[SAMPLE_WARPS][SAMPLE_BUCKETS];  // each warp's bucket sums
    double bucket[SAMPLE_BUCKETS];             // the block's
    double warp_total[SAMPLE_WARPS];           // the draw's scan: each warp's total, then its offset
    float max_value[SAMPLE_WARPS];
    int max_index[SAMPLE_WARPS];
    int first[SAMPLE_WARPS];
    unsigned key_lo[SAMPLE_WARPS], key_hi[SAMPLE_WARPS];  // a search pass's range of keys: each warp's
    unsigned key_range[2];                                 // ... the block's
};

// The block's largest logit and its first index; every thread gets them.
__device__ void block_argmax(float& v, int& i, SampleShared& sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int off = 16; off > 0; off >>= 1)
        argmax_pair(v, i, __shfl_xor_sync(0xffffffff, v, off), __shfl_xor_sync(0xffffffff, i, off));
    if (lane == 0) sh.max_value[warp] = v, sh.max_index[warp] = i;
    __syncthreads();
    v = sh.max_value[0], i = sh.max_index[0];
    for (int w = 1; w < SAMPLE_WARPS; w++) argmax_pair(v, i, sh.max_value[w], sh.max_index[w]);
}

// One halving of block_sum_buckets: lanes whose bit 2 HALF is set keep buckets [HALF, 2 HALF) of those they hold,
// the others [0, HALF), each adding the half its partner (lane ^ 2 HALF) gives away; the kept ones move to [0, HALF).
template <int HALF>
__device__ __forceinline__ void halve_buckets(double (&acc)[SAMPLE_BUCKETS], int lane) {
    const bool upper = lane & (2 * HALF);
#pragma unroll
    for (int j = 0; j < HALF; j++) {
        const double low = acc[j], high = acc[j + HALF];
        acc[j] = (upper ? high : low) + __shfl_xor_sync(0xffffffff, upper ? low : high, 2 * HALF);
    }
}

// The block's sums of each thread's 16 buckets, and the smallest and largest of the threads' key_lo and key_hi;
// every thread gets them. Each warp first reduces and scatters the buckets: four halvings (lane bits 16, 8, 4, 2)
// leave lanes 2b and 2b + 1 with bucket b over their 16 lanes, and one shuffle with lane ^ 1 adds the two (16
// shuffles of a double, those of a halving independent of one another, not a tree of 5 for each bucket). Then the
// warps' sums in warp order. A fixed order every run.
__device__ void block_sum_buckets(double (&acc)[SAMPLE_BUCKETS], unsigned& key_lo, unsigned& key_hi,
                                  SampleShared& sh) {
    static_assert(SAMPLE_BUCKETS == 16, "four halvings leave a lane pair one bucket");
    static_assert(SAMPLE_THREADS > 32, "warp 1 reduces the keys' range beside warp 0's buckets");
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    halve_buckets<8>(acc, lane);
    halve_buckets<4>(acc, lane);
    halve_buckets<2>(acc, lane);
    halve_buckets<1>(acc, lane);
    acc[0] += __shfl_xor_sync(0xffffffff, acc[0], 1);
    key_lo = warp_min(key_lo);
    key_hi = warp_max(key_hi);
    if (lane % 2 == 0) sh.part[warp][lane / 2] = acc[0];
    if (lane == 0) sh.key_lo[warp] = key_lo, sh.key_hi[warp] = key_hi;
    __syncthreads();
    if (threadIdx.x < SAMPLE_BUCKETS) {
        double s = 0.0;
        for (int w = 0; w < SAMPLE_WARPS; w++) s += sh.part[w][threadIdx.x];
        sh.bucket[threadIdx.x] = s;
    } else if (threadIdx.x == 32) {
        unsigned lo = sh.key_lo[0], hi = sh.key_hi[0];
        for (int w = 1; w < SAMPLE_WARPS; w++) lo = min(lo, sh.key_lo[w]), hi = max(hi, sh.key_hi[w]);
        sh.key_range[0] = lo, sh.key_range[1] = hi;
    }
    __syncthreads();  // (every thread reads bucket and key_range before the next pass's first barrier)
#pragma unroll
    for (int b = 0; b < SAMPLE_BUCKETS; b++) acc[b] = sh.bucket[b];
    key_lo = sh.key_range[0], key_hi = sh.key_range[1];
}

// The sum of the threads' values before this one, in thread order (a shuffle scan in each warp, then one over
// the warps' totals), and the block's total; the same order every run.
__device__ double block_exclusive_scan(double v, double& total, SampleShared& sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double inclusive = v;
    for (int off = 1; off < 32; off <<= 1) {
        double up = __shfl_up_sync(0xffffffff, inclusive, off);
        if (lane >= off) inclusive += up;
    }
    double exclusive = __shfl_up_sync(0xffffffff, inclusive, 1);
    if (lane == 0) exclusive = 0.0;
    if (lane == 31) sh.warp_total[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {  // the warps' offsets, scanned the same way
        double w_incl = lane < SAMPLE_WARPS ? sh.warp_total[lane] : 0.0;
        for (int off = 1; off < 32; off <<= 1) {
            double up = __shfl_up_sync(0xffffffff, w_incl, off);
            if (lane >= off) w_incl += up;
        }
        double w_excl = __shfl_up_sync(0xffffffff, w_incl, 1);
        __syncwarp();
        if (lane < SAMPLE_WARPS) sh.warp_total[lane] = lane == 0 ? 0.0 : w_excl;
        if (lane == 31) sh.bucket[0] = w_incl;  // the total (bucket is free once the searches are done)
    }
    __syncthreads();
    total = sh.bucket[0];
    return sh.warp_total[warp] + exclusive;
}

// The smallest of the threads' ints; every thread gets it.
__device__ int block_min_int(int v, SampleShared& sh) {
    v = warp_min(v);
    if (threadIdx.x % 32 == 0) sh.first[threadIdx.x / 32] = v;
    __syncthreads();
    for (int w = 0; w < SAMPLE_WARPS; w++) v = min(v, sh.first[w]);
    return v;
}

// ------------------------------------------------------------------------------ the threshold search
// What a token weighs in a search: 1 (top-k counts tokens), or its unnormalised probability if it is above
// the key `floor` (top-p's mass, over the tokens top-k kept) and 0 otherwise.
struct SearchWeight {
    bool count;
    unsigned floor;
    double m, temperature;
    __device__ double operator()(float l, unsigned key) const {
        if (count) return 1.0;
        return key > floor ? unnormalised(l, m, temperature) : 0.0;
    }
};

// The largest key t with G(t) >= target, G(t) = the weight of the tokens whose key is above t; the tokens kept
// are then those with key > t. With `relative`, target is a fraction of the whole weight, G(0). G only falls as t
// rises, so the answer lies in an interval (lo, lo + 2^32] that each pass cuts 16-fold: of the candidates
// lo + i * 2^s, the largest that reaches the target starts the next interval (s = 28, 24, ..., 0). The weight
// above the interval is carried from pass to pass, so only the tokens inside it are weighed. Where every token
// inside the interval has one key k, the passes left would end at k - 1 or below it at a key no token has (G(t) is
// the weight above the interval, below the target, for t >= k): the tokens kept are the same, and the search ends.
__device__ unsigned threshold_search(const float* row, int V, SearchWeight weight, double target, bool relative,
                                     SampleShared& sh) {
    unsigned lo = 0;
    double above = 0.0;  // G(lo + 16 * 2^s): the weight of the tokens above the interval
    for (int s = 32 - SAMPLE_BITS; s >= 0; s -= SAMPLE_BITS) {
        const unsigned long long span = (unsigned long long)SAMPLE_BUCKETS << s;
        double acc[SAMPLE_BUCKETS];
#pragma unroll
        for (int b = 0; b < SAMPLE_BUCKETS; b++) acc[b] = 0.0;
        unsigned key_lo = UINT_MAX, key_hi = 0;  // the keys inside the interval: the smallest and largest
        for (int j = threadIdx.x; j < V; j += SAMPLE_THREADS) {
            const float l = row[j];
            const unsigned key = order_key(l);
            if (key <= lo || key - lo - 1ull >= span) continue;  // below or above the interval
            key_lo = min(key_lo, key), key_hi = max(key_hi, key);
            const int b = (key - lo - 1u) >> s;
            const double w = weight(l, key);
            // a select for each bucket, not acc[b] += w: an array indexed at run time would live in local memory
#pragma unroll
            for (int i = 0; i < SAMPLE_BUCKETS; i++) acc[i] += i == b ? w : 0.0;
        }
        block_sum_buckets(acc, key_lo, key_hi, sh);
        if (key_lo == key_hi) return key_lo - 1;  // one key inside (key_lo > lo >= 0)
        if (relative && s == 32 - SAMPLE_BITS) {  // the first pass weighs every token: its total is G(0)
            double total = above;
#pragma unroll
            for (int i = SAMPLE_BUCKETS - 1; i >= 0; i--) total += acc[i];
            target *= total;
        }
        // G(candidate i) = the weight above the interval + buckets i..15, for i = 15 down to 0; bucket i holds the
        // keys in (lo + i 2^s, lo + (i+1) 2^s]. The first candidate to reach the target (or 0) is picked.
        double g = above, new_above = above;
        unsigned pick = 0;
        bool found = false;
#pragma unroll
        for (int i = SAMPLE_BUCKETS - 1; i >= 0; i--) {
            const double g_i = g + acc[i];
            if (!found && (g_i >= target || i == 0)) found = true, pick = i, new_above = g;
            g = g_i;
        }
        lo += pick << s;
        above = new_above;
    }
    return lo;
}

// ------------------------------------------------------------------------------ the kernel
__device__ __forceinline__ void sample_store(int* tokens, int* mirror, int token) {
    tokens[blockIdx.x] = token;
    if (mirror) mirror[blockIdx.x] = token;
}

// One block per row b (blockIdx.x), SAMPLE_THREADS threads: tokens[b] = choose(logits[b], temperature, top_k,
// top_p, u[b]), logits (B, V), and mirror[b] the same where mirror is not null (page-locked host memory mapped
// into the device, say, where the host reads the tokens with no copy after the kernel). top_k >= V cuts nothing,
// nor does top_p >= 1; temperature 0 takes the first largest logit and reads no u (which may then be null). The
// logits are expected free of NaN. staged: the first pass copies the row into V floats of dynamic shared memory,
// where the searches and the draw read it (each reads the whole row again); the launcher stages it where it fits
// and temperature > 0.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
k_sample(int* tokens, int* mirror, const float* logits, const double* u, int V, double temperature, int top_k,
         double top_p, int staged) {
    __shared__ SampleShared sh;
    extern __shared__ float sample_row[];
    pdl_wait();
    pdl_launch_dependents();
    const float* row = logits + (long long)blockIdx.x * V;

    // the largest logit (the greedy token, and the max that z subtracts): SAMPLE_IN_FLIGHT loads at a time
    float max_value = -INFINITY;
    int max_index = INT_MAX;
    for (int j0 = threadIdx.x; j0 < V; j0 += SAMPLE_IN_FLIGHT * SAMPLE_THREADS) {
        float l[SAMPLE_IN_FLIGHT];
#pragma unroll
        for (int i = 0; i < SAMPLE_IN_FLIGHT; i++) {
            const int j = j0 + i * SAMPLE_THREADS;
            l[i] = j < V ? row[j] : -INFINITY;
        }
#pragma unroll
        for (int i = 0; i < SAMPLE_IN_FLIGHT; i++) {
            const int j = j0 + i * SAMPLE_THREADS;
            if (j < V) {
                argmax_pair(max_value, max_index, l[i], j);
                if (staged) sample_row[j] = l[i];
            }
        }
    }
    block_argmax(max_value, max_index, sh);  // (its barrier also makes the staged row whole)
    if (staged) row = sample_row;
    if (temperature == 0.0) {
        if (threadIdx.x == 0) sample_store(tokens, mirror, max_index);
        return;
    }
    const double m = max_value;

    // top-k: the k-th largest key is the smallest kept, ties with it kept (G counts tokens: k is reached at
    // t = that key - 1). floor 0 keeps every token (no key of a float but a NaN's is 0).
    unsigned floor = 0;
    if (top_k < V) floor = threshold_search(row, V, SearchWeight{true, 0, m, temperature}, top_k, false, sh);
    // top-p: a token is kept iff the mass of the tokens strictly more likely (keys above its own) is below
    // top_p * Q, Q the mass top-k kept; max(): never keep what top-k dropped, whatever the rounding
    if (top_p < 1.0) {
        const unsigned t = threshold_search(row, V, SearchWeight{false, floor, m, temperature}, top_p, true, sh);
        floor = max(floor, t);
    }

    // the draw: the first token whose cumulative weight, in token-id order, passes u * the total. Each thread sums
    // a contiguous chunk of ids; a scan gives each chunk's start; the threads whose chunk ends past the target walk
    // it, and the smallest token found wins (a later chunk's find is never smaller than the crossing's).
    const int chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int begin = min(V, (int)threadIdx.x * chunk), end = min(V, begin + chunk);
    double mine = 0.0;
    for (int j = begin; j < end; j++) {
        const float l = row[j];
        if (order_key(l) > floor) mine += unnormalised(l, m, temperature);
    }
    double total;
    const double start = block_exclusive_scan(mine, total, sh);
    const double target = u[blockIdx.x] * total;
    int first = INT_MAX;
    if (start + mine > target) {
        double cum = start;
        for (int j = begin; j < end; j++) {
            const float l = row[j];
            if (order_key(l) <= floor) continue;
            const double q = unnormalised(l, m, temperature);
            cum += q;
            if (q > 0.0 && cum > target) {
                first = j;
                break;
            }
        }
    }
    first = block_min_int(first, sh);
    if (threadIdx.x == 0) sample_store(tokens, mirror, first == INT_MAX ? V - 1 : first);
}
