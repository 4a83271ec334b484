"""microgpt: the FP32 CUDA engine microgpt_cuda.cu, compiled and launched from Python through PyCUDA,
with a NumPy reference engine that computes every operation the same way on the CPU."""
from ._version import __version__
from .attention import MultiHeadAttention
from .config import GPTConfig, PRESETS
from .gpt import GPT
from .tokenizer import ByteTokenizer

__all__ = ["GPTConfig", "PRESETS", "GPT", "MultiHeadAttention", "ByteTokenizer", "__version__"]
