"""microgpt plot: several runs' logs on one PNG; without matplotlib, and for a run with no log, one line."""
import struct
import sys

import numpy as np
import pytest

from microgpt.cli import main
from microgpt.plot import moving_average, run_names

from helpers import SMALL_RUN as SMALL, one_line_error


@pytest.fixture
def runs(tmp_path, corpus, capsys):
    """Two short runs, a and b, of different learning rates."""
    for name, lr in (("a", "3e-3"), ("b", "1e-2")):
        assert main(["train", *SMALL, "--data", corpus, "--steps", "8", "--eval-every", "4", "--lr", lr,
                     "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    return [str(tmp_path / "a"), str(tmp_path / "b")]


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_draws_several_runs_into_one_png(tmp_path, runs, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "loss.png"
    assert main(["plot", *runs, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: a, b"
    assert png_size(out) == (1100, 400)
    assert main(["plot", runs[0], f"{runs[1]}/log.jsonl", "-o", str(out), "--log-x", "--smooth", "3"]) == 0


def test_the_moving_average_is_over_the_last_n_points():
    values = [4.0, 2.0, 6.0, 8.0, 1.0]
    expected = [np.mean(values[max(0, i - 2):i + 1]) for i in range(len(values))]
    np.testing.assert_allclose(moving_average(values, 3), expected)
    np.testing.assert_allclose(moving_average(values, 1), values)


def test_runs_are_named_by_their_folder_or_by_their_path_where_two_share_a_name(tmp_path):
    for p in ("x/run", "y/run", "z"):
        (tmp_path / p).mkdir(parents=True)
    assert run_names([tmp_path / "x/run", tmp_path / "z"]) == ["run", "z"]
    assert run_names([tmp_path / "x/run", tmp_path / "y/run"]) == [str(tmp_path / "x/run"), str(tmp_path / "y/run")]


def test_without_matplotlib_plot_says_how_to_install_it(tmp_path, runs, capsys, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    line = one_line_error(capsys, main(["plot", *runs, "-o", str(tmp_path / "x.png")]))
    assert line == "microgpt: error: plot needs matplotlib: pip install 'microgpt[plot]'"
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("case, message", [
    ("no log", "RUN {tmp}/empty: no log.jsonl in it"),
    ("no such run", "RUN {tmp}/nope: no such run folder or log file"),
    ("no valid line", "RUN {tmp}/torn: {tmp}/torn/log.jsonl holds no log line"),
    ("out is a folder", "-o {tmp} is a folder"),
    ("unknown image type", "-o {tmp}/loss.xyz: Format 'xyz' is not supported"),
    ("out cannot be written", "-o {tmp}/nope/loss.png cannot be written: No such file or directory"),
])
def test_bad_plot_arguments_are_one_line(tmp_path, runs, capsys, case, message):
    pytest.importorskip("matplotlib")
    (tmp_path / "empty").mkdir()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "log.jsonl").write_text('{"step": 0, "val')
    run, out = {"no log": ("empty", "x.png"), "no such run": ("nope", "x.png"), "no valid line": ("torn", "x.png"),
                "out is a folder": ("a", ""), "unknown image type": ("a", "loss.xyz"),
                "out cannot be written": ("a", "nope/loss.png")}[case]
    line = one_line_error(capsys, main(["plot", str(tmp_path / run), "-o", str(tmp_path / out)]))
    assert message.format(tmp=tmp_path) in line, line
