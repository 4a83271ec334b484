"""Launcher of cuda/sampling.cuh: the next token of each row of logits, chosen on the GPU by the host's rule.

    u = microgpt.sampling.draw(rng, B, temperature)             # float64 (B,), None at temperature 0
    K.sample(tokens, logits, None if u is None else ga.to_gpu(u), temperature, top_k, top_p)
    # tokens (B,) int32 now holds microgpt.sampling.choose(logits, temperature, top_k, top_p, u)

The kernel takes the draws from device memory, so a plan of launches recorded once can replay with fresh
draws copied into the same array. Its choice equals choose()'s on the same float32 logits and draws unless a
draw lands within rounding (about 1e-15 relative) of a boundary (microgpt/sampling.py says why).
"""
from __future__ import annotations

import functools

import numpy as np

from ..sampling import check_sampling
from .checks import opt_ptr, ptr, shape_of
from .runtime import launch, shared_limit
from .source import int_constants


@functools.cache  # (read from the preprocessed source: tens of milliseconds, once)
def threads() -> int:
    """SAMPLE_THREADS of cuda/sampling.cuh (enum SampleLaunch): the threads of k_sample's block per row."""
    return int_constants()["SAMPLE_THREADS"]


def sample(tokens, logits, u, temperature, top_k=None, top_p=None, *, mirror=None, stream=None):
    """tokens (B,) int32 = the token chosen from each row of logits (B, V) float32 with the draws u (B,)
    float64 in [0, 1), as microgpt.sampling.choose() chooses it: temperature 0 takes each row's first largest
    logit (u may then be None, and is not read); top_k None cuts nothing, nor does top_p None. mirror (B,) int32,
    if given, gets the tokens too: page-locked host memory mapped into the device (an engine's mapped_empty, a
    runtime.Mapped), where the host reads them once the launch is done, with no copy."""
    B, V = shape_of("logits", logits, 2)
    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p, V)
    if u is None and temperature > 0:
        raise ValueError(f"u must be a float64 device array of shape ({B},) (draws in [0, 1)) where "
                         f"temperature > 0; None only at temperature 0")
    # the searches and the draw read the row again: from shared memory, where it fits (greedy reads it once)
    staged = temperature > 0 and 4 * V <= shared_limit("k_sample", stream)
    args = [ptr("tokens", tokens, (B,), np.int32), opt_ptr("mirror", mirror, (B,), np.int32),
            ptr("logits", logits, (B, V)), opt_ptr("u", u, (B,), np.float64), V, temperature,
            V if top_k is None else top_k, 1.0 if top_p is None else top_p, int(staged)]
    launch("k_sample", args, B, stream, block=threads(), shared=4 * V if staged else 0, dependent=True,
           why="the row staged in shared memory" if staged else "")
