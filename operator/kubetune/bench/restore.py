"""Restore after an operator restart (issue 15): how long a fresh operator takes to
rebuild N running Experiments of R results each from their Trials, and whether its
liveness endpoint answers throughout.

``python -m kubetune.bench.restore [--experiments 100] [--results 10000]``: a control
plane of its own; each Experiment an ASHA run of 10 Trials, the results spread over
them, statuses written as the operator renders them (controller/render.py); the Ray
address is one nobody listens on, so what is measured is the restore (LIST, replay
of the study and the scheduler) and nothing else. Prints one JSON line."""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

from kubetune.bench.kube import KubeBench
from kubetune.controller import render
from kubetune.core.curve import add_point
from kubetune.core.trial import TrialInfo
from kubetune.core.types import TrialPhase
from kubetune.devcluster.processes import free_port, terminate
from kubetune.k8s.client import GROUP, VERSION

TRIALS = 10
RESTORED = re.compile(r"restored (\d+) trials")


def experiment_body(name: str, trials: int) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": name},
            "spec": {"objective": {"metric": "loss", "mode": "min"},
                     "searchSpace": {"lr": {"loguniform": [0.001, 1.0]}}, "search": {"algorithm": "random", "seed": 1},
                     "scheduler": {"type": "asha", "maxIterations": 100000, "gracePeriod": 1},
                     "budget": {"maxTrials": trials * 2, "parallelism": trials},
                     "trial": {"entrypoint": "kubetune.examples.quadratic:train", "resources": {"cpu": 0.1}}}}


def trial_status(name: str, index: int, results: int) -> tuple[dict, dict]:
    lr = 0.001 + index / 100
    trial = TrialInfo(name=name, index=index, params={"lr": lr},
                      phase=TrialPhase.RUNNING if index == 0 else TrialPhase.SUCCEEDED)
    # the curve as the runner keeps it (core/curve.py: at most 64 points, the CRD's bound)
    history: list = []
    stride = 1
    for i in range(results):
        history, stride = add_point(history, stride, {"loss": 1.0 / (i + 1) + lr, "iteration": i + 1})
    trial.history, trial.history_stride = history, stride
    trial.last_metrics = {"loss": 1.0 / results + lr, "iteration": results}
    trial.iteration, trial.last_seq, trial.start_time = results, results - 1, time.time()
    return {"lr": lr}, render.trial_status(trial)


def populate(bench: KubeBench, namespace: str, experiments: int, results: int) -> None:
    custom = bench._custom()
    per_trial = max(1, results // TRIALS)

    def one(e: int) -> None:
        name = f"r{e}"
        created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "experiments",
                                                         experiment_body(name, TRIALS))
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "experiments", name, {"status": {
            "phase": "Running", "observedGeneration": created["metadata"]["generation"],
            "startTime": render.rfc3339(time.time())}})
        for t in range(TRIALS):
            params, status = trial_status(f"{name}-{t}", t, per_trial)
            body = render.trial_body(namespace=namespace, experiment=created, name=f"{name}-{t}", index=t,
                                     params=params, resources={"cpu": 0.1})
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trials", body)
            custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "trials", f"{name}-{t}",
                                                         {"status": status})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(experiments)))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(bench: KubeBench, namespace: str, experiments: int, timeout_s: float) -> dict:
    health = free_port()
    log_path = bench.workdir / "restore-operator.log"
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "kubetune", "operator", "--namespace", namespace,
         "--ray-address", f"ray://127.0.0.1:{closed_port()}", "--liveness", f"http://127.0.0.1:{health}/healthz",
         "--results-url", f"sqlite:///{bench.workdir / 'results.db'}"],
        env={**bench.env, "KUBECONFIG": str(bench.plane.kubeconfig)}, stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT)
    latencies, failures, up_at = [], 0, None
    try:
        while time.monotonic() - started < timeout_s:
            probe = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as answer:
                    ok = answer.status == 200
            except OSError:
                ok = False
            if ok:
                up_at = up_at or time.monotonic()
                latencies.append(time.monotonic() - probe)
            elif up_at is not None:
                failures += 1       # once up, every probe must answer (as a kubelet's would)
            restored = len(RESTORED.findall(log_path.read_text()))
            if restored >= experiments:
                break
            time.sleep(0.25)
        done = time.monotonic()
    finally:
        terminate(process)
    return {"experiments_restored": restored, "restore_s": round(done - started, 2),
            "from_liveness_up_s": round(done - up_at, 2) if up_at else None,
            "liveness_probes": len(latencies), "liveness_failures": failures,
            "liveness_max_latency_s": round(max(latencies), 3) if latencies else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.restore")
    parser.add_argument("--experiments", type=int, default=100)
    parser.add_argument("--results", type=int, default=10000, help="results per Experiment")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    with KubeBench(log=lambda message: print(message, file=sys.stderr)) as bench:
        namespace = "restore"
        bench._core().create_namespace({"metadata": {"name": namespace}})
        began = time.monotonic()
        populate(bench, namespace, args.experiments, args.results)
        figures = measure(bench, namespace, args.experiments, args.timeout)
        print(json.dumps({"experiments": args.experiments, "results_per_experiment": args.results,
                          "trials_per_experiment": TRIALS, "populate_s": round(time.monotonic() - began, 1),
                          **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
