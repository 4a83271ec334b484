"""What a user installs: the sdist and the wheel build (the wheel from the sdist), the wheel carries the CUDA
source as package data and works in a fresh virtual environment from another folder; the README's first
command asks for the GPU extra only where a GPU and the CUDA toolkit are."""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tqdm

ROOT = Path(__file__).resolve().parent.parent
HEADERS = sorted(p.name for p in (ROOT / "cuda").iterdir())


def run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))}: exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("cc",)), reason="no C compiler for the Cython module")
def test_the_sdist_and_the_wheel_build_and_the_wheel_works_in_a_fresh_venv(tmp_path):
    pytest.importorskip("build")
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT])  # the wheel is built from the sdist
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"microgpt/_host.pyx", "microgpt/_tokens.pyx", "setup.py", "pyproject.toml"} <= names
    assert {f"cuda/{h}" for h in HEADERS} <= names
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    assert {f"microgpt/cuda/{h}" for h in HEADERS} <= names and "microgpt/kernels/runtime.py" in names
    for ext in ("_host", "_tokens"):
        assert f"microgpt/{ext}.c" not in names and any(n.startswith(f"microgpt/{ext}.") and n.endswith(".so")
                                                        for n in names)

    # nothing of this checkout may be visible to the fresh venv: a PYTHONPATH holding it (with its egg-info)
    # would even make pip take microgpt as installed already
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MICROGPT_CUDA_DIR")}
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], env=env)
    run([venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=env)
    # its dependencies from this environment (offline): plain path entries, after the venv's own, so that
    # microgpt itself can only come from the wheel
    site = run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               env=env).strip()
    deps = {str(Path(m.__file__).resolve().parent.parent) for m in (np, tqdm)}
    Path(site, "microgpt-test-deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    info = run([venv / "bin" / "microgpt", "info"], cwd=elsewhere, env=env)
    where = run([venv / "bin" / "python", "-c", "from microgpt import kernels; print(kernels.cuda_source_dir())"],
                cwd=elsewhere, env=env).strip()
    assert Path(where).is_relative_to(venv) and Path(where, "microgpt_cuda.cu").is_file(), where
    if shutil.which("nvcc"):
        assert re.search(rf"kernels \(\d+, from {re.escape(where)}/microgpt_cuda.cu\)", info), info
    run([venv / "bin" / "microgpt", "train", "--backend", "numpy", "--steps", "2", "--no-progress", "--sample-tokens",
         "5", "--out", elsewhere / "run"], cwd=elsewhere, env=env)
    assert (elsewhere / "run" / "model.ckpt").is_file()


def readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.*?)\n```", text, re.S)[:2]


def test_the_readme_opens_with_two_one_line_commands():
    main_job, tests = readme_commands()
    assert "\n" not in main_job and "\n" not in tests
    assert "microgpt train" in main_job and "pytest" in tests


@pytest.mark.parametrize("gpu,toolkit,extra", [(False, False, ""), (True, False, ""), (False, True, ""),
                                               (True, True, "[cuda]")])
def test_the_main_job_asks_for_the_gpu_extra_only_with_a_gpu_and_the_toolkit(tmp_path, gpu, toolkit, extra):
    main_job, _ = readme_commands()
    target = re.search(r'pip install -e "(\.\$\(.*?\))"', main_job).group(1)  # ".$(...)" as the shell sees it
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, present in (("nvidia-smi", gpu), ("nvcc", toolkit)):
        if present:
            (bin_dir / tool).write_text("#!/bin/sh\necho GPU 0: stub\n")
            (bin_dir / tool).chmod(0o755)
    out = subprocess.run(["/bin/bash", "-c", f'echo "{target}"'], capture_output=True, text=True,
                         env={"PATH": str(bin_dir)}).stdout.strip()
    assert out == "." + extra
