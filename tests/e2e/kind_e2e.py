"""``make e2e``: the product on a real cluster.

On Linux as root it runs the real-node path, tests/integration/test_real_node.py and
test_real_node_kuberay.py (kubetune.devcluster.node: containerd + kubelet beside the
embedded control plane, images built with buildah, KubeRay's operator built from its Go
module; `make test` runs them too).  Elsewhere, kind, KubeRay, the
kubetune chart and the KubeRay example, where a Docker engine runs.

Where there is no Docker engine (our CI machines, this repository's dev boxes) it
prints why and exits 0 without running anything: skipped, never faked.  With
``E2E_REQUIRED=1`` a skip is a failure (for the machine that is meant to run it).

Steps: build the operator image and the RayCluster image (Dockerfile targets), create
(or reuse) the kind cluster ``$E2E_CLUSTER`` (default kubetune-e2e), load the images,
install KubeRay's operator (Helm chart kuberay/kuberay-operator ``$KUBERAY_VERSION``) and
charts/kubetune, apply examples/kuberay/ scaled for a laptop (kind has no GPUs: the
trials ask for CPU, the GPU group stays at zero), ``kubectl wait
--for=condition=Succeeded``, and show ``kubectl get experiments,trials``.  The cluster
is deleted at the end unless ``E2E_KEEP=1``.

Tools: docker, kubectl (on PATH), kind (on PATH, else built from its Go module into
the kubetune cache), helm (kubetune.devcluster.helm).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CLUSTER = os.environ.get("E2E_CLUSTER", "kubetune-e2e")
KIND_VERSION = os.environ.get("KIND_VERSION", "v0.30.0")
KUBERAY_VERSION = os.environ.get("KUBERAY_VERSION", "1.4.2")
TAG = "e2e"
RAY_ADDRESS = "ray://kubetune-ray-head-svc.default.svc:10001"


def say(message: str) -> None:
    print(f"e2e: {message}", file=sys.stderr, flush=True)


def skip(reason: str) -> None:
    say(f"SKIPPED: {reason}")
    if os.environ.get("E2E_REQUIRED") == "1":
        say("E2E_REQUIRED=1: a skip is a failure here")
        sys.exit(1)
    sys.exit(0)


def run(*cmd: str, input: str | None = None, env: dict | None = None) -> str:
    say("$ " + " ".join(cmd))
    result = subprocess.run(cmd, input=input, text=True, stdout=subprocess.PIPE, env=env)
    if result.returncode != 0:
        say(f"FAILED (exit {result.returncode}): {' '.join(cmd)}")
        sys.exit(result.returncode)
    return result.stdout


def docker_engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no `docker` on PATH; kind runs Kubernetes nodes as Docker containers"
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if probe.returncode != 0:
        detail = (probe.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return f"the Docker engine is not reachable ({detail}); kind needs one"
    return None


def kind_binary() -> str:
    found = shutil.which("kind")
    if found:
        return found
    from kubetune.devcluster.build import cache_root
    target = cache_root() / "bin" / f"kind-{KIND_VERSION}"
    if not (target / "kind").is_file():
        if shutil.which("go") is None:
            say("no `kind` on PATH and no `go` to build it")
            sys.exit(1)
        say(f"building kind {KIND_VERSION} into {target}")
        env = dict(os.environ, GOBIN=str(target), CGO_ENABLED="0")
        env.pop("GOFLAGS", None)
        run("go", "install", f"sigs.k8s.io/kind@{KIND_VERSION}", env=env)
    return str(target / "kind")


def laptop_manifests() -> tuple[dict, dict]:
    """examples/kuberay/ with the e2e images, laptop-sized Pods and CPU-only trials."""
    cluster = yaml.safe_load((REPO / "examples/kuberay/raycluster.yaml").read_text())
    spec = cluster["spec"]
    for container in spec["headGroupSpec"]["template"]["spec"]["containers"]:
        container["image"] = f"kubetune-ray:{TAG}"
        container["resources"] = {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    for group in spec["workerGroupSpecs"]:
        for container in group["template"]["spec"]["containers"]:
            container["image"] = f"kubetune-ray:{TAG}"
            if group["groupName"] == "cpu":
                container["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"},
                                          "limits": {"cpu": "1", "memory": "2Gi"}}
    experiment = yaml.safe_load((REPO / "examples/kuberay/experiment.yaml").read_text())
    experiment["metadata"]["name"] = "kuberay-e2e"
    trial = experiment["spec"]["trial"]
    trial["resources"] = {"cpu": 0.5}
    trial["config"] = {"iterations": 5, "delay": 0.2}
    experiment["spec"]["scheduler"].update(maxIterations=5, gracePeriod=1)
    experiment["spec"]["budget"].update(maxTrials=4, parallelism=2)
    return cluster, experiment


def main() -> int:
    sys.path.insert(0, str(REPO / "operator"))
    from kubetune.devcluster.node.node import why_not_here
    node_problem = why_not_here()
    if node_problem is None:
        say("Linux with root: the real node (tests/integration/test_real_node*.py: the chart, pod trials, "
            "KubeRay)")
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-ra",
                                *(str(REPO / "tests" / "integration" / name)
                                  for name in ("test_real_node.py", "test_real_node_kuberay.py"))], cwd=REPO)
    problem = docker_engine_problem()
    if problem:
        skip(f"no real node here ({node_problem}) and no kind ({problem}). Nothing was run: the chart, "
             "RBAC, metrics and conditions are covered against a real API server and real Ray by "
             "tests/integration/test_chart.py")
    if shutil.which("kubectl") is None:
        say("kubectl is required on PATH")
        return 1
    kind = kind_binary()
    helm = run(sys.executable, "-m", "kubetune.devcluster.helm").strip()

    run("docker", "build", "-t", f"kubetune:{TAG}", str(REPO))
    run("docker", "build", "--target", "raycluster", "-t", f"kubetune-ray:{TAG}", str(REPO))

    if CLUSTER not in run(kind, "get", "clusters").split():
        run(kind, "create", "cluster", "--name", CLUSTER, "--wait", "180s")
    kubeconfig = Path(tempfile.mkdtemp(prefix="kubetune-e2e-")) / "kubeconfig"
    kubeconfig.write_text(run(kind, "get", "kubeconfig", "--name", CLUSTER))
    os.environ["KUBECONFIG"] = str(kubeconfig)
    ok = False
    try:
        run(kind, "load", "docker-image", f"kubetune:{TAG}", f"kubetune-ray:{TAG}", "--name", CLUSTER)
        run(helm, "repo", "add", "kuberay", "https://ray-project.github.io/kuberay-helm/", "--force-update")
        run(helm, "upgrade", "--install", "kuberay-operator", "kuberay/kuberay-operator",
            "--version", KUBERAY_VERSION, "--namespace", "kuberay-system", "--create-namespace",
            "--wait", "--timeout", "5m")
        run(helm, "upgrade", "--install", "kubetune", str(REPO / "charts/kubetune"),
            "--namespace", "kubetune-system", "--create-namespace",
            "--set", f"image.tag={TAG}", "--set", "image.pullPolicy=Never",
            "--set", f"ray.address={RAY_ADDRESS}", "--wait", "--timeout", "5m")
        cluster, experiment = laptop_manifests()
        run("kubectl", "apply", "-f", "-", input=yaml.safe_dump(cluster))
        # no wait for the head: until Ray answers, the Experiment says RayUnavailable and
        # the operator retries with backoff, which is part of what this shows
        run("kubectl", "apply", "-f", "-", input=yaml.safe_dump(experiment))
        run("kubectl", "wait", "--for=condition=Succeeded", "experiment/kuberay-e2e", "--timeout=20m")
        print(run("kubectl", "get", "experiments,trials", "-o", "wide"))
        ok = True
        say("PASSED: the KubeRay example ran to Succeeded on kind")
    finally:
        if not ok:
            subprocess.run(["kubectl", "-n", "kubetune-system", "logs", "deployment/kubetune",
                            "--tail=200"])
            subprocess.run(["kubectl", "describe", "experiment/kuberay-e2e"])
        if os.environ.get("E2E_KEEP") == "1":
            say(f"E2E_KEEP=1: leaving kind cluster {CLUSTER} (KUBECONFIG={kubeconfig})")
        else:
            subprocess.run([kind, "delete", "cluster", "--name", CLUSTER])
    return 0


if __name__ == "__main__":
    sys.exit(main())
