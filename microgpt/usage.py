"""What every command shares in refusing input: UsageError (one line, `microgpt: error: ...`, exit status 2,
printed by microgpt.cli.main) and the checks that more than one command makes: the backend asked for, a
checkpoint read whole, a tokenizer opened or found from a run's record, a --data file read."""
from __future__ import annotations

import sys
from pathlib import Path

from . import checkpoint, kernels
from .config import GPTConfig
from .data import NotText, read_text
from .model import footprint
from .params import num_params
from .tokenizer import BPETokenizer, recorded_tokenizer

EXIT_USAGE = 2


def flag(field: str) -> str:
    """'n_head' -> '--n-head': a field as its flag, in messages and in the parser."""
    return "--" + field.replace("_", "-")


def typed(args, fields) -> str:
    """The flags of these fields that the user gave, as typed: '--batch-size 4 --n-layer 2'."""
    return " ".join(f"{flag(k)} {getattr(args, k)}" for k in fields if getattr(args, k, None))


class UsageError(Exception):
    """What the user typed cannot run; printed as one line, exit status 2."""


class PeerFailed(RuntimeError):
    """Another process of a data-parallel run stopped (microgpt.distributed): this one stops too, in one line."""


def cuda_available() -> tuple[bool, str]:
    """(True, device name) where PyCUDA and a CUDA device are there, else (False, the reason)."""
    try:
        return True, kernels.device_summary()
    except kernels.NoDevice as e:
        return False, e.reason


def pick_backend(requested: str, quiet: bool = False) -> str:
    ok, why = (True, "") if requested == "numpy" else cuda_available()
    if requested == "cuda" and not ok:
        raise UsageError(f"--backend cuda: no usable CUDA GPU here ({why}); install PyCUDA with "
                         f"pip install 'microgpt[cuda]' on a machine with a GPU, or use --backend numpy")
    if requested != "auto":
        return requested
    if not ok and not quiet:
        print(f"no GPU ({why}): training on the numpy backend, a small model on the CPU", file=sys.stderr)
    return "cuda" if ok else "numpy"


def check_memory(config: GPTConfig, backend: str, flags: str, B: int, T: int, training: bool = True,
                 held: int = 0) -> None:
    """Refuses, before anything is allocated, what cannot fit in the memory free on the device or host: the
    weights (and for training their gradients and Adam moments), one pass's buffers at (B, T) (model.footprint;
    for sampling, the key-value cache too) and `held` bytes more. flags: what the user typed, for the message."""
    vectors = 4 if training else 1
    floats = vectors * num_params(config) + footprint(config, B, T, backend == "cuda", backward=training)
    if not training:
        floats += 2 * config.n_layer * B * config.block_size * config.d_model
    need = 4 * floats + held
    free = kernels.memory_free() if backend == "cuda" else host_memory_free()
    if free is not None and need > free:
        raise UsageError(f"{flags or 'the default sizes'}: a {num_params(config) / 1e6:,.1f}M-parameter model at "
                         f"B={B}, T={T} needs about {need / 2**30:,.1f} GiB, and {free / 2**30:,.1f} GiB is free "
                         f"{'on the GPU' if backend == 'cuda' else 'on this machine'}: lower the batch or the model's "
                         f"sizes")


def host_memory_free():
    """Bytes of memory available to a new allocation (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def read_checkpoint(path, flag=None):
    """The whole checkpoint at path, checked; a file that is missing or not whole is a usage error."""
    try:
        return checkpoint.read(path)
    except (OSError, checkpoint.CheckpointError) as e:
        raise UsageError(f"{flag}: {e}" if flag else str(e)) from None


def open_tokenizer(path, flag="--tokenizer"):
    try:
        return BPETokenizer(path)
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(f"{flag} {path}: {e}") from None


def run_tokenizer(given, extra: dict, where: str, resume: bool):
    """The tokenizer of a saved run (tokenizer.recorded_tokenizer), --tokenizer where given."""
    try:
        return recorded_tokenizer(extra.get("tokenizer"), given, where, resume)
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(str(e)) from None


def read_data(path, read=read_text):
    """read(path) of the UTF-8 text file that --data names; each reason it cannot be read is a usage error."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"--data {path}: no such file")
    if not p.is_file():
        raise UsageError(f"--data {path} is {'a folder' if p.is_dir() else 'not a regular file'}; expected a UTF-8 "
                         f"text file")
    try:
        return read(path)
    except OSError as e:
        raise UsageError(f"--data {path}: {e.strerror or e}") from None
    except NotText as e:
        raise UsageError(f"--data {e}") from None
