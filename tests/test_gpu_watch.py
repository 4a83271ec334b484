"""Watching a run on the GPU: eval's figures are the numpy backend's (relative 1e-5) in every variant, and the
run's log holds its MFU."""
import json

import numpy as np
import pytest

from microgpt import GPT, ByteTokenizer, GPTConfig, runlog
from microgpt.cli import main
from microgpt.data import builtin_corpus
from microgpt.evaluate import score
from microgpt.ops import VARIANTS

from helpers import record

pytestmark = pytest.mark.gpu

CONFIG = GPTConfig(n_layer=2, n_head=4, d_model=64, block_size=32, vocab_size=257)
TEXT = builtin_corpus()[:6000] + " naïve ☃"  # 6011 bytes: the last window is shorter


def close(what, got, want):
    err = abs(got - want) / abs(want)
    record("cuda vs numpy backend", what, err)
    assert err <= 1e-5, f"{what}: {got} on cuda, {want} on numpy (relative error {err:.1e})"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A checkpoint some steps from its random start (trained on numpy), and the text to score, in a file."""
    folder = tmp_path_factory.mktemp("eval")
    model = GPT(CONFIG, seed=5)
    ids = ByteTokenizer().encode(TEXT)
    rows = np.stack([ids[i:i + 33] for i in range(0, 33 * 8, 33)])
    for _ in range(5):
        model.zero_grad()
        model.forward(rows[:, :-1], rows[:, 1:])
        model.backward()
        model.step(lr=1e-2)
    model.save(folder / "model.ckpt")
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    return folder / "model.ckpt"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_eval_on_the_gpu_gives_the_numpy_backends_figures(ckpt, variant):
    tok = ByteTokenizer()
    want = score(GPT.load(ckpt), tok, TEXT, CONFIG.block_size, batch_size=8)
    got = score(GPT.load(ckpt, backend="cuda", variant=variant), tok, TEXT, CONFIG.block_size, batch_size=8)
    assert (got.tokens, got.bytes, got.windows) == (want.tokens, want.bytes, want.windows)
    close(f"eval loss ({variant})", got.loss, want.loss)
    close(f"eval bits per byte ({variant})", got.bits_per_byte, want.bits_per_byte)


def test_the_eval_command_on_the_gpu_prints_the_numpy_backends_figures(ckpt, capsys):
    figures = {}
    for backend in ("numpy", "cuda"):
        assert main(["eval", str(ckpt), "--data", str(ckpt.parent / "text.txt"), "--backend", backend, "--json",
                     "--no-progress", "--batch-size", "5"]) == 0
        figures[backend] = json.loads(capsys.readouterr().out)
    for key in ("loss", "perplexity", "bits_per_byte"):
        close(f"eval command {key}", figures["cuda"][key], figures["numpy"][key])


def test_the_log_of_a_gpu_run_holds_its_mfu(tmp_path, corpus, capsys):
    assert main(["train", "--n-layer", "2", "--n-head", "4", "--d-model", "64", "--block-size", "32", "--steps", "6",
                 "--batch-size", "4", "--no-progress", "--sample-tokens", "0", "--data", corpus,
                 "--out", str(tmp_path / "run")]) == 0
    records = runlog.read_log(tmp_path / "run")[1:]
    peak = runlog.peak_flops(GPT(CONFIG, backend="cuda"))
    if peak is None:  # a GPU kernels.virtual does not describe: no peak to be relative to
        assert not any("mfu" in r for r in records)
        return
    per_token = runlog.flops_per_token(CONFIG, 32)
    for r in records:
        assert 0 < r["mfu"] < 1 and r["mfu"] == pytest.approx(per_token * r["tok_s"] / peak, rel=1e-3)
