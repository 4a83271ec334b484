"""The command's argument types: numbers within bounds, each error quoting the value typed (argparse prints it
after the flag's name)."""
from __future__ import annotations

import argparse
import math


def _number(kind, low=None, high=None, low_open=False, high_open=False, what=None):
    """An argparse type: a finite `kind` within [low, high] (an end excluded where *_open), its error
    quoting the value typed."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        bad = not math.isfinite(value) or (low is not None and (value <= low if low_open else value < low)) \
            or (high is not None and (value >= high if high_open else value > high))
        if bad:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    return parse


count = _number(int, 1, what="an integer >= 1")
count0 = _number(int, 0, what="an integer >= 0")
seed = _number(int, 0, 2 ** 63 - 1, what="an integer in [0, 2**63)")
rate = _number(float, 0.0, what="a finite number >= 0")
positive = _number(float, 0.0, low_open=True, what="a finite number > 0")
fraction = _number(float, 0.0, 1.0, what="a number in [0, 1]")
open_fraction = _number(float, 0.0, 1.0, low_open=True, high_open=True, what="a number in (0, 1)")
unit = _number(float, 0.0, 1.0, low_open=True, what="a number in (0, 1]")
