"""The stdout result format (metricsCollector: stdout): which lines are results, how they
are numbered, and what a malformed one says."""
import json

import pytest

from kubetune.executors.pods import spec as pod_spec
from kubetune.executors.pods.logs import collects_stdout, result_lines
from kubetune.executors.pods.stdout_results import MAX_LINE_CHARS, MalformedLine, ResultLine, ResultLines
from kubetune.spec.results import Result


def feed_all(lines, first_seq=1, start_iteration=0, attempt=0):
    parser = ResultLines(first_seq, start_iteration, attempt)
    return [parser.feed(line) for line in lines]


def test_result_lines_become_ingest_bodies_and_other_output_is_ignored():
    parsed = feed_all(["epoch 1 done\n",
                       'KUBETUNE_RESULT {"loss": 0.5}\n',
                       "  KUBETUNE_RESULT {\"loss\": 9}",            # not at the start: the program's own text
                       'KUBETUNE_RESULTS {"loss": 9}',              # another word
                       'KUBETUNE_RESULT {"loss": 0.4, "acc": 0.9, "checkpoint": "s3://b/t/2"}\r\n',
                       'KUBETUNE_RESULT\t{"loss": 0.3, "iteration": 7}'], first_seq=4, start_iteration=2)
    assert parsed[0] is None and parsed[2] is None and parsed[3] is None
    # the one wire format (spec.results.Result.to_wire); the ingest stamps the time
    wire = {"timestamp": None, "checkpoint": None, "attempt": 0}
    assert [p.body for p in parsed if isinstance(p, ResultLine)] == [
        {**wire, "seq": 4, "iteration": 3, "metrics": {"loss": 0.5}},
        {**wire, "seq": 5, "iteration": 4, "metrics": {"loss": 0.4, "acc": 0.9}, "checkpoint": "s3://b/t/2"},
        {**wire, "seq": 6, "iteration": 7, "metrics": {"loss": 0.3}},
    ]
    (checkpoint_only,) = feed_all(['KUBETUNE_RESULT {"checkpoint": "s3://b/t/3"}'])
    assert checkpoint_only.body == {**wire, "seq": 1, "iteration": 1, "metrics": {}, "checkpoint": "s3://b/t/3"}
    assert Result.from_wire(checkpoint_only.body, now=5.0) == Result(1, 1, {}, 5.0, "s3://b/t/3", 0)


@pytest.mark.parametrize("line,words", [
    ("KUBETUNE_RESULT", "no JSON object"),
    ("KUBETUNE_RESULT {loss: 1}", "not JSON"),
    ("KUBETUNE_RESULT [0.3]", "expected a JSON object"),
    ('KUBETUNE_RESULT {"loss": 1, "iteration": 0}', "iteration must be an integer >= 1"),
    ('KUBETUNE_RESULT {"loss": 1, "iteration": 2.5}', "iteration must be an integer >= 1"),
    ('KUBETUNE_RESULT {"loss": 1, "checkpoint": 3}', "checkpoint must be a string"),
    ('KUBETUNE_RESULT {"iteration": 3}', "no metrics"),
    ('KUBETUNE_RESULT {"loss": 1, "iteration": 9223372036854775808}', "at most 9223372036854775807"),
    ('KUBETUNE_RESULT {"loss": 99999999999999999999}', "outside the 64-bit integer range"),
    ('KUBETUNE_RESULT {"loss": [1, 2]}', "metric 'loss' is a list; report numbers or strings"),
    ('KUBETUNE_RESULT {"loss": null}', "metric 'loss' is a NoneType"),
    ('KUBETUNE_RESULT {"x": "' + "a" * MAX_LINE_CHARS + '"}', "longer than"),
])
def test_a_malformed_result_line_says_why(line, words):
    (parsed,) = feed_all([line])
    assert isinstance(parsed, MalformedLine) and words in parsed.problem and parsed.seq == 1
    assert len(parsed.line) <= 200


def test_a_malformed_line_takes_its_seq_so_rereading_numbers_the_same():
    lines = ['KUBETUNE_RESULT {"loss": 1}', "KUBETUNE_RESULT oops", 'KUBETUNE_RESULT {"loss": 2}']
    first = feed_all(lines, first_seq=10)
    again = feed_all(lines, first_seq=10)
    assert [p.seq for p in first] == [10, 11, 12] and first == again
    assert first[2].body["iteration"] == 2     # the malformed line is no iteration


def pod(env, attempt="1", annotations=None):
    return {"metadata": {"name": "t-0-a1", "labels": {pod_spec.LABEL_ATTEMPT: attempt},
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "train", "env": [{"name": k, "value": v} for k, v in env.items()]}]}}


def test_a_pod_is_read_with_the_numbering_it_was_created_with():
    parser = result_lines(pod({"KUBETUNE_FIRST_SEQ": "6", "KUBETUNE_START_ITERATION": "5"}))
    assert parser.feed('KUBETUNE_RESULT {"loss": 1}').body == {"seq": 6, "iteration": 6, "attempt": 1,
                                                              "metrics": {"loss": 1}, "timestamp": None,
                                                              "checkpoint": None}


def test_the_stdout_collector_is_recorded_on_the_pod():
    def render(collector):
        return pod_spec.render_pod({"spec": {"containers": [{"name": "train", "image": "x"}]}},
                                   namespace="ns", experiment="e", trial="e-0", trial_uid="u", attempt=0,
                                   params={}, env={}, metrics_collector=collector)
    assert collects_stdout(render("stdout"))
    assert not collects_stdout(render("push"))
    assert pod_spec.ANNOTATION_METRICS_COLLECTOR not in render("push")["metadata"]["annotations"]


def test_kubetune_report_in_a_stdout_pod_prints_what_the_operator_reads_back(capfd, tmp_path):
    # the same training code in a pod of a metricsCollector: stdout experiment: report()
    # prints result lines, and parsing the log gives the bodies a push would have sent
    from kubetune.trainable.pod_session import PodSession

    session = PodSession({"KUBETUNE_INGEST_URL": "http://unreachable.invalid:1", "KUBETUNE_TRIAL_TOKEN": "t",
                          "KUBETUNE_TRIAL": "ns/exp/exp-1", "KUBETUNE_ATTEMPT": "1", "KUBETUNE_FIRST_SEQ": "6",
                          "KUBETUNE_START_ITERATION": "4", "KUBETUNE_METRICS_COLLECTOR": "stdout"})
    print("epoch 5 of the program's own output")
    session.report({"loss": 0.25, "acc": 0.5})
    session.report({"loss": 0.125}, checkpoint=str(tmp_path))    # no storage: the location is passed on
    parser = ResultLines(6, 4, 1)
    parsed = [parser.feed(line) for line in capfd.readouterr().out.splitlines()]
    assert [p.body for p in parsed if p is not None] == [
        {"seq": 6, "iteration": 5, "attempt": 1, "metrics": {"loss": 0.25, "acc": 0.5}, "timestamp": None,
         "checkpoint": None},
        {"seq": 7, "iteration": 6, "attempt": 1, "metrics": {"loss": 0.125}, "checkpoint": str(tmp_path),
         "timestamp": None},
    ]


def test_the_log_is_split_in_bounded_memory_whatever_a_line_holds():
    import tracemalloc

    from kubetune.executors.pods.stdout_results import LogLines
    lines, parser = LogLines(), ResultLines(1, 0, 0)
    chunk = b"#" * 65536
    parsed = [parser.feed(*line) for line in lines.feed(b'KUBETUNE_RESULT {"loss": 1}\nKUBETUNE_RESULT {"x": "')]
    tracemalloc.start()
    try:
        for _ in range(256):               # 16 MiB without a newline, as a log stream delivers it
            assert lines.feed(chunk) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_LINE_CHARS, peak        # the whole line held would be 16 MiB
    tail = lines.feed(b'"}\nprogress ' + b"." * 70000 + b'\nKUBETUNE_RESULT {"loss": 2}\nlast')
    parsed += [parser.feed(*line) for line in tail + lines.finish()]
    assert [p.body["metrics"] for p in parsed if isinstance(p, ResultLine)] == [{"loss": 1}, {"loss": 2}]
    overlong = [p for p in parsed if isinstance(p, MalformedLine)]
    # the cut result line keeps its seq (numbering stays right) and says why it was skipped
    assert [(p.seq, p.problem) for p in overlong] == [(2, f"longer than {MAX_LINE_CHARS} characters")]
    assert [p.seq for p in parsed if isinstance(p, ResultLine)] == [1, 3]


def test_an_iteration_too_large_is_said_and_does_not_drop_the_lines_after_it():
    """A printed iteration above what the ingest takes (2^31-1) was dropped without a word,
    and every later line with it (each counts on from the one before)."""
    parser = ResultLines(first_seq=0, start_iteration=0, attempt=0)
    parsed = [parser.feed(f"KUBETUNE_RESULT {json.dumps(fields)}") for fields in
              ({"loss": 1.0}, {"loss": 2.0, "iteration": 2 ** 40}, {"loss": 3.0}, {"loss": 4.0, "iteration": 9})]
    assert isinstance(parsed[1], MalformedLine) and parsed[1].seq == 1 and "above 2147483647" in parsed[1].problem
    assert [(p.seq, p.body["iteration"]) for p in parsed if isinstance(p, ResultLine)] == [(0, 1), (2, 2), (3, 9)]
