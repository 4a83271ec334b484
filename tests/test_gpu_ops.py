"""Every launcher of the op table against the op's reference, on the GPU, generated from microgpt.ops: for each op
and each variant that has a launcher of its own, fresh random inputs drawn as the op declares them (tests/helpers
.op_case), outputs poisoned before the launch (an element the kernel forgets fails), added-into outputs starting
from random values; the reference (microgpt.reference_ops) runs in float64 on the same inputs, and every output
must be within the op's tolerance (OPS[op].tolerance, relative; 0: equal). The test ids name the op."""
import numpy as np
import pytest

from microgpt import kernels
from microgpt import ops as O
from microgpt.reference import MASK_VALUE

from helpers import op_call, op_case, op_sizes, record, rel_err

pytestmark = pytest.mark.gpu

SIZES = {"B2-T7-odd": op_sizes(2, 7, 20, 4, 37),          # below every tile, T < 128: the fallbacks
         "B2-T256-C256": op_sizes(2, 256, 256, 4, 300)}   # d_k 64, K >= 256: flash attention, wgmma, the fusions
LAUNCHERS = [(op, variant) for op, spec in O.OPS.items() for variant in spec.kernels]


@pytest.fixture(scope="module")
def ga():
    kernels.engine()  # compiled, in the primary context, before the first allocation
    import pycuda.gpuarray as ga
    return ga


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("op,variant", LAUNCHERS, ids=[f"{op}-{v}" for op, v in LAUNCHERS])
def test_the_launcher_computes_the_reference(ga, rng, op, variant, sizes):
    spec, sizes = O.OPS[op], SIZES[sizes]
    host = op_case(spec, sizes, rng)
    dev, ref = {}, {}
    for a in spec.args:
        v = host[a.name]
        if a.role == "value":
            dev[a.name] = ref[a.name] = v
        elif a.role in ("out", "scratch"):
            dev[a.name] = ga.to_gpu(np.full(a.size(sizes), -1 if a.dtype == "int32" else np.nan, a.dtype))
            ref[a.name] = np.zeros(a.size(sizes), np.int32 if a.dtype == "int32" else np.float64)
        else:
            dev[a.name] = ga.to_gpu(v)
            ref[a.name] = v.astype(np.float64) if v.dtype == np.float32 else v.copy()
    args, kw = op_call(spec, dev)
    spec.kernels[variant](*args, **kw)
    kernels.engine().cuda.Context.synchronize()
    args, kw = op_call(spec, ref)
    spec.reference(*args, **kw)
    for a in spec.args:
        if a.role not in ("out", "inout"):
            continue
        got, want = dev[a.name].get(), ref[a.name]
        name = f"{op}[{variant}].{a.name}"
        if a.kind in ("lower", "masked"):  # compared on and below the diagonal; above it, masked scores must be
            keep = np.tril(np.ones(want.shape[-2:], bool))  # MASK_VALUE exactly ("lower": left to the kernel)
            if a.kind == "masked":
                assert np.all(got[..., ~keep] == MASK_VALUE), f"{name}: not MASK_VALUE above the diagonal"
            got, want = got[..., keep], want[..., keep]
        if a.dtype == "int32" or spec.tolerance == 0:
            np.testing.assert_array_equal(got, want, err_msg=name)
            continue
        err = record("op table: launchers vs float64 reference", name, rel_err(got, want))
        assert err <= spec.tolerance, f"{name}: relative error {err:.2e} > {spec.tolerance:.0e}"
