"""Every example of the README runs as written, on the CPU: its Python blocks, and each line of its shell
blocks (the two setup commands aside: CI runs the second, and the first is that one plus a training run),
in order, in one fresh folder holding a text file my.txt for the examples that name one. docs/usage.md's
Python blocks run too, in order, as one program."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETUP = ("python3 -m venv",)


def blocks(doc=README):
    """(language, text) of each fenced block of a Markdown file, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", doc.read_text(encoding="utf-8"), flags=re.M | re.S)


def examples():
    """What the README asks a reader to run: ("python", source) and ("sh", argv) in order."""
    out = []
    for lang, text in blocks():
        if lang == "python":
            out.append(("python", text))
        elif lang == "sh":
            for line in text.splitlines():
                argv = shlex.split(line, comments=True)
                if argv and not line.startswith(SETUP):
                    out.append(("sh", argv))
    return out


def test_the_readme_has_the_examples_this_test_runs():
    kinds = [k for k, _ in examples()]
    assert kinds.count("python") >= 1 and kinds.count("sh") >= 8
    assert all(argv[0] == "microgpt" for k, argv in examples() if k == "sh")


def test_every_readme_example_runs_as_written_on_the_cpu(tmp_path):
    for extra in ("tokenizers", "safetensors", "matplotlib"):
        pytest.importorskip(extra)
    from pydoc_data.topics import topics
    (tmp_path / "my.txt").write_text("\n\n".join(topics[k] for k in sorted(topics))[:200_000], encoding="utf-8")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="error::RuntimeWarning")
    for kind, example in examples():
        cmd = [sys.executable, "-c", example] if kind == "python" else [sys.executable, "-m", "microgpt", *example[1:]]
        res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        shown = example if kind == "python" else " ".join(example)
        assert res.returncode == 0 and "Traceback" not in res.stderr, f"{shown}\n{res.stdout}\n{res.stderr}"
    assert (tmp_path / "runs" / "b" / "model.ckpt").is_file() and (tmp_path / "hf-out" / "config.json").is_file()


def test_the_python_examples_of_the_usage_doc_run_as_one_program(tmp_path):
    pytest.importorskip("safetensors")
    program = "\n".join(text for lang, text in blocks(ROOT / "docs" / "usage.md") if lang == "python")
    assert "GPT.from_hf" in program
    res = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert res.returncode == 0, res.stderr
