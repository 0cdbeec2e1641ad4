"""The results store's pure parts: metric values to columns and back, and what
`kubetune results` prints (table, JSON, CSV) and draws (PNG plots)."""
from __future__ import annotations

import csv
import io
import json
import math
import struct

import pytest

from kubetune.results import ExperimentRow, FailureRow, ResultRow, TrialRow, values
from kubetune.results.export import Report


@pytest.mark.parametrize("value", [1.5, math.inf, -math.inf, 0, -7, 2 ** 80, True, False, "text", {"a": [1, 2]}])
def test_metric_values_round_trip(value):
    assert values.decode(*values.encode(value)) == value
    assert type(values.decode(*values.encode(value))) is type(value)


def test_nan_round_trips_through_a_null_column():
    kind, number, text = values.encode(math.nan)
    assert kind == "f" and math.isnan(number)
    assert math.isnan(values.decode(kind, None, text))     # what SQLite hands back


def report(trials: int = 4, iterations: int = 20) -> Report:
    experiment = ExperimentRow("e", "team-a", "exp", "loss", "min", "Succeeded")
    rows, results = [], []
    for i in range(trials):
        rows.append(TrialRow(f"t{i}", "e", f"exp-{i}", i, {"lr": 10 ** -(i + 1), "opt": ["adam", "sgd"][i % 2]},
                             "Succeeded"))
        for step in range(iterations):
            loss = math.nan if (i == 3 and step > 4) else (i + 1) / (step + 1)
            results.append(ResultRow(f"t{i}", step, step + 1, {"loss": loss, "acc": 1 - loss / 10, "tag": "x"},
                                     time=float(step), attempt=0))
    failures = [FailureRow("t3", 0, "Error", "FloatingPointError: diverged\nTraceback ...\n", 3.0)]
    return Report(experiment, rows, results, failures)


def test_json_is_strict_and_spells_non_finite_values():
    out = io.StringIO()
    report().write_json(out)
    document = json.loads(out.getvalue(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    diverged = document["trials"][3]
    assert diverged["results"][10]["metrics"]["loss"] == "NaN"
    assert diverged["failures"][0]["message"].startswith("FloatingPointError: diverged")
    assert len(document["trials"][0]["results"]) == 20


def test_csv_has_one_row_per_result_with_params_and_metrics():
    out = io.StringIO()
    report().write_csv(out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == 80
    assert list(rows[0])[:8] == ["trial", "seq", "iteration", "attempt", "time", "checkpoint", "param.lr", "param.opt"]
    assert rows[0]["loss"] == "1.0" and rows[79]["loss"] == "NaN" and rows[79]["param.opt"] == "sgd"
    assert float(rows[79]["loss"]) != float(rows[79]["loss"])   # float() reads it back as NaN


def test_table_shows_the_objective_first_and_the_failed_attempts():
    out = io.StringIO()
    report().write_table(out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["TRIAL", "ITERATION", "ATTEMPT", "loss", "acc", "tag"]
    assert len([line for line in lines if line.startswith("exp-")]) == 80 + 1
    assert "FloatingPointError: diverged" in out.getvalue()


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plots_are_pngs_with_the_lines_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib import image
    from kubetune.results.plots import draw
    paths = {p.name: p for p in draw(report(), tmp_path)}
    assert set(paths) == {"history.png", "curves.png", "parallel.png"}
    assert png_size(paths["history.png"]) == (800, 500) and png_size(paths["curves.png"]) == (800, 500)
    width, height = png_size(paths["parallel.png"])
    assert width >= 600 and height == 500
    history = image.imread(paths["history.png"])[..., :3]
    red = (abs(history - [0xd6 / 255, 0x27 / 255, 0x28 / 255]).sum(axis=-1) < 0.05).sum()
    assert red > 200, "the best-so-far line is drawn"
    curves = image.imread(paths["curves.png"])[..., :3]
    assert len({tuple(p) for p in curves.reshape(-1, 3)[::7].round(2)}) > 30, "several coloured curves"
