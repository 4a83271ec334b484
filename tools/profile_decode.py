#!/usr/bin/env python3
"""Where a decode step's time goes (sampling with the key-value cache on the cuda backend): the step as
GPT.generate runs it (its CUDA graph with k_sample, the position copied in), the graph's GPU time alone against the
least time its reads allow, each op's share and each kernel's (its launches of one step, ten times over, as one
graph: GPU time, no host in it) with what it adds to the step (the step's launches as one graph, less the same
without that op's or kernel's: with dependent launches, a launch's own time overlaps its neighbours'), and
k_sample's time for each way of choosing (recorded and timed the same way).

    python tools/profile_decode.py                        # andrea-120m, B 1 and 8, a prompt of 16 tokens
    python tools/profile_decode.py --preset andrea-12m -B 1 --prompt 512
    python tools/profile_decode.py --quick --json         # a small model, one JSON object

Weights are random (seeded): the time does not depend on them. Every time is of one step: the last decoded, at
position p = prompt + UNTIMED (4) + steps - 1 (printed), whose attention reads p + 1 cached positions, not the prompt's.

An op's MB are the weights and cached keys and values it reads at the step's position (tools/timing.py
decode_reads: the fused products every linear weight and wte, attention_decode the cache 0..pos; activations not
counted), its GB/s those over its time, %copy that over the copy bandwidth measured in the same run (device to
device, bytes read and written). The step's limit: all its reads at that bandwidth. An op whose reads fit in L2
(andrea-12m's weights, 45 MB) may read them from there ten times over, above the copy bandwidth.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from microgpt import GPT, PRESETS, GPTConfig
from microgpt import kernels as K
from microgpt.sampling import Choice

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import cuda_copy_gbs, decode_reads, gpu_or_exit  # noqa: E402

UNTIMED = 4  # decode steps before the timed ones (the step's graph is captured at the first)
QUICK = GPTConfig(n_layer=2, n_head=2, d_model=64, block_size=128, vocab_size=257)


def gpu_ms(cuda, stream, run, times):
    """Milliseconds of GPU time per call of run(), called `times` times between two events."""
    start, end = cuda.Event(), cuda.Event()
    start.record(stream)
    for _ in range(times):
        run()
    end.record(stream)
    end.synchronize()
    return start.time_till(end) / times


def grouped(plan, by) -> dict[str, list]:
    """by(launch) -> its launches in `plan`, in the order each first launches. By op: Launch.op, the op of
    microgpt.ops, its launcher in brackets where not the reference's ('matmul_fwd (tc)'); by kernel: its name."""
    groups = {}
    for entry in plan:
        groups.setdefault(by(entry), []).append(entry)
    return groups


def without(plan, by, key) -> list:
    """The launches of `plan` but those with by(launch) == key, in order: the step less one op's or kernel's."""
    return [entry for entry in plan if by(entry) != key]


def launches_us(be, entries) -> float:
    """Microseconds of GPU time of `entries` (launches of a plan), ten times over as one graph (replayed where
    no graph can be captured), per time."""
    sub = K.Plan()
    sub.extend(list(entries) * 10)
    try:
        graph = K.Graph(sub, be.stream, "profile")
    except K.GraphUnavailable:
        graph = None
    launch = (lambda: graph.launch(be.stream)) if graph else (lambda: K.replay(sub, be.stream, "profile"))
    launch()
    us = gpu_ms(be.cuda, be.stream, launch, 1) / 10 * 1e3
    if graph is not None:
        graph.release()
    return us


def profile(cfg, B, prompt_len, steps, copy_gbs):
    model = GPT(cfg, backend="cuda")
    be, cuda = model.backend, model.backend.cuda
    rng = np.random.default_rng(0)
    idx = rng.integers(0, cfg.vocab_size, size=(B, prompt_len)).astype(np.int32)
    if prompt_len + UNTIMED + steps > cfg.block_size:
        raise SystemExit(f"profile_decode: --prompt {prompt_len} and {steps} steps pass block_size {cfg.block_size}")
    greedy = Choice(0.0, None, None, None)
    tokens = be.prefill(idx, greedy)
    for pos in range(prompt_len, prompt_len + UNTIMED):
        tokens = be.decode(tokens, pos, greedy)
    t0 = time.perf_counter()
    for tokens in be.decode_steps(tokens, prompt_len + UNTIMED, [greedy] * steps):  # as generate runs them
        pass
    step_ms = (time.perf_counter() - t0) / steps * 1e3
    d = be._dec  # the decode state: its step's plan and graph (the tool looks inside the backend on purpose)
    graph_ms = gpu_ms(cuda, be.stream, lambda: d.step.launch(be.stream), steps)
    # what a group of launches adds to the step: the step's launches timed as one graph, less the same without them
    # (with dependent launches a group's own time and what it adds to the chain differ)
    step, by_kernel, by_op = d.step.plan, (lambda e: e[0]), (lambda e: e.op)
    step_us = launches_us(be, step)
    adds = lambda by, key: step_us - launches_us(be, without(step, by, key))
    kernels = [dict(kernel=name, launches=len(entries), us=launches_us(be, entries), adds_us=adds(by_kernel, name))
               for name, entries in grouped(step, by_kernel).items()]
    kernels.sort(key=lambda k: -k["us"])
    position = d.length - 1  # the graph replays the last decode step: every time below is at this position
    reads = decode_reads(cfg, B, position)
    ops = []
    for op, entries in grouped(step, by_op).items():
        nbytes, us = reads.get(op.split(" (")[0]), launches_us(be, entries)
        gbs = nbytes / us / 1e3 if nbytes else None
        ops.append(dict(op=op, launches=len(entries), us=us, adds_us=adds(by_op, op), bytes=nbytes, gbs=gbs,
                        pct_copy=100 * gbs / copy_gbs if gbs else None))
    ops.sort(key=lambda o: -o["us"])
    u = rng.random(B)
    logits = d.logits.reshape(B, cfg.vocab_size)
    choices = []
    for c in (greedy, Choice(1.0, None, None, u), Choice(0.9, 50, None, u), Choice(1.0, None, 0.95, u),
              Choice(0.9, 50, 0.9, u)):
        be._put_draws(d, d.ring[0], c)  # the draws in place on the device
        plan = K.Plan()  # recorded and timed as the step's launches are: a graph, no host between its launches
        be.ops.on(plan).sample(d.ids[:B], logits, d.u if c.u is not None else None, c.temperature, c.top_k, c.top_p)
        choices.append(dict(temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, us=launches_us(be, plan)))
    limit_ms = sum(reads.values()) / copy_gbs / 1e6
    return dict(B=B, prompt=prompt_len, position=position, launches=len(d.step.plan), step_ms=step_ms,
                tokens_per_s=B / step_ms * 1e3, graph_ms=graph_ms, step_us=step_us, graph=d.step.graph is not None,
                graph_unavailable=d.step.unavailable, reads_bytes=sum(reads.values()), limit_ms=limit_ms,
                pct_of_limit=100 * limit_ms / graph_ms, ops=ops, kernels=kernels, sample=choices)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="andrea-120m")
    ap.add_argument("-B", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=16,
                    help=f"prompt length: {UNTIMED} steps, then --steps timed, follow it; the last is the one profiled")
    ap.add_argument("--steps", type=int, default=100, help="decode steps timed")
    ap.add_argument("--quick", action="store_true", help="a small model, B=1, 20 steps")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    args = ap.parse_args(argv)
    if min(args.B) < 1 or args.prompt < 1 or args.steps < 1:
        ap.error("-B, --prompt and --steps must be >= 1")
    device = gpu_or_exit("profile_decode")
    cfg = QUICK if args.quick else GPTConfig.preset(args.preset)
    if args.quick:
        args.B, args.steps = [1], 20
    copy_gbs = cuda_copy_gbs(K.engine().cuda.Stream())
    rows = [profile(cfg, B, args.prompt, args.steps, copy_gbs) for B in args.B]
    if args.json:
        print(json.dumps(dict(device=device, preset="quick" if args.quick else args.preset, copy_gbs=copy_gbs,
                              rows=rows)))
        return 0
    for r in rows:
        how = "one CUDA graph" if r["graph"] else f"replayed ({r['graph_unavailable']})"
        print(f"{device}: {'quick' if args.quick else args.preset}, B={r['B']}, prompt {r['prompt']}, the step at "
              f"position {r['position']}: {r['launches']} launches a step, {how}")
        print(f"  step (generate's: graph with k_sample, position in) {r['step_ms']:.3f} ms, {r['tokens_per_s']:,.0f} "
              f"tokens/s; the graph alone {r['graph_ms']:.3f} ms of GPU time")
        print(f"  the step reads {r['reads_bytes'] / 1e6:,.2f} MB: {r['limit_ms']:.3f} ms at the copy bandwidth "
              f"({copy_gbs:,.0f} GB/s), the graph at {r['pct_of_limit']:.1f}% of that limit")
        print(f"  the step's launches as one graph {r['step_us']:.1f} us (us: a group's launches alone; adds: the "
              f"step's time less its time without them)")
        print(f"  {'op':<32}{'launches':>9}{'us':>10}{'adds':>9}{'MB':>10}{'GB/s':>9}{'%copy':>7}")
        for o in r["ops"]:
            mb = (f"{o['bytes'] / 1e6:>10,.2f}{o['gbs']:>9,.0f}{o['pct_copy']:>6.0f}%" if o["bytes"]
                  else f"{'-':>10}{'-':>9}{'-':>7}")
            print(f"  {o['op']:<32}{o['launches']:>9}{o['us']:>10.1f}{o['adds_us']:>9.1f}{mb}")
        print(f"  {'kernel':<32}{'launches':>9}{'us':>10}{'adds':>9}")
        for k in r["kernels"]:
            print(f"  {k['kernel']:<32}{k['launches']:>9}{k['us']:>10.1f}{k['adds_us']:>9.1f}")
        for c in r["sample"]:
            print(f"  k_sample temperature {c['temperature']}, top_k {c['top_k']}, top_p {c['top_p']}: "
                  f"{c['us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
