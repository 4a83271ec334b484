"""What every command shares in refusing input: UsageError (one line, `microgpt: error: ...`, exit status 2,
printed by microgpt.cli.main) and the checks that more than one command makes: the backend asked for, a
checkpoint read whole, a tokenizer opened or found from a run's record."""
from __future__ import annotations

import sys

from . import checkpoint, kernels
from .tokenizer import BPETokenizer, recorded_tokenizer

EXIT_USAGE = 2


def flag(field: str) -> str:
    """'n_head' -> '--n-head': a field as its flag, in messages and in the parser."""
    return "--" + field.replace("_", "-")


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
