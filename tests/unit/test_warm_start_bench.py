"""The warm-start benchmark (BENCHMARKS.md, issue 19) as a check: what it shows must keep
holding. Over the first 12 seeds (the unit suite stays fast; the 96-seed figures are in
BENCHMARKS.md): warm start with ``searchSpace: boundingBox`` reaches the first run's best
with at least 30% fewer trials than the first run needed, and warm start with the full
space beats a cold run with the same seed by a wide margin. Reused trials are not paid
for, so they are never counted."""
from kubetune.bench import warm_start
from kubetune.core.runner import TrialRunner
from kubetune.core.warm_trials import WarmTrial
from kubetune.core.simulate import Simulator
from kubetune.spec import parse_experiment


def test_warm_start_reaches_the_first_runs_best_in_fewer_trials():
    results = [warm_start.run_seed(seed) for seed in warm_start.SEEDS[:12]]
    assert warm_start.reduction(results, "box") >= warm_start.TARGET_REDUCTION
    warm, cold = sum(r.warm.trials for r in results), sum(r.cold.trials for r in results)
    assert warm <= 0.8 * cold, (warm, cold)
    # the box never ends worse than its own warm-start seed: B is inside it
    assert all(r.box.final <= r.best or r.box.trials == warm_start.SECOND_MAX_TRIALS for r in results)


def test_a_reused_trial_is_neither_counted_nor_reaches_the_target():
    # every configuration of a tiny space was evaluated before: nothing runs
    space = {"a": {"choice": [1, 2]}}
    spec = parse_experiment({"objective": {"metric": "loss", "mode": "min"}, "searchSpace": space,
                             "search": {"algorithm": "tpe", "seed": 1}, "budget": {"maxTrials": 4, "parallelism": 1},
                             "warmStart": {"experiments": ["first"]}, "trial": {"entrypoint": "m:f"}})
    earlier = [WarmTrial(f"first/first-{a}", {"a": a}, {"loss": float(a)}) for a in (1, 2)]
    runner = TrialRunner(spec, experiment="second", start_time=0.0, warm_start=earlier)
    sim = Simulator(runner, lambda p, i: float(p["a"]), trial_length=1, keep_log=False)
    assert warm_start.trials_to_reach(runner, sim, 1.0, limit=40) == 40
    assert len(runner.trials) == 4 and all(t.reason == "Reused" for t in runner.trials.values())


def test_the_benchmark_refuses_fewer_than_ten_seeds(capsys):
    try:
        warm_start.main(["--seeds", "9"])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("9 seeds accepted")
    assert "at least 10" in capsys.readouterr().err
