"""Nothing lost, nothing duplicated: every planned Experiment against what the API
server, the operator's results store and the trials' own run ledger say at the end.

``verify`` reads each Experiment and its Trials with paginated LISTs (not the watch:
the end state itself) and returns every discrepancy as a sentence naming the object;
an empty ``problems`` list is the pass."""
from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kubetune.bench.scale.observe import list_all
from kubetune.bench.scale.shapes import Planned
from kubetune.bench.scale.trials import SEPARATOR


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    experiments: int = 0
    trials: int = 0
    results: int = 0                     # lastResultSeq + 1, summed over Trials
    runs: int = 0                        # runs in the ledger
    stored_results: int | None = None    # rows in the results store (None: not checked)
    experiment_bytes_max: int = 0        # the object as the API server returns it, as compact JSON
    trial_bytes_max: int = 0
    trial_bytes_mean: float = 0.0
    trials_by_key: dict[str, list[dict]] = field(default_factory=dict, repr=False)   # for fairness

    def add(self, problem: str, limit: int = 50) -> None:
        if len(self.problems) < limit:
            self.problems.append(problem)
        elif len(self.problems) == limit:
            self.problems.append("... (more problems left out)")


def runs_of(runs_dir: str) -> dict[str, list[str]]:
    """``"<namespace>/<experiment>/<trial>"`` -> the state of each run the ledger holds
    (``started``: began and never got past its last report; ``done``)."""
    runs: dict[str, list[str]] = collections.defaultdict(list)
    for entry in os.scandir(runs_dir):
        parts = entry.name.split(SEPARATOR)
        with open(entry.path) as handle:
            runs["/".join(parts[:3])].append(handle.read().strip())
    return runs


def _size(obj: dict) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def verify(custom, planned: Iterable[Planned], *, runs_dir: str = "", results_url: str = "",
           count: Callable[[str, str], None] = lambda resource, verb: None) -> Verdict:
    """``count(resource, verb)`` is told of every request made, so that the caller can
    keep its own requests apart from the operator's."""
    planned = list(planned)
    verdict = Verdict()
    runs = runs_of(runs_dir) if runs_dir else None
    by_namespace: dict[str, list[Planned]] = collections.defaultdict(list)
    for p in planned:
        by_namespace[p.namespace].append(p)
    sizes: list[int] = []
    for namespace, members in sorted(by_namespace.items()):
        experiments, _ = list_all(custom, "experiments", namespace=namespace,
                                  count=lambda verb: count("experiments", verb))
        trials, _ = list_all(custom, "trials", namespace=namespace, count=lambda verb: count("trials", verb))
        experiments_by_name = {e["metadata"]["name"]: e for e in experiments}
        trials_by_experiment: dict[str, list[dict]] = collections.defaultdict(list)
        for trial in trials:
            trials_by_experiment[trial["spec"]["experiment"]].append(trial)
        for p in members:
            experiment = experiments_by_name.get(p.name)
            if experiment is None:
                verdict.add(f"{p.key}: the Experiment is gone")
                continue
            verdict.experiments += 1
            verdict.experiment_bytes_max = max(verdict.experiment_bytes_max, _size(experiment))
            own = trials_by_experiment.get(p.name, [])
            verdict.trials_by_key[p.key] = own
            _check_experiment(verdict, p, experiment, own, runs)
            sizes.extend(_size(t) for t in own)
    if runs is not None:
        planned_keys = {p.key for p in planned}
        for key in runs:
            if key.rsplit("/", 1)[0] not in planned_keys:
                verdict.add(f"{key}: ran, but belongs to no planned Experiment")
    verdict.trial_bytes_max = max(sizes, default=0)
    verdict.trial_bytes_mean = sum(sizes) / len(sizes) if sizes else 0.0
    if results_url:
        _check_store(verdict, planned, results_url)
    return verdict


def _check_experiment(verdict: Verdict, p: Planned, experiment: dict, trials: list[dict],
                      runs: dict[str, list[str]] | None) -> None:
    status = experiment.get("status") or {}
    if status.get("phase") != "Succeeded":
        verdict.add(f"{p.key}: phase {status.get('phase')!r} ({status.get('message', '')[:200]}), not Succeeded")
    succeeded = (status.get("trialCounts") or {}).get("succeeded")
    if succeeded != p.trials:
        verdict.add(f"{p.key}: status.trialCounts.succeeded is {succeeded}, {p.trials} trials were asked for")
    verdict.trials += len(trials)
    indices = sorted(t["spec"]["index"] for t in trials)
    if indices != list(range(p.trials)):
        duplicated = sorted(i for i, n in collections.Counter(indices).items() if n > 1)
        missing = sorted(set(range(p.trials)) - set(indices))
        verdict.add(f"{p.key}: {len(trials)} Trials for {p.trials} asked; duplicated indices {duplicated[:10]}, "
                    f"missing {missing[:10]}")
    for trial in trials:
        name, ts = trial["metadata"]["name"], trial.get("status") or {}
        results = ts.get("lastResultSeq", -1) + 1
        verdict.results += results
        if ts.get("phase") != "Succeeded":
            verdict.add(f"{p.key}/{name}: phase {ts.get('phase')!r}, not Succeeded")
        if results != p.reports:
            verdict.add(f"{p.key}/{name}: {results} results counted (lastResultSeq), {p.reports} reported")
        if ts.get("attempt", 0) != 0:
            verdict.add(f"{p.key}/{name}: attempt {ts.get('attempt')}: it was run again")
        if not (ts.get("startTime") and ts.get("completionTime")):
            verdict.add(f"{p.key}/{name}: startTime {ts.get('startTime')!r}, completionTime "
                        f"{ts.get('completionTime')!r}: a Trial that ran says when it started and ended")
        if runs is not None:
            mine = runs.get(f"{p.key.split('/')[0]}/{p.name}/{name}", [])
            verdict.runs += len(mine)
            if mine != ["done"]:
                verdict.add(f"{p.key}/{name}: the trial function's runs were {mine}, not one run to its end")


def store_problems(planned: Iterable[Planned], results_url: str) -> tuple[list[str], int]:
    """What the operator's results store lacks: every trial's results, seq 0..reports-1
    (the store keys results by trial and seq, so a duplicate cannot show here: the
    Trials' lastResultSeq and the run ledger catch those).  Returns (problems, rows)."""
    from kubetune.results.store import open_store
    problems: list[str] = []
    rows = 0
    store = open_store(results_url, create=False, read_only=True)
    try:
        for p in planned:
            row = store.experiment(p.namespace, p.name)
            if row is None:
                problems.append(f"{p.key}: not in the results store")
                continue
            stored: dict[str, list[int]] = collections.defaultdict(list)
            for result in store.results(row.uid):
                stored[result.trial_uid].append(result.seq)
            trials = store.trials(row.uid)
            rows += sum(len(seqs) for seqs in stored.values())
            if len(trials) != p.trials:
                problems.append(f"{p.key}: {len(trials)} trials in the results store, {p.trials} ran")
            for trial in trials:
                if sorted(stored.get(trial.uid, [])) != list(range(p.reports)):
                    problems.append(f"{p.key}/{trial.name}: stored results seq {sorted(stored.get(trial.uid, []))}, "
                                    f"expected 0..{p.reports - 1}")
    finally:
        store.close()
    return problems, rows


def _check_store(verdict: Verdict, planned: list[Planned], results_url: str) -> None:
    problems, verdict.stored_results = store_problems(planned, results_url)
    for problem in problems:
        verdict.add(problem)


def summary(verdict: Verdict) -> dict[str, Any]:
    return {k: v for k, v in vars(verdict).items() if k != "trials_by_key"}
