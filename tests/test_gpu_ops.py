"""Every launcher of the op table against the op's reference, on the GPU, generated from microgpt.ops: for each op
and each variant that has a launcher of its own, fresh random inputs drawn as the op declares them (tests/helpers
.op_case), outputs poisoned before the launch (an element the kernel forgets fails), added-into outputs starting
from random values; the reference (microgpt.reference_ops) runs in float64 on the same inputs, and every output
must be within the op's tolerance (OPS[op].tolerance, relative; 0: equal). An op with pitched arguments (rows padded,
as the model's logits are) runs again with them at two pitches, their padding NaN: a kernel that reads it fails, and
one that writes it too. The test ids name the op."""
import numpy as np
import pytest

from microgpt import kernels
from microgpt import ops as O
from microgpt.reference import MASK_VALUE

from helpers import op_call, op_case, op_sizes, record, rel_err

pytestmark = pytest.mark.gpu

SIZES = {"B2-T7-odd": op_sizes(2, 7, 20, 4, 37),          # below every tile, T < 128: the fallbacks
         "B2-T256-C256": op_sizes(2, 256, 256, 4, 300)}   # d_k 64, K >= 256: flash attention, wgmma, the fusions
# floats of padding after each row of a pitched argument (microgpt.ops.Arg.pitched): where its last dimension is a
# multiple of 4, pad4 keeps its rows 16-byte aligned (as model.padded_rows makes them) and pad3 does not
PADS = {"dense": 0, "pad3": 3, "pad4": 4}
LAUNCHERS = [(op, variant, rows) for op, spec in O.OPS.items() for variant in spec.kernels
             for rows in (PADS if any(a.pitched for a in spec.args) else ["dense"])]


@pytest.fixture(scope="module")
def ga():
    kernels.engine()  # compiled, in the primary context, before the first allocation
    import pycuda.gpuarray as ga
    return ga


def to_device(ga, host, pad):
    """host (..., n) on the device: C-contiguous, or with pad a (..., n) view of a (..., n + pad) array (the whole
    array, its padding NaN, also returned)."""
    if not pad:
        return ga.to_gpu(host), None
    whole = np.full(host.shape[:-1] + (host.shape[-1] + pad,), np.nan, host.dtype)
    whole[..., :host.shape[-1]] = host
    whole = ga.to_gpu(whole)
    return whole[..., :host.shape[-1]], whole


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("op,variant,rows", LAUNCHERS,
                         ids=[f"{op}-{v}" + (f"-{r}" if r != "dense" else "") for op, v, r in LAUNCHERS])
def test_the_launcher_computes_the_reference(ga, rng, op, variant, rows, sizes):
    spec, sizes = O.OPS[op], SIZES[sizes]
    host = op_case(spec, sizes, rng)
    dev, ref, whole = {}, {}, {}
    for a in spec.args:
        v, pad = host[a.name], PADS[rows] if a.pitched else 0
        if a.role == "value":
            dev[a.name] = ref[a.name] = v
        elif a.role in ("out", "scratch"):
            dev[a.name], whole[a.name] = to_device(
                ga, np.full(a.size(sizes), -1 if a.dtype == "int32" else np.nan, a.dtype), pad)
            ref[a.name] = np.zeros(a.size(sizes), np.int32 if a.dtype == "int32" else np.float64)
        else:
            dev[a.name], whole[a.name] = to_device(ga, v, pad)
            ref[a.name] = v.astype(np.float64) if v.dtype == np.float32 else v.copy()
    args, kw = op_call(spec, dev)
    spec.kernels[variant](*args, **kw)
    kernels.engine().cuda.Context.synchronize()
    args, kw = op_call(spec, ref)
    spec.reference(*args, **kw)
    for name, w in whole.items():
        if w is not None:
            padding = w.get()[..., ref[name].shape[-1]:]
            assert np.isnan(padding).all(), f"{op}[{variant}].{name}: the padding after its rows was written"
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
