"""The same GPT written in PyTorch: the outside oracle of the tests and the peer of the benchmarks.

Written from the architecture (README.md, The model), not from microgpt's own code: torch's layer_norm, linear, gelu
and cross_entropy, attention either spelled out (masked_fill -1e9, softmax) or through
scaled_dot_product_attention. Needs torch; importing this module without it raises ImportError.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from microgpt.config import GPTConfig
from microgpt.params import param_table


def _key(name: str) -> str:
    return name.replace(".", "_")  # nn.Module attribute names may not hold dots


class TorchGPT(torch.nn.Module):
    def __init__(self, config: GPTConfig, attention: str = "explicit"):
        super().__init__()
        if attention not in ("explicit", "sdpa"):
            raise ValueError(f"attention must be 'explicit' or 'sdpa', got {attention!r}")
        self.config, self.attention = config, attention
        self.table = param_table(config)
        self.p = torch.nn.ParameterDict(
            {_key(s.name): torch.nn.Parameter(torch.zeros(s.shape)) for s in self.table})

    def param(self, name: str) -> torch.nn.Parameter:
        return self.p[_key(name)]

    def load_numpy(self, state: dict) -> "TorchGPT":
        with torch.no_grad():
            for s in self.table:
                self.param(s.name).copy_(torch.from_numpy(np.asarray(state[s.name])))
        return self

    def numpy_state(self) -> dict:
        return {s.name: self.param(s.name).detach().cpu().numpy().copy() for s in self.table}

    def numpy_grads(self) -> dict:
        return {s.name: self.param(s.name).grad.detach().cpu().numpy().copy() for s in self.table}

    def param_groups(self, weight_decay: float) -> list:
        """AdamW groups: decay on the 2-D tensors only."""
        decay = [self.param(s.name) for s in self.table if len(s.shape) == 2]
        rest = [self.param(s.name) for s in self.table if len(s.shape) != 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]

    def attend(self, q, k, v):
        T, d_k = q.shape[-2], q.shape[-1]
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d_k))
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
        att = att.masked_fill(future, -1e9)
        return torch.softmax(att, dim=-1) @ v

    def forward(self, idx, targets=None):
        cfg, p = self.config, self.param
        B, T = idx.shape
        C, NH = cfg.d_model, cfg.n_head
        x = p("wte")[idx] + p("wpe")[:T]
        for l in range(cfg.n_layer):
            h = F.layer_norm(x, (C,), p(f"h.{l}.ln1.w"), p(f"h.{l}.ln1.b"), eps=1e-5)
            qkv = F.linear(h, p(f"h.{l}.attn.qkv.w"), p(f"h.{l}.attn.qkv.b"))
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2))
            y = self.attend(q, k, v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, p(f"h.{l}.attn.proj.w"), p(f"h.{l}.attn.proj.b"))
            h = F.layer_norm(x, (C,), p(f"h.{l}.ln2.w"), p(f"h.{l}.ln2.b"), eps=1e-5)
            h = F.gelu(F.linear(h, p(f"h.{l}.mlp.fc.w"), p(f"h.{l}.mlp.fc.b")), approximate="tanh")
            x = x + F.linear(h, p(f"h.{l}.mlp.proj.w"), p(f"h.{l}.mlp.proj.b"))
        x = F.layer_norm(x, (C,), p("lnf.w"), p("lnf.b"), eps=1e-5)
        logits = x @ p("wte").t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss
