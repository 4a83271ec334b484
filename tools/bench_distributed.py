"""Data-parallel scaling: tokens/s of training on 1 process and on N (a GPU each, NCCL), microgpt's DataParallel
against PyTorch's DistributedDataParallel on the same GPT, the same per-process batch and the same steps, in one
run.

    python tools/bench_distributed.py                       # every GPU of this host; andrea-120m, B=8 a GPU, T=1024
    python tools/bench_distributed.py --nproc 2 --json      # one JSON object
    python tools/bench_distributed.py --backend numpy --quick --nproc 2   # the logic on CPUs, over gloo

For each process count the script starts torchrun (torch.distributed.run --standalone), whose processes time the
steps training runs (forward, the loss and stop agreed, backward, the gradient all-reduce, AdamW) after warmup;
rank 0 reports. The batch is per process (weak scaling: N processes train N times the tokens a step), so
`scaling` is tokens/s on N over tokens/s on 1, and N is ideal. PyTorch's peer is TorchGPT (SDPA, fused AdamW,
FP32, TF32 off) under DistributedDataParallel, as a user would run it. NVLink multicast is left as the machine
sets it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig, kernels

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import batches, torch_step  # noqa: E402  (the same batches and PyTorch step as one GPU)

RESULT = "RESULT "  # the line of rank 0's JSON in a worker's output


def timed(step, warmup, steps, sync) -> float:
    """Seconds a step, every rank starting together after warmup."""
    import torch.distributed as dist
    for i in range(warmup):
        step(i)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    sync()
    return (time.perf_counter() - t0) / steps


def time_microgpt(cfg, dp, args, T):
    model = GPT(cfg, backend=args.backend, seed=0)
    data = batches(cfg, dp.world * args.B, T)
    losses = []

    def step(i):  # as train_loop runs a step
        b = dp.shard(data[i % len(data)])
        model.zero_grad()
        _, loss = model.forward(b[:, :-1], b[:, 1:], return_logits=False)
        loss, _ = dp.agree(loss, False)
        model.backward()
        dp.average_gradients(model)
        model.step(3e-4, weight_decay=0.1, grad_clip=1.0)
        losses.append(loss)
    seconds = timed(step, args.warmup, args.steps, lambda: model.last_grad_norm)
    return seconds, losses


def time_torch(cfg, dp, args, T):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from torch_gpt import TorchGPT
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = args.backend == "cuda"
    model = TorchGPT(cfg, attention="sdpa").load_numpy(GPT(cfg, seed=0).state_dict())
    model = DistributedDataParallel(model.cuda() if cuda else model, device_ids=[0] if cuda else None)
    opt = torch.optim.AdamW(model.module.param_groups(0.1), lr=3e-4, betas=(0.9, 0.95), fused=cuda)
    data = [torch.from_numpy(dp.shard(b)).long() for b in batches(cfg, dp.world * args.B, T)]
    step = torch_step(model, opt, [b.cuda() for b in data] if cuda else data)
    seconds = timed(step, args.warmup, args.steps, torch.cuda.synchronize if cuda else lambda: None)
    return seconds, f"PyTorch {torch.__version__}"


def worker(args) -> None:
    """One process of a torchrun: times microgpt, then PyTorch; rank 0 prints the RESULT line."""
    from microgpt.distributed import DataParallel, select_gpu
    select_gpu()
    dp = DataParallel(args.backend)
    cfg = GPTConfig.preset(args.preset)
    T = args.T or cfg.block_size
    tokens = dp.world * args.B * T  # a step, all processes together
    seconds, losses = time_microgpt(cfg, dp, args, T)
    out = dict(world=dp.world, tokens_per_step=tokens, microgpt_step_ms=seconds * 1e3,
               microgpt_tokens_per_s=tokens / seconds, losses_finite=bool(np.all(np.isfinite(losses))))
    if not args.no_torch:
        seconds, note = time_torch(cfg, dp, args, T)
        out.update(torch_step_ms=seconds * 1e3, torch_tokens_per_s=tokens / seconds, torch_note=note)
    if args.backend == "cuda":
        out["device"] = kernels.engine().device.name()
    if dp.lead:
        print(RESULT + json.dumps(out), flush=True)
    dp.close()


def launch(n: int, argv: list) -> dict:
    """torchrun of n processes of this script as workers; rank 0's result."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           os.path.abspath(__file__), "--worker", *argv]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in res.stdout.splitlines() if line.startswith(RESULT)]
    if res.returncode != 0 or not lines:
        sys.exit(f"bench_distributed: {n} processes failed (exit {res.returncode}):\n{res.stdout}{res.stderr}")
    return json.loads(lines[-1][len(RESULT):])


def report(rows, args, T) -> dict:
    one = rows[0]
    for r in rows:
        r["microgpt_scaling"] = r["microgpt_tokens_per_s"] / one["microgpt_tokens_per_s"]
        if "torch_tokens_per_s" in r:
            r["torch_scaling"] = r["torch_tokens_per_s"] / one["torch_tokens_per_s"]
    return dict(preset=args.preset, backend=args.backend, B_per_process=args.B, T=T, steps=args.steps,
                device=one.get("device", "CPU"), rows=rows)


def print_table(result) -> None:
    r0 = result["rows"][0]
    dtype = "FP32, TF32 off" if result["backend"] == "cuda" else "the numpy backend"
    print(f"{result['device']}: {result['preset']}, B={result['B_per_process']} a process, T={result['T']}, "
          f"{dtype}, {result['steps']} timed steps")
    print(f"{'processes':<10}{'ms/step':>10}{'tokens/s':>12}{'scaling':>9}   {'DDP ms/step':>12}{'tokens/s':>12}"
          f"{'scaling':>9}")
    for r in result["rows"]:
        torch_cols = (f"{r['torch_step_ms']:>12.1f}{r['torch_tokens_per_s']:>12,.0f}{r['torch_scaling']:>8.2f}x"
                      if "torch_step_ms" in r else f"{'-':>12}{'-':>12}{'-':>9}")
        print(f"{r['world']:<10}{r['microgpt_step_ms']:>10.1f}{r['microgpt_tokens_per_s']:>12,.0f}"
              f"{r['microgpt_scaling']:>8.2f}x   {torch_cols}")
    print(f"scaling: tokens/s on N processes over tokens/s on 1 (ideal: N); the left columns are microgpt's "
          f"DataParallel, the right PyTorch DistributedDataParallel ({r0.get('torch_note', 'skipped')})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="andrea-120m")
    ap.add_argument("-B", type=int, default=8, help="rows a process (default 8)")
    ap.add_argument("-T", type=int, default=None, help="sequence length (default: the preset's block_size)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backend", choices=["cuda", "numpy"], default="cuda")
    ap.add_argument("--nproc", type=int, default=None, help="processes to scale to (default: every GPU; 2 on CPUs)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch DDP peer")
    ap.add_argument("--quick", action="store_true", help="andrea-12m, B=2, T=64, 2 steps after 1 of warmup")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.preset, args.B, args.T, args.steps, args.warmup = "andrea-12m", 2, 64, 2, 1
    if args.worker:
        worker(args)
        return 0
    try:
        import torch
    except ImportError:
        sys.exit("bench_distributed: needs torch (pip install -e '.[dist]')")
    n = args.nproc or (torch.cuda.device_count() if args.backend == "cuda" else 2)
    if n < 2:
        sys.exit(f"bench_distributed: needs 2 or more processes to scale to, got {n} "
                 f"({'GPUs on this host' if args.nproc is None else '--nproc'})")
    passthrough = ["--preset", args.preset, "-B", str(args.B), "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--backend", args.backend] + (["-T", str(args.T)] if args.T else []) + \
        (["--no-torch"] if args.no_torch else [])
    T = args.T or GPTConfig.preset(args.preset).block_size
    result = report([launch(k, passthrough) for k in (1, n)], args, T)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
