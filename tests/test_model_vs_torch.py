"""The numpy backend's whole model against PyTorch autograd and torch.optim.AdamW on the same weights."""
import numpy as np
import pytest

from microgpt import GPT, GPTConfig

from helpers import record, rel_err

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install 'microgpt[test]'")
from torch_gpt import TorchGPT  # noqa: E402

CFG = GPTConfig(n_layer=2, n_head=4, d_model=64, block_size=19, vocab_size=97)


def pair(rng, B, T, seed):
    model = GPT(CFG, backend="numpy", seed=seed)
    # perturb the LN gains and biases so that no tensor is trivially 1 or 0
    sd = model.state_dict()
    for name in sd:
        if sd[name].ndim == 1:
            sd[name] = sd[name] + rng.normal(0, 0.1, sd[name].shape).astype(np.float32)
    model.load_state_dict(sd)
    peer = TorchGPT(CFG).load_numpy(model.state_dict())
    idx = rng.integers(0, CFG.vocab_size, size=(B, T))
    targets = rng.integers(0, CFG.vocab_size, size=(B, T))
    return model, peer, idx, targets


@pytest.mark.parametrize("B,T", [(3, 19), (1, 1), (2, 7)])
def test_logits_loss_and_every_gradient(rng, B, T):
    model, peer, idx, targets = pair(rng, B, T, seed=int(rng.integers(1 << 30)))
    logits, loss = model.forward(idx, targets)
    model.zero_grad()
    model.backward()
    t_logits, t_loss = peer(torch.from_numpy(idx), torch.from_numpy(targets))
    t_loss.backward()
    assert logits.dtype == np.float32 and logits.shape == (B, T, CFG.vocab_size)
    assert record("numpy backend vs PyTorch", "logits", rel_err(logits, t_logits.detach().numpy())) < 1e-4
    assert record("numpy backend vs PyTorch", "loss", rel_err(loss, t_loss.item())) < 1e-5
    grads, t_grads = model.grad_dict(), peer.numpy_grads()
    for name in grads:
        assert record("numpy backend vs PyTorch", "gradient", rel_err(grads[name], t_grads[name])) < 1e-3, name


def test_two_steps_of_clipping_and_adamw(rng):
    model, peer, idx, targets = pair(rng, 3, 19, seed=7)
    opt = torch.optim.AdamW(peer.param_groups(weight_decay=0.1), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(2):
        model.zero_grad()
        model.forward(idx, targets)
        model.backward()
        model.step(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, grad_clip=0.5)
        opt.zero_grad()
        _, t_loss = peer(torch.from_numpy(idx), torch.from_numpy(targets))
        t_loss.backward()
        t_norm = torch.nn.utils.clip_grad_norm_(peer.parameters(), 0.5)
        opt.step()
        assert t_norm.item() > 0.5  # clipping was active
        assert record("numpy backend vs PyTorch", "grad norm", rel_err(model.last_grad_norm, t_norm.item())) < 1e-4
    # Adam divides each weight's step by the size of its own gradients, so where a weight's two gradients nearly
    # cancel, the float32 roundings of the two implementations become a visible share of its step (a seed gave a
    # relative error of 1.7e-4 on mlp.proj.w: 111 of its 16384 weights off by more than 1e-6, the worst by 0.06 of
    # a step). So each weight is held within a tenth of one step (lr) of torch's, and the typical weight (the
    # median difference, at most 5e-8 on that seed) to 2e-7, which any error in the update itself would pass
    # (weight decay forgotten: lr * 0.1 * |w|, about 4e-6)
    ours, theirs = model.state_dict(), peer.numpy_state()
    for name in ours:
        record("numpy backend vs PyTorch", "weights after 2 steps", rel_err(ours[name], theirs[name]))
        diff = np.abs(ours[name] - theirs[name])
        assert diff.max() <= 0.1 * 3e-3 and np.median(diff) <= 2e-7, (name, diff.max(), np.median(diff))


def test_float64_backend_matches_torch_float64(rng):
    model = GPT(CFG, backend="numpy", seed=3, dtype=np.float64)
    peer = TorchGPT(CFG).double()
    sd = model.state_dict()
    peer.load_numpy({k: v.astype(np.float64) for k, v in sd.items()})
    model.load_state_dict(peer.numpy_state())
    idx = rng.integers(0, CFG.vocab_size, size=(2, 11))
    targets = rng.integers(0, CFG.vocab_size, size=(2, 11))
    _, loss = model.forward(idx, targets)
    model.backward()
    _, t_loss = peer(torch.from_numpy(idx), torch.from_numpy(targets))
    t_loss.backward()
    assert rel_err(loss, t_loss.item()) < 1e-12
    g, tg = model.backend.G, peer.numpy_grads()
    assert g["wte"].dtype == np.float64
    for name in g:
        assert rel_err(g[name], tg[name]) < 1e-9, name
