"""The scale run's figures as a Markdown table (pure formatting of harness output)."""
from __future__ import annotations

from typing import Any, Mapping


def _n(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _spread(s: Mapping[str, Any] | None) -> str:
    if not s:
        return "n/a"
    return f"{_n(s.get('p50'))} / {_n(s.get('p95'))} / {_n(s.get('max'))} s"


def rows(figures: Mapping[str, Any]) -> list[tuple[str, str]]:
    s, t = figures["settings"], figures.get("timeline", {})
    out: list[tuple[str, str]] = []
    if "many" in t:
        m = t["many"]
        out += [(f"many: {s['experiments']} Experiments × {s['trials']} trials × {s['reports']} reports, "
                 f"parallelism {s['parallelism']}, {s['namespaces']} namespaces",
                 f"{_n(m['wall_s'], 1)} s, {_n(m['trials_per_s'])} trials/s"),
                ("many: apply → first Trial p50 / p95 / max", _spread(m["apply_to_first_trial_s"])),
                ("many: apply → first Trial running p50 / p95 / max", _spread(m["apply_to_first_trial_started_s"]))]
    if "big" in t:
        b = t["big"]
        out += [(f"big: 1 Experiment × {s['big_trials']:,} one-result trials, parallelism {s['big_parallelism']}",
                 f"{_n(b['wall_s'], 1)} s, {_n(b['trials_per_s'])} trials/s"),
                ("big: `kubectl get trials` (10,000 rows, pages of 500)" if s["big_trials"] == 10_000
                 else "big: `kubectl get trials` (pages of 500)", f"{_n(figures.get('kubectl_get_trials_big_s'))} s")]
    out.append(("all shapes at once: wall, trials/s", f"{_n(t.get('wall_s'), 1)} s, {_n(t.get('trials_per_s'))} trials/s"))
    f = figures.get("fairness", {})
    out += [("slowest Experiment's share of its fair share (1 = fair)",
             f"{_n(f.get('slowest_share'))} ({f.get('slowest_experiment')}); p10 {_n(f.get('share_p10'))}, "
             f"median {_n(f.get('share_median'))}"),
            ("slowest namespace's share of its fair share", _n(f.get("slowest_namespace_share"))),
            ("longest starvation: other trials completed while an Experiment waited",
             f"{_n(f.get('starvation_max_completions'))} ({f.get('starvation_worst')})")]
    i = figures.get("idle")
    if i:
        events = ", ".join(f"{name} {n:,}" for name, n in i.get("ledger_events", {}).items())
        out += [("slots free while trials were queued (slot-seconds; share of all capacity)",
                 f"{_n(i.get('idle_slot_s_while_queued'), 1)} ({_n(i.get('idle_fraction_of_capacity'), 3)}) over "
                 f"{_n(i.get('observed_s'), 0)} s observed"),
                ("the ledger's counters (all operator processes)", events or "n/a")]
    r = t.get("restart")
    if r:
        out.append((f"restart (SIGKILL at {r['trials_finished_at_kill']:,} trials finished) → all "
                    f"{r['experiments_unfinished']} unfinished Experiments progressing",
                    f"{_n(r.get('restart_to_all_progressing_s'))} s (p50 {_n(r.get('restart_to_progress_p50_s'))} s"
                    f"{', ' + str(r['never_progressed']) + ' never' if r.get('never_progressed') else ''})"))
    o = figures.get("operator", {})
    out += [("operator peak RSS (process tree) / RSS at the end", f"{_n(o.get('peak_rss_mib'), 0)} MiB / "
             f"{_n(o.get('rss_at_end_mib'), 0)} MiB"),
            ("operator CPU (user + system, all its processes)", f"{_n(o.get('cpu_s'), 0)} s"),
            ("operator RSS before the apply (connected to Ray, no Experiment) / beyond that at the end, per "
             "finished Experiment or per Trial (all of it charged to each: upper bounds)",
             f"{_n(o.get('rss_idle_mib'), 0)} MiB / {_n(o.get('finished_kib_per_experiment'), 1)} KiB or "
             f"{_n(o.get('finished_kib_per_trial'), 2)} KiB")]
    api = figures.get("api", {})
    verbs = ", ".join(f"{verb} {int(n):,}" for verb, n in api.get("requests_by_verb", {}).items())
    out.append(("operator's API requests on experiments/trials/events", verbs or "n/a"))
    for verb, lat in api.get("latency", {}).items():
        out.append((f"API latency {verb} (p50 / p95 / p99, all clients)",
                    f"{_n(lat['p50_s'], 3)} / {_n(lat['p95_s'], 3)} / {_n(lat['p99_s'], 3)} s"))
    out.append(("etcd db size (file) / apiserver storage metric",
                f"{_n((api.get('etcd_db_bytes') or 0) / 2 ** 20, 1)} MiB / "
                f"{_n((api.get('storage_bytes_metric') or 0) / 2 ** 20, 1)} MiB"))
    ob = figures.get("objects", {})
    out.append(("object size (JSON): largest Experiment / largest Trial / mean Trial",
                f"{_n(ob.get('experiment_bytes_max'))} / {_n(ob.get('trial_bytes_max'))} / "
                f"{_n(ob.get('trial_bytes_mean'), 0)} B"))
    v = figures.get("verdict", {})
    out.append(("nothing lost or duplicated (Trials, indices, results, runs, results store)",
                "yes" if not v.get("problems") else f"NO: {len(v['problems'])} problems, e.g. {v['problems'][0]}"))
    out.append(("counted", f"{_n(v.get('experiments'))} Experiments, {_n(v.get('trials'))} Trials, "
                f"{_n(v.get('results'))} results, {_n(v.get('runs'))} runs, {_n(v.get('stored_results'))} stored"))
    return out


def markdown(figures: Mapping[str, Any], command: str) -> str:
    m = figures["machine"]
    lines = [f"Command: `{command}`; commit {m.get('git_commit')}{' (dirty)' if m.get('git_dirty') else ''}; "
             f"{m.get('cpus')} cores, load average {m.get('loadavg_start')} at the start, "
             f"{m.get('loadavg_end')} at the end; Ray {m.get('ray')}.", "",
             "| Figure | Value |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows(figures)]
    return "\n".join(lines)
