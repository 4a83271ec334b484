"""A plan of launches as one CUDA graph: captured once on a stream, then launched with one driver call.

    step = Graph(plan, stream, "decode")    # captures replay(plan, stream): nothing runs yet
    step.launch(stream)                      # every launch of the plan, in order, on stream
    fwd = Pass(plan, "forward")              # the model's passes: a Graph at the first launch, else replay
    fwd.launch(stream)

A decode step at B=1 is about a hundred kernels of a few microseconds each; queued one by one from Python they
cost more than they run. A graph costs one call, and on the GPU its launches follow each other more closely
than a stream's. PyCUDA has no binding for stream capture, so the driver's graph calls go through ctypes
(microgpt.kernels.driver), on the stream and the primary context PyCUDA made. Where the driver or the stream
handle is missing, or the capture fails, Graph raises GraphUnavailable and Pass replays the plan instead.
"""
from __future__ import annotations

import ctypes

from .driver import GraphUnavailable, check, driver
from .runtime import SYNC_EVERY_LAUNCH, Plan, release_at_exit, replay

_CAPTURE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' CUDA calls are not disturbed


class Graph:
    """plan captured on stream (the launches' arguments and order fixed, as replay runs them)."""

    def __init__(self, plan: Plan, stream, phase: str):
        self._graph = self._exec = None
        if SYNC_EVERY_LAUNCH:
            raise GraphUnavailable("MICROGPT_SYNC=1 synchronises after every launch, which a capture cannot")
        handle = getattr(stream, "handle", None)
        if not handle:
            raise GraphUnavailable("the stream has no handle (a graph is captured on a stream of its own)")
        lib = driver()
        self.phase, self._stream = phase, ctypes.c_void_p(handle)
        check(lib.cuStreamBeginCapture_v2(self._stream, _CAPTURE_THREAD_LOCAL), f"capturing the {phase} pass",
              GraphUnavailable)
        self._graph = ctypes.c_void_p()
        try:
            replay(plan, stream, phase)
        finally:  # the stream leaves capture mode whatever happened, or every later launch on it fails
            rc = lib.cuStreamEndCapture(self._stream, ctypes.byref(self._graph))
            if not self._graph.value:
                self._graph = None
        check(rc, f"capturing the {phase} pass", GraphUnavailable)
        execute = ctypes.c_void_p()
        check(lib.cuGraphInstantiateWithFlags(ctypes.byref(execute), self._graph, 0),
              f"instantiating the {phase} graph", GraphUnavailable)
        self._exec = execute
        release_at_exit(self)  # destroyed while the context is still there

    def launch(self, stream) -> None:
        """Queues the whole plan on stream (the one it was captured on)."""
        if stream.handle != self._stream.value:
            raise ValueError("a Graph launches on the stream it was captured on")
        check(driver().cuGraphLaunch(self._exec, self._stream), f"the {self.phase} graph")

    def release(self) -> None:
        if self._exec is not None:
            driver().cuGraphExecDestroy(self._exec)
            self._exec = None
        if self._graph is not None:
            driver().cuGraphDestroy(self._graph)
            self._graph = None

    def __del__(self):
        self.release()


class Pass:
    """A recorded plan run as one CUDA graph, captured at its first launch: a model's forward, backward or decode
    step. Where this process cannot capture one (`unavailable` says why), the plan is replayed launch by launch:
    the same launches in the same order, so the same bits, only with the GPU's gap between launches and Python's
    time to queue each."""

    def __init__(self, plan: Plan, phase: str):
        self.plan, self.phase = plan, phase
        self.graph: Graph | None = None
        self.unavailable: str | None = None

    def launch(self, stream) -> None:
        """Every launch of the plan, in order, on stream (the one of its first launch, where it is a graph)."""
        if self.graph is None and self.unavailable is None:
            try:
                self.graph = Graph(self.plan, stream, self.phase)
            except GraphUnavailable as e:
                self.unavailable = str(e)
        if self.graph is not None:
            self.graph.launch(stream)
        else:
            replay(self.plan, stream, self.phase)
