"""The BPE tokenizer (Hugging Face tokenizers, byte-level): trained here on the built-in corpus, it round-trips
any UTF-8 text, streams as it decodes, and plugs in wherever the byte tokenizer does."""
import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from microgpt.data import builtin_corpus  # noqa: E402
from microgpt.tokenizer import BPETokenizer, train_bpe  # noqa: E402


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "corpus.txt"
    path.write_text(builtin_corpus()[:200_000], encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bpe(corpus_file):
    return train_bpe([corpus_file], 400, corpus_file.parent / "tok.json", show_progress=False)


def random_text(rng, n):
    """Letters, spaces, newlines, accents, CJK, emoji, controls: any code point UTF-8 encodes."""
    pools = [range(0x20, 0x7f), range(0xa0, 0x250), range(0x4e00, 0x4e80), range(0x1f600, 0x1f650), [9, 10, 13]]
    return "".join(chr(int(rng.choice(list(pools[rng.integers(len(pools))])))) for _ in range(n))


def test_training_gives_the_vocabulary_asked_for_with_end_of_text(bpe):
    assert bpe.vocab_size == 400 and bpe.decode([bpe.eot]) == "<|endoftext|>"
    assert len(bpe.encode("the keyword arguments of the function")) < 20  # merges learned: fewer than bytes


def test_any_utf8_text_round_trips(bpe, rng):
    for n in (0, 1, 5, 50, 500):
        for _ in range(20):
            text = random_text(rng, n)
            ids = bpe.encode(text)
            assert ids.dtype == np.int32 and bpe.decode(ids) == text, text
    texts = [random_text(rng, 40) for _ in range(30)]
    assert all(np.array_equal(a, bpe.encode(t)) for a, t in zip(bpe.encode_batch(texts), texts))


def test_the_stream_gives_decode_of_the_whole(bpe, rng):
    for _ in range(200):
        ids = bpe.encode(random_text(rng, int(rng.integers(0, 30))))
        if rng.random() < 0.5 and len(ids):  # and ids that need not form UTF-8
            ids = rng.integers(0, bpe.vocab_size, size=len(ids)).astype(np.int32)
        stream, cuts = bpe.stream(), np.sort(rng.integers(0, len(ids) + 1, 3))
        text = "".join(stream.push(part) for part in np.split(ids, cuts)) + stream.flush()
        assert text == bpe.decode(ids)
    with pytest.raises(ValueError, match="token id 400 at index 0, outside"):
        bpe.decode([400])


def test_bad_tokenizers_are_refused_by_name(tmp_path, corpus_file, bpe):
    with pytest.raises(ValueError, match="vocab_size must be an int >= 257"):
        train_bpe([corpus_file], 100, tmp_path / "t.json")
    with pytest.raises(FileNotFoundError, match="tokenizer 'nope.json' does not exist"):
        BPETokenizer("nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a tokenizer.json"):
        BPETokenizer(tmp_path / "bad.json")
    spec = json.loads(open(bpe.path).read())
    spec["added_tokens"] = []
    spec["model"]["vocab"].pop("<|endoftext|>")
    (tmp_path / "no_eot.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="has no <\\|endoftext\\|> token"):
        BPETokenizer(tmp_path / "no_eot.json")


def test_text_pieces_encode_to_the_tokens_of_the_whole(bpe, monkeypatch):
    from microgpt import data
    text = builtin_corpus()[:60_000] + "\n\n  indented\n\tlines\n" * 50
    monkeypatch.setattr(data, "PIECE", 997)  # many cuts, at odd places
    pieces = data.text_pieces(text, 997)
    assert len(pieces) > 30 and "".join(pieces) == text
    whole = bpe.encode(text)
    np.testing.assert_array_equal(np.concatenate(bpe.encode_batch(pieces)), whole)
    path = bpe.path + ".txt"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    np.testing.assert_array_equal(data.load_tokens(path, bpe), whole)


def test_train_and_sample_with_a_bpe_tokenizer_through_the_command(tmp_path, corpus, capsys):
    from microgpt import checkpoint
    from microgpt.cli import main

    from helpers import SMALL_RUN
    tok = tmp_path / "tok.json"
    assert main(["tokenizer", "train", "--vocab-size", "300", "--data", corpus, "--out", str(tok),
                 "--no-progress"]) == 0
    bpe = BPETokenizer(tok)
    out = capsys.readouterr()
    assert f"a byte-level BPE of {bpe.vocab_size} tokens" in out.out and bpe.vocab_size <= 300
    assert (bpe.vocab_size < 300) == ("held merges for" in out.err)  # a short text has fewer merges
    run = tmp_path / "run"
    assert main(["train", *SMALL_RUN, "--data", corpus, "--tokenizer", str(tok), "--steps", "3",
                 "--out", str(run)]) == 0
    capsys.readouterr()
    saved = checkpoint.read(run / "model.ckpt")
    assert saved.config.vocab_size == bpe.vocab_size and saved.extra["tokenizer"] == bpe.record()
    assert main(["sample", str(run / "model.ckpt"), "--backend", "numpy", "--prompt", "the quick ",
                 "--max-new-tokens", "10", "--seed", "1"]) == 0  # the recorded tokenizer
    out = capsys.readouterr().out
    assert out.startswith("the quick ")

    def error(argv):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("microgpt: error: "), err
        return err
    other = tmp_path / "other.json"
    assert main(["tokenizer", "train", "--vocab-size", "280", "--data", corpus, "--out", str(other),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert "is not the tokenizer" in error(["sample", str(run / "model.ckpt"), "--backend", "numpy",
                                              "--tokenizer", str(other)])
    assert "is not the tokenizer" in error(["train", *SMALL_RUN, "--data", corpus, "--resume", "--steps", "5",
                                              "--tokenizer", str(other), "--out", str(run)])
    tok.write_bytes(other.read_bytes())  # the recorded file changed under the run
    assert "has changed since it was trained" in error(["sample", str(run / "model.ckpt"), "--backend", "numpy"])
    assert "does not exist" in error(["train", *SMALL_RUN, "--tokenizer", str(tmp_path / "no.json"),
                                      "--out", str(tmp_path / "r2")])
    assert "argument --vocab-size: must be an integer >= 1, got '0'" in error(["tokenizer", "train", "--vocab-size", "0"])
    assert "vocab_size must be an int >= 257" in error(["tokenizer", "train", "--vocab-size", "100",
                                                        "--data", corpus, "--out", str(tmp_path / "t.json")])


def test_pieces_match_the_whole_where_newline_runs_are_merged(tmp_path, rng):
    """A vocabulary that merges two newlines (and spaces before a newline): a cut after a newline would keep
    such a run whole at a piece's end and encode it otherwise than the whole text does."""
    from microgpt import data
    words = ["alpha", "beta", "gamma", " delta", "\n", "\n\n", "\n\n\n", "  \n", "\r\n", " \n\n", "\t"]
    text = "".join(rng.choice(words) for _ in range(20000))
    (tmp_path / "ws.txt").write_text(text, encoding="utf-8")
    tok = train_bpe([tmp_path / "ws.txt"], 320, tmp_path / "ws.json", show_progress=False)
    assert tok.piecewise and any(tok.decode([i]).isspace() and "\n\n" in tok.decode([i])
                                 for i in range(tok.vocab_size))  # a merged newline run
    whole = tok.encode(text)
    for size in (3, 50, 997):
        pieces = data.text_pieces(text, size)
        assert "".join(pieces) == text
        np.testing.assert_array_equal(np.concatenate(tok.encode_batch(pieces)), whole)


def test_convert_carries_the_tokenizer_and_sample_refuses_a_vocabulary_it_cannot_decode(tmp_path, corpus, capsys):
    import os
    import stat
    from microgpt import GPT, GPTConfig
    from microgpt.cli import main

    from helpers import SMALL_RUN
    tok = tmp_path / "tok.json"
    assert main(["tokenizer", "train", "--vocab-size", "280", "--data", corpus, "--out", str(tok),
                 "--no-progress"]) == 0
    assert main(["train", *SMALL_RUN, "--data", corpus, "--tokenizer", str(tok), "--steps", "2",
                 "--out", str(tmp_path / "run")]) == 0
    assert main(["convert", str(tmp_path / "run" / "model.ckpt"), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == tok.read_bytes()  # beside the weights
    assert stat.S_IMODE(os.stat(tmp_path / "hf" / "model.safetensors").st_mode) == 0o644
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back.ckpt")]) == 0
    capsys.readouterr()
    assert main(["sample", str(tmp_path / "back.ckpt"), "--backend", "numpy", "--prompt", "the ",
                 "--max-new-tokens", "5", "--seed", "0"]) == 0  # the directory's tokenizer, recorded
    assert capsys.readouterr().out.startswith("the ")
    GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, block_size=8, vocab_size=50)).save(tmp_path / "v50.ckpt")
    assert main(["sample", str(tmp_path / "v50.ckpt"), "--backend", "numpy"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size 50 is not the byte tokenizer's 257: give the tokenizer it was trained with" in err
    assert main(["tokenizer", "train", "--data", corpus, "--out", str(tmp_path / "no" / "such" / "t.json")]) == 2
    assert "the folder" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes("café crème ".encode("latin-1") * 200)  # not UTF-8: refused
    assert main(["tokenizer", "train", "--vocab-size", "270", "--data", str(tmp_path / "latin1.txt"),
                 "--out", str(tmp_path / "l.json"), "--no-progress"]) == 2
    assert "latin1.txt is not UTF-8 text: byte 0xe9 at offset 3" in capsys.readouterr().err
    assert not (tmp_path / "l.json").exists()
