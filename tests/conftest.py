import numpy as np
import pytest


def rel_err(a, b):
    """||a - b|| / ||b||, in float64; inf where a holds a NaN or inf (never passes)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape} != {b.shape}")
    if not np.all(np.isfinite(a)):
        return np.inf
    denom = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (denom if denom > 0 else 1.0))


# group -> name -> worst relative error seen this session; printed at the end of the run
WORST: dict = {}


def record(group, name, err):
    g = WORST.setdefault(group, {})
    g[name] = max(g.get(name, 0.0), err)
    return err


def pytest_terminal_summary(terminalreporter):
    skipped = len(terminalreporter.stats.get("skipped", []))
    if GPU_REASON is not None and skipped:
        terminalreporter.write_line(f"{skipped} tests skipped, the GPU tests among them: {GPU_REASON}")
    for group, errs in WORST.items():
        terminalreporter.write_line(f"worst relative error, {group}: "
                                    + ", ".join(f"{k} {v:.1e}" for k, v in sorted(errs.items())))


@pytest.fixture
def rng(request):
    # fresh inputs on every run, but reproducible from the printed seed when a test fails
    seed = np.random.SeedSequence().entropy % (2 ** 32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def _gpu_unavailable_reason():
    """None where PyCUDA and a CUDA device are there, else why not."""
    try:
        import pycuda.driver as cuda
    except Exception as e:
        return f"PyCUDA is not installed ({e}); pip install 'microgpt[cuda]'"
    try:
        cuda.init()
        if cuda.Device.count() == 0:
            return "no CUDA device"
    except Exception as e:
        return f"no usable CUDA device ({e})"
    return None


GPU_REASON = _gpu_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    if GPU_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
