"""Data-parallel training through an existing engine, torch.distributed, started by torchrun:

    torchrun --nproc-per-node 2 -m microgpt train --batch-size 4 ...   # 2 processes, 8 rows a step in all

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK; the command then builds one DataParallel (NCCL between GPUs,
gloo between CPUs; torch is the optional extra [dist], imported only then). Every process holds the whole
model, seeded alike, and:
  - draws the global batch of WORLD_SIZE * B rows from the one seeded sampler and takes its own B rows, so
    that N processes with --batch-size b see the batches of one process with --batch-size N * b;
  - after backward, all-reduces the flat gradient vector in place (one contiguous buffer: a NumPy array, or
    the device buffer wrapped for torch through __cuda_array_interface__, no copy) and divides it by N,
    the gradient of the global batch's mean loss; every process then takes the same AdamW step;
  - all-reduces the loss and the stop request with it, so that a NaN or a Ctrl-C stops every rank at the
    same step.
Rank 0 alone logs, evaluates, samples and writes checkpoints. A rank that fails exits with its error, and
the others stop at their next collective in one line (PeerFailed, exit 1), or torchrun ends them. NVLink multicast is left as the machine sets it (NCCL_NVLS_ENABLE is not touched).
"""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist

from .usage import PeerFailed


class DataParallel:
    def __init__(self, device: str):
        """device: "cuda" (NCCL; each process sees its LOCAL_RANK's GPU as device 0) or "numpy" (gloo)."""
        if device == "cuda":
            torch.cuda.set_device(0)  # the one GPU CUDA_VISIBLE_DEVICES leaves this process (see select_gpu)
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
        self.device = device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.lead = self.rank == 0

    def shard(self, batch: np.ndarray) -> np.ndarray:
        """This rank's rows of a global batch of world * B rows."""
        b = batch.shape[0] // self.world
        return batch[self.rank * b:(self.rank + 1) * b]

    def _all_reduce(self, t) -> None:
        try:
            dist.all_reduce(t)
        except RuntimeError as e:  # a peer that exited: its own error says why
            raise PeerFailed(f"rank {self.rank}: another process of the run stopped "
                             f"({str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__})") from None

    def agree(self, loss: float, stop: bool) -> tuple[float, bool]:
        """The mean of the ranks' losses, and whether any rank asks to stop."""
        t = torch.tensor([loss, float(stop)], dtype=torch.float64)
        if self.device == "cuda":
            t = t.cuda()
        self._all_reduce(t)
        total, stops = t.tolist()
        return total / self.world, stops > 0

    def average_gradients(self, model) -> None:
        """The flat gradient vector, summed over the ranks in place and divided by their number."""
        grads = model.backend.grad_buffer()
        t = torch.from_numpy(grads) if isinstance(grads, np.ndarray) else torch.as_tensor(grads, device="cuda")
        self._all_reduce(t)
        t.div_(self.world)
        if self.device == "cuda":
            torch.cuda.synchronize()  # the sum is in place before the next kernels read it

    def close(self) -> None:
        dist.destroy_process_group()


def select_gpu() -> None:
    """Each process of a torchrun on one host sees its own GPU (LOCAL_RANK) as device 0: set before CUDA
    starts, for PyCUDA and torch alike."""
    if "LOCAL_RANK" not in os.environ:
        return
    local = int(os.environ["LOCAL_RANK"])
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[local] if local < len(visible) else str(local)
