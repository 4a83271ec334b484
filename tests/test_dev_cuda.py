"""dev/cuda, the kernels' bench (dev/cuda/README.md): every file there builds against the engine's headers in cuda/
with no warning, the Makefile builds every file there is, and dev/ stays small. Needs nvcc and make, not a GPU."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[1] / "dev"
BENCH = DEV / "cuda"
MAX_LINES = 2000  # dev/ in all: the bench, not a lab notebook (the findings live in docs/kernels/)
BUILD_TIMEOUT = 900  # seconds; about a minute on two idle cores, the engine's flash and GEMM headers most of it

needs_tools = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("make") is None,
                                 reason="nvcc or make is not on PATH")


def targets() -> list[str]:
    """The Makefile's TARGETS: the binaries `make -C dev/cuda` builds."""
    line = next(x for x in (BENCH / "Makefile").read_text().splitlines() if x.startswith("TARGETS"))
    return line.split("=", 1)[1].split()


def test_the_makefile_builds_every_file():
    assert sorted(targets()) == sorted(p.stem for p in BENCH.glob("*.cu"))


def test_dev_stays_small():
    files = [p for p in DEV.rglob("*") if p.is_file() and "build" not in p.relative_to(DEV).parts]
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    assert lines <= MAX_LINES, f"dev/ holds {lines} lines, more than {MAX_LINES}"


@needs_tools
def test_every_file_builds_without_warnings(tmp_path):
    jobs = min(len(targets()), os.cpu_count() or 1)
    # -s: the compiler's output alone, not the commands (whose options name warnings)
    res = subprocess.run(["make", "-s", "-C", str(BENCH), f"-j{jobs}", f"BUILD={tmp_path}"], capture_output=True,
                         text=True, timeout=BUILD_TIMEOUT)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-5000:]
    assert "warning" not in out.lower(), out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(targets())
