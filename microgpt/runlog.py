"""A run's log: log.jsonl in the run folder, one JSON object a line, one line a logged step, so that runs can
be compared and plotted later (microgpt plot) and a resumed run goes on with it.

    {"step": 0, "elapsed": 0.0, "val_loss": 5.61}                        # the evaluation before the first step
    {"step": 1, "elapsed": 0.41, "train_loss": 5.58, "lr": 0.00015, "grad_norm": 2.9, "tok_s": 2493.7}
    {"step": 50, "elapsed": 9.8, "train_loss": 2.41, ..., "val_loss": 2.47}   # a step that was evaluated

step and elapsed (seconds since the run began, carried across resumes) are in every line; train_loss, lr,
grad_norm (the global gradient norm before clipping) and tok_s (tokens/s of the training since the line before,
evaluations and checkpoints left out) in a training step's; val_loss where the step was evaluated; mfu on the GPU.

Each line is one os.write on an O_APPEND descriptor, so a kill leaves whole lines (readers skip a torn last
one, left by a power cut), and the lines reach the disk before each checkpoint does. A resumed run first drops
the lines past its checkpoint's step, so the log goes on from there without a gap or a repeated step.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from . import kernels
from .backend_cuda import CudaBackend
from .kernels import virtual
from .params import num_params

LOG_NAME = "log.jsonl"
LOG_EVERY_HELP = ("a line in --out/log.jsonl every N steps and at each evaluation (default: 1, every step, as nanoGPT "
                  "and llm.c log): step, elapsed, train_loss, lr, grad_norm, tok_s, val_loss where evaluated, and on "
                  "the GPU mfu: 6N + 12 * n_layer * T * d_model FLOPs a token over the GPU's 3xTF32 peak")


class LogError(Exception):
    """A log that cannot be read or holds no line; the message names it."""


def parse_line(line: bytes) -> dict | None:
    """The record a line holds: a JSON object with an integer step; None for anything else (a torn line)."""
    try:
        record = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def read_log(path) -> list:
    """The records of a run's log, in order; path is the run folder or its log file. Lines that hold no record
    (a torn last line) are skipped; LogError where there is no log, or no record in it."""
    p = Path(path)
    file = p / LOG_NAME if p.is_dir() else p
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise LogError(f"{path}: no {LOG_NAME} in it (microgpt train writes one into its --out)" if p.is_dir()
                       else f"{path}: no such run folder or log file") from None
    except OSError as e:
        raise LogError(f"{path}: cannot read {file}: {e.strerror or e}") from None
    records = [r for r in map(parse_line, data.splitlines()) if r is not None]
    if not records:
        raise LogError(f"{path}: {file} holds no log line")
    return records


class RunLog:
    """The log file of one run, appended to by the trainer that holds the run folder (microgpt.runs)."""

    def __init__(self, path):
        self.path = Path(path)
        self.last = None  # the last record kept or appended
        self._fd = None

    def open(self, keep_through: int | None) -> None:
        """Keeps the whole lines of steps up to keep_through (the resumed checkpoint's step; None: a new run keeps
        none), drops everything after the first line that is not one of them, and opens the log to append."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        end, self.last = 0, None
        for line in data.splitlines(keepends=True) if keep_through is not None else []:
            record = parse_line(line) if line.endswith(b"\n") else None
            if record is None or not (self.last is None or self.last["step"] < record["step"]) \
                    or record["step"] > keep_through:
                break
            end, self.last = end + len(line), record
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if end < len(data):
            os.ftruncate(fd, end)
        self._fd = fd

    def append(self, record: dict) -> None:
        """Writes record as one line, whole or not at all (a short write is cut off again)."""
        line = (json.dumps(record, separators=(", ", ": ")) + "\n").encode()
        size = os.fstat(self._fd).st_size
        if os.write(self._fd, line) < len(line):
            os.ftruncate(self._fd, size)
            raise OSError(f"a short write of {self.path} (a full disk?)")
        self.last = record

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---------------------------------------------------------------------------------------------- what a step logs
def flops_per_token(config, T: int) -> int:
    """Model FLOPs of training on one token, nanoGPT's estimate: 6 a weight that multiplies (the position
    embedding is a lookup) for the forward and backward products, and 12 * n_layer * T * d_model for attention."""
    from_weights = 6 * (num_params(config) - config.block_size * config.d_model)
    return from_weights + 12 * config.n_layer * T * config.d_model


def described_peak(arch: str) -> float | None:
    """The 3xTF32 tensor-core FLOP/s that microgpt.kernels.virtual describes for GPUs of arch; None for others."""
    return next((d.peak_flops for d in virtual.DEVICES.values() if d.arch == arch and d.peak_flops), None)


def peak_flops(model) -> float | None:
    """The FLOP/s MFU is relative to: the described 3xTF32 peak of the GPU's architecture (described_peak); None on
    the CPU or a GPU it does not describe."""
    if not isinstance(model.backend, CudaBackend):
        return None
    return described_peak(kernels.engine().arch)


def progress_postfix(loss: float, tok_s: float, mfu: float | None) -> dict:
    """The training progress bar's figures: loss, tokens/s and, on the GPU (mfu not None), the MFU in percent."""
    return {"loss": f"{loss:.3f}", "tok_s": f"{tok_s:,.0f}"} | ({} if mfu is None else {"mfu": f"{100 * mfu:.1f}%"})


def _figure(x: float) -> float:
    """x to 7 significant digits, as a float32 holds it: lines stay short."""
    return float(f"{x:.7g}")


class StepLog:
    """What train_loop writes to the run's log: a line every `every` steps and at every evaluation (the same
    steps whatever the resumes), timed here. log None (another rank of a data-parallel run): writes nothing."""

    def __init__(self, log: RunLog | None, model, T: int, tokens_per_step: int, every: int, world: int = 1):
        self.log, self.model, self.tokens_per_step, self.every = log, model, tokens_per_step, every
        peak = peak_flops(model)
        self.flops_per_s = None if peak is None else peak * world  # every process's GPU
        self.flops_per_token = flops_per_token(model.config, T)
        self.base = (log.last or {}).get("elapsed", 0.0) if log is not None else 0.0
        self.paused = 0.0  # seconds of untimed calls since the line before

    def mfu(self, tok_s: float) -> float | None:
        """The model FLOPs a second at tok_s tokens/s over the GPUs' peak (peak_flops); None on the CPU."""
        return None if self.flops_per_s is None else self.flops_per_token * tok_s / self.flops_per_s

    def untimed(self, fn):
        """fn, the time of its calls left out of tok_s: evaluating and checkpointing are not training."""
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.paused += time.perf_counter() - start
        return call

    def start(self, step: int, val_loss: float) -> None:
        """The clock starts; a new run logs its first evaluation as step 0."""
        self.t0 = self.since_t = time.perf_counter()
        self.since_step, self.paused = step, 0.0
        if step == 0:
            self._write({"step": 0, "elapsed": round(self.base, 3), "val_loss": _figure(val_loss)})

    def step(self, step: int, loss: float, lr: float, val_loss: float | None = None) -> None:
        """Logs training step `step` (1-based) where it is due."""
        if self.log is None or (step % self.every and val_loss is None):
            return
        now = time.perf_counter()
        tok_s = self.tokens_per_step * (step - self.since_step) / max(now - self.since_t - self.paused, 1e-9)
        record = {"step": step, "elapsed": round(self.base + now - self.t0, 3), "train_loss": _figure(loss),
                  "lr": _figure(lr), "grad_norm": _figure(self.model.last_grad_norm), "tok_s": round(tok_s, 1)}
        if self.flops_per_s is not None:
            record["mfu"] = _figure(self.mfu(tok_s))
        if val_loss is not None:
            record["val_loss"] = _figure(val_loss)
        self._write(record)
        self.since_t, self.since_step, self.paused = now, step, 0.0

    def sync(self) -> None:
        """The lines so far to the disk, before a checkpoint is: a checkpoint never runs ahead of its log."""
        if self.log is not None:
            self._guard(self.log.sync)

    def _write(self, record) -> None:
        if self.log is not None:
            self._guard(lambda: self.log.append(record))

    def _guard(self, action) -> None:
        """A log that cannot be written is warned of once and given up: the run and its checkpoints go on."""
        try:
            action()
        except OSError as e:
            print(f"microgpt: warning: could not write {self.log.path}: {e.strerror or e}; training goes on "
                  f"without the log", file=sys.stderr)
            self.log = None
