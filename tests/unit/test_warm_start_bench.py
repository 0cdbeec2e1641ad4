"""The warm-start benchmark (BENCHMARKS.md, issue 19) as a check: what it shows must keep
holding. Warm start misses the issue's 30% against the first run's own trial count
(reported there honestly); what it must keep doing is beat a cold run with the same seed."""
from kubetune.bench import warm_start


def test_warm_start_reaches_the_first_runs_best_in_fewer_trials_than_a_cold_run():
    results = [warm_start.run_seed(seed) for seed in warm_start.SEEDS]
    assert len(results) >= 10
    warm, cold = sum(r.warm for r in results), sum(r.cold for r in results)
    assert warm <= 0.8 * cold, (warm, cold)
