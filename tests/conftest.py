import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import GPU_REASON, TOOLS, WORST

sys.path.append(TOOLS)  # tools/torch_gpt.py: the held-out PyTorch GPT, an oracle of the tests


def pytest_terminal_summary(terminalreporter):
    skipped = len(terminalreporter.stats.get("skipped", []))
    if GPU_REASON is not None and skipped:
        terminalreporter.write_line(f"{skipped} tests skipped, the GPU tests among them: {GPU_REASON}")
    for group, errs in WORST.items():
        terminalreporter.write_line(f"worst relative error, {group}: "
                                    + ", ".join(f"{k} {v:.1e}" for k, v in sorted(errs.items())))


@pytest.fixture
def rng(request):
    # fresh inputs on every run, but reproducible from the printed seed when a test fails:
    # MICROGPT_TEST_SEED=<seed> pytest ... runs it again on the same inputs
    given = os.environ.get("MICROGPT_TEST_SEED")
    seed = int(given) if given else np.random.SeedSequence().entropy % (2 ** 32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def hopper_build(tmp_path_factory):
    """The engine built for sm_90a once a session (nvcc, about 45 s): `result`, nvcc's CompletedProcess with every
    warning an error, and `ptx`, the PTX it kept, kernel by kernel (name -> its .entry's text)."""
    from microgpt import kernels
    keep = tmp_path_factory.mktemp("sm_90a")
    result = subprocess.run(["nvcc", "--cubin", "-arch=sm_90a", "-Werror", "all-warnings", *kernels.NVCC_OPTIONS,
                             "--keep", f"--keep-dir={keep}", "-o", str(keep / "m.cubin"),
                             str(kernels.cuda_source_dir() / "microgpt_cuda.cu")], capture_output=True, text=True)
    ptx = keep / "microgpt_cuda.ptx"
    entries = re.split(r"^\.visible \.entry ", ptx.read_text(), flags=re.M)[1:] if ptx.exists() else []
    return SimpleNamespace(result=result, ptx={e[:e.index("(")]: e for e in entries})


@pytest.fixture
def corpus(tmp_path):
    """A small text file for `microgpt train --data`."""
    p = tmp_path / "corpus.txt"
    p.write_text("the quick brown fox jumps over the lazy dog. " * 400, encoding="utf-8")
    return str(p)


def pytest_collection_modifyitems(config, items):
    if GPU_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
