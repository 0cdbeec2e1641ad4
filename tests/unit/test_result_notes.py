"""What a Trial's status cuts of its results is said once per trial, in words a user
acts on (controller/result_notes.py): a long string metric, a result too large for
lastMetrics, a flood of results the history thins."""
from kubetune.controller.result_notes import CUT, THINNED, ResultNotes
from kubetune.spec.results import Result


def results(count, metrics=lambda i: {"loss": 1.0 / i}, per_second=100_000.0):
    return [Result(seq=i, iteration=i, metrics=metrics(i), timestamp=1000.0 + i / per_second)
            for i in range(1, count + 1)]


def test_a_one_megabyte_string_metric_is_said_once_naming_the_metric_and_where_it_is_whole():
    notes = ResultNotes("exp")
    big = results(2, metrics=lambda i: {"loss": 0.5, "log": "x" * 1_000_000})
    (found,) = notes.notes("exp-0", big)
    assert found[0] == CUT
    assert "metric 'log' is a 1,000,000-character string" in found[1]
    assert "shows its first 200" in found[1] and "kubetune results exp --trial exp-0" in found[1]
    assert notes.notes("exp-0", big) == []            # once per trial
    assert notes.notes("exp-1", big)[0][0] == CUT     # each trial its own


def test_too_many_metrics_for_last_metrics_are_said():
    many = results(1, metrics=lambda i: {f"m{k:04d}": float(k) for k in range(800)})
    (found,) = ResultNotes("exp").notes("exp-0", many)
    assert found[0] == CUT and "a result of 800 metrics" in found[1] and "4,096 bytes" in found[1]


def test_fifty_thousand_results_in_a_second_are_said_thinned_with_the_stride():
    notes = ResultNotes("exp")
    flood = results(50_000, per_second=50_000.0)
    (found,) = notes.notes("exp-0", flood, history_stride=1024)
    assert found[0] == THINNED
    assert "1,000 results or more within one second" in found[1] and "one point every 1024 iterations" in found[1]
    assert "Report less often" in found[1]
    assert notes.notes("exp-0", flood, history_stride=2048) == []


def test_a_flood_split_into_small_fetches_is_still_seen():
    notes = ResultNotes("exp")
    flood = results(1_200, per_second=5_000.0)
    said = [found for start in range(0, 1_200, 100) for found in notes.notes("exp-0", flood[start:start + 100])]
    assert [reason for reason, _ in said] == [THINNED]


def test_ordinary_results_say_nothing():
    notes = ResultNotes("exp")
    assert notes.notes("exp-0", results(200, per_second=10.0)) == []       # a long, paced run
    assert notes.notes("exp-1", results(999)) == []                        # fast, but few
    assert notes.notes("exp-2", results(3_000, per_second=900.0)) == []    # many, but under 1,000 a second
    assert notes.notes("exp-0", results(3, metrics=lambda i: {"loss": 0.1, "phase": "train"})) == []
