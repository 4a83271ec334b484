"""ANDREA checkpoints: the byte layout, exact round trips, resumed training, atomic writes and refusals."""
import json
import os
import struct

import numpy as np
import pytest

from microgpt import GPT, GPTConfig, _host, checkpoint
from microgpt.checkpoint import CheckpointError
from microgpt.data import BatchSampler
from microgpt.params import num_params, param_table

CFG = GPTConfig(n_layer=2, n_head=2, d_model=16, block_size=8, vocab_size=23)
N = num_params(CFG)
VECTORS = ("params", "m", "v")


def trained(steps=3, seed=0, cfg=CFG):
    """A model whose weights, Adam m and v and step are all away from their initial values."""
    model = GPT(cfg, seed=seed)
    sampler = BatchSampler(np.arange(500, dtype=np.int32) % cfg.vocab_size, 2, cfg.block_size, seed=seed)
    train(model, sampler, steps)
    return model


def train(model, sampler, steps):
    for _ in range(steps):
        batch = sampler.next()
        model.zero_grad()
        model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
        model.backward()
        model.step(1e-2, weight_decay=0.1, grad_clip=0.5)


def snapshot(model):
    return {w: model.backend.pull(w).copy() for w in VECTORS} | {"step": model.step_count}


def assert_bit_equal(a, b):
    assert a["step"] == b["step"]
    for w in VECTORS:
        assert a[w].dtype == b[w].dtype == np.float32
        np.testing.assert_array_equal(a[w].view(np.uint32), b[w].view(np.uint32), err_msg=w)


# -- the format -------------------------------------------------------------------------------------------

def test_file_is_the_andrea_layout_in_the_param_table_order(tmp_path):
    model = trained()
    path = tmp_path / "run.ckpt"
    model.save(path)
    raw = path.read_bytes()
    assert len(raw) == 8 + 12 * N
    assert struct.unpack("<ii", raw[:8]) == (3, N)
    weights, m, v = (np.frombuffer(raw, dtype="<f4", count=N, offset=8 + 4 * N * i) for i in range(3))
    np.testing.assert_array_equal(weights, model.backend.pull("params"))
    np.testing.assert_array_equal(m, model.backend.pull("m"))
    np.testing.assert_array_equal(v, model.backend.pull("v"))
    state = model.state_dict()
    for spec in param_table(CFG):  # each tensor where the one layout table says
        np.testing.assert_array_equal(weights[spec.offset:spec.offset + spec.size].reshape(spec.shape),
                                      state[spec.name])
    assert param_table(CFG)[0].name == "wte" and param_table(CFG)[-1].name == "lnf.b"


def test_sidecar_holds_the_config_and_format(tmp_path):
    path = tmp_path / "run.ckpt"
    trained().save(path, extra={"note": "hello", "sampler": {"words": [1, 2, 3, 4]}})
    meta = json.loads((tmp_path / "run.ckpt.json").read_text())
    assert meta["format"] == checkpoint.FORMAT and meta["version"] == checkpoint.VERSION
    assert GPTConfig.from_dict(meta["config"]) == CFG
    assert meta["n_params"] == N and meta["step"] == 3
    assert checkpoint.read_meta(path)["extra"] == {"note": "hello", "sampler": {"words": [1, 2, 3, 4]}}


def test_round_trip_is_bit_for_bit(tmp_path):
    model = trained()
    path = tmp_path / "run.ckpt"
    model.save(path)
    loaded = GPT.load(path)
    assert loaded.config == CFG
    assert_bit_equal(snapshot(loaded), snapshot(model))
    assert not loaded.backend.pull("grads").any()
    assert GPT.load(str(path)).step_count == 3  # str and PathLike both


def test_a_float64_model_saves_float32(tmp_path):
    model = GPT(CFG, seed=4, dtype=np.float64)
    model.save(tmp_path / "f64.ckpt")
    loaded = GPT.load(tmp_path / "f64.ckpt")
    np.testing.assert_array_equal(loaded.backend.pull("params"), model.backend.pull("params").astype(np.float32))


def test_save_load_continue_equals_never_stopping(tmp_path):
    tokens = np.arange(3000, dtype=np.int32) * 7 % CFG.vocab_size
    # one run of 6 steps without stopping
    straight = GPT(CFG, seed=1)
    train(straight, BatchSampler(tokens, 2, CFG.block_size, seed=9), 6)
    # the same run stopped after 3 steps, saved with its sampler, loaded into a new process' objects
    first = GPT(CFG, seed=1)
    sampler = BatchSampler(tokens, 2, CFG.block_size, seed=9)
    train(first, sampler, 3)
    first.save(tmp_path / "mid.ckpt", extra={"sampler": sampler.state})
    del first, sampler
    resumed = GPT.load(tmp_path / "mid.ckpt")
    sampler = BatchSampler(tokens, 2, CFG.block_size, seed=12345)
    sampler.state = checkpoint.read_meta(tmp_path / "mid.ckpt")["extra"]["sampler"]
    train(resumed, sampler, 3)
    assert resumed.step_count == 6
    assert_bit_equal(snapshot(resumed), snapshot(straight))


def test_load_checkpoint_restores_an_existing_model_and_returns_extra(tmp_path):
    source = trained(steps=2)
    source.save(tmp_path / "a.ckpt", extra={"epoch": 7})
    target = trained(steps=5, seed=3)
    target.forward(np.zeros((1, 4), dtype=np.int32), np.zeros((1, 4), dtype=np.int32))
    target.backward()  # leaves gradients behind
    assert target.load_checkpoint(tmp_path / "a.ckpt") == {"epoch": 7}
    assert_bit_equal(snapshot(target), snapshot(source))
    assert not target.backend.pull("grads").any()
    with pytest.raises(RuntimeError, match="backward"):  # the old forward's activations are gone
        target.backward()


# -- refusals: each leaves the model as it was ---------------------------------------------------------------

def corrupt_header(step, n):
    def edit(raw):
        return struct.pack("<ii", step, n) + raw[8:]
    return edit


REFUSALS = {
    "truncated inside v": (lambda raw: raw[:-1], CheckpointError, rf"is truncated: expected {8 + 12 * N} bytes, "
                                                                   rf"found {8 + 12 * N - 1}"),
    "truncated inside weights": (lambda raw: raw[:100], CheckpointError, "is truncated"),
    "truncated inside the header": (lambda raw: raw[:5], CheckpointError, "fewer than its 8-byte header"),
    "empty": (lambda raw: b"", CheckpointError, "0 bytes, fewer than its 8-byte header"),
    "trailing bytes": (lambda raw: raw + b"\0" * 4, CheckpointError, "4 bytes past its last vector"),
    "n_params of another model": (lambda raw: struct.pack("<ii", 3, N - 1) + raw[8:-12], CheckpointError,
                                  rf"holds n_params={N - 1} parameters, the config needs {N}"),
    "n_params not matching the size": (corrupt_header(3, N + 5), CheckpointError, "header claims n_params"),
    "negative step": (corrupt_header(-1, N), CheckpointError, "impossible header: step=-1"),
    "negative n_params": (corrupt_header(3, -N), CheckpointError, f"impossible header: step=3, n_params={-N}"),
    "zero n_params": (corrupt_header(3, 0), CheckpointError, "n_params=0"),
    "absurd n_params": (corrupt_header(3, 2 ** 31 - 1), CheckpointError, "is not an ANDREA checkpoint"),
    "not a checkpoint (text)": (lambda raw: b"hello, world: this is a text file\n" * 10, CheckpointError,
                                "is not an ANDREA checkpoint"),
    "step from another save": (corrupt_header(2, N), CheckpointError, "does not match the sha256"),
    "a flipped byte in the weights": (lambda raw: raw[:100] + bytes([raw[100] ^ 1]) + raw[101:], CheckpointError,
                                      "does not match the sha256 that its sidecar .* records: the file is corrupt"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refuses_a_broken_binary_and_leaves_the_model_untouched(tmp_path, case):
    edit, error, message = REFUSALS[case]
    path = tmp_path / "bad.ckpt"
    trained().save(path)
    path.write_bytes(edit(path.read_bytes()))
    victim = trained(steps=4, seed=7)
    before = snapshot(victim)
    with pytest.raises(error, match=message) as info:
        victim.load_checkpoint(path)
    assert "bad.ckpt" in str(info.value)  # the error names the file
    assert_bit_equal(snapshot(victim), before)
    with pytest.raises(error, match=message):
        GPT.load(path)


def sidecar_edit(change):
    def edit(path):
        side = tmp_sidecar(path)
        meta = json.loads(side.read_text())
        side.write_text(change(meta) if callable(change) else change)
    return edit


def tmp_sidecar(path):
    return path.with_name(path.name + ".json")


SIDECAR_REFUSALS = {
    "missing sidecar": (lambda p: tmp_sidecar(p).unlink(), FileNotFoundError, "has no sidecar"),
    "missing binary": (lambda p: p.unlink(), FileNotFoundError, "bad.ckpt' does not exist \\(no such file\\)"),
    "sidecar not JSON": (sidecar_edit("{ not json"), CheckpointError, "is not valid JSON"),
    "sidecar of something else": (sidecar_edit(lambda m: json.dumps({"hello": 1})), CheckpointError,
                                  "not a microgpt checkpoint sidecar"),
    "sidecar from the future": (sidecar_edit(lambda m: json.dumps(m | {"version": 99})), CheckpointError,
                                "format version 99, newer"),
    "sidecar with a bad config": (sidecar_edit(lambda m: json.dumps(m | {"config": m["config"] | {"n_head": 5}})),
                                  CheckpointError, "invalid config: GPTConfig.n_head=5 must divide"),
    "sidecar without a config": (sidecar_edit(lambda m: json.dumps({k: v for k, v in m.items() if k != "config"})),
                                 CheckpointError, "invalid config"),
    "sidecar n_params wrong": (sidecar_edit(lambda m: json.dumps(m | {"n_params": 5})), CheckpointError,
                               "says n_params=5"),
    "sidecar with a negative step": (sidecar_edit(lambda m: json.dumps(m | {"step": -2})), CheckpointError,
                                     "invalid step -2"),
    "sidecar config edited, same n_params": (sidecar_edit(lambda m: json.dumps(
        m | {"config": m["config"] | {"n_head": 4}})), CheckpointError, "does not match its checksum"),
    "sidecar extra edited": (sidecar_edit(lambda m: json.dumps(m | {"extra": {"T": 4}})), CheckpointError,
                             "does not match its checksum"),
    "sidecar checksum removed": (sidecar_edit(lambda m: json.dumps({k: v for k, v in m.items() if k != "checksum"})),
                                 CheckpointError, "does not match its checksum"),
}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("vector", ["params", "m", "v"])
def test_save_refuses_non_finite_values_and_keeps_the_checkpoint_in_place(tmp_path, bad, vector):
    path = tmp_path / "run.ckpt"
    model = trained()
    model.save(path)
    before = path.read_bytes()
    spoiled = model.backend.pull(vector).copy()
    at = param_table(CFG)[3]
    spoiled[at.offset + 1] = bad
    model.backend.push(vector, spoiled)
    label = {"params": "weights"}.get(vector, vector)
    with pytest.raises(checkpoint.NonFiniteError, match=rf"{label} hold non-finite values .* in {at.name}"):
        model.save(path)
    assert path.read_bytes() == before and GPT.load(path).step_count == model.step_count


def test_read_refuses_a_checkpoint_holding_nan_even_with_matching_checksums(tmp_path):
    path = tmp_path / "nan.ckpt"
    trained().save(path)
    data = bytearray(path.read_bytes())
    data[8 + 4 * 5: 8 + 4 * 6] = struct.pack("<f", float("nan"))  # weight 5: in wte
    path.write_bytes(bytes(data))
    side = tmp_path / "nan.ckpt.json"
    meta = json.loads(side.read_text())
    meta["sha256"] = __import__("hashlib").sha256(bytes(data)).hexdigest()
    meta["checksum"] = checkpoint.checksum(meta)
    side.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="weights hold non-finite values .* in wte"):
        GPT.load(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_load_state_dict_refuses_non_finite_weights_and_loads_nothing(bad):
    model = trained()
    before = snapshot(model)
    state = model.state_dict()
    state["h.1.mlp.fc.w"][2, 3] = bad
    with pytest.raises(ValueError, match=r"state_dict\['h.1.mlp.fc.w'\] holds non-finite values"):
        model.load_state_dict(state)
    assert_bit_equal(snapshot(model), before)


@pytest.mark.parametrize("case", list(SIDECAR_REFUSALS))
def test_refuses_a_broken_or_missing_sidecar_and_leaves_the_model_untouched(tmp_path, case):
    edit, error, message = SIDECAR_REFUSALS[case]
    path = tmp_path / "bad.ckpt"
    trained().save(path)
    edit(path)
    victim = trained(steps=4, seed=7)
    before = snapshot(victim)
    with pytest.raises(error, match=message):
        victim.load_checkpoint(path)
    assert_bit_equal(snapshot(victim), before)
    with pytest.raises(error, match=message):
        GPT.load(path)


def test_refuses_a_checkpoint_of_another_config_with_the_same_size(tmp_path):
    other = GPTConfig(n_layer=2, n_head=4, d_model=16, block_size=8, vocab_size=23)  # n_head moves no sizes
    assert num_params(other) == N
    trained(cfg=other).save(tmp_path / "other.ckpt")
    victim = trained(steps=4, seed=7)
    before = snapshot(victim)
    with pytest.raises(CheckpointError, match="is of another model"):
        victim.load_checkpoint(tmp_path / "other.ckpt")
    assert_bit_equal(snapshot(victim), before)
    assert GPT.load(tmp_path / "other.ckpt").config == other  # and GPT.load takes the sidecar's config


def test_refuses_a_folder(tmp_path):
    (tmp_path / "dir.ckpt").mkdir()
    trained().save(tmp_path / "x.ckpt")
    os.replace(tmp_path / "x.ckpt.json", tmp_path / "dir.ckpt.json")
    with pytest.raises(CheckpointError, match="not a regular file"):
        GPT.load(tmp_path / "dir.ckpt")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        trained().save(tmp_path / "dir.ckpt")


# -- writing never loses the previous checkpoint -------------------------------------------------------------

def files(folder):
    return sorted(os.listdir(folder))


def test_a_failure_mid_write_leaves_the_old_checkpoint_whole_and_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    old_model = trained(steps=2)
    old_model.save(path)
    old_bytes, old_side = path.read_bytes(), tmp_sidecar(path).read_bytes()

    def disk_full(fd, header, weights, m, v, name):
        os.write(fd, bytes(header) + bytes(weights)[:1000])  # part of the new file, then the disk fills
        raise OSError(28, "No space left on device", name)

    monkeypatch.setattr(_host, "write_vectors", disk_full)
    with pytest.raises(OSError, match="No space left"):
        trained(steps=5).save(path)
    assert path.read_bytes() == old_bytes and tmp_sidecar(path).read_bytes() == old_side
    assert files(tmp_path) == ["run.ckpt", "run.ckpt.json"]
    assert_bit_equal(snapshot(GPT.load(path)), snapshot(old_model))


def test_an_interrupt_while_writing_the_sidecar_leaves_the_old_pair(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    trained(steps=2).save(path)
    old_bytes, old_side = path.read_bytes(), tmp_sidecar(path).read_bytes()

    def interrupted(fd, data):
        os.write(fd, data[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trained(steps=5).save(path)
    assert path.read_bytes() == old_bytes and tmp_sidecar(path).read_bytes() == old_side
    assert files(tmp_path) == ["run.ckpt", "run.ckpt.json"]


def test_a_backend_failure_before_writing_touches_nothing(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    model = trained(steps=2)
    model.save(path)
    old_bytes = path.read_bytes()

    def broken_pull(which):
        raise RuntimeError(f"device lost while pulling {which}")

    monkeypatch.setattr(model.backend, "pull", broken_pull)
    with pytest.raises(RuntimeError, match="device lost"):
        model.save(path)
    assert path.read_bytes() == old_bytes and files(tmp_path) == ["run.ckpt", "run.ckpt.json"]


def test_save_replaces_and_keeps_the_file_mode(tmp_path):
    path = tmp_path / "run.ckpt"
    trained(steps=1).save(path)
    os.chmod(path, 0o600)
    trained(steps=2).save(path)
    assert GPT.load(path).step_count == 2
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert files(tmp_path) == ["run.ckpt", "run.ckpt.json"]


@pytest.mark.parametrize("extra, error, message", [
    ({"x": object()}, TypeError, "extra must hold only JSON values"),
    ({"x": float("nan")}, TypeError, "extra must hold only JSON values"),
    ([1, 2], TypeError, "extra must be a dict"),
])
def test_save_refuses_extra_that_is_not_json_and_writes_nothing(tmp_path, extra, error, message):
    with pytest.raises(error, match=message):
        trained(steps=1).save(tmp_path / "x.ckpt", extra=extra)
    assert files(tmp_path) == []


def test_save_refuses_a_missing_folder_and_a_step_past_int32(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        trained(steps=1).save(tmp_path / "nope" / "x.ckpt")
    model = trained(steps=1)
    model.step_count = 2 ** 31
    with pytest.raises(ValueError, match="step must be in"):
        model.save(tmp_path / "x.ckpt")
    assert files(tmp_path) == []


def test_checkpoint_save_checks_vector_sizes(tmp_path):
    with pytest.raises(ValueError, match=f"m holds {N - 1} numbers, the config has n_params={N}"):
        checkpoint.save(tmp_path / "x.ckpt", CFG, 0, np.zeros(N), np.zeros(N - 1), np.zeros(N))
    assert files(tmp_path) == []


def test_read_vectors_reports_a_file_that_ends_early(tmp_path):
    # a file that shrinks between the size check and the read: the Cython reader still refuses it
    path = tmp_path / "short.bin"
    path.write_bytes(bytes(range(10)))
    weights, m, v = (np.zeros(8, dtype=np.uint8) for _ in range(3))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(CheckpointError, match="ended inside its m vector"):
            _host.read_vectors(fd, weights, m, v, str(path))
    finally:
        os.close(fd)
    assert weights.tolist() == list(range(8))
