"""The layout shows the architecture: small modules, the launch layer mirroring cuda/, imports that only
run down, one switch for the kernels, and docs that describe this repository."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE, TOOLS, CUDA, KERNELS = ROOT / "microgpt", ROOT / "tools", ROOT / "cuda", ROOT / "microgpt" / "kernels"
PYTHON = sorted(PACKAGE.rglob("*.py")) + sorted(TOOLS.glob("*.py"))
CYTHON = sorted(PACKAGE.glob("*.pyx"))
MAX_LINES = 450
# the launch layer's own modules; every other module of microgpt/kernels/ is a header's launchers
ENGINE_MODULES = {"__init__", "source", "runtime", "checks", "driver", "graph", "virtual", "products"}
# our modules that need an optional dependency at import: imported where it is used, so that the rest runs
# without it
OPTIONAL = {"microgpt.distributed": "torch", "torch_gpt": "torch"}


def rel(p):
    return p.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", PYTHON + CYTHON, ids=rel)
def test_no_module_is_too_long(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{rel(path)} has {n} lines (at most {MAX_LINES}): split it along what it owns"


def test_importing_the_package_imports_no_torch():
    code = ("import sys, pkgutil, importlib, microgpt; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(microgpt.__path__, 'microgpt.') "
            "if m.name not in ('microgpt.__main__', 'microgpt.distributed')]; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", "importing microgpt imported torch"


def test_no_globals_lookups_nor_global_statements():
    """State is passed, not read from the side: no module looks itself up (globals()) or rebinds its names (global)."""
    for path in PYTHON:
        text = path.read_text()
        assert "globals()" not in text and not any(isinstance(n, ast.Global) for n in ast.walk(ast.parse(text))), \
            rel(path)


def test_the_launch_layer_mirrors_cuda():
    headers = {p.stem for p in CUDA.glob("*.cuh")} - {"common"}
    launchers = {p.stem for p in KERNELS.glob("*.py")} - ENGINE_MODULES
    assert headers == launchers, f"headers without a module: {headers - launchers}; modules without a header: " \
                                 f"{launchers - headers}"


def test_the_readme_lists_what_the_translation_unit_includes():
    includes = set(re.findall(r'^#include "(\w+\.cuh)"', (CUDA / "microgpt_cuda.cu").read_text(), re.M))
    section = (ROOT / "README.md").read_text().split("## The kernels", 1)[1].split("\n## ", 1)[0]
    assert includes == set(re.findall(r"`(\w+\.cuh)`", section)) - {"common.cuh"}


def _imports(path):
    """(module-level imports, function-local imports) of microgpt modules or tools' own modules, as dotted
    names resolved against the file's package."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    own_tools = {p.stem for p in TOOLS.glob("*.py")}
    top, local = set(), set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                names = [base] + [f"{base}.{a.name}" for a in child.names]
            for n in names:
                if n.split(".")[0] == "microgpt" or n in own_tools:
                    (local if in_function else top).add(n)
            visit(child, inside)
    visit(tree, False)
    return top, local


def test_no_function_local_imports_of_our_own_modules():
    for path in PYTHON:
        _, local = _imports(path)
        local = {n for n in local if not any(n == m or n.startswith(m + ".") for m in OPTIONAL)}
        assert not local, f"{rel(path)} imports {sorted(local)} inside a function: no cycle needs it"


def test_the_package_has_no_import_circle():
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    modules["microgpt._host"] = None  # the Cython module imports nothing of ours
    graph = {}
    for name, path in modules.items():
        if path is None:
            graph[name] = set()
            continue
        top, local = _imports(path)
        # an import of a name inside a module counts as an import of that module
        graph[name] = {max((m for m in modules if n == m or n.startswith(m + ".")), key=len)
                       for n in top | local if any(n == m or n.startswith(m + ".") for m in modules)} - {name}
        # a package's face imports its modules; a module importing from its own package's face is no circle
        graph[name] -= {m for m in graph[name] if name.startswith(m + ".")}
    seen, done = set(), set()

    def walk(node, trail):
        if node in done:
            return
        assert node not in seen, "import circle: " + " -> ".join(trail[trail.index(node):] + [node])
        seen.add(node)
        for nxt in sorted(graph[node]):
            walk(nxt, trail + [node])
        done.add(node)
    for m in sorted(graph):
        walk(m, [])


def test_the_docs_speak_of_this_repository():
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *PYTHON, *CUDA.iterdir(), *CYTHON]
    for path in texts:
        text = path.read_text()
        for stale in ("seed engine", "DESIGN.md"):
            assert stale not in text, f"{rel(path)} speaks of {stale!r}, which is not in this repository"


def test_gpu_test_files_are_named_alike():
    for path in (ROOT / "tests").glob("test_*.py"):
        text = path.read_text()
        module_marked = re.search(r"^pytestmark = pytest\.mark\.gpu$", text, re.M) is not None
        assert module_marked == path.name.startswith("test_gpu_"), \
            f"{path.name}: GPU tests live in test_gpu_*.py files, marked gpu as a whole"
        assert not re.search(r"^@pytest\.mark\.gpu", text, re.M), f"{path.name}: mark the file, not a test"


def test_the_kernel_checklist_names_the_files_it_asks_for():
    text = (ROOT / "docs" / "adding-an-op.md").read_text()
    for path in re.findall(r"`((?:cuda|microgpt|tests|tools)/[\w/.]+\.(?:py|cuh|cu))`", text):
        assert (ROOT / path).exists(), f"docs/adding-an-op.md names {path}, which does not exist"
    for test in re.findall(r"`(tests/test_\w+\.py)`", text):
        assert (ROOT / test).exists(), test
