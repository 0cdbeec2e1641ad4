"""Several Ray clusters from one operator (issue 15, item 6): each Ray address an
Experiment names gets a connection of its own (the operator's own address in its
process, any other in a driver process of its own), and an address that cannot be
reached fails only the Experiments that name it.

Before, the operator held one Ray connection: an Experiment naming a second cluster
was refused, and after a restart whichever daemon started first could decide the
connection for everyone."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from k8s_helpers import condition, create, experiment, experiment_gone, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.devcluster.processes import free_port
from operator_fixtures import OperatorProcess
from ray_fixtures import start_ray_head, stop_ray_head

pytestmark = pytest.mark.integration

SECOND = "second_head"   # a resource only the second head has: a trial placed elsewhere is Infeasible


DRIVER_MODULE = b"kubetune.executors.ray.driver_main"


# this module's Experiments name other clusters by loopback addresses, which the default
# allow-list refuses (test_tenants.py): allowed here, with the session's Ray token, which
# every test head shares (never the operator's own: it is passed by name, per cluster)
ALLOW_OTHERS = ("--ray-allowed-addresses", "any=KUBETUNE_TEST_RAY_TOKEN")


@pytest.fixture
def operator(kube_cluster, ray_local, namespace, tmp_path):
    process = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, namespace, extra_args=ALLOW_OTHERS).start()
    yield process
    process.stop_and_report()


@pytest.fixture
def second_head_addresses():
    """Another Ray cluster, by two Ray Client addresses (an IP and a host name): two
    addresses as Experiments name them, so two driver processes in the operator."""
    client_port = free_port()
    process, _, temp_dir = start_ray_head(num_cpus=2, num_gpus=0, resources={SECOND: 4}, client_port=client_port)
    try:
        yield f"ray://127.0.0.1:{client_port}", f"ray://localhost:{client_port}"
    finally:
        stop_ray_head(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def second_head(second_head_addresses):
    """Another Ray cluster, named as Experiments name one: by its Ray Client address."""
    return second_head_addresses[0]


def test_experiments_on_two_ray_clusters_run_and_a_bad_address_fails_alone(
        operator, second_head, experiments_api, namespace, tmp_path):
    api, ns = experiments_api, namespace
    bad = f"ray://127.0.0.1:{free_port()}"      # nothing listens there
    gate = tmp_path / "gate"
    # the bad address comes first: before, its daemon could claim the one Ray connection
    create(api, ns, experiment("typo", ray={"address": bad}, budget={"maxTrials": 1}))
    create(api, ns, experiment(
        "elsewhere", entrypoint="kubetune.examples.sleepy:train", objective={"metric": "step", "mode": "max"},
        ray={"address": second_head}, budget={"maxTrials": 2, "parallelism": 2},
        trial={"resources": {"cpu": 0.5, "custom": {SECOND: 1}},
               "config": {"iterations": 4, "interval": 0.01, "hold_after": 2, "gate": str(gate)}}))
    create(api, ns, experiment("here", budget={"maxTrials": 2}, trial={"config": {"iterations": 3}}))

    wait_condition(api, ns, "here", "Succeeded", timeout=240, operator=operator)

    def held(name: str) -> bool:
        items = trials(api, ns, name)
        return len(items) == 2 and all((t.get("status") or {}).get("phase") == "Running"
                                       and (t["status"].get("iteration") or 0) >= 2 for t in items)
    wait_for(lambda: held("elsewhere"), timeout=240, interval=0.5,
             message="both trials on the second cluster running, held at their gate")

    def refused_alone() -> None:
        typo = wait_condition(api, ns, "typo", "RayUnavailable", timeout=120, operator=operator)
        unavailable = condition(typo, "RayUnavailable")
        assert unavailable["reason"] == "ConnectionFailed" and bad in unavailable["message"], unavailable
        assert typo["status"].get("phase") != "Succeeded" and trials(api, ns, "typo") == []
        assert get_experiment(api, ns, "elsewhere")["status"]["phase"] == "Running"
    refused_alone()

    # after a restart every daemon starts at once: none decides the others' cluster
    operator.kill()
    operator.start()
    refused_alone()
    gate.touch()
    done = wait_condition(api, ns, "elsewhere", "Succeeded", timeout=240, operator=operator)
    assert done["status"]["trialCounts"]["succeeded"] == 2
    for trial in trials(api, ns, "elsewhere"):
        # re-attached after the restart on the second cluster, not started again
        assert trial["status"]["iteration"] == 4 and trial["status"]["attempt"] == 0, trial["status"]
    assert get_experiment(api, ns, "here")["status"]["phase"] == "Succeeded"

    # nothing ever ran at the bad address: its deletion is not held up waiting for it
    api.delete_namespaced_custom_object("kubetune.dev", "v1alpha1", ns, "experiments", "typo")
    wait_for(lambda: experiment_gone(api, ns, "typo"), timeout=60, interval=0.5, message="typo deleted")


def test_a_driver_process_that_dies_is_replaced_at_the_next_connect_and_dies_with_its_operator(ray_local, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from kubetune.executors.ray.errors import RayUnavailableError
    from kubetune.executors.ray.process import DriverProcess

    driver = DriverProcess(ray_local, token=os.environ["KUBETUNE_TEST_RAY_TOKEN"])   # the operator's is scrubbed
    try:
        driver.connect()
        environ = Path(f"/proc/{driver.pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith((b"KUBETUNE_TEST_RAY_TOKEN=", b"KUBETUNE_RESULTS_URL="))]
        # in its sandbox (test_ray_sandbox.py), which starts with no_new_privs; its work directory its own
        assert "NoNewPrivs:\t1" in Path(f"/proc/{driver.pid}/status").read_text()
        workdirs = [driver._child.workdir]
        assert Path(f"/proc/{driver.pid}/cwd").resolve() == Path(workdirs[0]).resolve()
        assert driver.list_trials("it/none/") == []
        first = driver.pid
        os.kill(first, signal.SIGKILL)          # e.g. Ray aborted the driver's process
        with pytest.raises(RayUnavailableError, match="driver process") as failed:
            driver.list_trials("it/none/")
        assert failed.value.address == ray_local
        driver.connect()
        assert driver.pid not in (None, first) and driver.list_trials("it/none/") == []
        workdirs.append(driver._child.workdir)
    finally:
        driver.close()
    wait_for(lambda: not any(Path(w).exists() for w in workdirs), timeout=60, interval=0.2,
             message="the driver processes' work directories removed")

    # an operator killed outright leaves no driver process behind
    script = tmp_path / "killed_operator.py"
    script.write_text("import os, signal, sys\n"
                      "from kubetune.executors.ray.process import DriverProcess\n"
                      f"driver = DriverProcess({ray_local!r}, token=os.environ['KUBETUNE_TEST_RAY_TOKEN'])\ndriver.connect()\n"
                      "print(driver.pid, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert done.stdout.strip(), done.stderr[-3000:]
    orphan = int(done.stdout.split()[-1])

    def gone() -> bool:   # exited (a zombie not yet reaped by whoever adopted it counts)
        try:
            return (Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[0]) in ("Z", "X")
        except FileNotFoundError:
            return True
    wait_for(gone, timeout=60, interval=0.2, message="the driver process of a killed operator exiting")


IDLE_S = 3.0     # the operator's --ray-driver-idle-seconds in the test below (default 300)


def driver_pids(operator) -> dict[str, int]:
    """The operator's live driver processes (executors/ray/process.py), by the address each serves."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if stat[0] in ("Z", "X") or int(stat[1]) != operator.process.pid or DRIVER_MODULE not in argv:
            continue
        found[json.loads(argv[argv.index(DRIVER_MODULE) + 2])["address"]] = int(entry.name)
    return found


def exited(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie not yet reaped counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_driver_process_ends_once_no_experiment_needs_its_address_and_starts_again_when_one_does(
        kube_cluster, ray_local, second_head_addresses, experiments_api, namespace, tmp_path):
    """Before, a driver process lived as long as the operator: one per address ever named,
    each holding a Ray connection, over weeks of Experiments coming and going."""
    api, ns = experiments_api, namespace
    client_address, other_address = second_head_addresses     # two addresses: two driver processes
    operator = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, ns,
                               extra_args=("--ray-driver-idle-seconds", str(IDLE_S), *ALLOW_OTHERS)).start()
    try:
        gates = {"on-x": tmp_path / "gate-x", "on-y": tmp_path / "gate-y"}
        for name, address in (("on-x", client_address), ("on-y", other_address)):
            create(api, ns, experiment(
                name, entrypoint="kubetune.examples.sleepy:train", objective={"metric": "step", "mode": "max"},
                ray={"address": address}, budget={"maxTrials": 1},
                trial={"resources": {"cpu": 0.5, "custom": {SECOND: 1}},
                       "config": {"iterations": 3, "interval": 0.01, "hold_after": 1, "gate": str(gates[name])}}))

        def held(name: str) -> bool:
            items = trials(api, ns, name)
            return len(items) == 1 and (items[0].get("status") or {}).get("phase") == "Running" \
                and (items[0]["status"].get("iteration") or 0) >= 1
        wait_for(lambda: held("on-x") and held("on-y"), timeout=240, interval=0.5,
                 message="a trial on each address running, held at its gate")
        drivers = driver_pids(operator)
        assert {client_address, other_address} <= set(drivers), drivers

        # deleted: its address's driver ends after the grace period; the other one stays
        api.delete_namespaced_custom_object("kubetune.dev", "v1alpha1", ns, "experiments", "on-x")
        wait_for(lambda: experiment_gone(api, ns, "on-x"), timeout=120, interval=0.5, message="on-x deleted")
        wait_for(lambda: client_address not in driver_pids(operator), timeout=IDLE_S + 60, interval=0.2,
                 message=f"the driver process of {client_address} ending")
        wait_for(lambda: exited(drivers[client_address]), timeout=30, interval=0.2, message="its process gone")
        assert driver_pids(operator).get(other_address) == drivers[other_address]
        assert held("on-y")

        # finished: the same, once nothing of it runs
        gates["on-y"].touch()
        wait_condition(api, ns, "on-y", "Succeeded", timeout=240, operator=operator)
        wait_for(lambda: other_address not in driver_pids(operator), timeout=IDLE_S + 60, interval=0.2,
                 message=f"the driver process of {other_address} ending after its Experiment finished")
        assert get_experiment(api, ns, "on-y")["status"]["phase"] == "Succeeded"   # left as it was

        # named again: a new driver process serves it
        create(api, ns, experiment(
            "again-x", entrypoint="kubetune.examples.sleepy:train", objective={"metric": "step", "mode": "max"},
            ray={"address": client_address}, budget={"maxTrials": 1},
            trial={"resources": {"cpu": 0.5, "custom": {SECOND: 1}}, "config": {"iterations": 2, "interval": 0.01}}))
        wait_condition(api, ns, "again-x", "Succeeded", timeout=240, operator=operator)
        assert operator.process.poll() is None
    finally:
        operator.stop_and_report()


@pytest.mark.parametrize("address,cause", [
    ("ray://ray-head.invalid:10001", "the host name ray-head.invalid does not resolve"),
    ("ray://127.0.0.1:{port}", "connection refused: nothing listens on port {port} of 127.0.0.1"),
])
def test_an_unreachable_address_is_named_in_the_message_kubectl_shows_with_since_when(
        operator, experiments_api, namespace, kubectl, address, cause):
    """The line a user reads first (status.message: kubectl get -o wide, Argo CD, describe)
    names the unreachable address, the cause in words, since when, and the fix, not only
    "0 running, 0 queued, 0/2 done" with the cause hidden in a condition."""
    port = free_port()
    address, cause = address.format(port=port), cause.format(port=port)
    create(experiments_api, namespace, experiment("unreachable", ray={"address": address},
                                                  budget={"maxTrials": 2}))

    def message_names_the_cause():
        message = (get_experiment(experiments_api, namespace, "unreachable").get("status") or {}).get("message") or ""
        return message if cause in message else None
    message = wait_for(message_names_the_cause, timeout=120, interval=0.5, message=f"status.message naming {cause!r}")
    assert message.startswith(f"cannot reach Ray at {address}"), message
    assert "(since 20" in message and "retrying" in message and "check spec.ray.address" in message, message
    assert message.endswith("0 running, 0 queued, 0/2 done"), message
    wide = kubectl("get", "experiment", "unreachable", "-n", namespace, "-o", "wide").stdout
    assert cause in wide and "check spec.ray.address" in wide, wide
    described = kubectl("describe", "experiment", "unreachable", "-n", namespace).stdout
    assert cause in described, described
