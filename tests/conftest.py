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


@pytest.fixture
def rng(request):
    # fresh inputs on every run, but reproducible from the printed seed when a test fails
    seed = np.random.SeedSequence().entropy % (2 ** 32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
