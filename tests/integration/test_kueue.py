"""Pod trials admitted by a real Kueue (built from its Go module, its webhooks on):
examples/kueue as a user applies it, two teams sharing one ClusterQueue of 2 CPUs.

The test plays each trial's container as tests/integration/test_pods.py does: it reads
what the pod would see, posts results with kubetune's trial-side session and ends the
pod through kwok.  Kueue gates each trial pod until it admits its Workload; the
kube-scheduler then binds it and kwok makes it Running."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from k8s_helpers import GROUP, VERSION, create, experiment_gone, wait_condition
from kube_fixtures import Kubectl, temporary_namespace, wait_for
from kubetune.executors.pods.kueue import ADMISSION_GATE
from kubetune.devcluster.build import kubectl as kubectl_binary
from kubetune.devcluster.processes import free_port
from kubetune.k8s.kueue import KueueApi
from kubetune.trainable.api import TrialStopped
from operator_fixtures import OperatorProcess
from soak import size, soak
from test_pods import Container

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kueue"


def example(name: str, **budget) -> dict:
    body = copy.deepcopy(yaml.safe_load((EXAMPLES / name).read_text()))
    body["spec"]["budget"].update(budget)
    return body


@pytest.fixture(scope="module")
def teams(kueue_cluster):
    with temporary_namespace(kueue_cluster, "team-a-") as team_a, temporary_namespace(kueue_cluster, "team-b-") as team_b:
        yield team_a, team_b


@pytest.fixture(scope="module")
def queues(kueue_cluster, teams):
    """examples/kueue applied as the README says, with the project's own kubectl."""
    kubectl = Kubectl(kubectl_binary(log=lambda message: None), kueue_cluster.kubeconfig)
    kubectl("apply", "-f", str(EXAMPLES / "queues.yaml"))
    for team in teams:
        kubectl("apply", "-n", team, "-f", str(EXAMPLES / "local-queue.yaml"))
    return kubectl


@pytest.fixture(scope="module")
def kueue_operator(kueue_cluster, teams, queues, tmp_path_factory):
    process = OperatorProcess(kueue_cluster.kubeconfig, "local", tmp_path_factory.mktemp("kueue-operator"), teams[0],
                              extra_args=("--namespace", teams[1], "--pod-executor",
                                          # the WorkloadPriorityClasses the examples name (default: none allowed)
                                          "--pod-priority-classes", "tuning-low,tuning-high",
                                          "--ingest-port", str(free_port()))).start()
    yield process
    process.stop_and_report()


@pytest.fixture(scope="module")
def api(kueue_cluster):
    with kueue_cluster.api_client() as api_client:
        yield client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)


def pods(core, namespace: str, experiment: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"kubetune.dev/experiment={experiment}").items


def gated(pod) -> bool:
    return any(gate.name == ADMISSION_GATE for gate in pod.spec.scheduling_gates or [])


def running(core, namespace: str, experiment: str, count: int) -> list:
    found = [p for p in pods(core, namespace, experiment)
             if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
    return found if len(found) == count else []


def trial(custom, namespace: str, name: str) -> dict:
    """The Trial, or {} while it does not exist yet."""
    try:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "trials", name)
    except client.exceptions.ApiException as error:
        if error.status == 404:
            return {}
        raise


def test_a_higher_priority_team_preempts_and_the_preempted_trial_resumes_from_its_checkpoint(
        kueue_operator, api, teams, tmp_path):
    core, custom = api
    team_a, team_b = teams
    create(custom, team_a, example("team-a.yaml", maxTrials=2))
    first = wait_for(lambda: running(core, team_a, "team-a-sweep", 2), timeout=90, interval=0.2,
                     message="both of team A's trials admitted (2 CPUs of quota) and Running")
    played = {}
    for pod in first:
        container = Container(core, pod, tmp_path)
        saved = tmp_path / f"{container.trial}-step1"
        saved.mkdir()
        (saved / "model.txt").write_text(f"{container.trial} at step 1")
        container.session.report({"loss": 0.9}, checkpoint=str(saved))
        played[container.trial] = container
    wait_for(lambda: ((custom.get_namespaced_custom_object(GROUP, VERSION, team_a, "experiments", "team-a-sweep")
                       .get("status") or {}).get("kueue") or {}).get("admissions") == 2,
             timeout=30, interval=0.2, message="the operator counting both admissions")

    create(custom, team_b, example("team-b.yaml"))
    urgent = wait_for(lambda: running(core, team_b, "team-b-urgent", 1), timeout=90, interval=0.2,
                      message="team B's high-priority trial admitted by preempting one of team A's")
    preempted = wait_for(lambda: next((name for name in played if trial(custom, team_a, name).get("status", {}).get(
        "evictions") == 1), None), timeout=30, interval=0.2, message="a team A trial recorded as evicted")
    status = trial(custom, team_a, preempted)["status"]
    assert status["phase"] in ("Pending", "Queued") and status["reason"] == "Preempted", status
    assert "resumes from" in status["message"]
    assert status.get("failureCount", 0) == 0     # a pause, not a failure against maxFailures
    survivor = next(name for name in played if name != preempted)
    assert trial(custom, team_a, survivor)["status"]["phase"] == "Running"

    b = Container(core, urgent[0], tmp_path)
    b.session.report({"loss": 0.5})
    b.exit(0)
    wait_condition(custom, team_b, "team-b-urgent", "Succeeded", timeout=60, operator=kueue_operator)

    resumed = wait_for(lambda: next((p for p in running(core, team_a, "team-a-sweep", 2)
                                     if p.metadata.name == f"{preempted}-a1"), None),
                       timeout=90, interval=0.2, message="the preempted trial admitted again as attempt 1")
    again = Container(core, resumed, tmp_path)
    assert again.env["KUBETUNE_START_ITERATION"] == "1" and again.env["KUBETUNE_FIRST_SEQ"] == "1"
    assert (Path(again.session.get_checkpoint()) / "model.txt").read_text() == f"{preempted} at step 1"
    again.session.report({"loss": 0.4})
    again.exit(0)
    played[survivor].session.report({"loss": 0.7})
    played[survivor].exit(0)
    done = wait_condition(custom, team_a, "team-a-sweep", "Succeeded", timeout=60, operator=kueue_operator)

    history = trial(custom, team_a, preempted)["status"]["history"]
    assert [(h["iteration"], h["loss"]) for h in history] == [(1, 0.9), (2, 0.4)]   # no result lost
    summary = done["status"]["kueue"]
    assert summary["evictions"] == 1 and summary["admissions"] == 3, summary
    assert summary["queueWaitSeconds"]["max"] > 0


class Players:
    """Plays every admitted pod of some Experiments as its container would: one result,
    then exit 0; and keeps, per Experiment, what a sample of pods and Workloads showed."""

    def __init__(self, core, custom, tmp_path: Path, experiments: dict[str, str]) -> None:
        self.core, self.custom, self.tmp_path = core, custom, tmp_path
        self.experiments = experiments                 # name -> namespace
        self.admitted: list[str] = []                   # experiment of each admission, in order
        self.ended: set[str] = set()                    # pods played to their end
        self.most_running = dict.fromkeys(experiments, 0)
        self.most_in_flight = dict.fromkeys(experiments, 0)
        self.most_waiting = dict.fromkeys(experiments, 0)   # gated pods, or Workloads pending
        self.samples = 0
        self._seen: set[str] = set()

    def pending_workloads(self, namespace: str, experiment: str) -> int:
        """Workloads of the Experiment's pods that Kueue has neither admitted nor finished."""
        def holds(w, kind):
            return any(c["type"] == kind and c["status"] == "True" for c in (w.get("status") or {}).get("conditions") or [])
        return sum(1 for w in KueueApi(self.custom.api_client).list_workloads(namespace)
                   if any(ref.get("name", "").startswith(f"{experiment}-") for ref in w["metadata"].get("ownerReferences") or [])
                   and not holds(w, "Admitted") and not holds(w, "Finished"))

    def sample(self, play: bool = True) -> None:
        self.samples += 1
        for experiment, namespace in self.experiments.items():
            live = [p for p in pods(self.core, namespace, experiment) if p.metadata.deletion_timestamp is None
                    and p.status.phase not in ("Succeeded", "Failed")]
            waiting = sum(1 for p in live if gated(p))
            admitted = [p for p in live if not gated(p)]
            self.most_waiting[experiment] = max(self.most_waiting[experiment], waiting,
                                                self.pending_workloads(namespace, experiment))
            self.most_running[experiment] = max(self.most_running[experiment], len(admitted))
            self.most_in_flight[experiment] = max(self.most_in_flight[experiment], len(live))
            for pod in admitted:
                if pod.metadata.name not in self._seen:
                    self._seen.add(pod.metadata.name)
                    self.admitted.append(experiment)
                if play and pod.status.phase == "Running" and pod.metadata.name not in self.ended:
                    self._play(pod)

    def _play(self, pod) -> None:
        try:
            container = Container(self.core, pod, self.tmp_path)
            container.session.report({"loss": 0.5})
            container.exit(0)
        except TrialStopped:      # admitted beyond parallelism and given back: its pod goes
            return
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise
            return
        self.ended.add(pod.metadata.name)

    def phase(self, experiment: str) -> str | None:
        found = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.experiments[experiment], "experiments",
                                                         experiment)
        return (found.get("status") or {}).get("phase")


@soak
def test_a_200_trial_experiment_never_has_more_than_its_admission_window_pending(kueue_operator, api, teams, tmp_path):
    """parallelism 4 over the ClusterQueue's 2 CPUs: Kueue refuses the third trial, and
    from then on at most admissionWindow (3) pods and Workloads wait for admission, at
    every sample, while trials are admitted two at a time and finish.  The test plays
    the first 60 of the 200 trials (25 in ``make test``: soak.py) and then deletes the
    Experiment: at load 20 the
    operator, Kueue and kwok turn over about 0.5 trials a second (all 200 took 6 min),
    and the window's bound is the same at trial 60 as at trial 200."""
    core, custom = api
    team_a = teams[0]
    window, played = 3, size(quick=25, full=60)
    create(custom, team_a, {**example("team-a.yaml", maxTrials=200, parallelism=4, admissionWindow=window),
                            "metadata": {"name": "many"}})
    players = Players(core, custom, tmp_path, {"many": team_a})

    def advance():
        # the first trials run until the window has filled behind them
        players.sample(play=players.most_waiting["many"] >= window)
        return len(players.ended) >= played

    try:
        wait_for(advance, timeout=240, interval=0.1, message=f"{played} trials admitted in turn and finished")
        assert players.most_waiting["many"] == window, \
            f"at most {window} waiting for admission at every sample ({players.samples}), and the window used"
        assert players.most_running["many"] <= 2        # the ClusterQueue's 2 CPUs
        status = wait_for(lambda: (lambda s: s if s.get("kueue", {}).get("admissions", 0) >= played else None)(
            custom.get_namespaced_custom_object(GROUP, VERSION, team_a, "experiments", "many").get("status") or {}),
            timeout=60, interval=0.2, message="the operator counting the admissions of the trials played")
        assert status["kueue"]["waitingForAdmission"] <= window
        assert status["trialCounts"]["failed"] == 0 and status["kueue"]["evictions"] == 0, status
    finally:    # the ClusterQueue free for the next test
        custom.delete_namespaced_custom_object(GROUP, VERSION, team_a, "experiments", "many")
        wait_for(lambda: experiment_gone(custom, team_a, "many") and not [
            p for p in pods(core, team_a, "many") if p.status.phase not in ("Succeeded", "Failed")
            and p.metadata.deletion_timestamp is None], timeout=90, interval=0.2,
            message="the Experiment deleted and its pods gone")


def test_two_teams_saturating_one_cluster_queue_share_it_fairly(kueue_operator, api, teams, tmp_path):
    """Kueue's Admission Fair Sharing (examples/kueue/queues.yaml, the manager's
    admissionFairSharing): team A keeps eight trials waiting, team B two, both at the same
    priority.  By age alone (BestEffortFIFO) a team's share is about its share of the
    waiting Workloads: without admissionScope B got 8 of the first 30 admissions (27%)
    and this test failed; by usage each team gets about half.  And a trial waiting for
    admission holds no parallelism slot: A's pods in flight go past its parallelism (2)
    while at most 2 run."""
    core, custom = api
    team_a, team_b = teams
    for team in teams:      # LocalQueues of their own: no usage from the other tests
        custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", team, "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "fair"},
            "spec": {"clusterQueue": "tuning"}})
    for team, name, window in ((team_a, "fair-a", 8), (team_b, "fair-b", 2)):
        body = example("team-a.yaml", maxTrials=60, parallelism=2, admissionWindow=window)
        body["metadata"]["name"], body["spec"]["queue"] = name, "fair"
        create(custom, team, body)
    players = Players(core, custom, tmp_path, {"fair-a": team_a, "fair-b": team_b})
    admissions = 30

    def advance():
        players.sample()
        return len(players.admitted) >= admissions

    try:
        wait_for(advance, timeout=240, interval=0.1, message=f"{admissions} admissions between the two teams")
        first = players.admitted[:admissions]
        shares = {team: first.count(team) / admissions for team in ("fair-a", "fair-b")}
        assert min(shares.values()) >= 0.4, f"one team starved the other: {shares}, in order {first}"
        assert max(players.most_running.values()) <= 2, players.most_running      # parallelism: admitted ones
        assert players.most_in_flight["fair-a"] > 2, players.most_in_flight       # waiting ones hold no slot
        assert players.most_waiting["fair-a"] <= 8 and players.most_waiting["fair-b"] <= 2, players.most_waiting
    finally:    # the ClusterQueue free for the next test
        for name, team in (("fair-a", team_a), ("fair-b", team_b)):
            custom.patch_namespaced_custom_object(GROUP, VERSION, team, "experiments", name, {"spec": {"suspend": True}})
        wait_for(lambda: not any(pods_live for pods_live in (
            [p for p in pods(core, team, name) if p.status.phase not in ("Succeeded", "Failed")
             and p.metadata.deletion_timestamp is None]
            for name, team in (("fair-a", team_a), ("fair-b", team_b)))), timeout=60, interval=0.2,
            message="both suspended: their pods gone")


def test_a_trial_is_provisioning_while_an_admission_check_is_pending(kueue_operator, api, teams, tmp_path):
    """The test plays an admission-check controller (as a ProvisioningRequest controller
    would wait for the cluster autoscaler): Kueue reserves quota, the check stays Pending
    and the trial says Provisioning; the check turns Ready and Kueue admits the pod."""
    core, custom = api
    team_b = teams[1]
    check = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": "capacity"},
             "spec": {"controllerName": "kubetune.dev/test-capacity"}}
    custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", check)
    now = "2026-01-01T00:00:00Z"
    custom.patch_cluster_custom_object_status("kueue.x-k8s.io", "v1beta2", "admissionchecks", "capacity", {
        "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active", "message": "the test",
                                   "lastTransitionTime": now}]}})
    custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "checked"},
        "spec": {"namespaceSelector": {}, "admissionChecksStrategy": {"admissionChecks": [{"name": "capacity"}]},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                     "name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": 2},
                                                             {"name": "memory", "nominalQuota": "8Gi"}]}]}]}})
    custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", team_b, "localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "checked"},
        "spec": {"clusterQueue": "checked"}})
    body = example("team-b.yaml")
    body["metadata"]["name"], body["spec"]["queue"] = "provisioned", "checked"
    create(custom, team_b, body)

    # Kueue reserves the quota first and lists the Workload's admission checks a moment
    # later (at load 30 one poll saw the reservation without them): wait for the check's name
    status = wait_for(lambda: (lambda s: s if s.get("reason") == "Provisioning" and "capacity" in s.get("message", "")
                               else None)((trial(custom, team_b, "provisioned-0").get("status") or {})),
                      timeout=60, interval=0.2, message="the trial Provisioning, naming the pending admission check")
    assert status["phase"] == "Queued", status
    [pod] = pods(core, team_b, "provisioned")
    assert gated(pod)

    workloads = KueueApi(custom.api_client).list_workloads(team_b)
    [workload] = [w for w in workloads if any(r.get("uid") == pod.metadata.uid
                                              for r in w["metadata"].get("ownerReferences") or [])]
    custom.patch_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta2", team_b, "workloads",
                                                 workload["metadata"]["name"], {"status": {"admissionChecks": [{
                                                     "name": "capacity", "state": "Ready", "message": "nodes are up",
                                                     "lastTransitionTime": now}]}})
    [admitted] = wait_for(lambda: running(core, team_b, "provisioned", 1), timeout=60, interval=0.2,
                          message="the pod admitted once the check is Ready")
    container = Container(core, admitted, tmp_path)
    container.session.report({"loss": 0.3})
    container.exit(0)
    done = wait_condition(custom, team_b, "provisioned", "Succeeded", timeout=60, operator=kueue_operator)
    assert done["status"]["kueue"]["admissions"] == 1
