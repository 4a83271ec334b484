"""How tools/kernel_cases.py builds its cases: the Case and the Shape, and a Builder that adds only the cases
a caller wants and makes each input only when a wanted case first needs it.

Making every input takes most of a minute at andrea-120m's shapes (several GB of random draws), which a
profile of two kernels should not pay. Each input is drawn from a random stream of its own, named after what
it is, so that a case's inputs do not depend on which other cases are built.
"""
from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from microgpt import kernels as K
from microgpt import ops as O


@dataclass
class Case:
    kernel: str           # the CUDA kernel's name
    launch: Callable      # launches it once (synchronously unless given a stream)
    bytes: int
    flops: int
    rotate: Callable = None  # switches to another set of inputs, so repeated timing is not a cache test
    sets: int = 1            # the sets of inputs rotate() cycles through


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    C: int
    NH: int
    V: int

    @property
    def N(self):
        return self.B * self.T

    @property
    def d_k(self):
        return self.C // self.NH

    @property
    def BH(self):
        return self.B * self.NH


class Draws:
    """Random arrays on the device, from the stream of (seed, key)."""

    def __init__(self, ga, seed: int, key: str):
        self.ga, self.rng = ga, np.random.default_rng([seed, zlib.crc32(key.encode())])

    def randn(self, *s, scale=1.0):
        return self.ga.to_gpu(self.normal(*s, scale=scale))

    def normal(self, *s, scale=1.0):  # drawn in float32, scaled in place: at andrea-120m's shapes the draws in
        x = self.rng.standard_normal(s, dtype=np.float32)  # float64 and their casts were most of the setup time
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def ints(self, high, *s):
        return self.ga.to_gpu(self.rng.integers(0, high, size=s).astype(np.int32))

    def uniform(self, *s):
        return self.ga.to_gpu(self.rng.random(s))

    def probs_like(self, *s):  # rows of a softmax
        x = self.normal(*s)
        x -= x.max(-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(-1, keepdims=True)
        return self.ga.to_gpu(x)


class Builder:
    """The cases added so far, and what adds them: which cases are wanted, in which variants, and the arrays
    they share."""

    def __init__(self, seed: int, sets: int, variants, wanted: Callable[[str], bool] | None):
        self.ga = K.engine().ga  # compiles the module and makes the primary context current before any allocation
        self.seed, self.sets, self.variants = seed, sets, variants
        self._wanted = wanted or (lambda name: True)
        self.written = set()  # the names of every case the written code asked for, wanted or not (declared())
        self.cases: list[Case] = []
        self.bufs = {}

    def want(self, name: str) -> bool:
        """Whether the case called name is wanted; the name is noted as one the written cases cover."""
        self.written.add(name)
        return self._wanted(name)

    def draws(self, key: str) -> Draws:
        return Draws(self.ga, self.seed, key)

    def drawn(self, make):
        """make(draws, *args) as a getter of inputs that several cases share: made once per args, when a wanted
        case first needs them, from the stream named after make and args."""
        return functools.cache(lambda *args: make(self.draws(f"{make.__name__}{args}"), *args))

    def empty(self, *s, dtype=np.float32):
        return self.ga.empty(s, dtype)

    def buf(self, name: str, *s):
        """The output array called name: the cases that write it share it, as a step's kernels do."""
        if (name, s) not in self.bufs:
            self.bufs[name, s] = self.empty(*s)
        return self.bufs[name, s]

    def own(self, op, label="", with_reference=True, also=()):
        """(case name, launcher) of op in each variant that has a launcher of its own, the wanted ones; `also`:
        suffixes of further cases a loop adds beside each, which make it wanted too."""
        self.written.add(f"k_{op}")  # the op is covered by written cases, whichever of them are wanted
        reference, seen, out = O.launcher(op, "reference"), set(), []
        for var in self.variants:
            fn = O.launcher(op, var)
            if fn not in seen and (with_reference or fn is not reference):
                seen.add(fn)
                name = (f"k_{op}" if fn is reference else fn.__name__) + label
                if any(self.want(name + suffix) for suffix in ("", *also)):
                    out.append((name, fn))
        return out

    def add(self, kernel, launch, nbytes, flops, inputs=None):
        """inputs: a list of `sets` tuples of arrays; rotate() makes launch use the next tuple."""
        state = {"i": 0}
        if inputs is None:
            self.cases.append(Case(kernel, lambda stream=None: launch(stream), int(nbytes), int(flops)))
            return

        def run(stream=None):
            launch(stream, *inputs[state["i"]])

        def rotate():
            state["i"] = (state["i"] + 1) % len(inputs)
        self.cases.append(Case(kernel, run, int(nbytes), int(flops), rotate, len(inputs)))

    def declared(self, shape: Shape) -> None:
        """A case from its declaration in microgpt.ops (op.args) for every launcher of every op that no written case
        covers (none asked for under its name or its launchers' names, wanted or not), named as own() names them: its
        inputs drawn by kind, `sets` of them; its bytes every array read or written once (added-into ones both), its
        FLOPs as the op declares them (op.flops). A new op is profiled at once."""
        sizes = dict(B=shape.B, T=shape.T, C=shape.C, NH=shape.NH, D=shape.d_k, V=shape.V, M=shape.T)
        bases = {name.split(" (")[0] for name in self.written}
        for op, spec in O.OPS.items():
            names = {f"k_{op}"} | {fn.__name__ for v, fn in spec.kernels.items() if v != "reference"}
            if names & bases:
                continue
            for name, fn in self.own(op):
                r, arrays = self.draws(name), [a for a in spec.args if a.role != "value"]
                values = {a.name: a.value(sizes) for a in spec.args if a.role == "value"}
                sets = [{a.name: _drawn(self, r, a, a.size(sizes), sizes) for a in arrays} for _ in range(self.sets)]
                for s in sets:  # the embedding backward's order: its ids' positions sorted by token
                    if "order" in s:
                        s["order"] = self.ga.to_gpu(K.token_order(s["idx"].get()))
                nbytes = sum(math.prod(a.size(sizes)) * np.dtype(a.dtype).itemsize * (2 if a.role == "inout" else 1)
                             for a in arrays if a.role != "scratch")

                def launch(stream, *arrays_of_set, spec=spec, fn=fn, values=values, names=[a.name for a in arrays]):
                    args = [dict(zip(names, arrays_of_set), **values)[a.name] for a in spec.args if not a.keyword]
                    kw = {a.name: dict(zip(names, arrays_of_set), **values)[a.name] for a in spec.args if a.keyword}
                    fn(*args, **kw, stream=stream)
                self.add(name, launch, nbytes, spec.work(sizes), [tuple(s[a.name] for a in arrays) for s in sets])


def _drawn(builder, r: Draws, arg, shape, sizes):
    """A device array for arg (a microgpt.ops.Arg) of its kind: outputs empty, ids in the vocabulary, the rest
    random."""
    if arg.role in ("out", "scratch"):
        return builder.empty(*shape, dtype=np.dtype(arg.dtype))
    if arg.kind == "ids":
        return r.ints(sizes["V"], *shape)
    if arg.kind == "pos":
        return builder.ga.to_gpu(np.array([sizes["T"] - 1], np.int32))
    if arg.dtype != "float32":
        return builder.ga.to_gpu((r.rng.random(shape) * (2 if arg.kind == "mask" else 1)).astype(arg.dtype))
    x = r.normal(*shape)
    return builder.ga.to_gpu(np.abs(x) + 0.5 if arg.kind in ("rstd", "positive") else x)
