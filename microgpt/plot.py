"""microgpt plot: the logs of training runs (microgpt.runlog) on one figure.

    microgpt plot runs/a runs/b -o loss.png --smooth 10

Left, the loss against the step: the train loss as a line (with --smooth N, its moving average over N points
before the raw loss, drawn faint) and the val loss as dots; right, tokens/s. Each run has one colour and is
named by its folder. Drawn with matplotlib (the optional extra `plot`), imported only here, when drawing, on
its Agg canvas, which needs no screen.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .argtypes import count
from .runlog import LogError, read_log


class PlotError(Exception):
    """The runs cannot be plotted or the figure cannot be written; the message names the argument."""


def add_parser(sub):
    """The `plot` subcommand's parser, on the command's subparsers."""
    pl = sub.add_parser("plot", help="train and val loss, and tokens/s, of runs' logs (log.jsonl) on one figure")
    pl.add_argument("runs", nargs="+", metavar="RUN", help="a run folder (train's --out) or its log.jsonl")
    pl.add_argument("-o", "--out", default="loss.png", help="the image to write: .png, .pdf, .svg (default: "
                    "loss.png)")
    pl.add_argument("--log-x", action="store_true", help="the steps on a logarithmic axis")
    pl.add_argument("--smooth", type=count, default=1, metavar="N", help="draw the train loss as its moving average "
                    "over N points (default: 1, the loss as logged)")
    return pl


def moving_average(values, n: int) -> np.ndarray:
    """Each value's mean with the n - 1 before it (with as many as there are, at the start)."""
    sums = np.concatenate([[0.0], np.cumsum(np.asarray(values, np.float64))])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - n, 0)
    return (sums[end] - sums[start]) / (end - start)


def series(records, key: str, log_x: bool = False) -> tuple[list, list]:
    """(steps, values) of the records that hold a finite number under key (and a step > 0 on a log axis)."""
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))
              and math.isfinite(r[key]) and (r["step"] > 0 or not log_x)]
    return [p[0] for p in points], [p[1] for p in points]


def run_names(runs) -> list:
    """Each run's folder name; the paths as typed where two folders share a name."""
    names = [(Path(r).parent if Path(r).is_file() else Path(r)).resolve().name for r in runs]
    return names if len(set(names)) == len(names) else [str(r) for r in runs]


def plot_runs(runs, out, log_x: bool = False, smooth: int = 1) -> str:
    """Draws the runs' logs into the image `out`; returns a line saying what was drawn."""
    Figure, FigureCanvasAgg = _matplotlib()
    logs = []
    for run in runs:
        try:
            logs.append(read_log(run))
        except LogError as e:
            raise PlotError(f"RUN {e}") from None
    if Path(out).is_dir():
        raise PlotError(f"-o {out} is a folder; expected the path of an image to write")
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, speed_ax = fig.subplots(1, 2)
    for i, (name, records) in enumerate(zip(run_names(runs), logs)):
        colour = f"C{i % 10}"
        steps, train = series(records, "train_loss", log_x)
        if smooth > 1 and train:
            loss_ax.plot(steps, train, color=colour, alpha=0.25, linewidth=0.8)
            train = moving_average(train, smooth)
        loss_ax.plot(steps, train, color=colour, linewidth=1.2, label=f"{name} train")
        loss_ax.plot(*series(records, "val_loss", log_x), "o--", color=colour, markersize=4, linewidth=0.8,
                     label=f"{name} val")
        speed_ax.plot(*series(records, "tok_s", log_x), color=colour, linewidth=1.0, label=name)
    smoothed = f", train smoothed over {smooth} points" if smooth > 1 else ""
    loss_ax.set(xlabel="step", ylabel="loss (nats a token)", title=f"loss{smoothed}")
    speed_ax.set(xlabel="step", ylabel="tokens/s", title="tokens/s")
    for ax in (loss_ax, speed_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        if log_x:
            ax.set_xscale("log")
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise PlotError(f"-o {out} cannot be written: {e.strerror or e}") from None
    except ValueError as e:  # a file type matplotlib does not write
        raise PlotError(f"-o {out}: {e}") from None
    return f"{out}: {', '.join(run_names(runs))}"


def _matplotlib():
    """matplotlib's Figure and Agg canvas; PlotError where matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("plot needs matplotlib: pip install 'microgpt[plot]'") from None
    return Figure, FigureCanvasAgg
