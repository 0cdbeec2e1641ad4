"""``kubetune run FILE``: the same Experiment file and the same controller loop, on
embedded Ray (or, with ``--platform local``, as processes of this host: executors/local),
with an in-memory store instead of Kubernetes.  Every result goes to
the results store (a local SQLite file unless --results-url says otherwise), where
``kubetune results`` reads it."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from typing import Any, Callable

import yaml

from kubetune.controller import table
from kubetune.controller.experiment import ExperimentController
from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.controller.store import MemoryStore
from kubetune.executors.platform import PlatformRegistry
from kubetune.results import default_url, open_store
from kubetune.results.writer import ResultsWriter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="an Experiment manifest (YAML)")
    parser.add_argument("--ray-address", default="local", help="local (default), auto, or ray://host:10001")
    parser.add_argument("--platform", choices=["ray", "local"], default="ray",
                        help="where trials run: ray (default: the Ray cluster of --ray-address) or local "
                             "(each trial a process of this host, at most one per CPU; no Ray, no GPU)")
    parser.add_argument("--output", "-o", choices=["table", "json"], default="table",
                        help="table: live progress; json: one machine-readable summary at the end")
    parser.add_argument("--checkpoint-storage", default="", help="where checkpoints go (default: ~/.cache/kubetune)")
    parser.add_argument("--results-url", default="",
                        help="results store (default: $KUBETUNE_RESULTS_URL or sqlite:///~/.local/share/kubetune/results.db)")


POD_EXECUTOR_NEEDS_THE_OPERATOR = (
    "executor: pod needs the operator (`kubetune operator`), which runs "
    "trials as pods and receives their results; `kubetune run` runs Ray trials only")


def load_experiment(path: str) -> dict[str, Any]:
    with open(path) as handle:
        documents = [d for d in yaml.safe_load_all(handle) if d]
    experiments = [d for d in documents if d.get("kind") == "Experiment"]
    if len(experiments) != 1:
        raise SystemExit(f"{path}: expected exactly one Experiment, found {len(experiments)}")
    body = _sorted_keys(experiments[0])
    body.setdefault("metadata", {}).setdefault("name", "experiment")
    body["metadata"].update(generation=1, uid=str(uuid.uuid4()))
    return body


def _sorted_keys(value: Any) -> Any:
    """``value`` with every mapping's keys in sorted order, as the API server stores an
    object: the search samples parameters in searchSpace order, so a file run here gives
    the same trials as the same file applied with kubectl."""
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


async def run_experiment(body: dict[str, Any], *, ray_address: str, checkpoint_storage: str,
                         show: bool, on_cycle: Callable[[ExperimentController], None] | None = None,
                         results_url: str | None = None, platform: str = "ray",
                         ) -> tuple[ExperimentController, MemoryStore]:
    """Run ``body`` to the end; ``on_cycle`` (benchmarks) is called after every controller cycle.
    ``results_url``: the results store (None: the default; "": none, e.g. benchmarks).
    ``platform``: ray, or local (the trials as processes of this host)."""
    events: list[str] = []
    store = MemoryStore(on_event=lambda kind, reason, message: events.append(f"{reason}: {message}"))
    registry = PlatformRegistry({"ray": _function_platforms(body, platform, ray_address)},
                                refusals={"pod": POD_EXECUTOR_NEEDS_THE_OPERATOR})
    namespace = body["metadata"].get("namespace", "local")
    last_drawn = [0.0]

    def draw(controller: ExperimentController) -> None:
        if on_cycle is not None:
            on_cycle(controller)
        now = time.monotonic()
        if show and now - last_drawn[0] >= 1.0:
            last_drawn[0] = now
            table.draw(sys.stdout, controller, store)

    writer = ResultsWriter(lambda: open_store(results_url)) if results_url != "" else None
    controller = ExperimentController(namespace=namespace, name=body["metadata"]["name"], store=store,
                                      registry=registry, body=lambda: body, on_cycle=draw,
                                      checkpoint_storage=checkpoint_storage,
                                      results=ResultsRecorder(writer, namespace, lambda: body) if writer else None)
    try:
        await controller.run(stopped=lambda: _finished(controller, store))
    finally:
        if writer is not None:
            await asyncio.to_thread(writer.close, 60.0)
            if writer.problem:
                print(f"kubetune: results not stored: {writer.problem}", file=sys.stderr)
            if writer.dropped or writer.pending:   # the store away or slow past the wait, or the buffer full
                print(f"kubetune: {writer.dropped} result(s) given up and {writer.pending} row(s) not written "
                      "yet: not in the results store", file=sys.stderr)
            for rejected in writer.rejected.values():   # the user's own rows: say which
                print(f"kubetune: {rejected.rows} result row(s) refused by the results store "
                      f"({', '.join(rejected.kinds)}; first: {rejected.example})", file=sys.stderr)
    if show:
        table.draw(sys.stdout, controller, store, final=True)
    return controller, store


def _function_platforms(body: dict[str, Any], platform: str, ray_address: str):
    """The provider of the platform that runs Python-function trials (``executor: ray``)."""
    if platform == "local":
        from kubetune.executors.local.platform import LocalPlatforms
        return LocalPlatforms()
    from kubetune.executors.ray.executor import RayExecutor
    from kubetune.executors.ray.platform import RayPlatforms
    # one Experiment, one process: its own spec.ray.address, if it names one, is the cluster
    return RayPlatforms(((body.get("spec") or {}).get("ray") or {}).get("address") or ray_address, RayExecutor)


def _finished(controller: ExperimentController, store: MemoryStore) -> bool:
    status = store.experiment_status
    if status.get("phase") == "Failed" and controller.runner is None:
        return True   # invalid spec: nothing will ever run
    runner = controller.runner
    return runner is not None and runner.summary(time.time()).finished is not None and not runner.active_trials()


def main(args: argparse.Namespace) -> int:
    body = load_experiment(args.file)
    controller, store = asyncio.run(run_experiment(
        body, ray_address=args.ray_address, checkpoint_storage=args.checkpoint_storage,
        show=args.output == "table", results_url=args.results_url or None, platform=args.platform))
    status = store.experiment_status
    if args.output == "json":
        trials = [{"name": name, "phase": t["status"].get("phase"), "parameters": t["spec"]["parameters"],
                   "bestMetric": t["status"].get("bestMetric"), "iteration": t["status"].get("iteration"),
                   "reason": t["status"].get("reason"), "lastMetrics": t["status"].get("lastMetrics"),
                   "usage": {key: (t["status"].get("usage") or {}).get(key, 0.0)
                             for key in ("gpuSeconds", "cpuSeconds", "runSeconds", "queueSeconds")},
                   **({"infeasible": t["status"]["infeasible"]} if t["status"].get("infeasible") else {})}
                  for name, t in sorted(store.trials.items(), key=lambda kv: kv[1]["spec"]["index"])]
        json.dump({"experiment": body["metadata"]["name"], "status": status, "trials": trials},
                  sys.stdout, indent=2, default=str)
        print()
    else:
        url = args.results_url or default_url()
        print(f"every result: kubetune results {body['metadata']['name']} --namespace "
              f"{body['metadata'].get('namespace', 'local')} --store {url}")
    return 0 if status.get("phase") == "Succeeded" else 1
