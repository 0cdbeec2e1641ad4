"""spec.trial.timeout on the real control plane: a run that lasts longer is stopped, its
Trial ends Failed with reason TimedOut (not retried, though maxFailures would allow it),
and what it held is given back: the Ray worker hosts nothing, the trial pod is deleted."""
from __future__ import annotations

import pytest

from k8s_helpers import condition, create, experiment, trials, wait_condition
from kube_fixtures import wait_for
from test_pods import Container, core, custom, pod_experiment, pods_of  # noqa: F401 - core, custom: fixtures

pytestmark = pytest.mark.integration


def _timed_out(trial: dict) -> None:
    status = trial["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "TimedOut"), status
    assert "longer than spec.trial.timeout 3s; not retried" in status["message"]
    assert status.get("attempt", 0) == 0                      # maxFailures: 2, yet no retry
    assert status["failures"][-1]["reason"] == "TimedOut"


def test_a_ray_trial_longer_than_its_timeout_is_stopped_and_failed(operator, experiments_api, namespace, ray_local):
    import ray

    body = experiment("slow", entrypoint="kubetune.examples.sleepy:train", budget={"maxTrials": 1},
                      trial={"timeout": "3s", "maxFailures": 2, "config": {"iterations": 100000, "interval": 0.05}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "slow", "Failed", timeout=90, operator=operator)
    (trial,) = trials(experiments_api, namespace, "slow")
    _timed_out(trial)
    assert done["status"]["trialCounts"]["failed"] == 1
    if not ray.is_initialized():
        ray.init(address=ray_local, namespace="kubetune", log_to_driver=False)
    prefix = f"kubetune/{namespace}/slow/"
    from kubetune.executors.ray.answers import call, read, ready
    hosts = [(ray.get_actor(a["name"], namespace=a["namespace"]), a["namespace"])
             for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]

    def hosted(handle, ray_namespace):
        pending = call(handle.describe, ray_namespace)
        assert ready([pending], 10)
        return read(pending)["trial_key"]
    # the run is over: no actor of the experiment still runs (or holds) the trial
    assert all(hosted(*host) is None for host in hosts)


def test_a_pod_trial_longer_than_its_timeout_is_stopped_and_failed(pod_operator, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, pod_experiment("slowpod", budget={"maxTrials": 1}, trial={"timeout": "3s", "maxFailures": 2}))
    pod = wait_for(lambda: next((p for p in pods_of(core, ns, "slowpod") if p.status.phase == "Running"), None),
                   timeout=60, interval=0.2, message="the trial's pod")
    Container(core, pod, tmp_path).session.report({"loss": 0.8})
    failed = wait_condition(custom, ns, "slowpod", "Failed", timeout=60, operator=pod_operator)
    assert condition(failed, "Failed") is not None
    (trial,) = trials(custom, ns, "slowpod")
    _timed_out(trial)
    wait_for(lambda: not pods_of(core, ns, "slowpod"), timeout=30, interval=0.2, message="the pod to be deleted")
