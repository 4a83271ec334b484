"""What the tests share: the relative error they compare by, the worst errors printed at the end of a run,
and a stand-in for the GPU that lets the launch layer check and record launches on a machine without one."""
from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys

import numpy as np

from microgpt import kernels as K
from microgpt import reference as R
from microgpt.kernels import runtime, virtual


def rel_err(a, b):
    """||a - b|| / ||b||, in float64; inf where a holds a NaN or inf (never passes)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape} != {b.shape}")
    if not np.all(np.isfinite(a)):
        return np.inf
    denom = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (denom if denom > 0 else 1.0))


# group -> name -> worst relative error seen this session; conftest prints it at the end of the run
WORST: dict = {}


def device(ga, a, offset=0):
    """a on the device (ga: pycuda.gpuarray), `offset` floats past an allocation's start (offset 1: off every 8- and
    16-byte boundary)."""
    buf = ga.empty(a.size + offset, np.float32)
    view = buf[offset:].reshape(a.shape)
    view.set(np.ascontiguousarray(a, np.float32))
    return view


def record(group, name, err):
    g = WORST.setdefault(group, {})
    g[name] = max(g.get(name, 0.0), err)
    return err


# `microgpt train` flags for a model numpy trains in a blink (tests/test_cli*.py; the `corpus` fixture of
# conftest is its data)
SMALL_RUN = ["--backend", "numpy", "--n-layer", "1", "--n-head", "2", "--d-model", "32", "--block-size", "32",
             "--batch-size", "4", "--eval-batches", "2", "--no-progress", "--sample-tokens", "10"]

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools")


def import_tools(monkeypatch, *names):
    """tools/<name>.py imported, tools/ on sys.path for the test's length: the module, or a tuple of them."""
    monkeypatch.syspath_prepend(TOOLS)
    modules = tuple(importlib.import_module(name) for name in names)
    return modules[0] if len(modules) == 1 else modules


def run_tool(script, *args, timeout=300):
    """tools/<script> in a fresh interpreter, its output captured."""
    return subprocess.run([sys.executable, os.path.join(TOOLS, script), *args], capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------------------------- no GPU
def _gpu_unavailable_reason():
    """None where PyCUDA and a CUDA device are there, else why not."""
    try:
        import pycuda.driver as cuda
    except Exception as e:
        return f"PyCUDA is not installed ({e}); pip install 'microgpt[cuda]'"
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            return "no CUDA device"
    except Exception as e:
        return f"no usable CUDA device ({e})"
    return None


GPU_REASON = _gpu_unavailable_reason()


class FakeArray:
    """A device array by __cuda_array_interface__ alone: a shape, a dtype and a made-up address."""
    _next = 1 << 20

    def __init__(self, shape, dtype=np.float32, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.gpudata = FakeArray._next
        FakeArray._next += 256 * (1 + int(np.prod(self.shape)) * self.dtype.itemsize // 256)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "strides": strides,
                                         "data": (self.gpudata, False), "version": 3}

    @classmethod
    def padded(cls, shape, pad, dtype=np.float32):
        """A (..., n) view of a (..., n + pad) array: rows n + pad elements apart (kernels.checks.rows_ptr)."""
        a = cls(tuple(shape[:-1]) + (shape[-1] + pad,), dtype)
        full, item = a.shape, a.dtype.itemsize
        a.shape = tuple(shape)
        a.__cuda_array_interface__.update(shape=a.shape, strides=tuple(item * int(np.prod(full[i + 1:]))
                                                                       for i in range(len(full))))
        return a

    @property
    def size(self):
        return int(np.prod(self.shape))

    def get(self):
        return np.zeros(self.shape, self.dtype)


class FakeEngine(virtual.Engine):
    """Stands in for microgpt.kernels.engine's compiled module: launches are checked and recorded, never run, on a
    device described by these numbers (an H200 by default). Reads of device memory (token ids) return zeros."""

    def __init__(self, signatures, sm_count=132, arch="sm_90a", max_shared=227 * 1024):
        super().__init__(dataclasses.replace(virtual.H200, arch=arch, sm_count=sm_count, max_shared=max_shared),
                         signatures)


def stand_in(monkeypatch, engine):
    """engine as this process's engine for one test (runtime.engine(), which launches without a Plan and default
    allocations reach through device_of, and kernels.engine(), which the tools call): a GPU's double for code that
    runs on the process's GPU rather than planning for a described one. Returns engine."""
    monkeypatch.setattr(runtime, "engine", lambda: engine)
    monkeypatch.setattr(K, "engine", lambda: engine)
    return engine


# ---------------------------------------------------------------------------------------------- an op's arguments
def op_sizes(B, T, C, NH, V) -> dict:
    """The sizes an op's argument shapes are written in (microgpt.ops.Arg): D = d_k, M = a cache's length."""
    return dict(B=B, T=T, C=C, NH=NH, D=C // NH, V=V, M=T + 3)


def _causal(a, above):
    a = a.copy()
    a[..., np.triu(np.ones(a.shape[-2:], bool), k=1)] = above
    return a


def op_case(op, sizes: dict, rng) -> dict:
    """Host values of every argument of `op` (a microgpt.ops.Op) at `sizes`, drawn by each Arg's kind: inputs
    random (consistent where the op needs it: the embedding's order, attention's y and lse from its qkv), outputs
    None (the caller poisons them), added-into outputs their random start."""
    from microgpt import reference as R
    from microgpt import reference_ops
    from microgpt.kernels import token_order

    vals = {}
    for a in op.args:
        if a.role == "value":
            vals[a.name] = a.value(sizes)
            continue
        shape = a.size(sizes)
        if a.role in ("out", "scratch"):
            vals[a.name] = None
        elif a.kind == "ids":
            vals[a.name] = rng.integers(0, sizes["V"], size=shape).astype(np.int32)
        elif a.kind == "pos":
            vals[a.name] = np.array([sizes["T"] - 1], np.int32)
        elif a.kind == "unit":
            vals[a.name] = rng.random(shape)
        elif a.kind == "mask":
            vals[a.name] = rng.integers(0, 2, size=shape).astype(np.uint8)
        elif a.kind == "sumsq":
            vals[a.name] = np.array([4.0])
        else:
            x = rng.standard_normal(shape).astype(np.float32)
            masked = lambda: _causal(x, R.MASK_VALUE)  # noqa: E731
            make = {"rstd": lambda: np.abs(x) + 0.5, "positive": lambda: np.abs(x), "causal": lambda: _causal(x, 0.0),
                    "masked": masked, "probs": lambda: R.softmax_fwd(masked()),
                    "softmax": lambda: R.softmax_fwd(x)}.get(a.kind, lambda: x)
            vals[a.name] = make().astype(a.dtype)
    if "order" in vals:
        vals["order"] = token_order(vals["idx"])
    if "lse" in vals and vals["lse"] is not None:  # y and lse of the forward of qkv
        y, lse = np.empty(vals["y"].shape, np.float64), np.empty(vals["lse"].shape, np.float64)
        reference_ops.fused_attention_fwd(y, lse, vals["qkv"].astype(np.float64), vals["n_head"])
        vals["y"], vals["lse"] = y.astype(np.float32), lse.astype(np.float32)
    return vals


def op_call(op, vals: dict) -> tuple[list, dict]:
    """(positional, keyword) arguments of op's launchers from vals (name -> array or value)."""
    args = [vals[a.name] for a in op.args if not a.keyword]
    return args, {a.name: vals[a.name] for a in op.args if a.keyword}


def one_line_error(capsys, code):
    """The one line a command printed for a user error (exit status 2, no traceback), checked and returned."""
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("microgpt: error: ") and "Traceback" not in err, err
    return lines[0]


def attention_fwd(x, w_qkv, b_qkv, w_o, b_o, n_head):
    """The attention sublayer composed of microgpt.reference's stages, the oracle of the package's own pipeline
    (microgpt.attention): fused QKV projection, split into heads, scores, causal mask, softmax, weighted sum of V,
    concat, W_O. Returns the output and every intermediate (the cache)."""
    qkv = R.linear_fwd(x, w_qkv, b_qkv)
    q, k, v = R.split_heads_fwd(qkv, n_head)
    scores = R.attn_scores_fwd(q, k)
    masked = R.causal_mask_fwd(scores)
    probs = R.softmax_fwd(masked)
    heads = R.attn_values_fwd(probs, v)
    y = R.merge_heads_fwd(heads)
    out = R.linear_fwd(y, w_o, b_o)
    cache = dict(x=x, qkv=qkv, q=q, k=k, v=v, scores=scores, masked=masked, probs=probs, heads=heads, y=y,
                 lse=R.logsumexp(masked))
    return out, cache


def attention_bwd(dout, cache, w_qkv, w_o, n_head):
    """Returns dx and the gradients of (w_qkv, b_qkv, w_o, b_o)."""
    dy, dw_o, db_o = R.linear_bwd(dout, cache["y"], w_o)
    dheads = R.merge_heads_bwd(dy, n_head)
    dprobs, dv = R.attn_values_bwd(dheads, cache["probs"], cache["v"])
    dmasked = R.softmax_bwd(dprobs, cache["probs"])
    dscores = R.causal_mask_bwd(dmasked)
    dq, dk = R.attn_scores_bwd(dscores, cache["q"], cache["k"])
    dqkv = R.split_heads_bwd(dq, dk, dv)
    dx, dw_qkv, db_qkv = R.linear_bwd(dqkv, cache["x"], w_qkv)
    return dx, dict(w_qkv=dw_qkv, b_qkv=db_qkv, w_o=dw_o, b_o=db_o)
