"""The launch layer: cuda/microgpt_cuda.cu compiled once through PyCUDA, one checked function per kernel.

    import pycuda.gpuarray as ga
    from microgpt import kernels as K
    x = ga.to_gpu(np.random.randn(8, 1024, 768).astype(np.float32))
    out = ga.empty_like(x); mean = ga.empty((8, 1024), np.float32); rstd = ga.empty_like(mean)
    K.layernorm_fwd(out, mean, rstd, x, w, b)

Every function takes its arguments in the kernel's order (outputs first), checks each one (a device
array: pycuda GPUArray or anything with __cuda_array_interface__, such as PyTorch and CuPy tensors; its
dtype, its shape against the others, C-contiguity, token ids inside the vocabulary) and raises
TypeError/ValueError naming the argument before anything is launched. A CUDA error becomes a KernelError
naming the kernel. Without `stream` a call is synchronous; with a stream it is queued on it, and an error
surfaces at the stream's next synchronisation (set MICROGPT_SYNC=1 to synchronise after every launch).

The module is compiled once per (source, options, device architecture): PyCUDA's compiler cache keys on
the preprocessed source, so an edit to any header recompiles. Everything runs in the device's primary
context, the one PyTorch and CuPy use, so their arrays can be passed straight in.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

BLOCK = 256
NVCC_OPTIONS = ["-lineinfo"]  # line numbers for compute-sanitizer and ncu; no effect on the code
SYNC_EVERY_LAUNCH = os.environ.get("MICROGPT_SYNC", "0") not in ("", "0")


class KernelError(RuntimeError):
    """A CUDA error raised by (or surfacing after) a named kernel's launch."""


def cuda_source_dir() -> Path:
    """cuda/ beside the package in a checkout; the copy inside the package in an installed wheel."""
    override = os.environ.get("MICROGPT_CUDA_DIR")
    candidates = [Path(override)] if override else []
    here = Path(__file__).resolve().parent
    candidates += [here.parent / "cuda", here / "cuda"]
    for c in candidates:
        if (c / "microgpt_cuda.cu").is_file():
            return c
    raise FileNotFoundError(f"microgpt_cuda.cu not found in {', '.join(map(str, candidates))}")


def kernel_signatures(source: str) -> dict[str, str]:
    """name -> PyCUDA argument format ('P' pointer, 'i' int, 'q' long long, 'f' float) of every
    extern "C" kernel, read from the source so the two cannot drift apart."""
    sigs = {}
    for name, params in re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)', source):
        fmt = ""
        for p in (p.strip() for p in params.split(",")):
            if "*" in p:
                fmt += "P"
            elif p.startswith("long long"):
                fmt += "q"
            elif p.startswith("int"):
                fmt += "i"
            elif p.startswith("float"):
                fmt += "f"
            else:
                raise ValueError(f"{name}: cannot map parameter {p!r}")
        sigs[name] = fmt
    return sigs


def full_source() -> str:
    """The translation unit with its headers, as the compiler sees them (for the signature table)."""
    d = cuda_source_dir()
    return "\n".join((d / f).read_text() for f in sorted(os.listdir(d)) if f.endswith((".cu", ".cuh")))


# -------------------------------------------------------------------------------------------- module
class _Engine:
    """The compiled module in the primary context, with each kernel prepared once."""

    def __init__(self):
        import pycuda.autoprimaryctx  # noqa: F401  (retains and pushes the device's primary context)
        import pycuda.driver as cuda
        from pycuda.compiler import SourceModule

        self.cuda = cuda
        self.device = cuda.Context.get_device()
        self.arch = "sm_%d%d" % self.device.compute_capability()
        src_dir = cuda_source_dir()
        source = (src_dir / "microgpt_cuda.cu").read_text()
        self.module = SourceModule(source, options=list(NVCC_OPTIONS), arch=self.arch, no_extern_c=True,
                                   include_dirs=[str(src_dir)])
        self.signatures = kernel_signatures(full_source())
        self.functions = {}
        self.sm_count = self.device.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)

    def function(self, name):
        fn = self.functions.get(name)
        if fn is None:
            fn = self.module.get_function(name)
            fn.prepare(self.signatures[name])
            self.functions[name] = fn
        return fn


_engine = None


def engine() -> _Engine:
    global _engine
    if _engine is None:
        _engine = _Engine()
    return _engine


def device_summary() -> str:
    """'NVIDIA H200 (sm_90, 132 SMs)'; raises where PyCUDA or a CUDA device is missing."""
    e = engine()
    attr = e.cuda.device_attribute
    return f"{e.device.name()} ({e.arch}, {e.device.get_attribute(attr.MULTIPROCESSOR_COUNT)} SMs)"


def kernel_names() -> list[str]:
    return sorted(kernel_signatures(full_source()))


class Plan(list):
    """Launches recorded with their checked arguments, to be replayed on a stream (see recording()).
    `keep` holds the scratch buffers the launches point into, alive as long as the plan."""

    def __init__(self):
        super().__init__()
        self.keep = []


_recording: Plan | None = None


class recording:
    """Within `with recording() as plan:` the launch functions check their arguments and append each
    launch to `plan` instead of running it; replay(plan, stream) then runs them all, unchecked. A model's
    forward and backward are fixed sequences per (B, T): checking once is enough."""

    def __enter__(self) -> Plan:
        global _recording
        if _recording is not None:
            raise RuntimeError("recording() does not nest")
        _recording = Plan()
        return _recording

    def __exit__(self, *exc):
        global _recording
        _recording = None
        return False


def replay(plan: Plan, stream, phase: str) -> None:
    cuda = engine().cuda
    for name, fn, grid, args in plan:
        try:
            fn.prepared_async_call(grid, (BLOCK, 1, 1), stream, *args)
            if SYNC_EVERY_LAUNCH:
                stream.synchronize()
        except cuda.Error as err:
            raise KernelError(f"{name} failed in the {phase} pass: {err}") from None


def synchronize(stream, phase: str) -> None:
    """Waits for the stream; an error of an earlier asynchronous launch is named by the pass it came from."""
    cuda = engine().cuda
    try:
        stream.synchronize()
    except cuda.Error as err:
        raise KernelError(f"a kernel launched in the {phase} failed: {err} (MICROGPT_SYNC=1 names "
                          f"it)") from None


def _launch(name, n_threads, args, parts=1, stream=None, grid_x=None, grid=None):
    e = engine()
    grid = grid or (grid_x or max(1, math.ceil(n_threads / BLOCK)), parts)
    if _recording is not None:
        _recording.append((name, e.function(name), grid, args))
        return
    try:
        e.function(name).prepared_async_call(grid, (BLOCK, 1, 1), stream, *args)
        if stream is None:
            e.cuda.Context.synchronize()
        elif SYNC_EVERY_LAUNCH:
            stream.synchronize()
    except e.cuda.Error as err:
        raise KernelError(f"{name} failed: {err}") from None


# -------------------------------------------------------------------------------------------- checks
def _describe(name, a):
    """(device pointer, dtype, shape, C-contiguous) of a device array; TypeError for anything else."""
    try:
        from pycuda.gpuarray import GPUArray
    except ImportError:  # pragma: no cover - the engine needs pycuda anyway
        GPUArray = ()
    if isinstance(a, GPUArray):
        return int(a.gpudata), a.dtype, tuple(a.shape), a.flags.c_contiguous
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        dtype = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, dtype.itemsize)
        return int(cai["data"][0]), dtype, shape, contiguous
    if isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a device array, got a NumPy array (copy it with "
                        f"pycuda.gpuarray.to_gpu)")
    raise TypeError(f"{name} must be a device array (pycuda GPUArray or an object with "
                    f"__cuda_array_interface__), got {type(a).__name__}")


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def shape_of(name, a, ndim=None):
    _, _, shape, _ = _describe(name, a)
    if ndim is not None and len(shape) != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {shape}")
    if any(n == 0 for n in shape):
        raise ValueError(f"{name} must not be empty, got shape {shape}")
    return shape


def ptr(name, a, shape, dtype=np.float32):
    """The device pointer of `a` after checking its dtype, shape and contiguity."""
    p, dt, sh, contiguous = _describe(name, a)
    if dt != np.dtype(dtype):
        raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {dt.name}")
    if sh != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {sh}")
    if not contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return p


def opt_ptr(name, a, shape, dtype=np.float32):
    return 0 if a is None else ptr(name, a, shape, dtype)


def check_ids(name, a, shape, vocab_size):
    """Token ids must lie in [0, vocab_size): read back (a few KB) and checked before any launch."""
    p = ptr(name, a, shape, np.int32)
    host = np.empty(shape, dtype=np.int32)
    engine().cuda.memcpy_dtoh(host, p)
    lo, hi = int(host.min()), int(host.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name} holds token id {lo if lo < 0 else hi}, outside [0, {vocab_size})")
    return p


def _rows(shape):
    """(rows, last) of an array of shape (..., last)."""
    return math.prod(shape[:-1]), shape[-1]


# -------------------------------------------------------------------------------------------- embedding
def embed_fwd(x, idx, wte, wpe, *, check_token_ids=True, stream=None):
    """x (B, T, C) = wte[idx] + wpe[:T]."""
    B, T = shape_of("idx", idx, 2)
    V, C = shape_of("wte", wte, 2)
    T_max = shape_of("wpe", wpe, 2)[0]
    if T > T_max:
        raise ValueError(f"idx has T={T} positions, above wpe's {T_max}")
    args = [ptr("x", x, (B, T, C)),
            check_ids("idx", idx, (B, T), V) if check_token_ids else ptr("idx", idx, (B, T), np.int32),
            ptr("wte", wte, (V, C)), ptr("wpe", wpe, (T_max, C)), B, T, C]
    _launch("k_embed_fwd", B * T * C, args, stream=stream)


def token_order(idx: np.ndarray) -> np.ndarray:
    """The positions of idx (B, T) sorted by token id, stably: what embed_bwd reads as `order`."""
    return np.argsort(np.asarray(idx).reshape(-1), kind="stable").astype(np.int32).reshape(np.shape(idx))


def embed_bwd(dwte, dwpe, dx, idx, order=None, *, check_token_ids=True, stream=None):
    """dwte (V, C) += dx gathered by token; dwpe (T_max, C)[:T] += dx summed over the batch.
    order (B, T) int32 is token_order(idx); without it, it is computed here from idx (a read-back)."""
    B, T, C = shape_of("dx", dx, 3)
    V = shape_of("dwte", dwte, 2)[0]
    T_max = shape_of("dwpe", dwpe, 2)[0]
    if T > T_max:
        raise ValueError(f"dx has T={T} positions, above dwpe's {T_max}")
    idx_ptr = check_ids("idx", idx, (B, T), V) if check_token_ids else ptr("idx", idx, (B, T), np.int32)
    if order is None:
        import pycuda.gpuarray as ga
        host = np.empty((B, T), np.int32)
        engine().cuda.memcpy_dtoh(host, idx_ptr)
        order = ga.to_gpu(token_order(host))
    elif check_token_ids:
        host_idx, host_order = np.empty((B, T), np.int32), np.empty((B, T), np.int32)
        engine().cuda.memcpy_dtoh(host_idx, idx_ptr)
        engine().cuda.memcpy_dtoh(host_order, ptr("order", order, (B, T), np.int32))
        if not np.array_equal(host_order, token_order(host_idx)):
            raise ValueError("order must be token_order(idx): the positions sorted stably by token id")
    args = [ptr("dwte", dwte, (V, C)), ptr("dwpe", dwpe, (T_max, C)), ptr("dx", dx, (B, T, C)), idx_ptr,
            ptr("order", order, (B, T), np.int32), B, T, C]
    _launch("k_embed_bwd", B * T * C, args, parts=2, stream=stream)


# -------------------------------------------------------------------------------------------- layernorm
def layernorm_fwd(out, mean, rstd, x, w, b, *, stream=None):
    """x (..., C) normalised over C; mean and rstd (...) saved for backward."""
    shape = shape_of("x", x)
    N, C = _rows(shape)
    args = [ptr("out", out, shape), ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1]),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]
    _launch("k_layernorm_fwd", N, args, stream=stream)


def layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, *, stream=None):
    """dx written; dw, db (C) added into."""
    shape = shape_of("x", x)
    N, C = _rows(shape)
    args = [ptr("dx", dx, shape), ptr("dw", dw, (C,)), ptr("db", db, (C,)), ptr("dout", dout, shape),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("mean", mean, shape[:-1]),
            ptr("rstd", rstd, shape[:-1]), N, C]
    _launch("k_layernorm_bwd", max(N, C), args, parts=2, stream=stream)


# -------------------------------------------------------------------------------------------- matmul
def matmul_fwd(out, inp, weight, bias=None, *, stream=None):
    """out (..., OUT) = inp (..., IN) @ weight (OUT, IN)^T + bias (OUT) (bias None: none)."""
    shape = shape_of("inp", inp)
    N, IN = _rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    args = [ptr("out", out, shape[:-1] + (OUT,)), ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN)),
            opt_ptr("bias", bias, (OUT,)), N, IN, OUT]
    _launch("k_matmul_fwd", N * OUT, args, stream=stream)


def matmul_bwd(dinp, dweight, dbias, dout, inp, weight, *, stream=None):
    """dinp written; dweight (OUT, IN) and dbias (OUT, or None) added into."""
    shape = shape_of("inp", inp)
    N, IN = _rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    args = [ptr("dinp", dinp, shape), ptr("dweight", dweight, (OUT, IN)), opt_ptr("dbias", dbias, (OUT,)),
            ptr("dout", dout, shape[:-1] + (OUT,)), ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN)),
            N, IN, OUT]
    _launch("k_matmul_bwd", max(N * IN, OUT * IN), args, parts=3, stream=stream)


# -------------------------------------------------------------------------------------------- attention
def _heads(name, a):
    return shape_of(name, a, 4)  # (B, NH, T, d_k)


def split_heads_fwd(q, k, v, qkv, n_head, *, stream=None):
    """qkv (B, T, 3C) -> q, k, v (B, NH, T, d_k)."""
    B, T, C3 = shape_of("qkv", qkv, 3)
    if C3 % 3 or (C3 // 3) % n_head:
        raise ValueError(f"qkv's last dimension {C3} must be 3 * C with n_head={n_head} dividing C")
    d_k = C3 // 3 // n_head
    hs = (B, n_head, T, d_k)
    args = [ptr("q", q, hs), ptr("k", k, hs), ptr("v", v, hs), ptr("qkv", qkv, (B, T, C3)), B, T, n_head, d_k]
    _launch("k_split_heads_fwd", B * T * C3 // 3, args, stream=stream)


def split_heads_bwd(dqkv, dq, dk, dv, *, stream=None):
    B, NH, T, d_k = _heads("dq", dq)
    hs = (B, NH, T, d_k)
    args = [ptr("dqkv", dqkv, (B, T, 3 * NH * d_k)), ptr("dq", dq, hs), ptr("dk", dk, hs), ptr("dv", dv, hs),
            B, T, NH, d_k]
    _launch("k_split_heads_bwd", B * T * 3 * NH * d_k, args, stream=stream)


def attn_scores_fwd(scores, q, k, *, stream=None):
    """scores (B, NH, T, T): scores[i][j] = dot(Q[i], K[j]) * (1.0f / sqrtf(d_k))."""
    B, NH, T, d_k = _heads("q", q)
    args = [ptr("scores", scores, (B, NH, T, T)), ptr("q", q, (B, NH, T, d_k)), ptr("k", k, (B, NH, T, d_k)),
            B * NH, T, d_k]
    _launch("k_attn_scores_fwd", B * NH * T * T, args, stream=stream)


def attn_scores_bwd(dq, dk, dscores, q, k, *, stream=None):
    B, NH, T, d_k = _heads("q", q)
    hs = (B, NH, T, d_k)
    args = [ptr("dq", dq, hs), ptr("dk", dk, hs), ptr("dscores", dscores, (B, NH, T, T)), ptr("q", q, hs),
            ptr("k", k, hs), B * NH, T, d_k]
    _launch("k_attn_scores_bwd", B * NH * T * d_k, args, parts=2, stream=stream)


def causal_mask_fwd(out, scores, *, stream=None):
    """out = scores with -1e9 where j > i; out may be scores itself."""
    B, NH, T, T2 = _heads("scores", scores)
    if T != T2:
        raise ValueError(f"scores must be (B, NH, T, T), got {(B, NH, T, T2)}")
    args = [ptr("out", out, (B, NH, T, T)), ptr("scores", scores, (B, NH, T, T)), B * NH, T]
    _launch("k_causal_mask_fwd", B * NH * T * T, args, stream=stream)


def causal_mask_bwd(dscores, dout, *, stream=None):
    B, NH, T, T2 = _heads("dout", dout)
    if T != T2:
        raise ValueError(f"dout must be (B, NH, T, T), got {(B, NH, T, T2)}")
    args = [ptr("dscores", dscores, (B, NH, T, T)), ptr("dout", dout, (B, NH, T, T)), B * NH, T]
    _launch("k_causal_mask_bwd", B * NH * T * T, args, stream=stream)


def softmax_fwd(probs, x, *, stream=None):
    """Row-wise softmax over the last axis of x (..., cols)."""
    shape = shape_of("x", x)
    rows, cols = _rows(shape)
    _launch("k_softmax_fwd", rows, [ptr("probs", probs, shape), ptr("x", x, shape), rows, cols], stream=stream)


def softmax_bwd(dx, dprobs, probs, *, stream=None):
    shape = shape_of("probs", probs)
    rows, cols = _rows(shape)
    args = [ptr("dx", dx, shape), ptr("dprobs", dprobs, shape), ptr("probs", probs, shape), rows, cols]
    _launch("k_softmax_bwd", rows, args, stream=stream)


def attn_values_fwd(out, probs, v, *, stream=None):
    """out (B, NH, T, d_k): out[i] = sum_j A[i][j] * V[j]."""
    B, NH, T, d_k = _heads("v", v)
    args = [ptr("out", out, (B, NH, T, d_k)), ptr("probs", probs, (B, NH, T, T)), ptr("v", v, (B, NH, T, d_k)),
            B * NH, T, d_k]
    _launch("k_attn_values_fwd", B * NH * T * d_k, args, stream=stream)


def attn_values_bwd(dprobs, dv, dout, probs, v, *, stream=None):
    B, NH, T, d_k = _heads("v", v)
    hs = (B, NH, T, d_k)
    args = [ptr("dprobs", dprobs, (B, NH, T, T)), ptr("dv", dv, hs), ptr("dout", dout, hs),
            ptr("probs", probs, (B, NH, T, T)), ptr("v", v, hs), B * NH, T, d_k]
    _launch("k_attn_values_bwd", B * NH * T * max(T, d_k), args, parts=2, stream=stream)


def merge_heads_fwd(y, heads, *, stream=None):
    """heads (B, NH, T, d_k) -> y (B, T, NH * d_k)."""
    B, NH, T, d_k = _heads("heads", heads)
    args = [ptr("y", y, (B, T, NH * d_k)), ptr("heads", heads, (B, NH, T, d_k)), B, T, NH, d_k]
    _launch("k_merge_heads_fwd", B * NH * T * d_k, args, stream=stream)


def merge_heads_bwd(dheads, dy, n_head, *, stream=None):
    B, T, C = shape_of("dy", dy, 3)
    if C % n_head:
        raise ValueError(f"n_head={n_head} must divide dy's last dimension {C}")
    d_k = C // n_head
    args = [ptr("dheads", dheads, (B, n_head, T, d_k)), ptr("dy", dy, (B, T, C)), B, T, n_head, d_k]
    _launch("k_merge_heads_bwd", B * T * C, args, stream=stream)


# -------------------------------------------------------------------------------------------- pointwise
def gelu_fwd(out, x, *, stream=None):
    shape = shape_of("x", x)
    n = math.prod(shape)
    _launch("k_gelu_fwd", n, [ptr("out", out, shape), ptr("x", x, shape), n], stream=stream)


def gelu_bwd(dx, dout, x, *, stream=None):
    shape = shape_of("x", x)
    n = math.prod(shape)
    _launch("k_gelu_bwd", n, [ptr("dx", dx, shape), ptr("dout", dout, shape), ptr("x", x, shape), n],
            stream=stream)


def residual_fwd(out, a, b, *, stream=None):
    """out = a + b (out may be a or b)."""
    shape = shape_of("a", a)
    n = math.prod(shape)
    _launch("k_residual_fwd", n, [ptr("out", out, shape), ptr("a", a, shape), ptr("b", b, shape), n],
            stream=stream)


def residual_bwd(da, db, dout, *, stream=None):
    shape = shape_of("dout", dout)
    n = math.prod(shape)
    _launch("k_residual_bwd", n, [ptr("da", da, shape), ptr("db", db, shape), ptr("dout", dout, shape), n],
            stream=stream)


# -------------------------------------------------------------------------------------------- cross-entropy
def crossentropy_fwd(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    """losses (...) and probs (..., V) of logits (..., V) against targets (...)."""
    shape = shape_of("logits", logits)
    N, V = _rows(shape)
    args = [ptr("losses", losses, shape[:-1]), ptr("probs", probs, shape), ptr("logits", logits, shape),
            check_ids("targets", targets, shape[:-1], V) if check_token_ids
            else ptr("targets", targets, shape[:-1], np.int32), N, V]
    _launch("k_crossentropy_fwd", N, args, stream=stream)


def crossentropy_bwd(dlogits, probs, targets, dlosses, *, check_token_ids=True, stream=None):
    """dlogits = (probs - onehot(targets)) * dlosses, per position."""
    shape = shape_of("probs", probs)
    N, V = _rows(shape)
    args = [ptr("dlogits", dlogits, shape), ptr("probs", probs, shape),
            check_ids("targets", targets, shape[:-1], V) if check_token_ids
            else ptr("targets", targets, shape[:-1], np.int32),
            ptr("dlosses", dlosses, shape[:-1]), N, V]
    _launch("k_crossentropy_bwd", N * V, args, stream=stream)


# -------------------------------------------------------------------------------------------- optimiser
NORM_GRID = 1024  # blocks of the grid-stride norm reduction: enough to fill any current GPU
_norm_partials = None


def global_norm(sumsq, g, *, accumulate=False, stream=None):
    """sumsq (1,) float64 (+)= sum of g**2; zeroed first unless accumulate. Deterministic. Calls on
    several streams at once would share the kernel's scratch: keep them on one stream."""
    global _norm_partials
    shape = shape_of("g", g)
    n = math.prod(shape)
    p = ptr("sumsq", sumsq, (1,), np.float64)
    if _norm_partials is None:
        _norm_partials = engine().cuda.mem_alloc(NORM_GRID * 8)
    if not accumulate:
        cuda = engine().cuda
        if stream is None:
            cuda.memset_d32(p, 0, 2)
        else:
            cuda.memset_d32_async(p, 0, 2, stream)
    _launch("k_global_norm", n, [p, int(_norm_partials), ptr("g", g, shape), n], stream=stream,
            grid_x=min(NORM_GRID, max(1, math.ceil(n / BLOCK))))


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
    _launch("k_adamw", n, args, stream=stream)


# ============================================================================================ fast variants
# Beside the reference kernels, with the same arguments; tests/test_kernels_gpu.py checks each against
# its reference. The model uses them unless asked for kernels="reference".
GEMM_TILE = 128  # the M and N of one SGEMM block (cuda/matmul_fast.cuh)
CAUSAL_OUT_LOWER, CAUSAL_A_LOWER, CAUSAL_A_UPPER = 1, 2, 3


def _split_k(M, N, K, tiles):
    """How many slices to cut K into so that a product of few tiles (a weight gradient: M x N small, K =
    B*T large) still fills the GPU: the fewest of 2, 4, 8 that give two blocks per SM; 1 if none needed."""
    target = 2 * engine().sm_count
    for splits in (1, 2, 4, 8):
        if tiles * splits >= target or splits == 8:
            return splits if K % splits == 0 and K // splits >= 128 else 1
    return 1


def _gemm(kernel, c, a, b, bias, M, N, K, lda, ldb, ldc, batch=1, strides=(0, 0, 0), alpha=1.0, beta=0.0,
          causal=0, fill=0.0, stream=None):
    """Launches k_sgemm_<kernel> on pointers: the 128 x 64 tile where N fits in it (attention's d_k),
    split-K where a single product has too few tiles (the reduction stays deterministic)."""
    narrow = N <= 64
    if narrow:
        kernel += "_n64"
    tile_n = 64 if narrow else GEMM_TILE
    tiles = math.ceil(N / tile_n) * math.ceil(M / GEMM_TILE)
    splits = _split_k(M, N, K, tiles) if batch == 1 and not bias and not causal and ldc == N else 1
    if splits > 1:
        part = _scratch(splits * M * N)
        k_slice = K // splits  # a slice of K is a block of A's and B's rows (or columns, transposed)
        step_a = k_slice * (lda if kernel.startswith("k_sgemm_t") else 1)
        step_b = k_slice * (1 if kernel[9] == "t" else ldb)
        _launch(kernel, 0, [int(part.gpudata), a, b, 0, M, N, k_slice, lda, ldb, N, step_a, step_b, M * N,
                            float(alpha), 0.0, 0, 0.0], grid=(math.ceil(N / tile_n), math.ceil(M / GEMM_TILE),
                                                             splits), stream=stream)
        _launch("k_splitk_reduce", M * N, [c, int(part.gpudata), splits, M * N, float(beta)], stream=stream)
        return
    grid = (math.ceil(N / tile_n), math.ceil(M / GEMM_TILE), batch)
    _launch(kernel, 0, [c, a, b, bias, M, N, K, lda, ldb, ldc, *strides, float(alpha), float(beta), causal,
                        float(fill)], grid=grid, stream=stream)


def sgemm(c, a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, bias=None, stream=None):
    """c = alpha * op(a) @ op(b) + bias + beta * c, op(x) = x.T (the last two axes) where trans_x.
    a, b, c are 2-D, or 3-D with a leading batch axis (all three)."""
    sa, sb = shape_of("a", a), shape_of("b", b)
    if len(sa) != len(sb) or len(sa) not in (2, 3):
        raise ValueError(f"a and b must both be 2-D or both 3-D (batched), got shapes {sa} and {sb}")
    batch = sa[0] if len(sa) == 3 else 1
    if len(sa) == 3 and sb[0] != batch:
        raise ValueError(f"b must have a's batch size {batch}, got {sb[0]}")
    M, K = (sa[-1], sa[-2]) if trans_a else (sa[-2], sa[-1])
    Kb, N = (sb[-1], sb[-2]) if trans_b else (sb[-2], sb[-1])
    if Kb != K:
        raise ValueError(f"op(a) is {M}x{K} but op(b) is {Kb}x{N}: inner dimensions differ")
    lead = (batch,) if len(sa) == 3 else ()
    args = [ptr("c", c, lead + (M, N)), ptr("a", a, sa), ptr("b", b, sb), opt_ptr("bias", bias, (N,))]
    kernel = "k_sgemm_" + ("t" if trans_a else "n") + ("t" if trans_b else "n")  # _gemm may add _n64
    _gemm(kernel, *args, M, N, K, sa[-1], sb[-1], N, batch, (M * K, K * N, M * N), alpha, beta, stream=stream)


def _chunks(N):
    """Row chunks of the deterministic column sums: enough blocks to fill the GPU, in a fixed order."""
    rows_per_chunk = max(8, math.ceil(N / 64))
    return rows_per_chunk, math.ceil(N / rows_per_chunk)


def _scratch(n):
    """A float32 device buffer of n elements for partial sums, kept alive by the plan being recorded."""
    import pycuda.gpuarray as ga
    buf = ga.empty(n, np.float32)
    if _recording is not None:
        _recording.keep.append(buf)
    return buf


def _colsum(out_ptr, x_ptr, N, C, stream):
    """out (C,) += column sums of x (N, C), deterministically."""
    rows_per_chunk, chunks = _chunks(N)
    part = _scratch(chunks * C)
    _launch("k_colsum_partial", 0, [int(part.gpudata), x_ptr, N, C, rows_per_chunk],
            grid=(math.ceil(C / 32), chunks, 1), stream=stream)
    _launch("k_colsum_reduce", C, [out_ptr, int(part.gpudata), chunks, C], stream=stream)


def matmul_fwd_fast(out, inp, weight, bias=None, *, stream=None):
    """As matmul_fwd, through the tiled SGEMM."""
    shape = shape_of("inp", inp)
    N, IN = _rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    _gemm("k_sgemm_nt", ptr("out", out, shape[:-1] + (OUT,)), ptr("inp", inp, shape),
          ptr("weight", weight, (OUT, IN)), opt_ptr("bias", bias, (OUT,)), N, OUT, IN, IN, IN, OUT, stream=stream)


def matmul_bwd_fast(dinp, dweight, dbias, dout, inp, weight, *, stream=None):
    """As matmul_bwd: dinp = dout @ W (written), dW += dout^T @ inp, dbias += column sums of dout."""
    shape = shape_of("inp", inp)
    N, IN = _rows(shape)
    OUT = shape_of("weight", weight, 2)[0]
    p_dinp, p_dw, p_db = ptr("dinp", dinp, shape), ptr("dweight", dweight, (OUT, IN)), opt_ptr("dbias", dbias, (OUT,))
    p_dout, p_inp, p_w = ptr("dout", dout, shape[:-1] + (OUT,)), ptr("inp", inp, shape), ptr("weight", weight, (OUT, IN))
    _gemm("k_sgemm_nn", p_dinp, p_dout, p_w, 0, N, IN, OUT, OUT, IN, IN, stream=stream)
    _gemm("k_sgemm_tn", p_dw, p_dout, p_inp, 0, OUT, IN, N, OUT, IN, IN, beta=1.0, stream=stream)
    if p_db:
        _colsum(p_db, p_dout, N, OUT, stream)


def _attn_dims(q_name, q):
    B, NH, T, d_k = _heads(q_name, q)
    scale = float(np.float32(1.0) / np.sqrt(np.float32(d_k)))  # 1.0f / sqrtf(d_k), as the literal kernel
    return B, NH, T, d_k, scale


def attn_scores_fwd_fast(masked, q, k, *, stream=None):
    """The scores with the causal mask applied, in one pass: masked[i][j] = dot(Q[i], K[j]) * (1/sqrt(d_k))
    for j <= i and -1e9 above the diagonal, whose tiles are never computed."""
    B, NH, T, d_k, scale = _attn_dims("q", q)
    hs = (B, NH, T, d_k)
    _gemm("k_sgemm_nt", ptr("masked", masked, (B, NH, T, T)), ptr("q", q, hs), ptr("k", k, hs), 0,
          T, T, d_k, d_k, d_k, T, B * NH, (T * d_k, T * d_k, T * T), alpha=scale, causal=CAUSAL_OUT_LOWER,
          fill=-1e9, stream=stream)


def attn_scores_bwd_fast(dq, dk, dscores, q, k, *, stream=None):
    """As attn_scores_bwd, for causal dscores (zero above the diagonal, as the pipeline makes them)."""
    B, NH, T, d_k, scale = _attn_dims("q", q)
    hs, st = (B, NH, T, d_k), (T * T, T * d_k, T * d_k)
    p_ds = ptr("dscores", dscores, (B, NH, T, T))
    _gemm("k_sgemm_nn", ptr("dq", dq, hs), p_ds, ptr("k", k, hs), 0, T, d_k, T, T, d_k, d_k, B * NH, st,
          alpha=scale, causal=CAUSAL_A_LOWER, stream=stream)
    _gemm("k_sgemm_tn", ptr("dk", dk, hs), p_ds, ptr("q", q, hs), 0, T, d_k, T, T, d_k, d_k, B * NH, st,
          alpha=scale, causal=CAUSAL_A_UPPER, stream=stream)


def attn_values_fwd_fast(out, probs, v, *, stream=None):
    """As attn_values_fwd, for causal probs: row i stops at j = i."""
    B, NH, T, d_k, _ = _attn_dims("v", v)
    hs = (B, NH, T, d_k)
    _gemm("k_sgemm_nn", ptr("out", out, hs), ptr("probs", probs, (B, NH, T, T)), ptr("v", v, hs), 0,
          T, d_k, T, T, d_k, d_k, B * NH, (T * T, T * d_k, T * d_k), causal=CAUSAL_A_LOWER, stream=stream)


def attn_values_bwd_fast(dprobs, dv, dout, probs, v, *, stream=None):
    """As attn_values_bwd for causal probs; dprobs is written 0 above the diagonal, where the softmax
    backward multiplies it by a probability of 0 anyway."""
    B, NH, T, d_k, _ = _attn_dims("v", v)
    hs = (B, NH, T, d_k)
    p_do = ptr("dout", dout, hs)
    _gemm("k_sgemm_nt", ptr("dprobs", dprobs, (B, NH, T, T)), p_do, ptr("v", v, hs), 0, T, T, d_k, d_k, d_k, T,
          B * NH, (T * d_k, T * d_k, T * T), causal=CAUSAL_OUT_LOWER, fill=0.0, stream=stream)
    _gemm("k_sgemm_tn", ptr("dv", dv, hs), ptr("probs", probs, (B, NH, T, T)), p_do, 0, T, d_k, T, T, d_k, d_k,
          B * NH, (T * T, T * d_k, T * d_k), causal=CAUSAL_A_UPPER, stream=stream)


def softmax_fwd_fast(probs, x, *, stream=None):
    shape = shape_of("x", x)
    rows, cols = _rows(shape)
    _launch("k_softmax_fwd_fast", rows * 32, [ptr("probs", probs, shape), ptr("x", x, shape), rows, cols],
            stream=stream)


def softmax_bwd_fast(dx, dprobs, probs, *, stream=None):
    shape = shape_of("probs", probs)
    rows, cols = _rows(shape)
    args = [ptr("dx", dx, shape), ptr("dprobs", dprobs, shape), ptr("probs", probs, shape), rows, cols]
    _launch("k_softmax_bwd_fast", rows * 32, args, stream=stream)


def layernorm_fwd_fast(out, mean, rstd, x, w, b, *, stream=None):
    shape = shape_of("x", x)
    N, C = _rows(shape)
    args = [ptr("out", out, shape), ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1]),
            ptr("x", x, shape), ptr("w", w, (C,)), ptr("b", b, (C,)), N, C]
    _launch("k_layernorm_fwd_fast", N * 32, args, stream=stream)


def layernorm_bwd_fast(dx, dw, db, dout, x, w, mean, rstd, *, stream=None):
    shape = shape_of("x", x)
    N, C = _rows(shape)
    p_dout, p_x = ptr("dout", dout, shape), ptr("x", x, shape)
    p_mean, p_rstd = ptr("mean", mean, shape[:-1]), ptr("rstd", rstd, shape[:-1])
    p_dw, p_db = ptr("dw", dw, (C,)), ptr("db", db, (C,))
    _launch("k_layernorm_bwd_fast", N * 32, [ptr("dx", dx, shape), p_dout, p_x, ptr("w", w, (C,)), p_mean, p_rstd,
                                             N, C], stream=stream)
    rows_per_chunk, chunks = _chunks(N)
    pw, pb = _scratch(chunks * C), _scratch(chunks * C)
    _launch("k_layernorm_bwd_fast_wb", 0, [int(pw.gpudata), int(pb.gpudata), p_dout, p_x, p_mean, p_rstd, N, C,
                                           rows_per_chunk], grid=(math.ceil(C / 32), chunks, 1), stream=stream)
    _launch("k_colsum_reduce", C, [p_dw, int(pw.gpudata), chunks, C], stream=stream)
    _launch("k_colsum_reduce", C, [p_db, int(pb.gpudata), chunks, C], stream=stream)


def crossentropy_fwd_fast(losses, probs, logits, targets, *, check_token_ids=True, stream=None):
    shape = shape_of("logits", logits)
    N, V = _rows(shape)
    args = [ptr("losses", losses, shape[:-1]), ptr("probs", probs, shape), ptr("logits", logits, shape),
            check_ids("targets", targets, shape[:-1], V) if check_token_ids
            else ptr("targets", targets, shape[:-1], np.int32), N, V]
    _launch("k_crossentropy_fwd_fast", N * BLOCK, args, stream=stream)


VARIANTS = ("reference", "fast")


def variant(op: str, which: str):
    """The launch function of `op` ('matmul_fwd', ...) in variant `which`; ops without a fast variant
    use their reference kernel in both."""
    if which not in VARIANTS:
        raise ValueError(f"kernels must be one of {VARIANTS}, got {which!r}")
    fast = globals().get(op + "_fast")
    return fast if which == "fast" and fast is not None else globals()[op]
