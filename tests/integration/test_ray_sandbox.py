"""The sandbox of a Ray driver process (issue 25): code a hostile "Ray server" gets to run
in the driver (Ray Client unpickles what the server sends) reaches nothing of the operator.

A child is started as the operator starts a driver (process.py's environment and work
directory), enters its sandbox through the driver's own entry (driver_main.enter), and
then does what such code would: read a stand-in ServiceAccount token, read its parent's
``/proc/PID/environ``, ptrace or signal its parent, connect to a port other than its Ray
cluster's, listen, reach an abstract unix socket outside, write outside its directory.
Each must fail with EACCES or EPERM; what a driver needs must still work: import Ray and
connect to a real Ray Client server at the allowed port.  The parent here (this test
process) stands for the operator and holds a secret in its environment.

Before the sandbox, every one of those succeeded (the driver ran unconfined as the
operator's uid in the operator's container)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from k8s_helpers import condition, create, experiment, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.devcluster.processes import free_port
from kubetune.executors.ray.process import child_environment, scrubbed_environment
from kubetune.sandbox import landlock
from operator_fixtures import OperatorProcess
from ray_fixtures import start_ray_head, stop_ray_head
from test_ray_addresses import driver_pids

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(landlock.abi() < 6, reason="needs a kernel with Landlock ABI >= 6 (Linux >= 6.12)")]

SECRET = "kubetune-test-operator-secret"

# run in the sandboxed child: each attempt's errno (0: it worked), then Ray's answer
HOSTILE = r'''
import ctypes, errno, json, os, signal, socket, sys
from kubetune.executors.ray import driver_main
settings = json.loads(sys.argv[1])
driver_main.enter(settings)
operator, outcome = settings["operator_pid"], {}

def attempt(name, action):
    try:
        action()
        outcome[name] = 0
    except OSError as error:
        outcome[name] = error.errno

def ptrace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(0x4206, operator, 0, 0) != 0:      # PTRACE_SEIZE
        raise OSError(ctypes.get_errno(), "ptrace")
    libc.ptrace(17, operator, 0, 0)                     # PTRACE_DETACH (it must never get here)

def abstract_unix():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(settings["abstract"])

def listen():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); s.listen()

attempt("token", lambda: open(settings["token"]).read())
attempt("environ", lambda: open(f"/proc/{operator}/environ", "rb").read())
attempt("parent_environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
attempt("mem", lambda: open(f"/proc/{operator}/mem", "rb").read(1))
attempt("ptrace", ptrace)
attempt("signal", lambda: os.kill(operator, signal.SIGCONT))   # harmless if delivered; scoping is by process
attempt("other_port", lambda: socket.create_connection(("127.0.0.1", settings["other_port"]), timeout=10).close())
attempt("listen", listen)
attempt("abstract_unix", abstract_unix)
attempt("write_outside", lambda: open(settings["outside"], "w").write("x"))
attempt("write_own", lambda: open(os.path.join(settings["workdir"], "scratch"), "w").write("x"))
attempt("own_proc", lambda: open("/proc/self/status").read())
if settings["ray"]:
    import time
    from kubetune.executors.ray.errors import RayUnavailableError
    from kubetune.executors.ray.executor import RayExecutor
    executor, deadline = RayExecutor(settings["address"]), time.monotonic() + 180
    while True:     # as the operator does: Ray's client server has failed to start a session under load
        try:
            executor.connect()
            break
        except RayUnavailableError as error:
            if time.monotonic() > deadline:
                raise
            print("retrying:", error, file=sys.stderr, flush=True)
    outcome["ray"] = {"trials": executor.list_trials("sandbox/"), "cpus": executor.cluster_resources().total.get("CPU")}
print("OUTCOME " + json.dumps(outcome), flush=True)
'''


@pytest.fixture(scope="module")
def ray_client():
    """A real Ray head, by its Ray Client address (what a driver process connects to)."""
    client_port = free_port()
    process, _, temp_dir = start_ray_head(num_cpus=1, num_gpus=0, client_port=client_port)
    try:
        yield f"ray://127.0.0.1:{client_port}"
    finally:
        stop_ray_head(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def operator_stand_in(tmp_path):
    """What a hostile driver would want of the operator: a token file, a process of its
    uid with a secret in its environment (the operator: its Ray token), a TCP port and
    an abstract unix socket it listens on."""
    token = tmp_path / "serviceaccount" / "token"
    token.parent.mkdir()
    token.write_text("a ServiceAccount token")
    operator = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                                env={**os.environ, "KUBETUNE_STAND_IN": SECRET})
    listener, abstract = socket.create_server(("127.0.0.1", 0)), socket.socket(socket.AF_UNIX)
    name = f"\0kubetune-sandbox-test-{os.getpid()}"
    abstract.bind(name)
    abstract.listen()
    try:
        yield {"operator_pid": operator.pid, "token": str(token), "other_port": listener.getsockname()[1], "abstract": name,
               "outside": str(tmp_path / "written-by-the-driver")}
        assert operator.poll() is None, "the hostile code killed the operator's stand-in"
        assert SECRET.encode() in open(f"/proc/{operator.pid}/environ", "rb").read()   # there to be stolen
    finally:
        operator.kill()
        operator.wait()
        listener.close()
        abstract.close()


def run_hostile(address: str, targets: dict, *, ray: bool, landlock_abi: int | None = None,
                token: str = "") -> dict:
    """The hostile code, in a child started and sandboxed as a driver process is."""
    workdir = tempfile.mkdtemp(prefix="kubetune-sandbox-test-")
    try:
        settings = {"address": address, "workdir": workdir, "sandbox": True, "ray": ray, **targets,
                    **({"landlock_abi": landlock_abi} if landlock_abi else {})}
        done = subprocess.run([sys.executable, "-c", HOSTILE, json.dumps(settings)], cwd=workdir,
                              env=child_environment(scrubbed_environment(token), workdir),
                              capture_output=True, text=True, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
        assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-5000:]
        return json.loads(lines[-1].removeprefix("OUTCOME "))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_code_run_in_a_driver_process_reaches_nothing_of_the_operator_and_ray_still_works(
        ray_client, operator_stand_in):
    outcome = run_hostile(ray_client, operator_stand_in, ray=True, token=os.environ["KUBETUNE_TEST_RAY_TOKEN"])
    assert outcome.pop("ray") == {"trials": [], "cpus": 1.0}
    assert outcome == {"token": errno.EACCES, "environ": errno.EACCES, "parent_environ": errno.EACCES,
                       "mem": errno.EACCES, "ptrace": errno.EPERM, "signal": errno.EPERM, "other_port": errno.EACCES, "listen": errno.EACCES,
                       "abstract_unix": errno.EPERM, "write_outside": errno.EACCES, "write_own": 0, "own_proc": 0}
    assert not os.path.exists(operator_stand_in["outside"])


def test_on_an_older_landlock_the_sandbox_keeps_what_that_abi_can_enforce(operator_stand_in):
    """ABI 3 (Linux 6.2) has no network rules and no signal scoping: the files and the
    operator's memory and environment stay out of reach; connections and signals do not."""
    outcome = run_hostile(f"ray://127.0.0.1:{free_port()}", operator_stand_in, ray=False, landlock_abi=3)
    assert outcome == {"token": errno.EACCES, "environ": errno.EACCES, "parent_environ": errno.EACCES,
                       "mem": errno.EACCES, "ptrace": errno.EPERM, "signal": 0, "other_port": 0, "listen": 0,
                       "abstract_unix": 0, "write_outside": errno.EACCES, "write_own": 0, "own_proc": 0}


# a process of the operator's user without capabilities, as in a pod (root here has
# CAP_SYS_PTRACE, which passes every ptrace check: the test drops it, and every other)
NO_CAPABILITIES = ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all"] if os.geteuid() == 0 else []


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="needs setpriv (util-linux) as root")
@pytest.mark.parametrize("protected", [False, True])
def test_the_operator_is_not_dumpable_so_no_process_of_its_user_reads_its_environment(protected):
    """The operator calls ``protect_process`` at start (operator_main.run): then no other
    process of its uid, sandboxed or not, reads its ``/proc/PID/environ`` (its Ray token,
    results URL).  Unprotected, the same reader can: the test can fail."""
    operator = subprocess.Popen(
        [*NO_CAPABILITIES, sys.executable, "-c",
         "import sys\nfrom kubetune.operator_main import protect_process\n"
         f"if {protected}: protect_process()\nprint('ready', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "KUBETUNE_STAND_IN": SECRET})
    try:
        assert operator.stdout.readline().strip() == "ready"
        read = subprocess.run([*NO_CAPABILITIES, "cat", f"/proc/{operator.pid}/environ"], capture_output=True)
        if protected:
            assert read.returncode != 0 and b"Permission denied" in read.stderr, read
        else:
            assert SECRET.encode() in read.stdout, read
    finally:
        operator.kill()
        operator.wait()


# runs its arguments as a command, where Landlock's system calls fail with ENOSYS (a
# seccomp filter, as a node's profile may have): a kernel without Landlock, to the operator
WITHOUT_LANDLOCK = (sys.executable, "-c", r'''
import ctypes, os, sys
class Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]
filter = (Instruction * 6)(
    Instruction(0x20, 0, 0, 0),                  # load the system call's number
    Instruction(0x15, 3, 0, 444), Instruction(0x15, 2, 0, 445), Instruction(0x15, 1, 0, 446),   # landlock_*
    Instruction(0x06, 0, 0, 0x7FFF0000),         # allow
    Instruction(0x06, 0, 0, 0x00050000 | 38))    # fail with ENOSYS
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0           # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(Program(6, filter)), 0, 0) == 0, ctypes.get_errno()   # PR_SET_SECCOMP
os.execv(sys.argv[1], sys.argv[1:])
''')


def test_where_the_node_has_no_landlock_no_driver_process_starts_unless_the_admin_allows_it(
        kube_cluster, ray_local, namespace, experiments_api, tmp_path):
    """The operator under a seccomp filter that fails Landlock's calls: an Experiment
    naming another cluster waits, its RayUnavailable condition naming the setting, and no
    driver process starts; the operator's own cluster is unaffected.  With
    --allow-unsandboxed-ray-drivers, the driver starts (and meets nothing listening)."""
    api, ns, address = experiments_api, namespace, f"ray://127.0.0.1:{free_port()}"
    operator = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, ns,
                               extra_args=("--ray-allowed-addresses", "any"), launcher=WITHOUT_LANDLOCK).start()
    try:
        create(api, ns, experiment("elsewhere", ray={"address": address}, budget={"maxTrials": 1}))
        create(api, ns, experiment("here", budget={"maxTrials": 1}))
        waiting = condition(wait_condition(api, ns, "elsewhere", "RayUnavailable", timeout=120, operator=operator),
                            "RayUnavailable")["message"]
        assert "no Landlock" in waiting and "--allow-unsandboxed-ray-drivers" in waiting \
            and "ray.allowUnsandboxedDrivers" in waiting, waiting
        wait_condition(api, ns, "here", "Succeeded", timeout=240, operator=operator)
        assert driver_pids(operator) == {}
        assert trials(api, ns, "elsewhere") == []

        operator.stop_and_report()
        operator.extra_args += ("--allow-unsandboxed-ray-drivers",)
        operator.start()

        def refused() -> str | None:
            found = condition(get_experiment(api, ns, "elsewhere"), "RayUnavailable") or {}
            return found.get("message") if "connection refused" in (found.get("message") or "") else None
        wait_for(refused, timeout=120, interval=0.5, message="the unsandboxed driver meeting nothing at the address")
        assert set(driver_pids(operator)) == {address}
    finally:
        operator.stop_and_report()
