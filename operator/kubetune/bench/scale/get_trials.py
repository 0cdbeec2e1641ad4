"""``python -m kubetune.bench.scale.get_trials``: is ``kubectl get trials`` usable on a
10,000-trial Experiment (issue 26: ≤ 3 s)?

Lighter than the whole scale bench: only the control plane (``devcluster.ControlPlane``
with the chart's CRDs), no operator and no Ray.  One Experiment of the ``big`` shape and
``--trials`` Trials in its namespace, each with the status the operator writes for a
finished trial of ``--results`` results (finished_trial.py: the operator's own runner and
rendering), then stripped of its ``managedFields`` as the operator strips a finished
Trial's (the same PATCH, k8s/store.STRIP_MANAGED_FIELDS; controller/managed_fields.py).
The peer, in the same run: the same Trials before the strip, as they were until the
operator stripped them (``with_managed_fields``).  Each, the median of ``--repeat`` runs:

- ``kubectl get trials -n NS`` (kubectl's default: pages of 500, the server renders each
  page as a Table from the CRD's additionalPrinterColumns);
- ``kubectl get trials -n NS -o name`` (no Table);
- the same LIST without kubectl: pages of 500 as a Table (as kubectl asks: each row with
  the Trial's metadata, managedFields included), as a Table of the printer columns alone
  (``includeObject=None``) and as JSON, read whole: where the server's time goes, apart
  from kubectl's own.

Prints one JSON object: the figures (of the stripped Trials; the peer's under
``with_managed_fields``), the Trial's size in bytes (compact JSON as the server returns
it), the load average at the start and the end and the commit."""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import statistics
import sys
import time
from typing import Any, Callable

from kubetune.bench import machine
from kubetune.bench.kube import KubeBench
from kubetune.bench.scale import shapes
from kubetune.bench.scale.finished_trial import finished_status, trial_body
from kubetune.k8s.client import GROUP, VERSION
from kubetune.k8s.store import STRIP_MANAGED_FIELDS

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PAGE = 500    # kubectl's default --chunk-size


def populate(bench: KubeBench, namespace: str, trials: int, results: int, threads: int = 8) -> dict[str, Any]:
    """The namespace, the Experiment (never reconciled: no operator runs) and its Trials."""
    bench._core().create_namespace({"metadata": {"name": namespace}})
    custom = bench._custom()
    planned = shapes.big(trials=trials, parallelism=32, cpu=0.05)
    body = planned.body()
    body["metadata"]["namespace"] = namespace
    experiment = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", body)
    status = finished_status(body["spec"], results, experiment=body["metadata"]["name"])
    draw = random.Random(0)
    xs = [draw.random() for _ in range(trials)]

    def one(index: int) -> None:
        created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trials",
                                                         trial_body(namespace, experiment, index, xs[index]))
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "trials",
                                                     created["metadata"]["name"], {"status": status})

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(trials)))
    return experiment


def strip_all(bench: KubeBench, namespace: str, experiment: dict[str, Any], trials: int, threads: int = 8) -> None:
    """What the operator does once each Trial's terminal status is written."""
    custom = bench._custom()

    def one(index: int) -> None:
        name = trial_body(namespace, experiment, index, 0.0)["metadata"]["name"]
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trials", name, STRIP_MANAGED_FIELDS)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(trials)))


def _median_of(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    took, last = [], None
    for _ in range(repeat):
        started = time.monotonic()
        last = run()
        took.append(time.monotonic() - started)
    return round(statistics.median(took), 3), last


def raw_list(bench: KubeBench, namespace: str, accept: str, *params: tuple[str, str]) -> int:
    """Every page of the LIST, read whole; the bytes it took."""
    api, size, token = bench._api, 0, ""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/trials"
    while True:
        query = [("limit", PAGE), *params] + ([("continue", token)] if token else [])
        method, url, headers, body, _ = api.param_serialize("GET", path, query_params=query,
                                                            header_params={"Accept": accept},
                                                            auth_settings=["BearerToken"])
        response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=300)
        response.read()
        size += len(response.data)
        token = json.loads(response.data)["metadata"].get("continue") or ""
        if not token:
            return size


def measure(bench: KubeBench, namespace: str, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["kubectl_get_s"], rows = _median_of(repeat, lambda: bench.kubectl_get_trials(namespace))
    out["kubectl_get_rows"] = rows - 1    # its header
    out["kubectl_get_name_s"], _ = _median_of(repeat, lambda: bench.kubectl_get_trials(namespace, "-o", "name"))
    out["list_table_s"], out["list_table_bytes"] = _median_of(repeat, lambda: raw_list(bench, namespace, TABLE))
    out["list_table_columns_only_s"], out["list_table_columns_only_bytes"] = _median_of(
        repeat, lambda: raw_list(bench, namespace, TABLE, ("includeObject", "None")))
    out["list_json_s"], out["list_json_bytes"] = _median_of(
        repeat, lambda: raw_list(bench, namespace, "application/json"))
    one = bench._custom().list_namespaced_custom_object(GROUP, VERSION, namespace, "trials", limit=1)["items"][0]
    out["trial_bytes"] = len(json.dumps(one, separators=(",", ":")))
    out["trial_status_bytes"] = len(json.dumps(one.get("status") or {}, separators=(",", ":")))
    out["trial_managed_fields_bytes"] = len(json.dumps(one["metadata"].get("managedFields") or [],
                                                       separators=(",", ":")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.scale.get_trials",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000, help="Trials in the namespace")
    parser.add_argument("--results", type=int, default=1, help="results of each (finished) trial")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (the median counts)")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"command": "python -m kubetune.bench.scale.get_trials "
                                          + " ".join(argv if argv is not None else sys.argv[1:]),
                               "commit": machine.git_state()[0],
                               "loadavg_start": machine.loadavg_text()}
    with KubeBench(log=lambda m: print(m, file=sys.stderr, flush=True)) as bench:
        began = time.monotonic()
        experiment = populate(bench, "get-trials", args.trials, args.results)
        figures["populate_s"] = round(time.monotonic() - began, 1)
        figures.update(trials=args.trials, results=args.results)
        bench.kubectl_get_trials("default")    # kubectl's first call reads the API's discovery: not measured
        peer = measure(bench, "get-trials", args.repeat)
        began = time.monotonic()
        strip_all(bench, "get-trials", experiment, args.trials)
        figures["strip_s"] = round(time.monotonic() - began, 1)
        figures.update(measure(bench, "get-trials", args.repeat))
        figures["with_managed_fields"] = peer
        figures["kubectl_get_ratio"] = round(figures["kubectl_get_s"] / peer["kubectl_get_s"], 3)
    figures["loadavg_end"] = machine.loadavg_text()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
