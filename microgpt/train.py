"""The training loop, top to bottom: evaluate, then for each step a batch, forward, backward, AdamW with the
scheduled learning rate; evaluate and checkpoint on schedule; stop on a NaN loss, after --stop-after steps,
or at Ctrl-C (finishing the step in flight and saving first).

microgpt.cli checks every argument and builds the model and the samplers before this runs.
"""
from __future__ import annotations

import math
import signal
import sys
import time

import numpy as np
from tqdm import tqdm

from .runlog import StepLog

EXIT_INTERRUPTED = 130  # what a shell reports for a process ended by SIGINT


class PeerFailed(RuntimeError):
    """Another process of a data-parallel run stopped (microgpt.distributed): this one stops too, in one line."""


def lr_at(step: int, lr: float, warmup: int, total: int, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class StopAtStepEnd:
    """While active, a first Ctrl-C asks the loop to stop after the step in flight; a second one
    interrupts at once (KeyboardInterrupt)."""

    def __init__(self):
        self.requested = False

    def __enter__(self):
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._previous)
        return False

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ninterrupted: finishing this step, then saving (Ctrl-C again to stop at once)", file=sys.stderr)


def train_loop(model, ckpt, train, val, args, tokenizer, resumed=False, dp=None, log=None) -> int:
    """Trains model from its step to args.steps (or args.stop_after steps of it) on batches of the samplers
    train and val, checkpointing at ckpt; returns the exit status: 0, 1 (a NaN loss, a failed save), or
    130 (Ctrl-C, after saving). dp (microgpt.distributed.DataParallel): this process trains its rows of each
    global batch, the gradients averaged over the processes; rank 0 alone logs, evaluates and saves.
    log: the run's open microgpt.runlog.RunLog, which gets a line every args.log_every steps and each evaluation."""
    T = train.T
    last_saved = model.step_count if resumed else None
    lead = dp is None or dp.lead  # the other ranks only train: no output, no evaluation, no checkpoint
    say = print if lead else (lambda *a, **k: None)  # noqa: E731
    watch = StepLog(log if lead else None, model, T, train.B * T, args.log_every, dp.world if dp else 1)

    def save():
        if not lead:
            return True
        nonlocal last_saved
        watch.sync()  # the log's lines reach the disk before the checkpoint of their step does
        try:
            record = tokenizer.record()  # a BPE tokenizer's path and sha256, for sample and --resume
            model.save(ckpt, extra={"train_sampler": train.state, "T": T} | ({"tokenizer": record} if record else {}))
        except OSError as e:
            kept = f"{ckpt} (step {last_saved}) is intact" if last_saved is not None else "no checkpoint was written"
            print(f"microgpt: error: could not write the checkpoint at step {model.step_count}: "
                  f"{e.strerror or e}; {kept}", file=sys.stderr)
            return False
        last_saved = model.step_count
        return True

    val_batches = [val.next() for _ in range(args.eval_batches)]  # the same held-out batches every time

    def evaluate() -> float:
        if not lead:
            return math.nan
        return float(np.mean([model.forward(b[:, :-1], b[:, 1:], return_logits=False)[1] for b in val_batches]))
    evaluate, save = watch.untimed(evaluate), watch.untimed(save)  # the log's tok_s is of training alone

    first = model.step_count
    if first >= args.steps:
        say(f"the checkpoint is at step {first}, --steps {args.steps}: nothing to train")
        return 0
    last = args.steps if args.stop_after is None else min(args.steps, first + args.stop_after)
    tokens_per_step = train.B * T  # the global batch's, under dp too
    with StopAtStepEnd() as stop:
        val_loss = evaluate()
        say(f"step {first:5d} | val loss {val_loss:.4f}")
        watch.start(first, val_loss)
        bar = tqdm(range(first, last), desc="train", unit="step", dynamic_ncols=True, file=sys.stderr,
                   disable=args.no_progress or not lead, initial=first, total=args.steps)
        t0 = time.perf_counter()
        for step in bar:
            lr = lr_at(step, args.lr, args.warmup, args.steps, args.min_lr_ratio)
            batch = train.next() if dp is None else dp.shard(train.next())
            model.zero_grad()
            _, loss = model.forward(batch[:, :-1], batch[:, 1:], return_logits=False)
            stopping = stop.requested  # decided here, for every rank alike; a later Ctrl-C counts next step
            if dp is not None:  # every rank sees the global loss and any rank's Ctrl-C at the same step
                loss, stopping = dp.agree(loss, stop.requested)
            if not math.isfinite(loss):
                bar.close()
                kept = f"the last good checkpoint is {ckpt} (step {last_saved})" if last_saved is not None \
                    else "no checkpoint was written"
                if lead:
                    print(f"step {step + 1}: the loss is {loss}; stopping ({kept})", file=sys.stderr)
                return 1
            model.backward()
            if dp is not None:
                dp.average_gradients(model)
            model.step(lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip)
            done = step + 1
            tok_s = tokens_per_step * (done - first) / (time.perf_counter() - t0)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}")
            val_loss = None
            if lead and (done % args.eval_every == 0 or done == args.steps):
                val_loss = evaluate()
                bar.write(f"step {done:5d} | train loss {loss:.4f} | val loss {val_loss:.4f} | "
                          f"lr {lr:.2e} | {tok_s:,.0f} tok/s")
            watch.step(done, loss, lr, val_loss)
            if done % args.ckpt_every == 0 or done == last or stopping:
                if not save():
                    bar.close()
                    return 1
            if stopping:
                bar.close()
                say(f"interrupted after step {done}: saved {ckpt}; continue with --resume")
                return EXIT_INTERRUPTED
    bar.close()
    if last < args.steps:
        say(f"stopped after step {last} (--stop-after {args.stop_after}): saved {ckpt}; continue with --resume")
        return 0
    if not lead:
        return 0
    print(f"checkpoint: {ckpt} (step {last_saved})")
    prompt = tokenizer.encode("The ")
    sample = model.generate(prompt, args.sample_tokens, temperature=0.8, top_k=40, seed=args.seed)
    print("sample:", tokenizer.decode(sample[0]))
    return 0
