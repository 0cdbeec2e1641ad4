"""What an Experiment is told about the shared results store (AUDIT N3 and the
"results error text is shown to every tenant" finding): a store outage names no row
of anybody (the writer's error holds SQL text and other tenants' bound values), and
rows refused for their content show only on their own Experiment, with a Warning."""
from __future__ import annotations

from sqlalchemy.exc import OperationalError

from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.controller.status_events import status_events
from kubetune.results.isolation import Rejection
from kubetune.results.writer import ResultsWriter
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


class Submitted:
    """A writer that keeps what it is handed (the rows' path ends here for this test)."""

    problem = None
    dropped = 0

    def __init__(self) -> None:
        self.batches = []

    def submit(self, batch) -> None:
        self.batches.append(batch)

    def rejection(self, uid):
        return None

    def trial_rows(self):
        return [row for batch in self.batches for row in batch.trials]


def test_the_store_gets_a_trials_state_from_the_runner_never_from_a_rendered_status():
    import asyncio

    from kubetune.controller.experiment import ExperimentController
    from kubetune.controller.store import MemoryStore
    from kubetune.core.types import CreateTrial, LaunchTrial, Result
    from unit_helpers import make_runner, make_spec

    spec = make_spec()
    body = {"metadata": {"name": "exp", "uid": "E"}, "spec": {}}
    writer = Submitted()
    controller = ExperimentController(namespace="ns", name="exp", store=MemoryStore(), registry=None,
                                      body=lambda: body, results=ResultsRecorder(writer, "ns", lambda: body))
    runner = make_runner(spec)
    controller.ctx.spec, controller.ctx.runner = spec, runner
    decisions = runner.step(0.0)
    [create] = [d for d in decisions if isinstance(d, CreateTrial)]
    [launch] = [d for d in decisions if isinstance(d, LaunchTrial) and d.name == create.name]

    async def scenario() -> None:
        await controller.effects.apply([create])       # the Trial is created: its UID keys its rows
        runner.on_trial_launched(launch.name, 1.0)
        runner.on_trial_result(launch.name, Result(seq=1, iteration=1, metrics={"loss": 0.25}, timestamp=1.0), 1.0)
        # a status patch alone (what any writer sends) gives the store no trial row
        before = len(writer.trial_rows())
        await controller.store.patch_trial_status(launch.name, {"phase": "Succeeded", "bestMetric": 99.0})
        assert len(writer.trial_rows()) == before
        # the status writer writes the Trial: the pump hands the runner's view to the store
        await controller.status.persist_trial(launch.name)
    asyncio.run(scenario())
    row = writer.trial_rows()[-1]
    assert (row.name, row.phase, row.best, row.iteration, row.attempt) == (launch.name, "Running", 0.25, 1, 0)
