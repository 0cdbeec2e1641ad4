"""``kubetune results EXP --plot DIR --objectives ...``: the Pareto front and the
hypervolume history drawn from stored results."""
from __future__ import annotations

import pytest

from kubetune.results import ExperimentRow, ResultRow, TrialRow
from kubetune.results.export import Report
from kubetune.results.pareto_plots import final_values, pareto_front, parse_constraints, parse_objectives

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


def constrained() -> Report:
    """report() with a memory metric: mo-0 (on the unconstrained front) needs 3 GB, mo-3
    never reports it; the others need 1 GB."""
    base = report()
    memory = {0: 3.0, 1: 1.0, 2: 1.0}
    extra = [ResultRow(f"t{i}", 2, 3, {"memory_gb": gb}) for i, gb in memory.items()]
    return Report(base.experiment, base.trials, base.results + extra, [])


def test_infeasible_trials_are_never_on_the_front():
    objectives = parse_objectives("loss:min:1,size:min:10")
    assert set(pareto_front(constrained(), objectives)) == {"mo-0", "mo-1", "mo-3"}
    # mo-0 breaks memory_gb <= 2, mo-3 never reported it (broken, as the operator counts it)
    assert set(pareto_front(constrained(), objectives, parse_constraints("memory_gb:max:2"))) == {"mo-1"}
    assert set(pareto_front(constrained(), objectives, parse_constraints("memory_gb:max:2,memory_gb:min:1.5"))) == set()
    with pytest.raises(SystemExit, match="metric:max"):
        parse_constraints("memory_gb<=2")


def test_the_command_draws_the_front_from_a_real_store(tmp_path, capsys):
    """`kubetune results EXP --plot DIR --objectives ... --constraints ...` on a SQLite store."""
    pytest.importorskip("matplotlib")
    from kubetune.cli import main
    from kubetune.results import Batch, open_store
    url = f"sqlite:///{tmp_path / 'results.db'}"
    data = constrained()
    store = open_store(url)
    store.write(Batch(experiments=[data.experiment], trials=list(data.trials), results=list(data.results)))
    store.close()
    plots = tmp_path / "plots"
    code = main(["results", "mo", "--store", url, "--plot", str(plots), "-o", "csv",
                 "--objectives", "loss:min:1,size:min:10", "--constraints", "memory_gb:max:2"])
    assert code == 0
    assert {p.name for p in plots.iterdir()} >= {"pareto.png", "hypervolume.png", "history.png"}
    assert "Pareto front: 1 trials: mo-1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="give --plot"):
        main(["results", "mo", "--store", url, "--objectives", "loss:min,size:min"])
    with pytest.raises(SystemExit, match="give --objectives"):
        main(["results", "mo", "--store", url, "--plot", str(plots), "--constraints", "memory_gb:max:2"])
