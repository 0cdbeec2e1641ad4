"""What ``kubetune results`` prints: the stored results of one Experiment as a table,
JSON or CSV.  Non-finite numbers are written as ``NaN``, ``Infinity`` and
``-Infinity`` everywhere — the form the Trial resources use too — so JSON stays valid
and a CSV reader (pandas, a spreadsheet) reads them back as numbers."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from typing import Any, Iterable, TextIO

from kubetune.results.rows import ExperimentRow, FailureRow, ResultRow, TrialRow, UsageRow


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def cell(value: Any) -> str:
    """One value for the table: floats short, non-finite spelt out."""
    if value is None:
        return ""
    if isinstance(value, float):
        return json_safe(value) if not math.isfinite(value) else f"{value:.6g}"
    return str(value)


def metric_names(results: Iterable[ResultRow], first: str = "") -> list[str]:
    """Every metric name, the objective first, the others as they first appear."""
    names = dict.fromkeys([first] if first else [])
    for result in results:
        names.update(dict.fromkeys(result.metrics))
    return list(names)


class Report:
    """One Experiment's stored results, ready to print."""

    def __init__(self, experiment: ExperimentRow, trials: list[TrialRow], results: list[ResultRow],
                 failures: list[FailureRow], usage: list[UsageRow] | None = None) -> None:
        self.experiment = experiment
        self.usage = usage or []     # one row per attempt (core/usage.py)
        self.trials = trials
        self.results = results
        self.failures = failures
        self.trial_names = {t.uid: t.name for t in trials}
        self.metrics = metric_names(results, experiment.metric)

    def write_json(self, out: TextIO) -> None:
        by_trial: dict[str, list[dict[str, Any]]] = {}
        for r in self.results:
            by_trial.setdefault(r.trial_uid, []).append(
                {"seq": r.seq, "iteration": r.iteration, "attempt": r.attempt, "time": r.time,
                 "checkpoint": r.checkpoint, "metrics": dict(r.metrics)})
        failures: dict[str, list[dict[str, Any]]] = {}
        for f in self.failures:
            failures.setdefault(f.trial_uid, []).append(
                {"attempt": f.attempt, "reason": f.reason, "message": f.message, "time": f.time})
        usage: dict[str, list[dict[str, Any]]] = {}
        for u in self.usage:
            usage.setdefault(u.trial_uid, []).append({k: v for k, v in asdict(u).items() if k != "trial_uid"})
        document = {"experiment": asdict(self.experiment), "trials": [
            {**asdict(t), "failures": failures.get(t.uid, []), "usage": usage.get(t.uid, []),
             "results": by_trial.get(t.uid, [])}
            for t in self.trials]}
        json.dump(json_safe(document), out, indent=1, allow_nan=False)
        out.write("\n")

    def write_csv(self, out: TextIO) -> None:
        params = list(dict.fromkeys(name for t in self.trials for name in t.params))
        by_uid = {t.uid: t for t in self.trials}
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["trial", "seq", "iteration", "attempt", "time", "checkpoint",
                         *(f"param.{p}" for p in params), *self.metrics])
        for r in self.results:
            trial = by_uid.get(r.trial_uid)
            writer.writerow([self.trial_names.get(r.trial_uid, r.trial_uid), r.seq, r.iteration, r.attempt,
                             repr(r.time), r.checkpoint or "",
                             *(_csv(trial.params.get(p)) if trial else "" for p in params),
                             *(_csv(r.metrics.get(m)) for m in self.metrics)])

    def write_table(self, out: TextIO) -> None:
        header = ["TRIAL", "ITERATION", "ATTEMPT", *self.metrics]
        rows = [[self.trial_names.get(r.trial_uid, r.trial_uid), str(r.iteration), cell(r.attempt),
                 *(cell(r.metrics.get(m)) for m in self.metrics)] for r in self.results]
        _table(out, header, rows)
        if self.failures:
            out.write("\nFAILED ATTEMPTS (whole tracebacks: -o json)\n")
            _table(out, ["TRIAL", "ATTEMPT", "REASON", "ERROR"],
                   [[self.trial_names.get(f.trial_uid, f.trial_uid), str(f.attempt), f.reason,
                     (f.message.strip().splitlines() or [""])[0][:120]] for f in self.failures])
        if self.usage:
            out.write("\nUSAGE PER ATTEMPT (seconds on the trial host's clock)\n")
            _table(out, ["TRIAL", "ATTEMPT", "RUN", "GPU", "CPU", "QUEUE", "ENDED"],
                   [[self.trial_names.get(u.trial_uid, u.trial_uid), str(u.attempt), f"{u.run_seconds:.1f}",
                     f"{u.gpu_seconds:.1f}", f"{u.cpu_seconds:.1f}", f"{u.queue_seconds:.1f}",
                     "yes" if u.ended is not None else "running"] for u in self.usage])
            gpu = sum(u.gpu_seconds for u in self.usage)
            out.write(f"total: {gpu / 3600:.4g} GPU-hours, {sum(u.cpu_seconds for u in self.usage) / 3600:.4g} "
                      f"CPU-hours, {sum(u.run_seconds for u in self.usage):.1f} s run\n")


def _csv(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return json_safe(value) if not math.isfinite(value) else repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(json_safe(value))
    return value


def _table(out: TextIO, header: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(header)]
    for row in [header, *rows]:
        out.write("  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() + "\n")
