"""A kill at any instant of a save leaves a checkpoint that loads, the old one or the new one, and a reader
beside a saving process never sees half of a save.

The kills are not left to timing: a child process saves with every disk operation of checkpoint._fs
(each write, fsync, close, chmod, rename, unlink) counted, and SIGKILLs itself just before or just after
the k-th one, for every k."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from microgpt import checkpoint
from microgpt.config import GPTConfig
from microgpt.params import num_params

CFG = GPTConfig(n_layer=1, n_head=2, d_model=8, block_size=4, vocab_size=11)
N = num_params(CFG)

CHILD = r"""
import os, signal, sys
import numpy as np
from microgpt import checkpoint
from microgpt.config import GPTConfig
from microgpt.params import num_params

path, step, k, when = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = GPTConfig(n_layer=1, n_head=2, d_model=8, block_size=4, vocab_size=11)
count = 0

def counted(fn):
    def op(*args, **kwargs):
        global count
        count += 1
        if count == k and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = fn(*args, **kwargs)
        if count == k and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return op

for name, fn in list(vars(checkpoint._fs).items()):
    setattr(checkpoint._fs, name, counted(fn))
n = num_params(cfg)
checkpoint.save(path, cfg, step, np.full(n, step, np.float32), np.full(n, -step, np.float32),
                np.full(n, 0.5 * step, np.float32), extra={"step": step})
print(count)
"""


def save(path, step):
    checkpoint.save(path, CFG, step, np.full(N, step, np.float32), np.full(N, -step, np.float32),
                    np.full(N, 0.5 * step, np.float32), extra={"step": step})


def child(path, step, k=0, when="before"):
    return subprocess.run([sys.executable, "-c", CHILD, str(path), str(step), str(k), when], capture_output=True,
                          text=True, timeout=60)


def assert_whole(path, steps):
    """The checkpoint at path loads, is one of `steps`, and every part of it belongs to that step."""
    ckpt = checkpoint.read(path)
    assert ckpt.step in steps, (ckpt.step, steps)
    s = ckpt.step
    assert (ckpt.weights == s).all() and (ckpt.m == -s).all() and (ckpt.v == 0.5 * s).all()
    assert ckpt.extra == {"step": s}
    return s


def operations(tmp_path):
    path = tmp_path / "count" / "run.ckpt"
    path.parent.mkdir()
    save(path, 1)
    res = child(path, 2)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def test_a_kill_at_every_disk_operation_of_a_save_leaves_a_loadable_checkpoint(tmp_path):
    n_ops = operations(tmp_path)
    assert n_ops >= 10  # mkstemp, write, fsync, close, chmod for each file, two renames, the folder's fsync
    seen = set()
    for k in range(1, n_ops + 1):
        for when in ("before", "after"):
            folder = tmp_path / f"{k}-{when}"
            folder.mkdir()
            path = folder / "run.ckpt"
            save(path, 1)
            res = child(path, 2, k, when)
            assert res.returncode == -signal.SIGKILL, (k, when, res.returncode, res.stderr)
            seen.add(assert_whole(path, {1, 2}))
            # killed again, at the same point of the next save, on top of what the first kill left
            res = child(path, 3, k, when)
            assert res.returncode == -signal.SIGKILL, (k, when, res.stderr)
            assert_whole(path, {1, 2, 3})
            save(path, 4)  # the next save in a live process completes, and sweeps the dead ones' temp files
            assert assert_whole(path, {4}) == 4
            assert sorted(os.listdir(folder)) == ["run.ckpt", "run.ckpt.json"], (k, when, os.listdir(folder))
    assert seen == {1, 2}  # kills before the commit keep the old checkpoint, after it the new one


def test_between_the_two_renames_the_old_binary_loads_with_the_new_sidecars_previous(tmp_path):
    path = tmp_path / "run.ckpt"
    save(path, 1)
    old_binary = path.read_bytes()
    save(path, 2)
    path.write_bytes(old_binary)  # the sidecar of step 2, the binary of step 1: a save killed mid-way
    assert assert_whole(path, {1}) == 1
    meta = json.loads((tmp_path / "run.ckpt.json").read_text())
    assert meta["step"] == 2 and meta["previous"]["step"] == 1 and "previous" not in meta["previous"]


def test_the_sidecar_records_the_sha256_of_the_binary(tmp_path):
    path = tmp_path / "run.ckpt"
    save(path, 5)
    meta = json.loads((tmp_path / "run.ckpt.json").read_text())
    assert meta["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()  # what sha256sum prints
    assert meta["size"] == path.stat().st_size and meta["version"] == 3


def test_a_reader_beside_a_saving_process_never_sees_half_a_save(tmp_path):
    path = tmp_path / "run.ckpt"
    save(path, 1)
    done = threading.Event()
    errors = []

    def saver():
        try:
            for step in range(2, 60):
                save(path, step)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()
    t = threading.Thread(target=saver)
    t.start()
    reads = 0
    while not done.is_set():
        assert_whole(path, set(range(1, 60)))
        reads += 1
    t.join()
    assert not errors and reads > 0
    assert assert_whole(path, {59}) == 59


def test_a_version_1_checkpoint_still_loads(tmp_path):
    path = tmp_path / "old.ckpt"
    save(path, 3)
    side = tmp_path / "old.ckpt.json"
    meta = json.loads(side.read_text())
    side.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("sha256", "size", "previous")}
                               | {"version": 1}))
    assert assert_whole(path, {3}) == 3
    save(path, 4)  # and the next save writes the current version over it
    assert json.loads(side.read_text())["version"] == checkpoint.VERSION and assert_whole(path, {4}) == 4


@pytest.mark.parametrize("missing", ["binary", "both"])
def test_a_path_that_does_not_exist_says_so(tmp_path, missing):
    path = tmp_path / "run.ckpt"
    if missing == "binary":
        save(path, 1)
        path.unlink()
    with pytest.raises(FileNotFoundError, match=r"run.ckpt' does not exist \(no such file\)"):
        checkpoint.read(path)
