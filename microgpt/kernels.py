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
    for name, params in re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', source):
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
    """Launches recorded with their checked arguments, to be replayed on a stream (see recording())."""


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


def _launch(name, n_threads, args, parts=1, stream=None, grid_x=None):
    e = engine()
    grid = (grid_x or max(1, math.ceil(n_threads / BLOCK)), parts)
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


def embed_bwd(dwte, dwpe, dx, idx, *, check_token_ids=True, stream=None):
    """dwte (V, C) += scatter of dx by token; dwpe (T_max, C)[:T] += dx summed over the batch."""
    B, T, C = shape_of("dx", dx, 3)
    V = shape_of("dwte", dwte, 2)[0]
    T_max = shape_of("dwpe", dwpe, 2)[0]
    if T > T_max:
        raise ValueError(f"dx has T={T} positions, above dwpe's {T_max}")
    args = [ptr("dwte", dwte, (V, C)), ptr("dwpe", dwpe, (T_max, C)), ptr("dx", dx, (B, T, C)),
            check_ids("idx", idx, (B, T), V) if check_token_ids else ptr("idx", idx, (B, T), np.int32),
            B, T, C]
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


def global_norm(sumsq, g, *, accumulate=False, stream=None):
    """sumsq (1,) float64 (+)= sum of g**2; zeroed first unless accumulate."""
    shape = shape_of("g", g)
    n = math.prod(shape)
    p = ptr("sumsq", sumsq, (1,), np.float64)
    if not accumulate:
        cuda = engine().cuda
        if stream is None:
            cuda.memset_d32(p, 0, 2)
        else:
            cuda.memset_d32_async(p, 0, 2, stream)
    _launch("k_global_norm", n, [p, ptr("g", g, shape), n], stream=stream,
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
