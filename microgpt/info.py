"""`microgpt info`: the device, the compiled architecture, the kernels, the variants, a checkpoint; and with
--explain, every launch of one training step (or decode step), planned on a described GPU without needing one.

    microgpt info --explain --preset andrea-120m --variant tc -B 8 -T 1024
    phase     op                 kernel            grid     block  smem   why
    forward   matmul_fwd (tc)    k_gemm_wg_areg    132x1    384    ...    3xTF32 wgmma, A split in registers ...

A plan is the cuda backend's own (CudaBackend.plan) on microgpt.kernels.virtual's described device, a Plan for it:
the same launchers, the same choices, nothing run.
"""
from __future__ import annotations

from .backend_cuda import CudaBackend
from .config import PRESETS, GPTConfig
from . import kernels
from ._version import __version__
from .kernels import Plan, flash_attention, virtual
from .ops import DEFAULT_VARIANT, VARIANTS, resolve

def describe(cuda: tuple[bool, str], saved=None, path=None) -> str:
    """The device (cuda: usage.cuda_available()'s answer), the compiled architecture, the kernels, the variants, and
    the checkpoint `saved` read from path (or the presets)."""
    ok, why = cuda
    src = kernels.cuda_source_dir() / kernels.TRANSLATION_UNIT
    lines = [f"microgpt {__version__}"]
    if ok:
        lines += [f"device: {why}",
                  f"compiled for: {kernels.engine().arch} ({src}, nvcc options {' '.join(kernels.NVCC_OPTIONS)})"]
    else:
        lines.append(f"device: none ({why}); the numpy backend runs on the CPU")
    try:
        names = kernels.kernel_names()
        lines.append(f"kernels ({len(names)}, from {src}): {', '.join(names)}")
    except (OSError, RuntimeError) as e:  # no nvcc to read the translation unit with
        lines.append(f"kernels: not listed ({str(e).splitlines()[0]})")
    lines += [f"variant {name}{' (default)' if name == DEFAULT_VARIANT else ''}: {v.summary}"
              for name, v in VARIANTS.items()]
    if saved is not None:
        lines.append(f"checkpoint {path}: step {saved.step}, {saved.weights.size:,} parameters, whole (sha256 "
                     f"checked), config {saved.config}")
    else:
        lines += [f"preset {name}: {GPTConfig.preset(name)}" for name in PRESETS]
    return "\n".join(lines)


# the optimizer's launches as a training step makes them (AdamW with clipping; the values do not change the kernels)
STEP = dict(t=1, lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)


def step_plans(config: GPTConfig, variant: str | None, B: int, T: int, device: str = "h200",
               decode: bool = False) -> dict[str, Plan]:
    """The plans of one training step at (B, T) (forward with targets, backward, optimizer), or of one decode step
    of B sequences, on the described device `device` (a name of virtual.DEVICES)."""
    backend = CudaBackend(config, variant=variant, device=virtual.Engine(virtual.DEVICES[device]))
    if decode:
        return {"decode": backend.plan("decode", B, 1)}
    plans = {"forward": backend.plan("forward", B, T), "backward": backend.plan("backward", B, T)}
    plans["optimizer"] = Plan(backend.device)
    backend.optimizer(backend.ops.on(plans["optimizer"]), **STEP)
    return plans


def explain(config: GPTConfig, variant: str | None, B: int, T: int, device: str = "h200",
            decode: bool = False) -> str:
    """step_plans() printed: a heading, then each phase's plan, a line a launch (Plan.__str__)."""
    plans, d = step_plans(config, variant, B, T, device, decode), virtual.DEVICES[device]
    what = f"a decode step of {B} sequences" if decode else f"a training step at B={B}, T={T}"
    name = resolve(variant)
    att = ("one position against the cached keys and values" if decode else  # flash attention or stages, and why
           flash_attention.reason(B, config.n_head, config.d_k, T, virtual.Engine(d)) if VARIANTS[name].fused_attention
           else "stage by stage (the variant fuses none of it)")
    lines = [f"{what} of {config}", f"variant {name}, on {d.name} ({d.arch}, {d.sm_count} SMs)",
             f"attention: {att}"]
    for phase, plan in plans.items():
        lines += ["", f"{phase}: {len(plan)} launches", str(plan)]
    return "\n".join(lines)
