import pytest

from microgpt import GPTConfig, PRESETS
from microgpt.params import num_params, param_table


def test_presets_have_the_sizes_of_the_design():
    cfg = GPTConfig.preset("andrea-120m")
    assert (cfg.d_model, cfg.n_head, cfg.d_k, cfg.n_layer, cfg.block_size, cfg.vocab_size) == \
        (768, 12, 64, 12, 1024, 8449)
    assert GPTConfig.preset("andrea-12m").d_k == 32
    assert GPTConfig.preset("andrea-480m").d_k == 64
    assert GPTConfig.preset("gpt2-124m").vocab_size == 50257
    assert set(PRESETS) == {"andrea-12m", "andrea-120m", "andrea-480m", "gpt2-124m"}


def test_andrea_120m_has_92_3m_parameters():
    assert round(num_params(GPTConfig.preset("andrea-120m")) / 1e6, 1) == 92.3


def test_configurable_vocab():
    assert GPTConfig.preset("andrea-12m", vocab_size=1000).vocab_size == 1000
    with pytest.raises(ValueError, match="vocab_size"):
        GPTConfig.preset("andrea-120m", vocab_size=1000)
    with pytest.raises(ValueError, match="vocab_size"):
        GPTConfig.preset("andrea-12m", vocab_size=0)


@pytest.mark.parametrize("field,kwargs", [
    ("n_head", dict(n_layer=2, n_head=5, d_model=64, block_size=8, vocab_size=10)),
    ("n_layer", dict(n_layer=0, n_head=4, d_model=64, block_size=8, vocab_size=10)),
    ("n_head", dict(n_layer=1, n_head=-4, d_model=64, block_size=8, vocab_size=10)),
    ("d_model", dict(n_layer=1, n_head=4, d_model=0, block_size=8, vocab_size=10)),
    ("block_size", dict(n_layer=1, n_head=4, d_model=64, block_size=0, vocab_size=10)),
    ("vocab_size", dict(n_layer=1, n_head=4, d_model=64, block_size=8, vocab_size=0)),
])
def test_sizes_that_do_not_fit_are_refused_naming_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        GPTConfig(**kwargs)


def test_non_int_size_is_a_type_error():
    with pytest.raises(TypeError, match="d_model"):
        GPTConfig(1, 4, 64.0, 8, 10)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'andrea-7b'"):
        GPTConfig.preset("andrea-7b")


def test_param_table_is_contiguous_and_ordered():
    cfg = GPTConfig(2, 4, 64, 19, 97)
    table = param_table(cfg)
    names = [s.name for s in table]
    assert names[:2] == ["wte", "wpe"] and names[-2:] == ["lnf.w", "lnf.b"]
    assert names[2:14] == [f"h.0.{n}" for n in ("ln1.w", "ln1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w",
                                                  "attn.proj.b", "ln2.w", "ln2.b", "mlp.fc.w", "mlp.fc.b",
                                                  "mlp.proj.w", "mlp.proj.b")]
    offset = 0
    for s in table:
        assert s.offset == offset
        offset += s.size
    assert offset == num_params(cfg)
    assert dict((s.name, s.shape) for s in table)["h.1.mlp.proj.w"] == (64, 256)
