"""What an Experiment is told about the shared results store (AUDIT N3 and the
"results error text is shown to every tenant" finding): a store outage names no row
of anybody (the writer's error holds SQL text and other tenants' bound values), and
rows refused for their content show only on their own Experiment, with a Warning."""
from __future__ import annotations

from sqlalchemy.exc import OperationalError

from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.controller.status_events import status_events
from kubetune.results.writer import Rejection, ResultsWriter
from unit_helpers import wait_for


def _failing_store():
    raise OperationalError("INSERT INTO kubetune_metrics (name, text) VALUES (%(name)s, %(text)s)",
                           {"name": "tenant-b-secret-metric", "text": "tenant-b-secret-value"},
                           Exception("server closed the connection unexpectedly"))


def recorder(writer: ResultsWriter, uid: str) -> ResultsRecorder:
    return ResultsRecorder(writer, "team-a", lambda: {"metadata": {"name": "e", "uid": uid}, "spec": {}})


def test_a_store_outage_shows_no_sql_and_no_other_tenants_values():
    writer = ResultsWriter(_failing_store)
    try:
        recorder(writer, "A").experiment_status({"phase": "Running"})
        wait_for(lambda: writer.problem is not None, timeout=30)
        assert "tenant-b-secret" in writer.problem          # the operator log has it all
        [condition] = recorder(writer, "A").conditions([])
        assert condition[:3] == ("ResultsStoreUnavailable", True, "WriteFailed")
        assert "OperationalError" in condition[3]
        for hidden in ("tenant-b-secret", "INSERT", "kubetune_metrics", "server closed"):
            assert hidden not in condition[3]
    finally:
        writer.close(timeout=0.1)


def test_refused_rows_show_on_their_own_experiment_only_with_a_warning_each_time_more_are():
    writer = ResultsWriter(_failing_store)
    try:
        writer.rejected["A"] = Rejection(2, ("DataError",), "result seq 7")
        a, b = recorder(writer, "A").conditions([]), recorder(writer, "B").conditions([])
        assert "ResultsRejected" not in [c[0] for c in b]
        [rejected] = [c for c in a if c[0] == "ResultsRejected"]
        assert rejected[1] is True and "2 row(s)" in rejected[3] and "result seq 7" in rejected[3]
    finally:
        writer.close(timeout=0.1)

    def status(message):
        return {"conditions": [{"type": "ResultsRejected", "status": "True", "message": message}]}
    assert status_events({}, status("2 rows")) == [("Warning", "ResultsRejected", "2 rows")]
    assert status_events(status("2 rows"), status("2 rows")) == []
    assert status_events(status("2 rows"), status("3 rows")) == [("Warning", "ResultsRejected", "3 rows")]
