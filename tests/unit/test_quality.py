"""The search quality check (kubetune.bench.quality) with its fixed seeds and thresholds."""
import pytest

from kubetune.bench import quality


@pytest.mark.parametrize("seed", quality.CURVE_SEEDS)
def test_asha_matches_fifo_with_a_fraction_of_the_iterations(seed):
    result = quality.asha_vs_fifo(seed)
    assert result["gap"] <= quality.ASHA_MAX_GAP, result
    assert result["budget_fraction"] <= quality.ASHA_MAX_BUDGET, result
    assert result["asha_iterations"] < result["fifo_iterations"] == quality.CURVE_TRIALS * quality.CURVE_ITERATIONS


def test_tpe_beats_random_search_on_branin():
    result = quality.tpe_vs_random()
    assert result["tpe_median"] < result["random_median"], result
    assert result["tpe_median"] >= quality.BRANIN_MINIMUM - 1e-6      # nothing below the known minimum


def test_branin_known_minimum():
    assert quality.branin({"x1": 3.14159265, "x2": 2.275}) == pytest.approx(quality.BRANIN_MINIMUM, abs=1e-5)
