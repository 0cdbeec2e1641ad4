"""The warm-start benchmark (BENCHMARKS.md, issue 19) as a check: what it shows must keep
holding. Warm start misses the issue's 30% against the first run's own trial count over
48 seeds (reported there honestly); what it must keep doing is beat a cold run with the
same seed by a wide margin. The first 12 seeds keep the unit suite fast."""
from kubetune.bench import warm_start


def test_warm_start_reaches_the_first_runs_best_in_fewer_trials_than_a_cold_run():
    results = [warm_start.run_seed(seed) for seed in warm_start.SEEDS[:12]]
    warm, cold = sum(r.warm for r in results), sum(r.cold for r in results)
    assert warm <= 0.8 * cold, (warm, cold)


def test_the_benchmark_refuses_fewer_than_ten_seeds(capsys):
    try:
        warm_start.main(["--seeds", "9"])
    except SystemExit as exit:
        assert exit.code == 2
    else:
        raise AssertionError("9 seeds accepted")
    assert "at least 10" in capsys.readouterr().err
