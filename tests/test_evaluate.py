"""microgpt eval: the loss over every token of a text equals one computed window by window with model.forward,
bits per byte are the summed loss over ln 2 times the text's bytes, and bad input is one line."""
import json
import math

import numpy as np
import pytest

from microgpt import GPT, GPTConfig, ByteTokenizer
from microgpt.cli import main
from microgpt.tokenizer import BPETokenizer

CONFIG = GPTConfig(n_layer=1, n_head=2, d_model=16, block_size=16, vocab_size=257)
TEXT = "Café au lait, naïve façade: ☃ snow. " * 7 + "the end"  # not ASCII: bytes are not characters


@pytest.fixture
def ckpt(tmp_path):
    """A checkpoint of a model a few steps from its random start, so that its losses differ from token to token."""
    model = GPT(CONFIG, seed=1)
    ids = ByteTokenizer().encode(TEXT)
    rows = np.stack([ids[i:i + 17] for i in range(0, 64, 16)])
    for _ in range(3):
        model.zero_grad()
        model.forward(rows[:, :-1], rows[:, 1:])
        model.backward()
        model.step(lr=1e-2)
    path = tmp_path / "model.ckpt"
    model.save(path, extra={"T": 16})
    return path


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(TEXT.encode("utf-8"))
    return path


def evaluate(capsys, *args):
    assert main(["eval", *map(str, args), "--backend", "numpy", "--json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def direct_losses(ckpt, T):
    """Each token's loss in windows of T, by model.forward on one window at a time: the text follows an
    <|endoftext|>, so its first token is predicted from that."""
    model = GPT.load(ckpt)
    tok = ByteTokenizer()
    stream = np.concatenate([[tok.eot], tok.encode(TEXT)])
    total, n = 0.0, len(stream) - 1
    for start in range(0, n, T):
        x, y = stream[start:min(start + T, n)], stream[start + 1:min(start + T, n) + 1]
        total += model.forward(x[None], y[None], return_logits=False)[1] * len(x)
    return total, n


@pytest.mark.parametrize("T, batch", [(16, 8), (16, 3), (5, 1)])
def test_the_loss_is_the_mean_over_every_token_window_by_window(capsys, ckpt, text, T, batch):
    total, n = direct_losses(ckpt, T)
    got = evaluate(capsys, ckpt, "--data", text, "--seq-len", T, "--batch-size", batch)
    n_bytes = len(TEXT.encode("utf-8"))
    assert (got["tokens"], got["bytes"], got["T"], got["windows"]) == (n, n_bytes, T, math.ceil(n / T))
    assert n % T and n_bytes > len(TEXT)  # a last window shorter than T; characters of several bytes
    assert got["loss"] == pytest.approx(total / n, rel=1e-6)
    assert got["bits_per_byte"] == pytest.approx(total / (math.log(2) * n_bytes), rel=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(total / n), rel=1e-6)


def test_the_windows_default_to_the_runs_T(capsys, ckpt, text):
    assert evaluate(capsys, ckpt, "--data", text)["T"] == 16


def test_the_text_report_names_the_figures(capsys, ckpt, text):
    assert main(["eval", str(ckpt), "--data", str(text), "--backend", "numpy", "--no-progress"]) == 0
    line = capsys.readouterr().out.strip()
    got = evaluate(capsys, ckpt, "--data", text)
    assert line.startswith(f"{text}: loss {got['loss']:.4f}, perplexity {got['perplexity']:.3f}, "
                           f"{got['bits_per_byte']:.4f} bits per byte (")


def test_a_bpe_checkpoint_is_scored_in_its_tokens_but_per_byte_of_the_same_text(tmp_path, capsys, corpus, text):
    pytest.importorskip("tokenizers")
    assert main(["tokenizer", "train", "--vocab-size", "300", "--data", corpus, "--out",
                 str(tmp_path / "tok.json"), "--no-progress"]) == 0
    assert main(["train", "--backend", "numpy", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size",
                 "8", "--batch-size", "2", "--steps", "2", "--no-progress", "--sample-tokens", "0", "--tokenizer",
                 str(tmp_path / "tok.json"), "--data", corpus, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    got = evaluate(capsys, tmp_path / "run" / "model.ckpt", "--data", text)
    n_tokens = len(BPETokenizer(tmp_path / "tok.json").encode(TEXT))
    assert got["bytes"] == len(TEXT.encode("utf-8")) > got["tokens"] == n_tokens
    assert got["bits_per_byte"] == pytest.approx(got["loss"] * got["tokens"] / (math.log(2) * got["bytes"]))


@pytest.mark.parametrize("case, message", [
    ("empty data", "--data {tmp}/empty.txt holds no text"),
    ("data not UTF-8", "--data {tmp}/latin1.txt is not UTF-8 text: byte 0xe9 at offset 3"),
    ("missing data", "--data {tmp}/nope.txt: no such file"),
    ("data folder", "--data {tmp} is a folder; expected a UTF-8 text file"),
    ("missing checkpoint", "{tmp}/nope.ckpt' does not exist"),
    ("damaged checkpoint", "is truncated"),
    ("seq len above block size", "--seq-len 17 is above the model's block_size 16"),
    ("batch size 0", "argument --batch-size: must be an integer >= 1, got '0'"),
])
def test_bad_eval_input_is_one_line(tmp_path, capsys, ckpt, text, case, message):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "cut.ckpt").write_bytes(ckpt.read_bytes()[:-10])
    (tmp_path / "cut.ckpt.json").write_bytes((tmp_path / "model.ckpt.json").read_bytes())
    args = {"empty data": ["--data", "{tmp}/empty.txt"], "data not UTF-8": ["--data", "{tmp}/latin1.txt"],
            "missing data": ["--data", "{tmp}/nope.txt"], "data folder": ["--data", "{tmp}"],
            "missing checkpoint": ["--data", str(text)], "damaged checkpoint": ["--data", str(text)],
            "seq len above block size": ["--data", str(text), "--seq-len", "17"],
            "batch size 0": ["--data", str(text), "--batch-size", "0"]}[case]
    path = {"missing checkpoint": tmp_path / "nope.ckpt", "damaged checkpoint": tmp_path / "cut.ckpt"}.get(case, ckpt)
    code = main(["eval", str(path), *(a.format(tmp=tmp_path) for a in args), "--backend", "numpy"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("microgpt: error: "), err
    assert message.format(tmp=tmp_path) in lines[0], lines[0]
