"""The training loop, top to bottom: evaluate, then for each step a batch, forward, backward, AdamW with the
scheduled learning rate; evaluate and checkpoint on schedule; stop on a non-finite loss or weights (keeping
the last finite checkpoint), after --stop-after steps, or at Ctrl-C, SIGTERM or SIGHUP (finishing the step in
flight and saving first).

cmd_train, below, is `microgpt train`: it checks every argument (microgpt.usage's one-line errors) and builds
the model and the samplers before train_loop runs.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time

import numpy as np
from tqdm import tqdm

from . import checkpoint
from .config import GPTConfig
from .data import BatchSampler, cached_tokens, load_tokens, split
from .gpt import GPT
from .runlog import StepLog, progress_postfix
from .runs import RunFolder, RunFolderError
from .tokenizer import ByteTokenizer
from .usage import (UsageError, check_memory, flag, open_tokenizer, pick_backend, read_checkpoint, read_data,
                    run_tokenizer, typed)

# Without a GPU the command still runs, on a model small enough for numpy to train in seconds.
CPU_SIZES = dict(n_layer=2, n_head=4, d_model=64, block_size=64)
SIZE_FLAGS = ("n_layer", "n_head", "d_model", "block_size")
DEFAULT_BATCH_SIZE = 8

# The signals that end a run gracefully: Ctrl-C, a closed terminal, and what timeout, a batch scheduler or
# docker stop send. Each exits with 128 + its number, as a shell reports a process it ended.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class StopNow(KeyboardInterrupt):
    """A second stop signal: the run ends at once, its last checkpoint standing; exit 128 + signum."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def lr_at(step: int, lr: float, warmup: int, total: int, min_lr_ratio: float) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class StopAtStepEnd:
    """While active, a first stop signal (STOP_SIGNALS) asks the loop to stop after the step in flight and
    save; `signum` is the one received. A second one ends the run at once (StopNow)."""

    def __init__(self):
        self.signum = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self):
        self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False

    def _handle(self, signum, frame):
        if self.requested:
            raise StopNow(signum)
        self.signum = signum
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\ninterrupted ({name}): finishing this step, then saving ({name} again to stop at once)",
              file=sys.stderr)


def train_loop(model, ckpt, train, val, args, tokenizer, resumed=False, dp=None, log=None) -> int:
    """Trains model from its step to args.steps (or args.stop_after steps of it) on batches of the samplers
    train and val, checkpointing at ckpt; returns the exit status: 0, 1 (a non-finite loss or weights, a failed
    save), or 128 + the stop signal's number after saving (Ctrl-C 130, SIGHUP 129, SIGTERM 143).
    dp (microgpt.distributed.DataParallel): this process trains its rows of each global batch, the gradients
    averaged over the processes; rank 0 alone logs, evaluates and saves.
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
            model.save(ckpt, extra={"train_sampler": train.state, "T": T, "steps": args.steps} |
                       ({"tokenizer": record} if record else {}))
        except checkpoint.NonFiniteError:  # the step before went wrong (an inf gradient): not saved
            return stopped(f"step {model.step_count}: the weights are no longer finite (NaN or inf)")
        except OSError as e:
            kept = f"{ckpt} (step {last_saved}) is intact" if last_saved is not None else "no checkpoint was written"
            print(f"microgpt: error: could not write the checkpoint at step {model.step_count}: "
                  f"{e.strerror or e}; {kept}", file=sys.stderr)
            return False
        last_saved = model.step_count
        return True

    def stopped(why):
        kept = f"the last good checkpoint is {ckpt} (step {last_saved})" if last_saved is not None \
            else "no checkpoint was written"
        if lead:
            print(f"{why}; stopping ({kept})", file=sys.stderr)
        return False

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
                stopped(f"step {step + 1}: the loss is {loss}")
                return 1
            model.backward()
            if dp is not None:
                dp.average_gradients(model)
            model.step(lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip)
            done = step + 1
            tok_s = tokens_per_step * (done - first) / (time.perf_counter() - t0)
            bar.set_postfix(progress_postfix(loss, tok_s, watch.mfu(tok_s)))
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
                return 128 + (stop.signum or signal.SIGINT)  # a peer's signal stops this rank too
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


# ---------------------------------------------------------------------------------------------- the command
def config_from_args(args, backend: str, vocab_size: int) -> GPTConfig:
    """The preset (andrea-12m; CPU_SIZES on the numpy backend without --preset), each size flag given
    replacing one field of it."""
    try:
        base = GPTConfig.preset(args.preset or "andrea-12m", vocab_size=vocab_size)
    except ValueError as e:
        raise UsageError(f"--preset {args.preset}: {e} (the tokenizer's vocabulary is {vocab_size})") from None
    fields = base.to_dict() | (CPU_SIZES if args.preset is None and backend == "numpy" else {})
    fields |= {k: getattr(args, k) for k in SIZE_FLAGS if getattr(args, k) is not None}
    try:
        return GPTConfig.from_dict(fields)
    except ValueError as e:
        raise UsageError(f"{typed(args, SIZE_FLAGS) or 'the model sizes'}: {e}") from None


def run_batch_size(extra: dict):
    sampler = extra.get("train_sampler")
    B = sampler.get("B") if isinstance(sampler, dict) else None
    return B if type(B) is int and B >= 1 else None


def check_resume_flags(args, config: GPTConfig, T: int, extra: dict) -> None:
    """--resume continues the checkpoint's model: a size flag or a --seq-len that differs is refused."""
    changed = [f"{flag(k)} {getattr(args, k)} (the checkpoint's is {getattr(config, k)})"
               for k in SIZE_FLAGS if getattr(args, k) is not None and getattr(args, k) != getattr(config, k)]
    if args.preset is not None:
        try:
            same = GPTConfig.preset(args.preset, vocab_size=config.vocab_size) == config
        except ValueError:  # a preset that fixes another vocabulary
            same = False
        if not same:
            changed.append(f"--preset {args.preset} (the checkpoint's model is {config})")
    if args.seq_len is not None and args.seq_len != T:
        changed.append(f"--seq-len {args.seq_len} (the checkpoint's run uses {T})")
    B, world = run_batch_size(extra), int(os.environ.get("WORLD_SIZE", 1))
    if args.batch_size is not None and B is not None and world * args.batch_size != B:
        changed.append(f"--batch-size {args.batch_size} (the checkpoint's run uses {B})")
    if changed:
        raise UsageError(f"--resume continues the checkpoint's run, which these would change: {'; '.join(changed)}")


def training_tokens(args, tokenizer, T):
    """(train, validation) tokens of --data, each long enough for a window of T+1."""
    # a file is tokenized once, into a token file beside it that later runs map
    tokens = load_tokens(None, tokenizer) if args.data is None else \
        read_data(args.data, lambda path: cached_tokens(path, tokenizer, progress=not args.no_progress))
    if len(tokens) == 0:
        raise UsageError(f"--data {args.data} holds no text")
    train_tokens, val_tokens = split(tokens, args.val_fraction)
    if min(len(train_tokens), len(val_tokens)) < T + 1:
        raise UsageError(f"--data {args.data or '(built-in corpus)'}: {len(tokens):,} tokens are too few: with "
                         f"--val-fraction {args.val_fraction} the training part has {len(train_tokens):,} and the "
                         f"validation part {len(val_tokens):,}, and each needs at least T+1 = {T + 1} for "
                         f"sequences of T = {T}")
    return train_tokens, val_tokens


def data_parallel(requested: str):
    """Under torchrun (WORLD_SIZE set): (the backend, microgpt.distributed.DataParallel); else (backend, None)."""
    if "WORLD_SIZE" not in os.environ:
        return pick_backend(requested), None
    try:
        from .distributed import DataParallel, select_gpu  # torch: the [dist] extra, imported only here
    except ImportError as e:
        raise UsageError(f"WORLD_SIZE is set (torchrun) but torch.distributed is missing ({e}): pip install "
                         f"'microgpt[dist]'") from None
    select_gpu()
    backend = pick_backend(requested, quiet=os.environ.get("RANK", "0") != "0")
    return backend, DataParallel(backend)


def cmd_train(args) -> int:
    run = RunFolder(args.out)
    ckpt = run.checkpoint
    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run at --out, --overwrite replaces it: give one of them")
    if not args.resume and not args.overwrite and run.holds_run():
        raise UsageError(f"--out {args.out} already holds a run ({ckpt}): continue it with --resume, or start "
                         f"a new one over it with --overwrite")
    backend, dp = data_parallel(args.backend)
    world = dp.world if dp else 1
    if args.resume:
        if not ckpt.is_file():
            raise UsageError(f"--resume: no checkpoint at {ckpt}")
        saved = read_checkpoint(ckpt, "--resume")
        config, extra = saved.config, saved.extra
        tokenizer = run_tokenizer(args.tokenizer, extra, f"--resume: {ckpt}", resume=True)
        T = extra.get("T", config.block_size)
        if type(T) is not int or not 1 <= T <= config.block_size:
            raise UsageError(f"--resume: {ckpt}'s sidecar records T={T!r}, not an integer in [1, block_size]")
        check_resume_flags(args, config, T, extra)
    else:
        tokenizer = open_tokenizer(args.tokenizer) if args.tokenizer is not None else ByteTokenizer()
        config = config_from_args(args, backend, tokenizer.vocab_size)
        saved, extra, T = None, {}, args.seq_len or config.block_size
    if config.vocab_size < tokenizer.vocab_size:
        raise UsageError(f"the model's vocab_size {config.vocab_size} is below the tokenizer's {tokenizer.vocab_size}")
    if T > config.block_size:
        raise UsageError(f"--seq-len {T} is above the model's block_size {config.block_size}")
    B = args.batch_size or (run_batch_size(extra) or world * DEFAULT_BATCH_SIZE) // world  # per process
    flags = typed(args, ("batch_size", "seq_len", "eval_batches", *SIZE_FLAGS))
    check_memory(config, backend, flags, B, T, held=4 * args.eval_batches * world * B * (T + 1))  # + val batches
    train_tokens, val_tokens = training_tokens(args, tokenizer, T)
    train = BatchSampler(train_tokens, world * B, T, seed=args.seed)  # the global batch, dealt to the ranks
    val = BatchSampler(val_tokens, world * B, T, seed=args.seed + 1)
    if "train_sampler" in extra:
        try:  # the resumed run draws the batches the first would have
            train.state = extra["train_sampler"]
        except (TypeError, ValueError) as e:
            raise UsageError(f"--resume: the run's batches cannot continue on this data ({e}): resume with "
                             f"the --data and --val-fraction the run started with") from None
    lead = dp is None or dp.lead  # rank 0 alone writes the run and speaks
    if lead and extra.get("steps", args.steps) != args.steps:
        print(f"microgpt: note: the run was started for {extra['steps']} steps; with --steps {args.steps} "
              f"the learning rate follows the schedule to step {args.steps} from here", file=sys.stderr)
    try:  # a file, a place that cannot be written, a folder in use: refused before any step
        if lead:
            run.open(saved.step if saved else None)  # a resumed run's log goes on from its checkpoint
    except RunFolderError as e:
        raise UsageError(str(e)) from None
    try:
        model = GPT(config, backend=backend, seed=args.seed, variant=args.variant) if saved is None else \
            GPT.from_checkpoint(saved, backend=backend, variant=args.variant)
        if lead:
            print((f"resumed {run.checkpoint} at step {model.step_count}\n" if saved else "") +
                  f"training {model.num_params / 1e6:.2f}M parameters on {backend}: {config}, B={train.B}"
                  f"{f' ({world} x {B})' if dp else ''}, T={T}, {len(train.tokens):,} train / {len(val.tokens):,} "
                  f"val tokens")
        return train_loop(model, run.checkpoint, train, val, args, tokenizer, resumed=saved is not None, dp=dp,
                          log=run.log)
    finally:
        run.close()
        if dp is not None:
            dp.close()
