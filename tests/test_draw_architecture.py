"""tools/draw_architecture.py: its layers put every module above what it imports, and it writes a PNG."""
import sys
from pathlib import Path

import pytest

from helpers import TOOLS, run_tool

sys.path.insert(0, TOOLS)
import draw_architecture  # noqa: E402

PACKAGE = Path(__file__).resolve().parent.parent / "microgpt"


def test_every_module_sits_above_what_it_imports():
    graph, rows = draw_architecture.imports(PACKAGE), draw_architecture.layers(PACKAGE)
    modules = {p.name for p in PACKAGE.glob("*.py")} | {"_host.pyx", "_tokens.pyx", "kernels/"}
    assert set(graph) == set(rows) == modules
    for module, imported in graph.items():
        for other in imported:
            assert rows[module] > rows[other], f"{module} (row {rows[module]}) imports {other} (row {rows[other]})"
    # the Cython modules are found from the .py files that import them
    assert "_host.pyx" in graph["checkpoint.py"] and "_tokens.pyx" in graph["tokenizer.py"]
    assert "kernels/" in graph["ops.py"] and rows["__main__.py"] == max(rows.values())


def test_it_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "architecture.png"
    res = run_tool("draw_architecture.py", "--out", str(out))
    assert res.returncode == 0, res.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000


def test_help():
    res = run_tool("draw_architecture.py", "--help")
    assert res.returncode == 0 and "usage:" in res.stdout and "--out" in res.stdout
