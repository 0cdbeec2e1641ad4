"""``kubetune results EXPERIMENT``: read one Experiment's results from the results store.

Where the store is: ``--store URL``, else ``$KUBETUNE_RESULTS_URL``, else the local
SQLite file that ``kubetune run`` and a locally run operator write.  On a cluster,
either point ``--store`` at the PostgreSQL database the chart's operator writes
(e.g. through ``kubectl port-forward``), or run the command inside the operator's
Pod, where the store's URL is already set:
``kubectl exec -n kubetune-system deploy/kubetune -- kubetune results EXPERIMENT -n NS -o csv``."""
from __future__ import annotations

import argparse
import os
import sys

from kubetune.results.export import Report
from kubetune.results.store import URL_ENV, default_url, open_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", help="the Experiment's name")
    parser.add_argument("--namespace", "-n", default=None,
                        help="its namespace (default: the only namespace holding an Experiment of that name; "
                             "`kubetune run` uses 'local')")
    parser.add_argument("--trial", default=None, help="only this Trial")
    parser.add_argument("--output", "-o", choices=["table", "json", "csv"], default="table")
    parser.add_argument("--store", default="",
                        help=f"results store URL (default: ${URL_ENV}, else {default_url()})")
    parser.add_argument("--plot", metavar="DIR", default=None,
                        help="also draw history.png, curves.png and parallel.png into DIR")
    parser.add_argument("--objectives", metavar="M:min|max[:REF],...", default=None,
                        help="with --plot, also draw pareto.png for these objectives (and hypervolume.png when "
                             "each has a reference), e.g. loss:min:2.0,model_size:min:1.0")
    parser.add_argument("--constraints", metavar="M:max|min:V,...", default=None,
                        help="with --objectives, the Experiment's constraints, e.g. memory_gb:max:2: infeasible "
                             "trials are drawn as crosses and are never on the front nor in the hypervolume")


def load(store, experiment: str, namespace: str | None, trial: str | None) -> Report:
    """The Report of one Experiment; SystemExit with what exists when it is not there."""
    found = [e for e in store.experiments(namespace) if e.name == experiment]
    if not found:
        known = sorted({f"{e.namespace}/{e.name}" for e in store.experiments()})
        raise SystemExit(f"no results for experiment {experiment!r}"
                         f"{f' in namespace {namespace!r}' if namespace else ''} in {store.url_shown}; "
                         f"experiments there: {', '.join(known[:20]) or 'none'}")
    namespaces = sorted({e.namespace for e in found})
    if len(namespaces) > 1:
        raise SystemExit(f"experiment {experiment!r} exists in namespaces {', '.join(namespaces)}: "
                         "choose one with --namespace")
    chosen = found[-1]   # the newest of that name: a re-created Experiment replaces the old one
    trials = store.trials(chosen.uid)
    if trial is not None:
        trials = [t for t in trials if t.name == trial]
        if not trials:
            raise SystemExit(f"experiment {experiment!r} has no trial {trial!r}")
    uids = {t.uid for t in trials}
    results = [r for t in trials for r in store.results(chosen.uid, t.uid)] if trial else store.results(chosen.uid)
    failures = [f for f in store.failures(chosen.uid) if f.trial_uid in uids]
    usage = [u for u in store.usage(chosen.uid) if u.trial_uid in uids]
    return Report(chosen, trials, results, failures, usage)


def main(args: argparse.Namespace) -> int:
    # options that would otherwise be ignored in silence
    if args.objectives and not args.plot:
        raise SystemExit("--objectives draws pareto.png and hypervolume.png: give --plot DIR too")
    if args.constraints and not args.objectives:
        raise SystemExit("--constraints applies to the Pareto front: give --objectives too")
    try:
        store = open_store(args.store or None, create=False)
    except FileNotFoundError as error:
        raise SystemExit(str(error)) from None
    try:
        report = load(store, args.experiment, args.namespace, args.trial)
    finally:
        store.close()
    if args.plot:
        from kubetune.results.plots import draw
        paths = draw(report, args.plot)
        if args.objectives:
            from kubetune.results.pareto_plots import draw_pareto, pareto_front, parse_constraints, parse_objectives
            objectives = parse_objectives(args.objectives)
            constraints = parse_constraints(args.constraints) if args.constraints else []
            paths += draw_pareto(report, args.plot, objectives, constraints)
            front = list(pareto_front(report, objectives, constraints))
            print(f"Pareto front: {len(front)} trials: {', '.join(front[:20])}"
                  f"{' ...' if len(front) > 20 else ''}", file=sys.stderr)
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    try:
        {"table": report.write_table, "json": report.write_json, "csv": report.write_csv}[args.output](sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:   # `kubetune results EXP | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
