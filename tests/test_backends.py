"""The declared backend interfaces (microgpt.backend): every implementation answers every call of its
protocol with the protocol's signature, and MultiHeadAttention runs whatever backend object it is given."""
import inspect

import numpy as np
import pytest

from microgpt import GPT, GPTConfig, MultiHeadAttention
from microgpt import reference as R
from microgpt.attention import CudaAttention, NumpyAttention
from microgpt.backend import AttentionBackend, Backend
from microgpt.backend_cuda import CudaBackend
from microgpt.backend_numpy import NumpyBackend

from helpers import attention_bwd, attention_fwd

CFG = GPTConfig(n_layer=1, n_head=2, d_model=8, block_size=6, vocab_size=11)


def members(protocol):
    return [n for n in vars(protocol) if not n.startswith("_")] + list(protocol.__annotations__)


@pytest.mark.parametrize("protocol,impl", [(Backend, NumpyBackend), (Backend, CudaBackend),
                                           (AttentionBackend, NumpyAttention), (AttentionBackend, CudaAttention)],
                         ids=["numpy", "cuda", "numpy-attention", "cuda-attention"])
def test_each_backend_answers_every_call_of_its_protocol(protocol, impl):
    for name in members(protocol):
        declared = vars(protocol).get(name)
        if callable(declared):
            assert callable(getattr(impl, name, None)), f"{impl.__name__} has no {name}()"
            want = list(inspect.signature(declared).parameters)
            got = list(inspect.signature(getattr(impl, name)).parameters)
            assert got == want, f"{impl.__name__}.{name}{tuple(got)} is not the protocol's {tuple(want)}"
        elif name == "last_grad_norm" or name in protocol.__annotations__:
            # an attribute or property: set in __init__ or defined on the class
            source = inspect.getsource(impl)
            assert name in vars(impl) or f"self.{name} =" in source, f"{impl.__name__} has no {name}"


def test_the_numpy_backend_is_a_backend_at_run_time():
    model = GPT(CFG)
    assert isinstance(model.backend, Backend)
    assert isinstance(NumpyAttention(2), AttentionBackend)


def test_a_variant_is_checked_on_every_backend():
    with pytest.raises(ValueError, match="variant must be one of"):
        GPT(CFG, variant="fastest")
    with pytest.raises(ValueError, match="variant must be one of"):
        MultiHeadAttention(8, 2, variant="fastest")
    GPT(CFG, variant="reference")  # the numpy backend has one set of operations, and takes either name


# ---------------------------------------------------------------------------------------------- MultiHeadAttention
def test_multi_head_attention_on_numpy_is_the_reference_pipeline(rng):
    mha = MultiHeadAttention(16, 4, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    out, inter = mha.forward(x, return_intermediates=True)
    w = mha.state_dict()
    want, cache = attention_fwd(x, w["qkv.w"], w["qkv.b"], w["proj.w"], w["proj.b"], 4)
    np.testing.assert_array_equal(out, want)
    assert set(inter) == {"q", "k", "v", "scores", "masked", "probs", "heads", "lse", "y"}
    assert inter["scores"].shape == (2, 4, 5, 5) and inter["q"].shape == (2, 4, 5, 4)
    assert np.all(inter["masked"][..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] == R.MASK_VALUE)
    dout = rng.standard_normal((2, 5, 16)).astype(np.float32)
    dx = mha.backward(dout)
    rdx, g = attention_bwd(dout, cache, w["qkv.w"], w["proj.w"], 4)
    np.testing.assert_array_equal(dx, rdx)
    np.testing.assert_array_equal(mha.grads["qkv.w"], g["w_qkv"])
    assert set(mha.grads) == set(w)


class Recorder:
    """An AttentionBackend of our own: the identity, recording the calls it answers."""

    def __init__(self):
        self.calls = []

    def load(self, weights):
        self.calls.append(("load", sorted(weights)))

    def forward(self, x, keep_intermediates):
        self.calls.append(("forward", x.shape, keep_intermediates))
        return x.copy(), ({"x": x} if keep_intermediates else None)

    def backward(self, dout):
        self.calls.append(("backward", dout.shape))
        return dout.copy(), {"qkv.w": np.zeros(1)}


def test_multi_head_attention_runs_a_backend_object_it_is_given():
    rec = Recorder()
    mha = MultiHeadAttention(8, 2, backend=rec)
    x = np.ones((1, 3, 8), np.float32)
    np.testing.assert_array_equal(mha.forward(x), x)
    mha.backward(x)
    assert rec.calls == [("load", ["proj.b", "proj.w", "qkv.b", "qkv.w"]), ("forward", (1, 3, 8), False),
                         ("backward", (1, 3, 8))]
    with pytest.raises(ValueError, match="variant: a backend object was given"):
        MultiHeadAttention(8, 2, backend=Recorder(), variant="fast")
    with pytest.raises(TypeError, match="backend must be a name or an AttentionBackend, got int"):
        MultiHeadAttention(8, 2, backend=3)
    with pytest.raises(ValueError, match=r"backend must be one of \('numpy', 'cuda'\)"):
        MultiHeadAttention(8, 2, backend="tpu")


def test_backward_answers_the_last_forward_of_the_weights_it_has():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(RuntimeError, match="backward\\(\\) needs a forward\\(\\) first"):
        mha.backward(np.zeros((1, 2, 8), np.float32))
    mha.forward(np.zeros((1, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"dout must have shape \(1, 2, 8\)"):
        mha.backward(np.zeros((1, 3, 8), np.float32))
    mha.load_state_dict(mha.state_dict())
    with pytest.raises(RuntimeError, match="needs a forward"):  # the activations belong to the old weights
        mha.backward(np.zeros((1, 2, 8), np.float32))
