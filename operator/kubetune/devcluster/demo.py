"""``kubetune demo`` (the README's first command): the whole product on one laptop.

With no reachable cluster in KUBECONFIG it starts the embedded control plane; it
installs the CRDs, runs the operator (embedded Ray) as a child process, applies
examples/quickstart.yaml, shows progress until the Experiment finishes and prints
what `kubectl get experiments,trials` would show."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kubetune.controller.conditions import parse_rfc3339


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", default=None, help="Experiment manifest (default: examples/quickstart.yaml)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the Experiment to finish")
    parser.add_argument("--keep", action="store_true", help="leave the Experiment in place at the end")


def _say(message: str) -> None:
    print(message, flush=True)


def reachable_kubeconfig() -> str | None:
    """The KUBECONFIG in use if it names a cluster that answers within a few seconds."""
    import kubernetes

    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not os.path.exists(path.split(os.pathsep)[0]):
        return None
    try:
        client = kubernetes.config.new_client_from_config(config_file=path)
        kubernetes.client.VersionApi(client).get_code(_request_timeout=3)
    except Exception:   # noqa: BLE001 - any failure means "no usable cluster here"
        return None
    return path


def _example_path(given: str | None) -> Path:
    if given:
        return Path(given)
    from kubetune.devcluster.crds import crds_dir
    return crds_dir().parent / "examples" / "quickstart.yaml"


def main(args: argparse.Namespace) -> int:
    import kubernetes

    from kubetune.devcluster.controlplane import ControlPlane
    from kubetune.devcluster.crds import install_crds
    from kubetune.devcluster.processes import terminate

    plane = None
    operator = None
    workdir = Path(tempfile.mkdtemp(prefix="kubetune-demo-"))
    try:
        kubeconfig = reachable_kubeconfig()
        if kubeconfig is None:
            _say("demo: no reachable cluster in KUBECONFIG; starting the embedded control plane "
                 "(the first run builds it from source: several minutes)")
            plane = ControlPlane(workdir / "cluster", die_with_parent=True, log=_say).start()
            kubeconfig = str(plane.kubeconfig)
        else:
            _say(f"demo: using the cluster in {kubeconfig}")
        client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
        install_crds(client)

        env = {**os.environ, "KUBECONFIG": kubeconfig}
        log_path = workdir / "operator.log"
        _say(f"demo: starting the operator with embedded Ray (log: {log_path})")
        operator = subprocess.Popen([sys.executable, "-m", "kubetune", "operator", "--ray-address", "local",
                                     "--namespace", args.namespace],
                                    env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)

        manifest = yaml.safe_load(_example_path(args.experiment).read_text())
        name = manifest["metadata"]["name"]
        api = kubernetes.client.CustomObjectsApi(client)
        _apply(api, args.namespace, manifest)
        _say(f"demo: applied Experiment {args.namespace}/{name}; waiting for it to finish")
        phase = _watch(api, args.namespace, name, operator, args.timeout, log_path)
        _say("")
        _say(_kubectl_get(api, args.namespace, name))
        _say(f"\ndemo: every result is in the results store: kubetune results {name} -n {args.namespace}"
             " [-o json|csv] [--plot DIR]")
        if not args.keep:
            api.delete_namespaced_custom_object("kubetune.dev", "v1alpha1", args.namespace, "experiments", name)
        return 0 if phase == "Succeeded" else 1
    finally:
        if operator is not None:
            terminate(operator)
        if plane is not None:
            plane.stop()


def _apply(api, namespace: str, manifest: dict) -> None:
    import kubernetes

    name = manifest["metadata"]["name"]
    try:
        api.delete_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", name)
        _wait_gone(api, namespace, name)
    except kubernetes.client.exceptions.ApiException as error:
        if error.status != 404:
            raise
    api.create_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", manifest)


def _wait_gone(api, namespace: str, name: str, timeout: float = 60.0) -> None:
    import kubernetes

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            api.get_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", name)
        except kubernetes.client.exceptions.ApiException as error:
            if error.status == 404:
                return
            raise
        time.sleep(0.5)
    raise TimeoutError(f"Experiment {name} still exists after {timeout}s")


def _watch(api, namespace: str, name: str, operator: subprocess.Popen, timeout: float, log_path: Path) -> str:
    deadline = time.monotonic() + timeout
    last_line = ""
    while time.monotonic() < deadline:
        if operator.poll() is not None:
            tail = log_path.read_text().splitlines()[-30:]
            raise SystemExit("demo: the operator exited:\n" + "\n".join(tail))
        status = api.get_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments",
                                                  name).get("status") or {}
        best = status.get("bestTrial") or {}
        line = (f"  {status.get('phase', 'Pending'):<10} done {status.get('progress', '-'):<7} "
                f"running {(status.get('trialCounts') or {}).get('running', 0)}  "
                f"best {best.get('name', '-')} {best.get('metric', '')}")
        if line != last_line:
            _say(line)
            last_line = line
        if status.get("phase") in ("Succeeded", "Failed"):
            return status["phase"]
        time.sleep(1.0)
    raise SystemExit(f"demo: Experiment {name} did not finish within {timeout:.0f}s (operator log: {log_path})")


def _age(created: str) -> str:
    seconds = int(time.time() - parse_rfc3339(created))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def _kubectl_get(api, namespace: str, name: str) -> str:
    """What `kubectl get experiments,trials` prints, from the CRDs' printer columns."""
    from kubetune.controller.table import render

    experiment = api.get_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", name)
    status = experiment.get("status") or {}
    rows = [[f"experiment.kubetune.dev/{name}", status.get("phase", ""), status.get("progress", ""),
             str((status.get("trialCounts") or {}).get("running", 0)),
             str((status.get("bestTrial") or {}).get("metric", "")), _age(experiment["metadata"]["creationTimestamp"])]]
    out = render(rows, ["NAME", "PHASE", "DONE", "RUNNING", "BEST", "AGE"]) + "\n\n"
    trials = api.list_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "trials",
                                               label_selector=f"kubetune.dev/experiment={name}")["items"]
    trials.sort(key=lambda t: t["spec"]["index"])
    rows = [[f"trial.kubetune.dev/{t['metadata']['name']}", name, (t.get("status") or {}).get("phase", ""),
             str((t.get("status") or {}).get("bestMetric", "")), str((t.get("status") or {}).get("iteration", "")),
             _age(t["metadata"]["creationTimestamp"])] for t in trials]
    out += render(rows, ["NAME", "EXPERIMENT", "PHASE", "METRIC", "ITERATION", "AGE"])
    best = status.get("bestTrial")
    if best:
        out += f"\n\nbest trial: {best['name']} metric={best['metric']} parameters={best['parameters']}"
    return out
