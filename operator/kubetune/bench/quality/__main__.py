"""``python -m kubetune.bench.quality [--quick | --full]``: search quality against the field.

Every method runs on the same problems, seeds, 8 simulated workers and budget; the result
is normalised regret (several objectives: the share of the analytic front's hypervolume
missed) against the budget, as IQM over seeds with a bootstrap 95% CI. Targets (exit 1 when
one is missed):
- T1, multi-fidelity: kubetune's ASHA reaches random search's final regret within 1/3 of
  RS's budget (IQM pooled over the suite's problems and seeds);
- T2, kubetune's samplers (TPE, CMA-ES, GP, NSGA-II) and schedulers never do worse than
  in-process Optuna with the same sampler and pruner: CIs overlap, or kubetune is better,
  on every problem (on the multi-objective suite this is T3: the hypervolume);
- T4, at equal budget kubetune's best method is at least as good as the best peer's
  (Optuna, Syne Tune, RS; CIs overlap or better) on >= 80% of the problems;
- T5, ``search.algorithm: auto`` never does worse than today's default, random search
  (CIs overlap or better), on every problem.
Writes ``<out>/quality.json``, ``<out>/quality.md`` and a PNG per suite.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from kubetune.bench.machine import commit_label
from kubetune.bench.quality import problems as catalogue_module
from kubetune.bench.quality.methods import RS, RS2, default_twin, methods, optuna_twin, side
from kubetune.bench.quality.problems import MF, MO, Problem
from kubetune.bench.quality.scoring import (FRACTIONS, Summary, budget_to_reach, budget_to_reach_ci, iqm, regret_curve,
                                            summarise)

T1_FRACTION = 1 / 3
T4_SHARE = 0.8
_PROBLEM: Problem | None = None      # the problem the worker processes run (inherited by fork)
_RUNNERS: dict = {}


def _one(task: tuple[str, int]) -> tuple[str, int, list[float], float]:
    method, seed = task
    started = time.perf_counter()
    trace = _RUNNERS[method](_PROBLEM, seed)
    return method, seed, regret_curve(_PROBLEM, trace), time.perf_counter() - started


def run_problem(problem: Problem, seeds: list[int], quick: bool, jobs: int, only: set[str],
                skip: set[str] = frozenset()) -> dict[str, Any]:
    global _PROBLEM, _RUNNERS
    _PROBLEM, _RUNNERS = problem, {m: r for m, r in methods(problem.suite, quick).items()
                                   if (not only or m in only or m in (RS, RS2)) and m not in skip}
    tasks = [(m, s) for m in _RUNNERS for s in seeds]
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = pool.map(_one, tasks, chunksize=1)
    else:
        done = [_one(t) for t in tasks]
    curves: dict[str, list[list[float]]] = {m: [] for m in _RUNNERS}
    seconds: dict[str, float] = {m: 0.0 for m in _RUNNERS}
    for method, _, curve, took in sorted(done, key=lambda d: (d[0], d[1])):
        curves[method].append(curve)
        seconds[method] += took
    final = {m: summarise([c[-1] for c in cs]) for m, cs in curves.items()}
    return {"problem": problem.name, "suite": problem.suite, "budget_seconds": problem.budget,
            "max_iterations": problem.max_iterations, "curves": curves, "cpu_seconds": seconds,
            "final": {m: s.as_dict() for m, s in final.items()}}


def _share(fraction: float | None) -> str:
    return "never" if fraction is None else f"{fraction:.0%}"


def _summary(d: dict[str, float]) -> Summary:
    return Summary(d["iqm"], d["ci_low"], d["ci_high"])


def check_targets(results: list[dict[str, Any]], quick: bool) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    mf = [r for r in results if r["suite"] == MF]
    for method in sorted({m for r in mf for m in r["curves"] if m.startswith("kubetune asha")}):
        pooled_rs = [c for r in mf for c in r["curves"][RS]]
        pooled = [c for r in mf for c in r["curves"][method]]
        rs_final = iqm([c[-1] for c in pooled_rs])
        reached = budget_to_reach(pooled, rs_final)
        low, high = budget_to_reach_ci([(r["curves"][method], r["curves"][RS]) for r in mf])
        checks.append({"target": "T1", "what": f"{method} reaches RS's final regret ({rs_final:.4f})",
                       "figure": f"{'never' if reached is None else f'at {reached:.0%} of RS budget'} "
                                 f"[95% CI {_share(low)}, {_share(high)}]",
                       "passed": reached is not None and reached <= T1_FRACTION + 1e-9})
    for r in results:
        for method, final in r["final"].items():
            twin = optuna_twin(method)
            if twin is None or twin not in r["final"]:
                continue
            ours, theirs = _summary(final), _summary(r["final"][twin])
            checks.append({"target": "T3" if r["suite"] == MO else "T2", "what": f"{r['problem']}: {method} vs {twin}",
                           "figure": f"{ours.iqm:.4f} [{ours.low:.4f}, {ours.high:.4f}] vs "
                                     f"{theirs.iqm:.4f} [{theirs.low:.4f}, {theirs.high:.4f}]",
                           "passed": ours.overlaps_or_better(theirs)})
    for r in results:
        for method, final in r["final"].items():
            twin = default_twin(method)
            if twin is None or twin not in r["final"]:
                continue
            ours, theirs = _summary(final), _summary(r["final"][twin])
            checks.append({"target": "T5", "what": f"{r['problem']}: {method} vs today's default {twin}",
                           "figure": f"{ours.iqm:.4f} [{ours.low:.4f}, {ours.high:.4f}] vs "
                                     f"{theirs.iqm:.4f} [{theirs.low:.4f}, {theirs.high:.4f}]",
                           "passed": ours.overlaps_or_better(theirs)})
    wins = []
    for r in results:
        ours = min((m for m in r["final"] if side(m) == "kubetune"), key=lambda m: r["final"][m]["iqm"])
        peers = [m for m in r["final"] if side(m) != "kubetune" and m != RS2]
        best_peer = min(peers, key=lambda m: r["final"][m]["iqm"])
        wins.append(_summary(r["final"][ours]).overlaps_or_better(_summary(r["final"][best_peer])))
    share = sum(wins) / len(wins) if wins else 0.0
    checks.append({"target": "T4", "what": "kubetune's best >= the best peer at equal budget",
                   "figure": f"on {sum(wins)} of {len(wins)} problems ({share:.0%})", "passed": share >= T4_SHARE})
    return checks


def markdown(report: dict[str, Any]) -> str:
    lines = [f"Search quality: {report['seeds']} seeds, 8 workers, commit {report['commit']}, "
             f"{report['machine']}; `{report['command']}` ({report['wall_seconds']:.0f} s).", "",
             "Final normalised regret (multi-objective: share of the front's hypervolume missed), "
             "IQM over seeds [bootstrap 95% CI]; lower is better.", ""]
    for r in report["results"]:
        lines += [f"**{r['problem']}** ({r['suite']}, budget {r['budget_seconds']:.0f} simulated s "
                  f"= {8 * r['budget_seconds'] / 3600:.2f} GPU-h at 8 workers)", "",
                  "| method | final regret | CI 95% |", "|---|---|---|"]
        for m, f in sorted(r["final"].items(), key=lambda kv: kv[1]["iqm"]):
            lines.append(f"| {m} | {f['iqm']:.4f} | [{f['ci_low']:.4f}, {f['ci_high']:.4f}] |")
        lines.append("")
    lines += ["| target | what | figure | passed |", "|---|---|---|---|"]
    lines += [f"| {c['target']} | {c['what']} | {c['figure']} | {'yes' if c['passed'] else '**no**'} |"
              for c in report["checks"]]
    if report["skipped"]:
        lines += ["", "Not run here: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for suite in sorted({r["suite"] for r in results}):
        rows = [r for r in results if r["suite"] == suite]
        fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.4), squeeze=False)
        for ax, r in zip(axes[0], rows):
            for method, curves in sorted(r["curves"].items()):
                ys = [iqm([c[i] for c in curves]) for i in range(len(FRACTIONS))]
                ax.plot(FRACTIONS, ys, label=method, linestyle="--" if side(method) != "kubetune" else "-")
            ax.set_title(r["problem"], fontsize=9)
            ax.set_xlabel("budget spent (fraction)")
            ax.set_yscale("log")
        axes[0][0].set_ylabel("IQM normalised regret")
        axes[0][-1].legend(fontsize=6)
        fig.tight_layout()
        path = out / f"quality-{suite}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(str(path))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.quality", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="5 seeds, one problem per suite (the smoke test)")
    size.add_argument("--full", action="store_true", help="30 seeds, every problem this machine can run")
    parser.add_argument("--seeds", type=int, default=0, help="override the number of seeds")
    parser.add_argument("--problems", default="", help="comma-separated problem names (default: all)")
    parser.add_argument("--methods", default="", help="comma-separated method names (default: all; RS always)")
    parser.add_argument("--skip-methods", default="", help="comma-separated method names to leave out")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every problem's budget (e.g. 3: does ASHA's saving grow with the budget?)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--out", default="bench-results/quality", help="directory for quality.json/.md/.png")
    parser.add_argument("--report-from", nargs="*", default=[], metavar="PARTIAL_JSON",
                        help="run nothing: report on the results of earlier (interrupted) runs' quality.partial.json")
    args = parser.parse_args(argv)
    quick = not args.full
    # quick: 5 seeds, not 3. On the late-bloomer curves a run either finds the optimum's
    # basin or not; with 3 seeds the CIs of two equal methods missed each other
    # (kubetune 0.0015 [0.0007, 0.0022] vs Optuna 0.0002 [0.0001, 0.0002]; over 16 seeds
    # the IQMs were 0.0013 and 0.0009), so T2 was decided by the seeds' luck.
    seeds = list(range(args.seeds or (5 if quick else 30)))
    builders, skipped = catalogue_module.catalogue(quick)
    wanted = [p for p in args.problems.split(",") if p]
    if wanted:    # in the order asked for, so the problems that matter most finish first
        known = dict(builders)
        missing = [p for p in wanted if p not in known]
        if missing:
            parser.error(f"unknown or unavailable problems: {', '.join(missing)}; known: {', '.join(known)}")
        builders = [(p, known[p]) for p in wanted]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    if args.report_from:
        builders = []
        for path in args.report_from:
            earlier = json.loads(Path(path).read_text())
            seeds = list(range(earlier["seeds"]))
            results += earlier["results"]
    for name, build in builders:
        problem = build()
        if args.budget_scale != 1.0:
            problem = dataclasses.replace(problem, budget=problem.budget * args.budget_scale)
        t0 = time.perf_counter()
        results.append(run_problem(problem, seeds, quick, args.jobs, {m for m in args.methods.split(",") if m},
                                   {m for m in args.skip_methods.split(",") if m}))
        print(f"{problem.name}: {len(results[-1]['final'])} methods x {len(seeds)} seeds in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        # what is done so far survives an interrupted run (a full run takes hours)
        (out / "quality.partial.json").write_text(json.dumps({"seeds": len(seeds), "results": results}))
    report = {"seeds": len(seeds), "quick": quick, "commit": commit_label(),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "command": "python -m kubetune.bench.quality " + " ".join(argv if argv is not None else sys.argv[1:]),
              "skipped": skipped, "results": results, "checks": check_targets(results, quick),
              "wall_seconds": time.perf_counter() - started}
    report["plots"] = plot(results, out)
    (out / "quality.json").write_text(json.dumps(report, indent=1))
    (out / "quality.md").write_text(markdown(report))
    print(markdown(report))
    missed = [c for c in report["checks"] if not c["passed"]]
    print("PASS" if not missed else f"FAIL: {len(missed)} target(s) missed", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
