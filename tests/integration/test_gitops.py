"""GitOps pipelines see the truth (issue 33), read by the tools' own code from the real
API server: kstatus (sigs.k8s.io/cli-utils, what Flux and kpt read), Flux's evaluation
of the healthCheckExprs in examples/gitops, Argo CD's health evaluation with the
chart's health scripts, `kubectl wait --for=condition=Ready`, and server-side apply by
a field manager standing in for Argo CD."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k8s_helpers import GROUP, VERSION, condition, create, experiment, get_experiment, trials
from kube_fixtures import wait_for
from kubectl_wait import condition_met
from kubetune.devcluster.gitops_tools import argocd_health, ensure_gitops_tools, flux_health, kstatus
from kubetune.devcluster.helm import ensure_helm
from operator_fixtures import OperatorProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ARGOCD = "argocd-controller"     # the field manager Argo CD's server-side apply uses


def built(request, ensure):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():   # a cold build takes minutes: show it
        return ensure(log=lambda message: print(message, file=sys.stderr, flush=True))


@pytest.fixture(scope="module")
def tools(request) -> dict[str, Path]:
    return built(request, ensure_gitops_tools)


@pytest.fixture(scope="module")
def argocd_cm(request, tmp_path_factory) -> Path:
    """The ConfigMap the chart renders with argocd.healthChecks.enabled, as JSON: what
    Argo CD reads its health customizations from (merged into argocd-cm)."""
    helm = built(request, ensure_helm)
    rendered = subprocess.run(
        [str(helm), "template", "kt", str(ROOT / "charts" / "kubetune"), "--namespace", "argocd",
         "--set", "argocd.healthChecks.enabled=true", "--show-only", "templates/argocd-health.yaml"],
        capture_output=True, text=True, check=True, timeout=120).stdout
    config_map = yaml.safe_load(rendered)
    path = tmp_path_factory.mktemp("argocd") / "argocd-cm.json"
    path.write_text(json.dumps(config_map))
    return path


@pytest.fixture(scope="module")
def flux_kustomization(tmp_path_factory) -> Path:
    """The Flux Kustomization of examples/gitops (its healthCheckExprs), as JSON."""
    documents = yaml.safe_load_all((ROOT / "examples" / "gitops" / "flux-kustomization.yaml").read_text())
    kustomization = next(d for d in documents if d["kind"] == "Kustomization")
    path = tmp_path_factory.mktemp("flux") / "kustomization.json"
    path.write_text(json.dumps(kustomization))
    return path


def read_all(api, namespace: str, plural: str) -> dict:
    """The objects as the tools get them from the API server (a List, as `kubectl get -o json`)."""
    return {"apiVersion": "v1", "kind": "List",
            "items": api.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)["items"]}


class Readers:
    """What kstatus and Argo CD say about the Experiments and Trials of a namespace."""

    def __init__(self, tools, argocd_cm, flux_kustomization, api, namespace) -> None:
        self.tools, self.argocd_cm, self.flux_kustomization = tools, argocd_cm, flux_kustomization
        self.api, self.namespace = api, namespace

    def experiments(self) -> tuple[dict, dict]:
        """kstatus and Argo CD health by Experiment name; Flux's healthCheckExprs of
        examples/gitops must say what kstatus says, in every phase."""
        objects = read_all(self.api, self.namespace, "experiments")
        ks = kstatus(self.tools["kstatus"], objects)
        flux = flux_health(self.tools["flux-health"], self.flux_kustomization, objects)
        assert {name: verdict["status"] for name, verdict in flux.items()} == {
            name: verdict["status"] for name, verdict in ks.items()}, (flux, ks)
        return ks, argocd_health(self.tools["argocd-health"], self.argocd_cm, objects)

    def trials(self) -> dict:
        return argocd_health(self.tools["argocd-health"], self.argocd_cm, read_all(self.api, self.namespace, "trials"))

    def note(self, label: str, name: str, ks: dict, argo: dict) -> None:
        print(f"issue-33 {label:<26} {name:<10} kstatus={ks['status']:<11} argocd={argo['status']:<11} "
              f"kstatus.message={ks.get('message', '')[:80]!r} argocd.message={argo['message'][:120]!r}")


def experiment_phase(api, namespace, name) -> str:
    return (get_experiment(api, namespace, name).get("status") or {}).get("phase", "")


def trial_phases(api, namespace, name) -> list[str]:
    return [(t.get("status") or {}).get("phase", "") for t in trials(api, namespace, name)]


def test_kstatus_and_argocd_health_in_every_phase(kube_cluster, kubectl, ray_local, experiments_api, namespace,
                                                  tmp_path, tools, argocd_cm, flux_kustomization):
    gate = tmp_path / "gate"
    held = experiment("held", entrypoint="kubetune.examples.sleepy:train",
                      objective={"metric": "step", "mode": "max"},
                      budget={"maxTrials": 3, "parallelism": 3},
                      # 4 GPUs on the test's Ray head: two trials run, the third waits (Queued)
                      trial={"resources": {"cpu": 0.1, "gpu": 2},
                             "config": {"iterations": 3, "interval": 0.01, "hold_after": 1, "gate": str(gate)}})
    broken = experiment("broken", entrypoint="kubetune.examples.misbehaving:reports_text",
                        budget={"maxTrials": 1, "parallelism": 1, "maxFailedTrials": 0})
    napping = experiment("napping", suspend=True, budget={"maxTrials": 2})
    for body in (held, broken, napping):
        create(experiments_api, namespace, body)
    readers = Readers(tools, argocd_cm, flux_kustomization, experiments_api, namespace)

    # Pending: applied from Git, no operator has seen them yet
    ks, argo = readers.experiments()
    for name in ("held", "broken", "napping"):
        readers.note("Pending (no operator yet)", name, ks[name], argo[name])
        assert ks[name]["status"] == "InProgress", ks[name]
    assert argo["held"]["status"] == argo["broken"]["status"] == "Progressing"
    assert argo["napping"]["status"] == "Suspended"

    operator = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, namespace).start()
    try:
        wait_for(lambda: sorted(trial_phases(experiments_api, namespace, "held")) == ["Queued", "Running", "Running"],
                 timeout=180, interval=0.5, message="two trials of held running, the third queued")
        wait_for(lambda: experiment_phase(experiments_api, namespace, "broken") == "Failed", timeout=120,
                 interval=0.5, message="broken Failed")
        wait_for(lambda: experiment_phase(experiments_api, namespace, "napping") == "Suspended", timeout=60,
                 interval=0.5, message="napping Suspended")
        ks, argo = readers.experiments()
        readers.note("Running, one trial Queued", "held", ks["held"], argo["held"])
        readers.note("Failed", "broken", ks["broken"], argo["broken"])
        readers.note("Suspended", "napping", ks["napping"], argo["napping"])
        assert ks["held"]["status"] == "InProgress"
        assert argo["held"]["status"] == "Progressing" and "queued" in argo["held"]["message"], argo["held"]
        assert ks["broken"]["status"] == "Failed"
        failed = get_experiment(experiments_api, namespace, "broken")
        assert argo["broken"] == {"status": "Degraded", "message": failed["status"]["message"]}
        assert failed["status"]["message"] and ks["broken"]["message"] == failed["status"]["message"]
        # not done, not failed: kstatus reads Ready=False (reason Suspended) as InProgress
        assert ks["napping"] == {"status": "InProgress", "message": "suspended: no new trials are launched"}
        assert argo["napping"]["status"] == "Suspended"

        trial_health = readers.trials()
        by_phase = {(t.get("status") or {}).get("phase"): t["metadata"]["name"]
                    for t in experiments_api.list_namespaced_custom_object(GROUP, VERSION, namespace, "trials")["items"]}
        for phase, health in (("Running", "Progressing"), ("Queued", "Progressing"), ("Failed", "Degraded")):
            readers.note(f"Trial {phase}", by_phase[phase], {"status": "-"}, trial_health[by_phase[phase]])
            assert trial_health[by_phase[phase]]["status"] == health
        failed_trial = experiments_api.get_namespaced_custom_object(GROUP, VERSION, namespace, "trials",
                                                                    by_phase["Failed"])["status"]
        assert trial_health[by_phase["Failed"]]["message"] == (
            f"Failed ({failed_trial['reason']}): {failed_trial['message']}"), trial_health[by_phase["Failed"]]

        # kubectl wait --for=condition=Ready: not while it runs, at once when it succeeds
        early = kubectl("wait", "--for=condition=Ready", "experiment/held", "-n", namespace, "--timeout=2s",
                        check=False)
        assert early.returncode != 0 and "timed out" in early.stderr, early
        gate.touch()
        done = kubectl("wait", "--for=condition=Ready", "experiment/held", "-n", namespace, "--timeout=180s",
                       timeout=200)
        assert "condition met" in done.stdout
        ks, argo = readers.experiments()
        readers.note("Succeeded", "held", ks["held"], argo["held"])
        assert ks["held"]["status"] == "Current" and argo["held"]["status"] == "Healthy"
        assert get_experiment(experiments_api, namespace, "held")["status"]["phase"] == "Succeeded"
        trial_health = readers.trials()
        for name in ("held-0", "held-1", "held-2"):
            assert trial_health[name]["status"] == "Healthy", trial_health[name]
        readers.note("Trial Succeeded", "held-0", {"status": "-"}, trial_health["held-0"])
    finally:
        operator.stop_and_report()


def manifest(name: str, **spec) -> str:
    """An Experiment as it sits in Git: labels and annotations of its own."""
    body = experiment(name, budget={"maxTrials": 2, "parallelism": 2}, trial={"config": {"iterations": 3}}, **spec)
    body["metadata"].update(labels={"team": "search", "app.kubernetes.io/part-of": "tuning"},
                            annotations={"example.com/owner": "ml-platform"})
    return json.dumps(body)   # JSON: kubectl would read an unquoted y: as YAML 1.1 true


def apply(kubectl, namespace: str, text: str) -> None:
    """`kubectl apply --server-side` as Argo CD's manager, without --force-conflicts: a
    field another manager took would fail it."""
    kubectl("apply", "--server-side", f"--field-manager={ARGOCD}", "-n", namespace, "-f", "-", input=text)


def assert_in_sync(kubectl, namespace: str, text: str) -> None:
    diff = kubectl("diff", "--server-side", f"--field-manager={ARGOCD}", "-n", namespace, "-f", "-",
                   input=text, check=False)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout + diff.stderr


def fields_of_others(body: dict) -> list[str]:
    """Every spec, label and annotation field a manager other than Argo CD's owns,
    as managedFields say, on the main resource (status is a subresource of its own)."""
    owned = []
    for entry in body["metadata"].get("managedFields") or []:
        if entry["manager"] == ARGOCD or entry.get("subresource"):
            continue
        fields = entry.get("fieldsV1") or {}
        metadata = fields.get("f:metadata") or {}
        if "f:spec" in fields:
            owned.append(f"{entry['manager']}: spec")
        owned += [f"{entry['manager']}: {key}" for part in ("f:labels", "f:annotations")
                  for key in metadata.get(part) or {}]
    return owned


def test_argocd_server_side_apply_never_conflicts_nor_drifts(operator, kubectl, experiments_api, namespace):
    text = manifest("synced")
    apply(kubectl, namespace, text)
    wait_for(lambda: experiment_phase(experiments_api, namespace, "synced") == "Running", timeout=120, interval=0.5,
             message="synced Running")
    apply(kubectl, namespace, text)          # a sync while it runs
    assert_in_sync(kubectl, namespace, text)
    wait_for(lambda: condition_met(get_experiment(experiments_api, namespace, "synced"), "Ready"), timeout=180,
             interval=0.5, message="synced Ready")
    apply(kubectl, namespace, text)          # and after the run
    assert_in_sync(kubectl, namespace, text)
    live = get_experiment(experiments_api, namespace, "synced")
    # the operator's own marks (kopf's finalizer, its digest annotations) are fields Git
    # never names; nothing of what Git names has another owner
    others = fields_of_others(live)
    assert not [field for field in others if field.split(": ")[1] in (
        "spec", "f:team", "f:app.kubernetes.io/part-of", "f:example.com/owner")], others
    assert live["metadata"]["labels"] == {"team": "search", "app.kubernetes.io/part-of": "tuning"}
    assert live["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
    assert live["metadata"]["generation"] == 1 and live["status"]["observedGeneration"] == 1


def test_edits_from_git_mid_run_are_applied_or_refused_and_never_wedge_it(
        operator, kubectl, experiments_api, namespace, tmp_path, tools, argocd_cm, flux_kustomization):
    """Each edit goes in as Argo CD syncs it (server-side apply of the whole manifest)."""
    gate = tmp_path / "gate"
    body = experiment("edited", entrypoint="kubetune.examples.sleepy:train",
                      objective={"metric": "step", "mode": "max"}, budget={"maxTrials": 4, "parallelism": 1},
                      trial={"config": {"iterations": 3, "interval": 0.01, "hold_after": 1, "gate": str(gate)}})
    readers = Readers(tools, argocd_cm, flux_kustomization, experiments_api, namespace)

    def sync(**changes) -> None:
        for path, value in changes.items():
            *parents, leaf = path.split("__")
            node = body["spec"]
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        apply(kubectl, namespace, json.dumps(body))

    def observed(check, message: str) -> dict:
        """The Experiment once the operator took the last edit and ``check`` holds."""
        def ready():
            live = get_experiment(experiments_api, namespace, "edited")
            status = live.get("status") or {}
            return live if status.get("observedGeneration") == live["metadata"]["generation"] and check(live) else None
        return wait_for(ready, timeout=120, interval=0.5, message=message)

    def rejected(live) -> dict | None:
        found = condition(live, "SpecRejected")
        return found if found and found["status"] == "True" else None

    def running(count: int):
        return lambda live: trial_phases(experiments_api, namespace, "edited").count("Running") == count

    sync()
    observed(running(1), "one trial running")
    sync(budget__parallelism=2)
    assert not rejected(observed(running(2), "parallelism 2 applied"))
    sync(budget__maxTrials=6)
    assert not rejected(observed(lambda live: live["status"]["progress"].endswith("/6"), "maxTrials raised to 6"))

    # refused: maxTrials below the trials that exist; the run goes on with 6
    sync(budget__maxTrials=1)
    live = observed(rejected, "the maxTrials cut refused")
    assert "spec.budget.maxTrials" in rejected(live)["message"] and live["status"]["progress"].endswith("/6")
    assert condition_met(live, "Reconciling") and live["status"]["phase"] == "Running"
    ks, argo = readers.experiments()
    readers.note("Running, edit refused", "edited", ks["edited"], argo["edited"])
    assert ks["edited"]["status"] == "InProgress" and argo["edited"]["status"] == "Progressing"
    assert "spec change refused: spec.budget.maxTrials" in argo["edited"]["message"]
    sync(budget__maxTrials=6)
    observed(lambda live: not rejected(live), "the refusal withdrawn once Git is reverted")

    # refused: what the study was built on (search space, objective)
    sync(searchSpace={"x": {"uniform": [0, 1]}}, objective__metric="pid")
    message = rejected(observed(rejected, "searchSpace and objective edits refused"))["message"]
    assert "spec.searchSpace" in message and "spec.objective.metric" in message, message
    assert trial_phases(experiments_api, namespace, "edited").count("Running") == 2   # the run went on
    sync(searchSpace=experiment("x")["spec"]["searchSpace"], objective__metric="step")
    observed(lambda live: not rejected(live), "reverted")

    # a budget cut to the trials created or more is applied
    sync(budget__maxTrials=3)
    assert not rejected(observed(lambda live: live["status"]["progress"].endswith("/3"), "maxTrials cut to 3"))

    # suspend and resume (a paused trial resumes from its checkpoint, past the gate)
    sync(suspend=True)
    observed(lambda live: live["status"]["phase"] == "Suspended"
             and trial_phases(experiments_api, namespace, "edited") == ["Paused", "Paused"], "suspended, trials paused")
    ks, argo = readers.experiments()
    readers.note("Suspended mid-run", "edited", ks["edited"], argo["edited"])
    assert (ks["edited"]["status"], argo["edited"]["status"]) == ("InProgress", "Suspended")
    sync(suspend=False)
    observed(lambda live: live["status"]["phase"] == "Running"
             and "Paused" not in trial_phases(experiments_api, namespace, "edited"), "resumed")

    # the run ends at the cut budget
    gate.touch()
    done = observed(lambda live: condition_met(live, "Ready"), "Succeeded after the edits")
    assert done["status"]["trialCounts"]["created"] == 3 and done["status"]["progress"] == "3/3"
    assert not rejected(done)
    assert_in_sync(kubectl, namespace, json.dumps(body))
