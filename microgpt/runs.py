"""The run folder a trainer writes its checkpoint and its log into: checked before training starts, and held
by one trainer at a time.

    with RunFolder("runs/a") as run:     # refuses a file, a place that cannot be written, a folder in use
        ...                              # run.checkpoint is runs/a/model.ckpt, run.log runs/a/log.jsonl

The hold is an advisory lock (flock) on runs/a/.lock: the kernel drops it when the process ends, however
it ends, so a killed trainer never leaves the folder stuck. The lock file names its holder, so that a
second trainer can say who has the folder.
"""
from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from .checkpoint import sidecar_path
from .runlog import LOG_NAME, RunLog

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; the folder is not guarded there
    fcntl = None

LOCK_NAME = ".lock"
CHECKPOINT_NAME = "model.ckpt"
CHECKPOINT_FILES = (CHECKPOINT_NAME, sidecar_path(CHECKPOINT_NAME))  # the binary and its sidecar


class RunFolderError(Exception):
    """The run folder cannot be used; the message says why, naming it."""


class RunFolder:
    def __init__(self, path):
        self.path = Path(path)
        self.checkpoint = self.path / CHECKPOINT_NAME
        self.log = RunLog(self.path / LOG_NAME)
        self._fd = None

    def __enter__(self) -> "RunFolder":
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def holds_run(self) -> bool:
        """Whether a run's checkpoint (or its sidecar) is here: what a new run would replace."""
        return any(os.path.lexists(self.path / n) for n in CHECKPOINT_FILES)

    def open(self, resumed_step: int | None = None) -> None:
        """Creates the folder if need be, checks that a file can be written in it, takes its lock, and opens its
        log (microgpt.runlog), kept through resumed_step, the step of the checkpoint a resumed run goes on from."""
        where = f"--out {os.fspath(self.path)}"
        if self.path.exists() and not self.path.is_dir():
            raise RunFolderError(f"{where} is a file, not a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=self.path, prefix=".write-check.")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise RunFolderError(f"{where} cannot be written: {e.strerror or e}") from None
        for name in (*CHECKPOINT_FILES, LOCK_NAME, LOG_NAME):
            p = self.path / name
            if os.path.lexists(p) and not p.is_file():
                raise RunFolderError(f"{where}: {p} is {'a folder' if p.is_dir() else 'not a file'}; a run "
                                     f"keeps a file there")
        if fcntl is not None:
            self._lock(where)
        try:
            self.log.open(resumed_step)
        except OSError as e:
            self.close()
            raise RunFolderError(f"{where}: cannot write {LOG_NAME}: {e.strerror or e}") from None

    def _lock(self, where: str) -> None:
        try:
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunFolderError(f"{where}: cannot open {LOCK_NAME}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise RunFolderError(f"{where} is in use by another trainer ({holder}); wait for it to end or "
                                     f"choose another --out") from None
            raise RunFolderError(f"{where}: cannot lock {LOCK_NAME}: {e.strerror}") from None
        os.ftruncate(fd, 0)
        os.write(fd, (f"pid {os.getpid()} on {socket.gethostname()}, started "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)}\n").encode())
        self._fd = fd

    def close(self) -> None:
        self.log.close()
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the descriptor
            self._fd = None


def _read_holder(fd) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
