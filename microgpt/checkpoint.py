"""Checkpoints: the ANDREA binary format, and a JSON sidecar that names the model it belongs to.

The binary file (what microgpt_cuda.cu reads and writes), all little-endian:

    offset 0            int32    step       AdamW steps taken (the t of the bias correction), >= 0
    offset 4            int32    n_params   number of parameters, > 0
    offset 8            float32  weights[n_params]
    offset 8 + 4n       float32  m[n_params]   Adam first moment
    offset 8 + 8n       float32  v[n_params]   Adam second moment
    size                8 + 12 n_params bytes, nothing after

Each vector is in the order of microgpt.params.param_table (wte, wpe, the layers' ln1, attn.qkv,
attn.proj, ln2, mlp.fc, mlp.proj, each weight then bias, then lnf): the one table that defines it.
Gradients are not saved; a loaded model starts with zero gradients.

The sidecar, at `path + ".json"`, holds what the binary cannot say: the config, so GPT.load(path) needs
no guessing (two configs can share n_params: n_head does not change it). Its fields: format
("microgpt-andrea-checkpoint"), version (1), config (GPTConfig.to_dict()), n_params, step (the header's,
to catch a binary and a sidecar from two different saves), dtype "float32", byteorder "little", and
extra (JSON values the caller keeps with the checkpoint, e.g. a BatchSampler's state).

Writing never loses a run: each file goes to a temporary file in the same folder, is flushed to disk, and
is renamed over the old one (the binary first, then the sidecar), so a crash or an error leaves the
previous checkpoint whole and no temporary file behind. Reading checks everything (sidecar, header,
size) and reads all three vectors before returning, so a caller that loads only what read() returned
is never left half-loaded.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from typing import NamedTuple

import numpy as np

from . import _host
from ._host import CheckpointError
from .config import GPTConfig
from .params import num_params

FORMAT = "microgpt-andrea-checkpoint"
VERSION = 1
FILE_DTYPE = np.dtype("<f4")

__all__ = ["Checkpoint", "CheckpointError", "FORMAT", "VERSION", "save", "read", "read_meta", "sidecar_path"]


class Checkpoint(NamedTuple):
    config: GPTConfig
    step: int
    weights: np.ndarray  # float32 (n_params,), in the order of microgpt.params.param_table
    m: np.ndarray
    v: np.ndarray
    extra: dict


def sidecar_path(path) -> str:
    return os.fspath(path) + ".json"


# -- writing --------------------------------------------------------------------------------------

def save(path, config: GPTConfig, step: int, weights, m, v, extra: dict | None = None) -> None:
    """Writes the checkpoint at path and its sidecar at path + '.json', each atomically."""
    name = os.fspath(path)
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    n = num_params(config)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    header = _host.pack_header(int(step), n)
    vectors = [_file_vector(label, a, n) for label, a in (("weights", weights), ("m", m), ("v", v))]
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict of JSON values, got {type(extra).__name__}")
    meta = {"format": FORMAT, "version": VERSION, "config": config.to_dict(), "n_params": n,
            "step": int(step), "dtype": "float32", "byteorder": "little", "extra": extra}
    try:
        sidecar_text = json.dumps(meta, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as e:
        raise TypeError(f"extra must hold only JSON values (dicts, lists, str, finite numbers): {e}") from None
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"checkpoint {name!r}: folder {folder!r} does not exist")
    if os.path.isdir(name):
        raise IsADirectoryError(f"checkpoint {name!r} is a folder")

    mode = _mode_for(name)
    sidecar = sidecar_path(name)
    temps = []
    try:
        bin_tmp = _write_temp_beside(name, mode, lambda fd: _host.write_vectors(fd, header, *vectors, name),
                                     temps)
        data = sidecar_text.encode("utf-8")
        side_tmp = _write_temp_beside(sidecar, mode, lambda fd: _write_bytes(fd, data), temps)
        os.replace(bin_tmp, name)
        temps.remove(bin_tmp)
        os.replace(side_tmp, sidecar)
        temps.remove(side_tmp)
        _sync_folder(folder)
    finally:
        for tmp in temps:  # only after a failure: a temp file that was not renamed into place
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _file_vector(label, a, n):
    """A vector as the bytes of n little-endian float32 (no copy for a float32 array on a little-endian
    host)."""
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise TypeError(f"{label} must be a float array, got dtype {a.dtype}")
    if a.size != n:
        raise ValueError(f"{label} holds {a.size} numbers, the config has n_params={n}")
    return np.ascontiguousarray(a.reshape(-1), dtype=FILE_DTYPE).view(np.uint8)


def _mode_for(path):
    """Keep the permissions of the file being replaced; a new file is rw-r--r-- (mkstemp would make it
    owner-only, which would surprise whoever shares a runs folder)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o644


def _write_temp_beside(path, mode, write, temps):
    """A new temporary file in path's folder (so that renaming it over path is atomic: one file system),
    filled by write(fd) and flushed to disk before anything renames it; its name joins temps at once."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    temps.append(tmp)
    try:
        write(fd)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    return tmp


def _write_bytes(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _sync_folder(folder):
    """Makes the renames themselves durable; some systems (Windows) cannot open a folder, and there the
    rename is as durable as it gets."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- reading --------------------------------------------------------------------------------------

def read_meta(path) -> dict:
    """The checked sidecar of the checkpoint at path, with "config" as a GPTConfig."""
    name = os.fspath(path)
    sidecar = sidecar_path(name)
    try:
        with open(sidecar, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {name!r} has no sidecar {sidecar!r}, which holds its config "
                                f"(a checkpoint is the pair that GPT.save writes)") from None
    try:
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"sidecar {sidecar!r} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"sidecar {sidecar!r} is not a microgpt checkpoint sidecar "
                              f"(expected format {FORMAT!r})")
    version = meta.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"sidecar {sidecar!r} has an invalid version {version!r}")
    if version > VERSION:
        raise CheckpointError(f"sidecar {sidecar!r} has format version {version}, newer than this microgpt "
                              f"reads ({VERSION}); upgrade microgpt")
    try:
        if not isinstance(meta.get("config"), dict):
            raise ValueError("config is missing or not an object")
        config = GPTConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"sidecar {sidecar!r} holds an invalid config: {e}") from None
    n = num_params(config)
    if meta.get("n_params") != n:
        raise CheckpointError(f"sidecar {sidecar!r} says n_params={meta.get('n_params')!r}, its config has {n}")
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"sidecar {sidecar!r} has an invalid step {step!r}")
    extra = meta.get("extra", {})
    if not isinstance(extra, dict):
        raise CheckpointError(f"sidecar {sidecar!r}: extra must be an object, got {type(extra).__name__}")
    return dict(meta, config=config, extra=extra)


def read(path, expect_config: GPTConfig | None = None) -> Checkpoint:
    """Reads and checks the whole checkpoint at path. expect_config, where given, must be the sidecar's
    config. Raises FileNotFoundError (no file, no sidecar) or CheckpointError, naming the file and what
    is wrong, for anything but a whole checkpoint."""
    name = os.fspath(path)
    meta = read_meta(name)
    config = meta["config"]
    if expect_config is not None and config != expect_config:
        raise CheckpointError(f"checkpoint {name!r} is of another model: its config is {config}, "
                              f"expected {expect_config}")
    n = num_params(config)
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"checkpoint {name!r} is not a regular file")
        header = os.read(fd, _host.HEADER_BYTES)
        step, _ = _host.parse_header(header, info.st_size, n, name)
        if step != meta["step"]:
            raise CheckpointError(
                f"checkpoint {name!r} is at step {step} but its sidecar was written at step {meta['step']}: "
                f"the two files come from different saves (a file copied alone, or a save interrupted "
                f"between its two renames)")
        weights, m, v = (np.empty(n, dtype=FILE_DTYPE) for _ in range(3))
        _host.read_vectors(fd, weights.view(np.uint8), m.view(np.uint8), v.view(np.uint8), name)
    finally:
        os.close(fd)
    native = np.dtype(np.float32)
    return Checkpoint(config, step, weights.astype(native, copy=False), m.astype(native, copy=False),
                      v.astype(native, copy=False), meta["extra"])
