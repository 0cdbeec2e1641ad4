"""Pure arithmetic and formatting of the benchmark figures: per-run metrics, medians
over repeats, ratios against Ray Tune, the table and its markdown.  No Ray, no I/O (what
the machine is: machine.py); the unit test ``tests/unit/test_bench_report.py`` runs it."""
from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Mapping, Sequence

KIB = 1024

# Targets of issue 7: (metric key, comparison, value)
TARGETS = {
    "tiny_ratio": (">=", 10.0),
    "efficiency": (">=", 0.95),
    "processed_over_offered": (">=", 0.98),
    "writes_per_result": ("<=", 0.1),
    "experiment_bytes_1000": ("<=", 16 * KIB),
}


# ---------------------------------------------------------------- small helpers

def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def meets(key: str, value: float | None) -> bool | None:
    if key not in TARGETS or value is None:
        return None
    op, target = TARGETS[key]
    return value >= target if op == ">=" else value <= target


# ---------------------------------------------------------------- per-run metrics

def tiny_metrics(run: Mapping[str, Any]) -> dict[str, float | None]:
    """Workload 1: trials and results per second over the whole run."""
    makespan = run["makespan_s"]
    return {"trials_per_s": ratio(run["trials_done"], makespan),
            "results_per_s": ratio(run["results"], makespan),
            "makespan_s": makespan}


def trial_intervals(offered: Sequence[Sequence[float]], rate: float,
                    reported: Sequence[Sequence[float]] | None = None) -> list[tuple[float, float]]:
    """(start, end) of each trial from its results: the function started one report period
    before its first ``offered_at`` and ended with its last report (``reported_at``; the
    last ``offered_at`` if not known)."""
    ends = [max(times) for times in reported] if reported else [max(times) for times in offered if times]
    return [(min(times) - 1.0 / rate, end) for times, end in zip((t for t in offered if t), ends)]


def busy_fraction(intervals: Sequence[tuple[float, float]], slots: int) -> float | None:
    """Utilisation of ``slots`` after ramp-up: from the moment the ``slots``-th trial
    started to the end of the last one, the share of slot-seconds spent inside trials.
    Start-up of the worker processes is excluded; every gap between trials is not."""
    if len(intervals) < slots:
        return None
    full = sorted(start for start, _ in intervals)[slots - 1]
    end = max(stop for _, stop in intervals)
    if end <= full:
        return None
    busy = sum(max(0.0, min(stop, end) - max(start, full)) for start, stop in intervals)
    return busy / (slots * (end - full))


def efficiency_metrics(run: Mapping[str, Any], *, trials: int, trial_seconds: float, slots: int,
                       rate: float) -> dict[str, float | None]:
    """Workload 2: ideal makespan (every slot busy from the first second) over actual."""
    ideal = trials * trial_seconds / slots
    intervals = trial_intervals(run.get("offered_at") or [], rate, run.get("reported_at"))
    return {"efficiency": ratio(ideal, run["makespan_s"]), "ideal_s": ideal,
            "makespan_s": run["makespan_s"], "busy_after_rampup": busy_fraction(intervals, slots),
            "first_start_s": (min(s for s, _ in intervals) - run["started"]) if intervals else None}


def ceiling_makespan(slot_ready_s: Sequence[float], *, trials: int, trial_seconds: float) -> float:
    """The shortest makespan of ``trials`` equal trials on slots that open at
    ``slot_ready_s``: each trial goes to the slot free first, with no gap between trials
    (a list schedule, optimal for equal jobs)."""
    import heapq

    free = list(slot_ready_s)
    heapq.heapify(free)
    end = 0.0
    for _ in range(trials):
        end = heapq.heappop(free) + trial_seconds
        heapq.heappush(free, end)
    return max(free) if free else end


def floor_metrics(run: Mapping[str, Any], *, trials: int, trial_seconds: float,
                  slots: int) -> dict[str, float | None]:
    """Workload 2's ceiling: the efficiency a tuner with zero overhead would reach once
    Ray brought up the slots' worker processes (``floor.py``)."""
    ready = run["slot_ready_s"]
    makespan = ceiling_makespan(ready, trials=trials, trial_seconds=trial_seconds)
    return {"efficiency": ratio(trials * trial_seconds / slots, makespan), "makespan_s": makespan,
            "first_slot_s": min(ready), "last_slot_s": max(ready)}


def throughput_metrics(run: Mapping[str, Any], *, nominal_rate: float) -> dict[str, float | None]:
    """Workload 3: results processed per second against results offered per second.

    Offered: every result over the window its trials meant to report in (first to
    last ``offered_at``).  Processed: the same results over the window from the first
    ``offered_at`` to the moment the tuner held the last of them.  A tuner that keeps
    up ends both windows together (1.0); one that falls behind stretches the second."""
    due = [t for times in run.get("offered_at") or [] for t in times]
    if len(due) < 2:
        return {"processed_over_offered": None}
    first, last = min(due), max(due)
    processed_window = run["last_processed"] - first
    lags = run.get("lags") or []
    return {
        "processed_over_offered": ratio(last - first, max(processed_window, last - first)),
        # every result, not the points of ``offered_at``: kubetune's history is a
        # downsampled curve (its first and last points kept), Ray Tune's the full list
        "offered_per_s": ratio(run.get("results") or len(due), last - first),
        "processed_per_s": ratio(run["results"], max(processed_window, last - first)),
        "nominal_per_s": nominal_rate,
        "lag_p50_s": percentile(lags, 0.5), "lag_p99_s": percentile(lags, 0.99),
        "results": run["results"], "makespan_s": run["makespan_s"],
    }


def kube_metrics(run: Mapping[str, Any]) -> dict[str, float | None]:
    """Workload 4: API writes per result, object size, operator memory."""
    writes = run["writes"]
    core = sum(v for k, v in writes.items() if not k.startswith("events"))
    total = sum(writes.values())
    results = run["results"]
    return {"writes_per_result": ratio(core, results), "writes_per_result_with_events": ratio(total, results),
            "writes": total, "results": results, "experiment_bytes": run["experiment_bytes"],
            "operator_peak_mib": run["operator_peak_kib"] / KIB if run.get("operator_peak_kib") else None,
            "trials_per_s": ratio(run["trials_done"], run["makespan_s"]),
            "results_per_s": ratio(results, run["makespan_s"]), "makespan_s": run["makespan_s"]}


def core_metrics(run: Mapping[str, Any]) -> dict[str, float | None]:
    return {"decisions_per_s": ratio(run["decisions"], run["seconds"]),
            "events_per_s": ratio(run["events"], run["seconds"]), "seconds": run["seconds"],
            "trials": run["trials"]}


def medians(per_run: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Key-wise median over repeats (keys of the first run)."""
    if not per_run:
        return {}
    return {key: median(m.get(key) for m in per_run) for key in per_run[0]}


# ---------------------------------------------------------------- table

def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    if unit == "x":
        return f"{value:.1f}×"
    if unit == "ratio":
        return f"{value:.3f}"
    if unit == "%":
        return f"{value:.1%}"
    if unit == "KiB":
        return f"{value / KIB:.1f} KiB"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}" if abs(value) >= 0.01 or value == 0 else f"{value:.2g}"
    return f"{text} {unit}".strip()


Row = tuple[str, str, str, str, str, str]   # workload, metric, kubetune, Ray Tune, ratio, target


def summary_rows(summary: Mapping[str, Any]) -> list[Row]:
    """The table's rows from the medians (see ``__main__.summarize``)."""
    rows: list[Row] = []

    def target_text(key: str, value: float | None, shown: str) -> str:
        ok = meets(key, value)
        op, target = TARGETS[key]
        goal = f"{op} {fmt(target, 'KiB') if key == 'experiment_bytes_1000' else fmt(target)}"
        return f"{goal}: {'met' if ok else 'NOT met' if ok is not None else 'not measured'} ({shown})"

    tiny = summary.get("tiny")
    if tiny:
        kt, rt, rr = tiny["kubetune"], tiny.get("raytune") or {}, tiny.get("raytune-reuse") or {}
        label = f"1. Tiny trials ({tiny['label']})"
        rows.append((label, "trials/s", fmt(kt.get("trials_per_s")), _pair(rt.get("trials_per_s"), rr.get("trials_per_s")),
                     _pair(tiny.get("ratio_trials"), tiny.get("ratio_trials_reuse"), "x"),
                     target_text("tiny_ratio", tiny.get("ratio_trials"), fmt(tiny.get("ratio_trials"), "x") + " vs default")))
        rows.append((label, "results/s", fmt(kt.get("results_per_s")), _pair(rt.get("results_per_s"), rr.get("results_per_s")),
                     _pair(tiny.get("ratio_results"), tiny.get("ratio_results_reuse"), "x"), ""))
    eff = summary.get("efficiency")
    if eff:
        kt, rt = eff["kubetune"], eff.get(eff.get("tune_side", "raytune")) or {}
        label = f"2. Bookkeeping efficiency ({eff['label']}){_tune_note(eff)}"
        rows.append((label, "ideal / actual makespan", fmt(kt.get("efficiency"), "ratio"),
                     fmt(rt.get("efficiency"), "ratio"), fmt(ratio(kt.get("efficiency"), rt.get("efficiency")), "x"),
                     target_text("efficiency", kt.get("efficiency"), fmt(kt.get("efficiency"), "ratio"))))
        rows.append((label, "makespan (ideal " + fmt(kt.get("ideal_s"), "s") + ")", fmt(kt.get("makespan_s"), "s"),
                     fmt(rt.get("makespan_s"), "s"), "", ""))
        rows.append((label, "slot use after ramp-up", fmt(kt.get("busy_after_rampup"), "%"),
                     fmt(rt.get("busy_after_rampup"), "%"), "", ""))
        ceiling = eff.get("ray-floor")
        if ceiling:
            rows.append((label, "ceiling: zero-overhead tuner on Ray's cold workers (slots up after "
                         f"{fmt(ceiling.get('first_slot_s'), 's')}-{fmt(ceiling.get('last_slot_s'), 's')})",
                         fmt(ceiling.get("efficiency"), "ratio"), "", "",
                         f"kubetune reaches {fmt(ratio(kt.get('efficiency'), ceiling.get('efficiency')), '%')} of it"))
    thr = summary.get("throughput")
    if thr:
        kt, rt = thr["kubetune"], thr.get(thr.get("tune_side", "raytune")) or {}
        label = f"3. Result throughput ({thr['label']}){_tune_note(thr)}"
        rows.append((label, "processed / offered", fmt(kt.get("processed_over_offered"), "ratio"),
                     fmt(rt.get("processed_over_offered"), "ratio"),
                     fmt(ratio(kt.get("processed_over_offered"), rt.get("processed_over_offered")), "x"),
                     target_text("processed_over_offered", kt.get("processed_over_offered"),
                                 fmt(kt.get("processed_over_offered"), "ratio"))))
        rows.append((label, "results/s processed (offered)",
                     f"{fmt(kt.get('processed_per_s'))} ({fmt(kt.get('offered_per_s'))})",
                     f"{fmt(rt.get('processed_per_s'))} ({fmt(rt.get('offered_per_s'))})", "", ""))
        rows.append((label, "result lag p50 / p99", _lag(kt), _lag(rt), "", ""))
    kube = summary.get("kube") or {}
    for key, number in (("tiny", "4a"), ("throughput", "4b"), ("size", "4c")):
        k = kube.get(key)
        if not k:
            continue
        label = f"{number}. With Kubernetes write-back: {k['label']}"
        m = k["kubetune"]
        rows.append((label, "API writes / result (with Events)",
                     f"{fmt(m.get('writes_per_result'), 'ratio')} ({fmt(m.get('writes_per_result_with_events'), 'ratio')})",
                     "", "", target_text("writes_per_result", m.get("writes_per_result"),
                                         fmt(m.get("writes_per_result"), "ratio"))))
        size_key = "experiment_bytes_1000" if key == "size" else ""
        rows.append((label, "Experiment object size", fmt(m.get("experiment_bytes"), "KiB"), "", "",
                     target_text(size_key, m.get("experiment_bytes"), fmt(m.get("experiment_bytes"), "KiB"))
                     if size_key else ""))
        rows.append((label, "operator peak memory (VmHWM)", fmt(m.get("operator_peak_mib"), "MiB"), "", "", ""))
        rows.append((label, "trials/s, results/s", f"{fmt(m.get('trials_per_s'))}, {fmt(m.get('results_per_s'))}",
                     "", "", ""))
    core = summary.get("core")
    if core:
        m = core["kubetune"]
        rows.append((f"5. Core only ({core['label']})", "decisions/s (events/s)",
                     f"{fmt(m.get('decisions_per_s'))} ({fmt(m.get('events_per_s'))})", "", "",
                     f"{fmt(m.get('seconds'), 's')} for {fmt(m.get('trials'))} trials"))
    return rows


def _tune_note(workload: Mapping[str, Any]) -> str:
    return "; Ray Tune with reuse_actors=True" if workload.get("tune_side") == "raytune-reuse" else ""


def _pair(default: float | None, reuse: float | None, unit: str = "") -> str:
    if reuse is None:
        return fmt(default, unit)
    return f"{fmt(default, unit)} / {fmt(reuse, unit)}"


def _lag(m: Mapping[str, float | None]) -> str:
    if m.get("lag_p50_s") is None:
        return "–"
    return f"{fmt(m['lag_p50_s'], 's')} / {fmt(m['lag_p99_s'], 's')}"


HEADERS = ("Workload", "Metric", "kubetune", "Ray Tune", "kubetune ÷ Ray Tune", "Target")


def text_table(rows: Sequence[Row]) -> str:
    widths = [max(len(str(r[i])) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(HEADERS, widths)),
             "  ".join("-" * w for w in widths)]
    previous = None
    for row in rows:
        cells = list(row)
        if cells[0] == previous:
            cells[0] = ""
        else:
            previous = cells[0]
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    return "\n".join(lines)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    previous = None
    for row in rows:
        cells = [str(c).replace("|", "\\|") for c in row]
        if row[0] == previous:
            cells[0] = ""
        else:
            previous = row[0]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(result: Mapping[str, Any], rows: Sequence[Row]) -> str:
    machine = result["machine"]
    start, end = _commit(machine, ""), _commit(machine, "_end")
    git = start if end in ("", start) else f"{start} at the start, {end} at the end"
    return "\n".join([
        f"Command: `{result['command']}` ({result['repeats']} repeats, medians; "
        f"{'quick smoke sizes' if result['quick'] else 'full sizes'}; took {result['wall_s'] / 60:.1f} min)",
        "",
        f"Machine: {machine['cpus']} cores ({machine.get('cpu_model') or 'unknown CPU'}), "
        f"{machine['memory_gib']:.1f} GiB, {machine['os']}, Python {machine['python']}, Ray {machine['ray']}, "
        f"kubetune {machine['kubetune']} (git {git}), "
        f"load average (1, 5, 15 min) at start {machine.get('loadavg_start', '?')}, "
        f"at the end {machine.get('loadavg_end', '?')}",
        "",
        "Ray Tune column: defaults (a new actor per trial) / `reuse_actors=True` where two figures are shown.",
        "",
        markdown_table(rows),
    ])


# ---------------------------------------------------------------- machine

def _commit(machine: Mapping[str, Any], suffix: str) -> str:
    commit = machine.get(f"git_commit{suffix}") or ""
    return commit + ("+dirty" if commit and machine.get(f"git_dirty{suffix}") else "")
