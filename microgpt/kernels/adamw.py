"""Launchers of cuda/adamw.cuh: the global gradient norm (for clipping) and the AdamW step."""
from __future__ import annotations

import math

import numpy as np

from .checks import opt_ptr, ptr, shape_of
from .runtime import blocks, launch, persistent_alloc, zero

NORM_GRID = 1024  # blocks of the norm reduction: fixed, as its order of additions is


def global_norm(sumsq, g, *, accumulate=False, stream=None):
    """sumsq (1,) float64 (+)= sum of g**2; zeroed first unless accumulate. Deterministic. Calls on
    several streams at once would share the kernel's scratch: keep them on one stream."""
    shape = shape_of("g", g)
    n = math.prod(shape)
    p = ptr("sumsq", sumsq, (1,), np.float64)
    partials = persistent_alloc("norm_partials", NORM_GRID * 8, stream)  # the blocks' partial sums
    if not accumulate:
        zero(p, 2, stream, why="sumsq = 0")
    launch("k_global_norm", [p, int(partials), ptr("g", g, shape), n], min(NORM_GRID, blocks(n)), stream)


def adamw(params, grads, m, v, *, lr, beta1, beta2, eps, weight_decay, step, decay_mask=None, sumsq=None,
          max_norm=None, stream=None):
    """One AdamW step (t = step, 1-based) over a parameter tensor; weight decay where decay_mask (uint8,
    the shape of params) is nonzero, everywhere without one; with sumsq (the global sum of squared
    gradients) and max_norm, the gradient is clipped first and the clipped value written back."""
    shape = shape_of("params", params)
    n = math.prod(shape)
    if not (isinstance(step, (int, np.integer)) and step >= 1):
        raise ValueError(f"step must be an int >= 1, got {step!r}")
    if (sumsq is None) != (max_norm is None):
        raise ValueError("sumsq and max_norm go together: give both to clip, neither not to")
    if max_norm is not None and not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    args = [ptr("params", params, shape), ptr("grads", grads, shape), ptr("m", m, shape), ptr("v", v, shape), n,
            float(lr), float(beta1), float(beta2), float(eps), float(weight_decay),
            opt_ptr("decay_mask", decay_mask, shape, np.uint8), float(1.0 - beta1 ** step), float(1.0 - beta2 ** step),
            opt_ptr("sumsq", sumsq, (1,), np.float64), float(max_norm or 0.0)]
    launch("k_adamw", args, blocks(math.ceil(n / 4)), stream)  # four parameters a thread
