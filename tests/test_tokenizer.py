"""ByteTokenizer: exact round trips, end-of-text, broken UTF-8 and the errors of bad ids."""
import numpy as np
import pytest

from microgpt import ByteTokenizer

TOK = ByteTokenizer()
MARK = ByteTokenizer.eot_text


def random_text(rng, n):
    """n code points from every plane, surrogates excluded (no UTF-8 text holds one)."""
    kind = rng.integers(4)
    top = [0x80, 0x100, 0x10000, 0x110000][kind]  # ASCII, Latin-1, BMP, all planes: each str storage kind
    cps = rng.integers(0, top, size=n)
    cps = np.where((cps >= 0xD800) & (cps <= 0xDFFF), cps - 0x800, cps)
    return "".join(map(chr, cps))


def test_vocabulary():
    assert TOK.vocab_size == 257 and TOK.eot == 256


def test_round_trip_on_many_random_texts(rng):
    for _ in range(300):
        text = random_text(rng, int(rng.integers(0, 200)))
        ids = TOK.encode(text)
        assert ids.dtype == np.int32 and ids.ndim == 1
        np.testing.assert_array_equal(ids, np.frombuffer(text.encode("utf-8"), dtype=np.uint8))
        assert TOK.decode(ids) == text


def test_long_text_with_sparse_non_ascii(rng):
    # the encoder copies all-ASCII blocks in bulk: non-ASCII characters at every offset of a block
    chars = rng.integers(32, 127, size=5000)
    text = list(map(chr, chars))
    for i in rng.choice(len(text), size=60, replace=False):
        text[i] = chr(int(rng.choice([0xE9, 0x2603, 0x1F600, 0x10FFFF])))
    text = "".join(text)
    np.testing.assert_array_equal(TOK.encode(text), np.frombuffer(text.encode("utf-8"), dtype=np.uint8))
    assert TOK.decode(TOK.encode(text)) == text


@pytest.mark.parametrize("text", [
    "", "\x00", "a\x00b\x00", "plain ASCII", "naïve café", "\x80\xff", "☃ snow", "\uffff", "\ud7ff\ue000",
    "😀 grin", "\U0010ffff", "\U00010000", "mixed: a é ☃ 😀 \x00 end", "".join(map(chr, range(256))),
])
def test_round_trip_edge_texts(text):
    ids = TOK.encode(text)
    assert ids.tolist() == list(text.encode("utf-8"))
    assert TOK.decode(ids) == text


def test_encode_never_produces_end_of_text(rng):
    assert all(TOK.encode(random_text(rng, 500)).max(initial=0) < 256 for _ in range(20))


@pytest.mark.parametrize("text, index", [("ab\ud800", 2), ("\udfff", 0), ("😀 x \udc80 y", 4)])
def test_encode_refuses_lone_surrogates(text, index):
    with pytest.raises(UnicodeEncodeError, match=f"position {index}: text holds a lone surrogate"):
        TOK.encode(text)


def test_encode_refuses_non_str():
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        TOK.encode(b"bytes")


def test_decode_writes_end_of_text_as_its_marker():
    ids = np.concatenate([TOK.encode("first"), [TOK.eot], TOK.encode("sécond"), [TOK.eot, TOK.eot]])
    assert TOK.decode(ids) == f"first{MARK}sécond{MARK}{MARK}"
    assert TOK.decode([TOK.eot]) == MARK


def test_decode_turns_broken_utf8_into_replacement_characters(rng):
    for _ in range(300):
        raw = rng.integers(0, 256, size=int(rng.integers(0, 40)), dtype=np.uint8)
        assert TOK.decode(raw.astype(np.int32)) == raw.tobytes().decode("utf-8", errors="replace")


def test_a_sequence_cut_by_end_of_text_breaks_there():
    snowman = list("☃".encode("utf-8"))  # three bytes
    ids = snowman[:2] + [TOK.eot] + snowman[2:] + snowman
    assert TOK.decode(ids) == "\ufffd" + MARK + "\ufffd" + "☃"


def test_decode_of_any_sampled_ids_never_crashes(rng):
    for _ in range(100):
        ids = rng.integers(0, 257, size=int(rng.integers(0, 100)))
        # the reference: the pieces between end-of-text tokens decoded one by one, joined by the marker
        pieces = np.split(ids, np.flatnonzero(ids == 256))
        expected = bytes(pieces[0].astype(np.uint8)).decode("utf-8", errors="replace")
        for p in pieces[1:]:  # each starts with its end-of-text
            expected += MARK + bytes(p[1:].astype(np.uint8)).decode("utf-8", errors="replace")
        assert TOK.decode(ids) == expected


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                                   np.uint64])
def test_decode_takes_any_integer_dtype(dtype):
    ids = TOK.encode("dtype ok")
    assert TOK.decode(ids.astype(dtype)) == "dtype ok"


def test_decode_takes_lists_scalars_and_empty():
    assert TOK.decode([104, 105]) == "hi"
    assert TOK.decode(np.int64(65)) == "A"
    assert TOK.decode([]) == "" and TOK.decode(np.empty(0, dtype=np.float32)) == ""


@pytest.mark.parametrize("ids, bad, index", [
    ([1, 2, 257], 257, 2),
    (np.array([-1, 5], dtype=np.int32), -1, 0),
    (np.array([5, 5, 1000], dtype=np.int64), 1000, 2),
    (np.array([2 ** 32 + 65], dtype=np.int64), 2 ** 32 + 65, 0),  # must not wrap to 65 ('A')
    (np.array([300], dtype=np.uint16), 300, 0),
    (np.array([3, -128], dtype=np.int8), -128, 1),
    (np.array([2 ** 64 - 1], dtype=np.uint64), 2 ** 64 - 1, 0),
])
def test_decode_refuses_ids_outside_the_vocabulary(ids, bad, index):
    with pytest.raises(ValueError, match=rf"ids holds token id {bad} at index {index}, outside \[0, 257\)"):
        TOK.decode(ids)


def test_decode_refuses_non_integer_and_multi_dimensional_ids():
    with pytest.raises(TypeError, match="ids must be integer token ids, got dtype float64"):
        TOK.decode(np.array([65.0]))
    with pytest.raises(TypeError, match="ids must be integer token ids, got dtype bool"):
        TOK.decode(np.array([True]))
    with pytest.raises(TypeError, match="ids must be"):
        TOK.decode([2 ** 80])
    with pytest.raises(ValueError, match=r"ids must be 1-D, got shape \(1, 2\)"):
        TOK.decode(np.array([[65, 66]]))
