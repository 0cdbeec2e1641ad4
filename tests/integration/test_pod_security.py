"""Pod trials on a shared cluster, against the real operator process and control
plane: templates asking for more than the restricted profile are refused, naming
the field, unless the namespace opted in; and the result ingest endpoint under
abuse: nothing listens when the pod executor is off; half-sent requests are closed
within the header timeout; a flood of bogus POSTs does not hold another Experiment's
results back (they cost no API call and no thread)."""
from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest

from ingest_flood import Flood
from k8s_helpers import condition, create, trials, wait_condition
from kube_fixtures import temporary_namespace, wait_for
from kubetune.devcluster.processes import free_port
from kubetune.executors.pods.ingest_http import HEADER_TIMEOUT_S
from operator_fixtures import OperatorProcess
from test_pbt_checkpoints import history_length, pbt_experiment, running_pods, save
from test_pods import Container, core, custom, pod_experiment, pods_of  # noqa: F401 (core, custom: fixtures)

pytestmark = pytest.mark.integration


def running_container(core, custom, ns: str, name: str, tmp_path) -> Container:
    create(custom, ns, pod_experiment(name, budget={"maxTrials": 1}, trial={"resources": {"cpu": 0.1}}))
    pod = wait_for(lambda: next((p for p in pods_of(core, ns, name) if p.status.phase == "Running"), None),
                   timeout=60, interval=0.2, message=f"the pod of {name}")
    return Container(core, pod, tmp_path)


def escaping(name: str, **escape) -> dict:
    body = pod_experiment(name, budget={"maxTrials": 1}, trial={"resources": {"cpu": 0.1}})
    template = body["spec"]["trial"]["template"]["spec"]
    if "privileged" in escape:
        template["containers"][0]["securityContext"] = {"privileged": True}
    if "hostPath" in escape:
        template["volumes"] = [{"name": "node", "hostPath": {"path": "/var/run"}}]
    return body


def test_a_privileged_or_host_path_template_is_refused_naming_the_field(pod_operator, core, custom, pod_namespace):
    ns = pod_namespace
    for body, field in ((escaping("privileged", privileged=True),
                         "spec.trial.template.spec.containers[0].securityContext.privileged"),
                        (escaping("hostpath", hostPath=True), "spec.trial.template.spec.volumes[0].hostPath")):
        name = body["metadata"]["name"]
        create(custom, ns, body)
        failed = condition(wait_condition(custom, ns, name, "Failed", timeout=60, operator=pod_operator), "Failed")
        assert failed["reason"] == "PodSecurityViolation", failed
        assert failed["message"].startswith(field + ":") and "pod-security.kubetune.dev/allow-" in failed["message"]
        assert not pods_of(core, ns, name) and not trials(custom, ns, name)


def test_a_namespace_opts_in_by_label_and_pods_get_restricted_defaults(pod_operator, core, custom, pod_namespace,
                                                                       tmp_path):
    ns = pod_namespace
    label = "pod-security.kubetune.dev/allow-hostPath"
    core.patch_namespace(ns, {"metadata": {"labels": {label: "true"}}})
    try:
        create(custom, ns, escaping("optedin", hostPath=True))
        pod = wait_for(lambda: next(iter(pods_of(core, ns, "optedin")), None), timeout=60, interval=0.2,
                       message="the opted-in trial's pod")
    finally:
        core.patch_namespace(ns, {"metadata": {"labels": {label: None}}})
    assert [v.host_path.path for v in pod.spec.volumes if v.host_path] == ["/var/run"]
    # what the template left unset is the restricted profile's
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    [container] = pod.spec.containers
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    # the label is gone: the next escape is refused again
    create(custom, ns, escaping("optedout", hostPath=True))
    assert condition(wait_condition(custom, ns, "optedout", "Failed", timeout=60), "Failed")["reason"] \
        == "PodSecurityViolation"


def test_a_reported_checkpoint_outside_the_experiments_storage_is_refused(pod_operator, core, custom,
                                                                        pod_namespace, tmp_path):
    """The donor of a PBT exploit reports the operator's own secrets as its checkpoint:
    the operator copies nothing, the recipient starts afresh, its Trial has a Warning."""
    ns = pod_namespace
    create(custom, ns, pbt_experiment("confined"))
    donor, recipient = sorted((Container(core, p, tmp_path) for p in running_pods(core, ns, "confined", 2)),
                              key=lambda c: c.trial)
    secrets = save(tmp_path / "operator-serviceaccount", "the operator's token")
    assert donor.post({"seq": 0, "iteration": 1, "metrics": {"loss": 0.1}, "checkpoint": secrets, "attempt": 0},
                      donor.token) == (200, {"accepted": True})
    wait_for(lambda: history_length(custom, ns, donor.trial) == 1, timeout=30, interval=0.2,
             message="the donor's result recorded")
    recipient.session.report({"loss": 0.9}, checkpoint=save(tmp_path / "recipient-1", "recipient at 1"))
    relaunched = wait_for(lambda: next((p for p in pods_of(core, ns, "confined")
                                        if p.metadata.name == f"{recipient.trial}-a1"), None),
                          timeout=60, interval=0.2, message="the exploiting trial's new pod")
    warning = wait_for(lambda: next(iter(core.list_namespaced_event(
        ns, field_selector=f"involvedObject.kind=Trial,involvedObject.name={recipient.trial},"
                           "reason=CheckpointRefused").items), None),
        timeout=30, interval=0.2, message="the CheckpointRefused Event on the recipient's Trial")
    assert warning.type == "Warning" and secrets in warning.message and "outside" in warning.message
    assert "KUBETUNE_CHECKPOINT" not in {e.name for e in relaunched.spec.containers[0].env}
    storage = pod_operator.workdir / "checkpoints" / ns / "confined" / recipient.trial
    assert not any(entry.name.startswith("exploit-") for entry in storage.glob("*"))


def ingest_port(container: Container) -> int:
    return int(container.env["KUBETUNE_INGEST_URL"].rsplit(":", 1)[1])


def test_with_the_pod_executor_off_nothing_listens_and_pod_experiments_are_refused(gpu_cluster, custom, tmp_path):
    port = free_port()
    with temporary_namespace(gpu_cluster, "kt-podsoff-") as ns:
        process = OperatorProcess(gpu_cluster.kubeconfig, "local", tmp_path, ns,
                                  extra_args=("--ingest-port", str(port))).start()
        try:
            create(custom, ns, pod_experiment("off", budget={"maxTrials": 1}))
            failed = wait_condition(custom, ns, "off", "Failed", timeout=60, operator=process)
            assert condition(failed, "Failed")["reason"] == "PodExecutorUnavailable"
            assert "--pod-executor" in condition(failed, "Failed")["message"]
            with pytest.raises(ConnectionRefusedError):      # the operator is up, its ingest port is not
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
        finally:
            process.stop_and_report()


def test_half_sent_requests_are_closed_within_the_header_timeout(pod_operator, core, custom, pod_namespace,
                                                                 tmp_path):
    container = running_container(core, custom, pod_namespace, "slowloris", tmp_path)
    port = ingest_port(container)

    async def hold(count: int) -> list[float]:
        async def one() -> float:
            # from an address of its own, as another pod's would be: beyond its per-client
            # share its connections are reset at once, the rest are closed at the header timeout
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            started = time.monotonic()
            try:
                writer.write(f"POST /v1/results/{pod_namespace}/{container.trial} HTTP/1.1\r\nHost: x\r\n"
                             .encode())
                await writer.drain()
                await asyncio.wait_for(reader.read(), HEADER_TIMEOUT_S + 20)    # b"" or a 408: closed by the server
            except ConnectionResetError:
                pass
            writer.close()
            return time.monotonic() - started
        return await asyncio.gather(*(one() for _ in range(count)))

    held = asyncio.run(hold(200))
    print(f"200 half-sent requests closed after {min(held):.2f}..{max(held):.2f}s "
          f"(header timeout {HEADER_TIMEOUT_S}s)")
    assert max(held) < HEADER_TIMEOUT_S + 3
    container.session.report({"loss": 0.5})       # the endpoint still serves the real pod
    wait_for(lambda: (trials(custom, pod_namespace, "slowloris")[0].get("status") or {}).get("history"),
             timeout=30, interval=0.2, message="the real result recorded")


# A real pod's POST waits its turn among the flood's requests in flight (one asyncio server,
# a task per connection): a fair server answers it while the flood's in-flight requests are
# answered about once each. Ten rounds of them is the real pod queued behind the flood.
FLOOD_CONCURRENCY = 100
FAIR_TURN = 10 * FLOOD_CONCURRENCY


def operator_threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


# what checking a token by the API would cost: a read of the Trial or its token Secret (404
# for the flood's made-up trials: nothing else reads objects that do not exist), or a review
LOOKUP = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')


def token_lookups(core) -> dict[str, float]:
    """The API server's count so far of the requests a token check through the API makes."""
    client = core.api_client
    response = client.call_api(*client.param_serialize("GET", "/metrics", auth_settings=["BearerToken"]))
    response.read()
    counts: dict[str, float] = {}
    for line in response.data.decode().splitlines():
        match = LOOKUP.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        resource, verb, code = labels.get("resource"), labels.get("verb"), labels.get("code")
        if (verb == "GET" and code == "404" and resource in ("trials", "secrets")) \
                or (verb == "POST" and resource in ("tokenreviews", "subjectaccessreviews")):
            key = f"{verb} {resource} {code}"
            counts[key] = counts.get(key, 0.0) + float(match.group(2))
    return counts


def result_on_trial(custom, ns: str, experiment: str, trial: str) -> bool:
    return any(t["metadata"]["name"] == trial and (t.get("status") or {}).get("history")
               for t in trials(custom, ns, experiment))


def test_a_flood_of_bogus_posts_does_not_hold_back_another_experiments_results(pod_operator, core, custom,
                                                                               pod_namespace, tmp_path):
    """Counted in events, not seconds: each of another Experiment's results is reported and
    recorded on its Trial while the flood keeps being answered; its POST is answered within
    a fair turn among the flood's (FAIR_TURN); the flood costs the operator no thread and no
    API call per request."""
    ns = pod_namespace
    create(custom, ns, pod_experiment("measured", budget={"maxTrials": 6, "parallelism": 6},
                                      trial={"resources": {"cpu": 0.1}}))
    pods = wait_for(lambda: (lambda ps: ps if len(ps) == 6 else None)(
        [p for p in pods_of(core, ns, "measured") if p.status.phase == "Running"]),
        timeout=60, interval=0.2, message="six running pods")
    containers = [Container(core, pod, tmp_path) for pod in pods]
    victim = running_container(core, custom, ns, "victim", tmp_path)
    operator = pod_operator.process.pid
    threads_before, lookups_before = operator_threads(operator), token_lookups(core)
    turns, during, threads = [], [], []
    with Flood(ingest_port(victim), ns, victim.trial, tmp_path, concurrency=FLOOD_CONCURRENCY) as flood:
        # under way before the first real result, or that result's path may see none of it
        # (the whole suite once saw [0, 120, 1720, ...]: the flood still starting)
        wait_for(lambda: flood.sent > 0, timeout=60, interval=0.05, message="the flood answered at all")
        for container in containers:
            before = flood.sent
            container.session.report({"loss": 1.0})      # returns once the ingest answered it
            turns.append(flood.sent - before)
            wait_for(lambda: result_on_trial(custom, ns, "measured", container.trial),
                     timeout=60, interval=0.05, message=f"{container.trial}'s result on the Trial under the flood")
            threads.append(operator_threads(operator))
            during.append(flood.sent - before)
            assert flood.process.poll() is None, "the flood ended before the result was recorded"
        # still answered after the last result was recorded: the flood was live across every
        # result's path (per result it may count 0: the flood's count moves 10 at a time, and
        # a result recorded quickly can fall between two of its writes)
        last = flood.sent
        wait_for(lambda: flood.sent > last, timeout=60, interval=0.05, message="the flood still answered")
        sent = flood.sent
    lookups_after = token_lookups(core)
    lookups = {k: lookups_after[k] - lookups_before.get(k, 0.0) for k in lookups_after
               if lookups_after[k] != lookups_before.get(k, 0.0)}
    print(f"{sent} bogus POSTs answered; per real result, answered while its POST waited {turns} "
          f"and until it was on its Trial {during}; operator threads {threads_before} -> {threads}; "
          f"token lookups through the API meanwhile {lookups}")
    assert sent >= 200, "the flood hardly ran"
    # the flood was answered while the results were being recorded, not only before or after
    assert sum(during) > 0, during
    # no real POST queued behind the flood (a refusal and retry, or a server serving the flood first)
    assert max(turns) <= FAIR_TURN, turns
    # bogus POSTs take no thread of the operator (one per connection would add ~FLOOD_CONCURRENCY)
    assert max(threads) <= threads_before + FLOOD_CONCURRENCY // 2, (threads_before, threads)
    # nor an API call: a token checked through the API would read half of them as missing objects
    assert sum(lookups.values()) <= sent // 20, lookups
    # the victim's own token still works: the flood made it no wrong-token lockout
    victim.session.report({"loss": 0.1})
