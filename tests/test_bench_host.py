"""tools/bench_host.py runs and reports what it promises (figures are not asserted: tests never time)."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "bench_host.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_quick_json_reports_cython_and_numpy_figures_with_their_ratio():
    done = run("--quick", "--json", "-B", "4", "-T", "64")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # one JSON object, nothing else on stdout
    assert result["quick"] is True
    assert [row["text"] for row in result["tokenizer"]] == ["pydoc-topics", "multilingual"]
    for row in result["tokenizer"]:
        assert row["bytes"] > 10_000
        for op in ("encode", "decode"):
            r = row[op]
            assert r["cython_MBps"] > 0 and r["numpy_MBps"] > 0
            assert abs(r["ratio"] - r["cython_MBps"] / r["numpy_MBps"]) < 1e-9 * r["ratio"]
    s = result["sampler"]
    assert (s["B"], s["T"]) == (4, 64) and s["tokens"] > 64
    assert s["cython_batches_per_s"] > 0 and s["numpy_batches_per_s"] > 0
    assert abs(s["ratio"] - s["cython_batches_per_s"] / s["numpy_batches_per_s"]) < 1e-9 * s["ratio"]


def test_help_and_table_output():
    done = run("--help")
    assert done.returncode == 0 and "--quick" in done.stdout and "--json" in done.stdout
    done = run("--quick", "-B", "2", "-T", "16")
    assert done.returncode == 0, done.stderr
    assert "encode pydoc-topics" in done.stdout and "B=2 T=16" in done.stdout


def test_refuses_bad_sizes():
    done = run("--quick", "-T", "0")
    assert done.returncode == 2 and "--seq-len must be >= 1" in done.stderr
