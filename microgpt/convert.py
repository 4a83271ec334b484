"""`microgpt convert`: an ANDREA checkpoint to a Hugging Face GPT-2 directory and back (microgpt.hf holds the
mapping, microgpt.checkpoint the ANDREA format). The tokenizer a checkpoint records goes along as the
directory's tokenizer.json, and a directory's tokenizer.json is recorded in the checkpoint made from it."""
from __future__ import annotations

import os
import shutil

from . import checkpoint
from .config import GPTConfig
from .gpt import GPT

TOKENIZER_FILE = "tokenizer.json"  # where a Hugging Face model directory keeps its tokenizer


def convert(src, dst) -> tuple[bool, GPTConfig, int]:
    """An ANDREA checkpoint or a Hugging Face directory (src) written as the other or the same (dst: a
    directory, Hugging Face's, unless it ends in .ckpt). ANDREA to ANDREA keeps the Adam moments, the step and
    the extra values; to Hugging Face they are dropped. Returns (to Hugging Face, the config, the step dropped
    or 0)."""
    src, dst = os.fspath(src), os.fspath(dst)
    to_hf = not dst.endswith(".ckpt")
    if to_hf and os.path.exists(dst) and not os.path.isdir(dst):
        raise ValueError(f"DST {dst!r} is a file: a Hugging Face checkpoint is a directory (an ANDREA one ends "
                         f"in .ckpt)")
    if not to_hf and os.path.isdir(dst):
        raise ValueError(f"DST {dst!r} is a directory, not an ANDREA checkpoint file")
    if os.path.isdir(src):
        model, extra = GPT.from_hf(src), {}
        hf_tokenizer = os.path.join(src, TOKENIZER_FILE)
        if os.path.isfile(hf_tokenizer):  # recorded as training records its tokenizer, for sample
            extra["tokenizer"] = {"path": os.path.abspath(hf_tokenizer),
                                  "sha256": checkpoint.file_sha256(hf_tokenizer)}
    else:
        saved = checkpoint.read(src)
        model, extra = GPT.from_checkpoint(saved), saved.extra
    if to_hf:
        model.save_hf(dst)
        record = extra.get("tokenizer")
        if isinstance(record, dict) and os.path.isfile(str(record.get("path"))):
            shutil.copyfile(record["path"], os.path.join(dst, TOKENIZER_FILE))  # beside the weights, as HF keeps it
        return True, model.config, model.step_count
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)  # as train makes its --out
    model.save(dst, extra=extra)
    return False, model.config, 0
