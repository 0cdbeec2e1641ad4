"""``kubetune results EXP --plot DIR --objectives ...``: the Pareto front and the
hypervolume history drawn from stored results."""
from __future__ import annotations

import pytest

from kubetune.results import ExperimentRow, ResultRow, TrialRow
from kubetune.results.export import Report
from kubetune.results.pareto_plots import final_values, parse_objectives

# (loss, size) of each trial's last result; exp-2 is dominated by exp-1, exp-4 failed
FINAL = {0: (0.2, 9.0), 1: (0.5, 3.0), 2: (0.6, 4.0), 3: (0.9, 1.0), 4: (0.1, 0.5)}


def report() -> Report:
    experiment = ExperimentRow("e", "ns", "mo", "loss", "min", "Succeeded")
    trials = [TrialRow(f"t{i}", "e", f"mo-{i}", i, {"x": i}, "Failed" if i == 4 else "Succeeded") for i in FINAL]
    results = []
    for i, (loss, size) in FINAL.items():
        results.append(ResultRow(f"t{i}", 0, 1, {"loss": loss + 1, "size": size}))
        results.append(ResultRow(f"t{i}", 1, 2, {"loss": loss}))      # size reported once: its last value counts
    return Report(experiment, trials, results, [])


def test_final_values_take_each_metrics_last_report_of_succeeded_trials():
    finals = final_values(report(), ["loss", "size"])
    assert finals == {f"mo-{i}": list(FINAL[i]) for i in range(4)}


def test_objectives_argument_names_what_is_wrong():
    assert parse_objectives("loss:min:2,size:max") == [("loss", "min", 2.0), ("size", "max", None)]
    with pytest.raises(SystemExit, match="metric:min"):
        parse_objectives("loss:lowest,size:min")
    with pytest.raises(SystemExit, match="at least two"):
        parse_objectives("loss:min")


def test_pareto_and_hypervolume_pngs_show_the_front(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib import image
    from kubetune.results.pareto_plots import draw_pareto
    paths = {p.name: p for p in draw_pareto(report(), tmp_path, parse_objectives("loss:min:1,size:min:10"))}
    assert set(paths) == {"pareto.png", "hypervolume.png"}
    pixels = image.imread(paths["pareto.png"])[..., :3]
    red = (abs(pixels - [0xd6 / 255, 0x27 / 255, 0x28 / 255]).sum(axis=-1) < 0.05).sum()
    grey = (abs(pixels - [0x7f / 255, 0x7f / 255, 0x7f / 255]).sum(axis=-1) < 0.1).sum()
    assert red > 100 and grey > 20, "the front in red, the dominated trial in grey"
    assert set(draw_pareto(report(), tmp_path / "b", parse_objectives("loss:min,size:min"))) == {tmp_path / "b" / "pareto.png"}
