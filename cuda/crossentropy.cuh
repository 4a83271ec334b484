// Fused softmax cross-entropy over the vocabulary: per-position losses and the probabilities backward needs.
// Each (N, V) array takes its rows' pitch (ld*, in floats, >= V): its rows may be padded.
#pragma once
#include "common.cuh"

// one thread per position (row of logits (N, V)): loss = logsumexp(logits) - logits[target]
extern "C" __global__ void k_crossentropy_fwd(float* losses, float* probs, const float* logits,
                                              const int* targets, int N, int V, int ldp, int ldl) {
    long long n = thread_index();
    if (n >= N) return;
    const float* lr = logits + n * ldl;
    float m = lr[0];
    for (int v = 1; v < V; v++) m = fmaxf(m, lr[v]);
    float sum = 0.0f;
    for (int v = 0; v < V; v++) sum += expf(lr[v] - m);
    float* pr = probs + n * ldp;
    for (int v = 0; v < V; v++) pr[v] = expf(lr[v] - m) / sum;
    losses[n] = logf(sum) + m - lr[targets[n]];
}

// one thread per logit: dlogits = (probs - onehot(target)) * dlosses[n]
extern "C" __global__ void k_crossentropy_bwd(float* dlogits, const float* probs, const int* targets,
                                              const float* dlosses, int N, int V, int ldd, int ldp) {
    long long i = thread_index();
    if (i >= (long long)N * V) return;
    long long n = i / V;
    int v = i % V;
    dlogits[n * ldd + v] = (probs[n * ldp + v] - (v == targets[n] ? 1.0f : 0.0f)) * dlosses[n];
}
