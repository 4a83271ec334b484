"""GPTConfig: the sizes of one ANDREA model, checked when it is made."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# name -> (n_layer, n_head, d_model, block_size, vocab_size); None = configurable (byte vocab by default)
PRESETS = {
    "andrea-12m": (6, 12, 384, 1024, None),
    "andrea-120m": (12, 12, 768, 1024, 8449),
    "andrea-480m": (16, 24, 1536, 1024, None),
    "gpt2-124m": (12, 12, 768, 1024, 50257),
}

# The ByteTokenizer's vocabulary: 256 bytes + end-of-text. Presets with a configurable vocabulary use it.
BYTE_VOCAB_SIZE = 257


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    vocab_size: int

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"GPTConfig.{field.name} must be an int, got {type(value).__name__}")
            if value <= 0:
                raise ValueError(f"GPTConfig.{field.name} must be positive, got {value}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"GPTConfig.n_head={self.n_head} must divide d_model={self.d_model} "
                f"(d_k = d_model / n_head)")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_head

    @classmethod
    def preset(cls, name: str, vocab_size: int | None = None, block_size: int | None = None) -> "GPTConfig":
        """One of PRESETS; vocab_size may be set where the preset leaves it open (default: byte vocab)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
        n_layer, n_head, d_model, preset_T, preset_V = PRESETS[name]
        if vocab_size is not None and preset_V is not None and vocab_size != preset_V:
            raise ValueError(f"vocab_size: preset {name!r} fixes it at {preset_V}, got {vocab_size}")
        V = preset_V if preset_V is not None else BYTE_VOCAB_SIZE if vocab_size is None else vocab_size
        return cls(n_layer, n_head, d_model, preset_T if block_size is None else block_size, V)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        names = [field.name for field in fields(cls)]
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"config is missing {', '.join(missing)}")
        return cls(**{n: d[n] for n in names})
