"""The search quality check (kubetune.bench.quality) with its fixed seeds and thresholds."""
import pytest

from kubetune.bench import quality


def test_asha_matches_fifo_with_a_fraction_of_the_iterations():
    """Over 12 seeds: ASHA's best within 5% of FIFO's with at most 40% of its iterations
    (medians), and no seed worse than a 15% gap or half the iterations."""
    results = [quality.asha_vs_fifo(seed) for seed in quality.CURVE_SEEDS]
    assert quality.asha_passes(results), results
    for result in results:
        assert result["asha_iterations"] < result["fifo_iterations"] == quality.CURVE_TRIALS * quality.CURVE_ITERATIONS
    # the check can fail: FIFO's own results judged as ASHA's would spend the whole budget
    assert not quality.asha_passes([{**r, "budget_fraction": 1.0} for r in results])


def test_tpe_beats_random_search_on_branin():
    result = quality.tpe_vs_random()
    assert result["tpe_median"] < result["random_median"], result
    assert result["tpe_median"] >= quality.BRANIN_MINIMUM - 1e-6      # nothing below the known minimum


def test_branin_known_minimum():
    assert quality.branin({"x1": 3.14159265, "x2": 2.275}) == pytest.approx(quality.BRANIN_MINIMUM, abs=1e-5)
