"""The op table, on the CPU: every entry declares a reference, a header, launchers and its arguments, and the
reference (microgpt.reference_ops) computes each op on those arguments as the launchers' convention says: every
output written, every input left as it was."""
import inspect
from pathlib import Path

import numpy as np
import pytest

from microgpt import ops as O
from microgpt import reference_ops

from helpers import op_call, op_case, op_sizes

CUDA = Path(__file__).resolve().parent.parent / "cuda"
OPS = list(O.OPS)


@pytest.mark.parametrize("op", OPS)
def test_every_entry_declares_a_reference_a_kernel_source_and_its_arguments(op):
    spec = O.OPS[op]
    assert spec.reference is getattr(reference_ops, op), op
    assert (CUDA / spec.header).is_file(), (op, spec.header)
    assert "reference" in spec.kernels and set(spec.kernels) <= set(O.VARIANTS), op
    params = inspect.signature(spec.kernels["reference"]).parameters
    declared = [a.name for a in spec.args]
    assert declared == [p for p in params if p not in ("stream", "check_token_ids")][:len(declared)], (op, declared)
    for a in spec.args:  # keyword-only parameters are declared after '|', and only they
        assert a.keyword == (params[a.name].kind == inspect.Parameter.KEYWORD_ONLY), (op, a.name)
    missing = [p for p, v in params.items() if v.default is inspect.Parameter.empty and p not in declared]
    assert not missing, (op, missing)


def test_the_table_covers_every_reference_op():
    public = {n for n, f in vars(reference_ops).items() if inspect.isfunction(f) and not n.startswith("_")
              and f.__module__ == "microgpt.reference_ops"}
    assert public == set(O.OPS)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sizes", [op_sizes(2, 7, 20, 4, 37), op_sizes(1, 1, 8, 2, 11)], ids=["B2-T7", "B1-T1"])
def test_the_reference_writes_its_outputs_and_only_them(op, sizes, rng):
    spec = O.OPS[op]
    vals = op_case(spec, sizes, rng)
    given = {k: v.copy() for k, v in vals.items() if isinstance(v, np.ndarray)}
    for a in spec.args:
        if a.role in ("out", "scratch"):
            vals[a.name] = np.full(a.size(sizes), -1 if a.dtype == "int32" else np.nan, a.dtype)
    args, kw = op_call(spec, vals)
    spec.reference(*args, **kw)
    for a in spec.args:
        v = vals[a.name]
        if a.role == "out":
            assert np.all(np.isfinite(v)) and not (a.dtype == "int32" and (v < 0).any()), (op, a.name)
        elif a.role == "in" and isinstance(v, np.ndarray) and a.kind != "causal":  # a causal input may be masked
            np.testing.assert_array_equal(v, given[a.name], err_msg=f"{op} changed its input {a.name}")
        elif a.role == "inout":
            assert np.all(np.isfinite(v)), (op, a.name)
