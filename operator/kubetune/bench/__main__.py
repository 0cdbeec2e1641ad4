"""``python -m kubetune.bench`` (``make bench``): kubetune side by side with Ray Tune.

Workloads (issue 7):
1. tiny trials: 200 trials x 10 reports of a trivial function, 8 concurrent;
2. bookkeeping efficiency: 400 trials of 1 s (10 steps), 16 logical CPU slots;
3. result throughput: 32 trials reporting 20 results/s for 20 s;
4. with Kubernetes write-back: 1 and 3 through ``kubetune operator`` on the embedded
   control plane, plus the Experiment's size at 1,000 trials;
5. core only: the pure runner on the simulated executor, 10,000 trials.

Each run of 1-3 and 5 is a fresh process with a Ray instance of its own (the same
logical CPUs for every side); kubetune and Ray Tune alternate within each repeat,
and the table shows medians over the repeats.  Everything measured, and the machine,
goes to ``<out>/bench.json``; ``<out>/bench.md`` is the table for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubetune.bench import machine, report
from kubetune.bench.workloads import Workload, workloads

LOCAL = ("tiny", "efficiency", "throughput")
ALL = LOCAL + ("kube", "core")
# Ray Tune's defaults start an actor per trial (~1 trial/s here): the anchor of issue 7,
# run for the tiny trials together with reuse_actors=True.  The efficiency workload
# (400 trials) runs Ray Tune with reuse_actors=True only: its best case, and with the
# defaults a single run would take 7-10 minutes.  Throughput: 32 trials on 32 slots,
# where reusing actors changes nothing.
TUNE_SIDES = {"tiny": ("raytune", "raytune-reuse"), "efficiency": ("raytune-reuse",), "throughput": ("raytune",)}
# The efficiency workload also measures its ceiling: bare Ray actors, one per slot (floor.py).
PEER_SIDES = {key: sides + (("ray-floor",) if key == "efficiency" else ()) for key, sides in TUNE_SIDES.items()}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke run of a few minutes")
    parser.add_argument("--repeats", type=int, default=0, help="repeats per workload and side (default 3; 1 with --quick)")
    parser.add_argument("--workloads", default=",".join(ALL),
                        help=f"comma-separated subset of {','.join(ALL)} (default: all)")
    parser.add_argument("--no-raytune", action="store_true", help="kubetune only (no comparison; for quick checks)")
    parser.add_argument("--out", default="bench-results", help="directory for bench.json, bench.md and logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    selected = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(selected) - set(ALL)
    if unknown:
        raise SystemExit(f"--workloads: unknown {sorted(unknown)}; choose from {','.join(ALL)}")
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    command = "python -m kubetune.bench" + (" " + shlex.join(argv if argv is not None else sys.argv[1:])).rstrip()
    result: dict[str, Any] = {"command": command.strip(), "quick": args.quick, "repeats": repeats,
                              "machine": machine.machine_info(), "runs": {}, "workloads": {}}
    started = time.time()
    specs = workloads(args.quick)
    for key in LOCAL:
        if key in selected:
            result["workloads"][key] = _describe(specs[key])
    bench = _Bench(out, args.quick, result["runs"])

    for repeat in range(1, repeats + 1):
        for key in [k for k in LOCAL if k in selected]:
            sides = ("kubetune",) + (() if args.no_raytune else PEER_SIDES[key])
            # alternate the order between repeats so neither side always goes first
            for side in (sides if repeat % 2 else tuple(reversed(sides))):
                bench.local(side, key, repeat)
        if "core" in selected:
            bench.local("core", "core", repeat)
    if "kube" in selected:
        bench.kube(specs, repeats)

    result["wall_s"] = time.time() - started
    result["machine"]["loadavg_end"] = machine.loadavg_text()
    # every run imports the working tree afresh: say if it changed under the benchmark
    result["machine"]["git_commit_end"], result["machine"]["git_dirty_end"] = machine.git_state()
    result["summary"] = summarize(result["runs"], specs)
    rows = report.summary_rows(result["summary"])
    table = report.text_table(rows)
    (out / "bench.json").write_text(json.dumps({**result, "runs": _without_series(result["runs"])},
                                               indent=1, default=str))
    (out / "bench.md").write_text(report.markdown(result, rows) + "\n")
    print()
    print(table)
    print(f"\n{out / 'bench.json'}: every figure; {out / 'bench.md'}: the table for BENCHMARKS.md "
          f"({result['wall_s'] / 60:.1f} min)")
    failed = [f"{k}/{side}" for k, sides in result["runs"].items() for side, runs in sides.items()
              for r in runs if "error" in r]
    if failed:
        print(f"failed runs (see {out / 'logs'}): {', '.join(failed)}")
        return 1
    return 0


def _without_series(runs: dict[str, dict[str, list]]) -> dict[str, dict[str, list]]:
    """The runs without their per-result series (offered_at, lags...): those went into
    the per-run figures and would make the file megabytes long."""
    return {key: {side: [{k: v for k, v in run.items() if not isinstance(v, list)} for run in side_runs]
                  for side, side_runs in sides.items()} for key, sides in runs.items()}


def _describe(w: Workload) -> dict[str, Any]:
    return {"trials": w.trials, "concurrency": w.concurrency, "cpus": w.cpus, "reports": w.reports,
            "rate": w.rate, "function": w.function, "barrier": w.barrier}


class _Bench:
    def __init__(self, out: Path, quick: bool, runs: dict[str, dict[str, list]]) -> None:
        self.out = out
        self.quick = quick
        self.runs = runs

    def local(self, side: str, key: str, repeat: int) -> None:
        log = self.out / "logs" / f"{key}-{side}-{repeat}.log"
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
            figures_path = handle.name
        argv = [sys.executable, "-m", "kubetune.bench.one", side, key, "--out", figures_path]
        if self.quick:
            argv.append("--quick")
        started = time.time()
        with open(log, "w") as stream:
            done = subprocess.run(argv, stdout=stream, stderr=subprocess.STDOUT)
        try:
            if done.returncode != 0:
                figures = {"error": f"exit {done.returncode}; see {log}"}
            else:
                figures = json.loads(Path(figures_path).read_text())
        finally:
            os.unlink(figures_path)
        figures["repeat"] = repeat
        self.runs.setdefault(key, {}).setdefault(side, []).append(figures)
        print(f"[{key}] {side} #{repeat}: {_headline(key, figures)} ({time.time() - started:.0f} s in all)",
              flush=True)

    def kube(self, specs: dict[str, Workload], repeats: int) -> None:
        from kubetune.bench.kube import KubeBench

        size_trials = 100 if self.quick else 1000
        plan = [(r, key, specs[key]) for r in range(1, repeats + 1) for key in ("tiny", "throughput")]
        plan.append((1, "size", specs["tiny"].with_trials(size_trials)))
        try:
            with KubeBench(log=lambda m: print(m, flush=True)) as bench:
                for repeat, key, workload in plan:
                    started = time.time()
                    try:
                        figures = bench.run(workload, name=f"bench-{key}")
                    except Exception as error:  # noqa: BLE001 - record it, go on with the rest
                        figures = {"error": f"{type(error).__name__}: {error}"}
                        (self.out / "logs" / f"kube-{key}-{repeat}.log").write_text(figures["error"])
                    figures["repeat"] = repeat
                    self.runs.setdefault(f"kube-{key}", {}).setdefault("kubetune", []).append(figures)
                    print(f"[kube {key}] operator #{repeat}: {_headline('kube', figures)} "
                          f"({time.time() - started:.0f} s in all)", flush=True)
        except Exception as error:  # noqa: BLE001 - e.g. the control plane binaries cannot be built
            self.runs.setdefault("kube-tiny", {}).setdefault("kubetune", []).append(
                {"error": f"control plane: {type(error).__name__}: {error}"})
            print(f"[kube] control plane failed: {error}", flush=True)


def _headline(key: str, figures: dict[str, Any]) -> str:
    if "error" in figures:
        return "FAILED: " + figures["error"][:300]
    if key == "core":
        return f"{figures['decisions'] / figures['seconds']:,.0f} decisions/s"
    if key == "kube":
        m = report.kube_metrics(figures)
        return (f"{figures['makespan_s']:.1f} s, {m['writes_per_result']:.3f} writes/result, "
                f"Experiment {figures['experiment_bytes']} B, peak {m['operator_peak_mib'] or 0:.0f} MiB")
    if "slot_ready_s" in figures:
        return f"{len(figures['slot_ready_s'])} bare workers up after {max(figures['slot_ready_s']):.2f} s"
    return f"{figures['makespan_s']:.1f} s, {figures['trials_done']} trials, {figures['results']} results"


def _with_tune_side(sides: dict[str, Any]) -> dict[str, Any]:
    """Name the Ray Tune run compared against: ``raytune`` (defaults) if it ran, else
    ``raytune-reuse``."""
    for side in ("raytune", "raytune-reuse"):
        if sides.get(side):
            return {**sides, "tune_side": side}
    return sides


def run_metrics(key: str, run: dict[str, Any], specs: dict[str, Workload]) -> dict[str, float | None]:
    """The figures of one run (``key``: a workload, ``kube-<workload>`` or ``core``)."""
    if key == "core":
        return report.core_metrics(run)
    if key.startswith("kube-"):
        metrics = report.kube_metrics(run)
        if key == "kube-throughput":
            w = specs["throughput"]
            metrics.update(report.throughput_metrics(run, nominal_rate=w.trials * w.rate))
        return metrics
    w = specs[key]
    if key == "tiny":
        return report.tiny_metrics(run)
    if key == "efficiency" and "slot_ready_s" in run:
        return report.floor_metrics(run, trials=w.trials, trial_seconds=w.trial_seconds, slots=w.concurrency)
    if key == "efficiency":
        return report.efficiency_metrics(run, trials=w.trials, trial_seconds=w.trial_seconds,
                                         slots=w.concurrency, rate=w.rate)
    return report.throughput_metrics(run, nominal_rate=w.trials * w.rate)


def summarize(runs: dict[str, dict[str, list]], specs: dict[str, Workload]) -> dict[str, Any]:
    """Medians over the repeats of each run's figures, and the ratios, per workload (see
    report.summary_rows).  Each run gets its figures as ``metrics``; failed runs are left out."""
    def sides(key: str) -> dict[str, dict[str, float | None]]:
        medians = {}
        for side, side_runs in (runs.get(key) or {}).items():
            for run in side_runs:
                if "error" not in run:
                    run["metrics"] = run_metrics(key, run, specs)
            measured = [run["metrics"] for run in side_runs if "metrics" in run]
            if measured:
                medians[side] = report.medians(measured)
        return medians

    summary: dict[str, Any] = {}
    w = specs["tiny"]
    tiny = sides("tiny")
    if tiny:
        kt, rt, rr = tiny.get("kubetune", {}), tiny.get("raytune", {}), tiny.get("raytune-reuse", {})
        summary["tiny"] = {**tiny, "label": f"{w.trials} × {w.reports} reports, {w.concurrency} concurrent",
                           "ratio_trials": report.ratio(kt.get("trials_per_s"), rt.get("trials_per_s")),
                           "ratio_results": report.ratio(kt.get("results_per_s"), rt.get("results_per_s")),
                           "ratio_trials_reuse": report.ratio(kt.get("trials_per_s"), rr.get("trials_per_s")),
                           "ratio_results_reuse": report.ratio(kt.get("results_per_s"), rr.get("results_per_s"))}
    w = specs["efficiency"]
    efficiency = sides("efficiency")
    if efficiency:
        summary["efficiency"] = {**_with_tune_side(efficiency), "label": (
            f"{w.trials} trials × {w.trial_seconds:g} s in {w.reports} steps, {w.concurrency} slots")}
    w = specs["throughput"]
    throughput = sides("throughput")
    if throughput:
        summary["throughput"] = {**_with_tune_side(throughput),
                                 "label": f"{w.trials} trials × {w.rate:g} results/s × {w.trial_seconds:g} s"}
    kube: dict[str, Any] = {}
    for key in ("tiny", "throughput", "size"):
        measured = sides(f"kube-{key}").get("kubetune")
        if not measured:
            continue
        w = specs["tiny" if key == "size" else key]
        done = next(r["trials_done"] for r in runs[f"kube-{key}"]["kubetune"] if "metrics" in r)
        label = {"tiny": f"workload 1 ({w.trials} × {w.reports})",
                 "throughput": f"workload 3 ({w.trials} × {w.rate:g}/s × {w.trial_seconds:g} s)",
                 "size": f"{done} tiny trials"}[key]
        kube[key] = {"kubetune": measured, "label": label}
    if kube:
        summary["kube"] = kube
    core = sides("core").get("core")
    if core:
        summary["core"] = {"kubetune": core, "label": f"{core['trials']:,.0f} simulated trials, ASHA, random search"}
    return summary


if __name__ == "__main__":
    sys.exit(main())
