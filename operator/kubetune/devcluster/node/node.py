"""A real node for the embedded control plane: containerd + runc + CNI bridge,
kube-proxy, a cluster DNS and the kubelet, all as host processes (Linux, root).

    node = Node(plane, log=print).start()   # plane: ControlPlane(address=network.BRIDGE_IP)
    node.load(image)                         # an images.Image, built if needed
    ...
    node.stop()

One node per machine: its containerd runs under ``RUN_DIR`` and the bridge, the
egress guard (network.py) and kube-proxy's iptables chains are machine-wide.
containerd's root (images) is kept under the cache between runs, so a warm start
imports nothing.  ``stop`` tears down in the order that leaves nothing behind: pods
(while the kubelet runs), kubelet, kube-proxy, DNS, leftover containers, containerd,
mounts, iptables chains, bridge (the steps are in teardown.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import yaml

from kubetune.devcluster import build, processes
from kubetune.devcluster.node import images, network, packages, teardown
from kubetune.devcluster.node.ctr import Ctr

Log = Callable[[str], None]
NODE_NAME = "kubetune-node"
RUN_DIR = Path("/run/kubetune-node")       # short: the containerd socket path has a length limit
SAVED_SYSCTLS = RUN_DIR / "sysctls.json"


class NodeError(RuntimeError):
    pass


def why_not_here() -> str | None:
    return packages.why_not_here()


class Node:
    def __init__(self, plane, *, log: Log = print):
        """``plane``: a ControlPlane serving on the bridge (``start_cluster`` makes both)."""
        if plane.address != network.BRIDGE_IP:
            raise NodeError(f"the control plane must serve on the bridge address {network.BRIDGE_IP}: "
                            "pods reach the apiserver there")
        self.plane = plane
        self.dir = plane.state_dir / "node"
        self.cache = build.cache_root() / "node"
        self.log = log
        self.records: list[processes.ProcessRecord] = []
        self._popens: dict[str, subprocess.Popen] = {}
        self.socket = RUN_DIR / "containerd.sock"
        self.ctr = Ctr(self.socket)        # node.ctr("images", "ls") -> its output
        self.builder = images.Builder(build.cache_root() / "images", log=log)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, timeout: float = 180.0) -> "Node":
        reason = why_not_here()
        if reason:
            raise NodeError(reason)
        packages.ensure(self.log)
        binaries = build.ensure_binaries(build.NODE_BINARIES, log=self.log)
        started = time.monotonic()
        for sub in ("logs", "cni", "kubelet"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            network.install_guard(SAVED_SYSCTLS)          # before any pod exists
            self._start_containerd()
            self.load_all([images.pause_image(self.dir), images.busybox_image(), images.python_image()])
            self._spawn("dns", [sys.executable, "-m", "kubetune.devcluster.node.dns",
                                f"--address={network.BRIDGE_IP}", f"--kubeconfig={self.plane.kubeconfig}"])
            self._start_kube_proxy(binaries["kube-proxy"])
            self._start_kubelet(binaries["kubelet"])
            self._wait_ready(started + timeout)
        except BaseException:
            self.stop()
            raise
        self.log(f"node: {NODE_NAME} Ready in {time.monotonic() - started:.1f}s")
        return self

    @classmethod
    def attach(cls, plane, log: Log = print) -> "Node | None":
        """The node recorded in ``plane``'s state directory (``devcluster down``), if any."""
        if not (plane.state_dir / "node" / "node.json").exists():
            return None     # a plane without a node (it may serve on loopback)
        node = cls(plane, log=log)
        try:
            node.records = [processes.ProcessRecord.from_dict(r)
                            for r in json.loads((node.dir / "node.json").read_text())]
        except (OSError, ValueError):
            return None
        return node

    def stop(self) -> None:
        errors: list[str] = []

        def attempt(step: Callable[[], None], what: str) -> None:
            started = time.monotonic()
            try:
                step()
            except Exception as error:    # keep tearing down: leave as little as possible
                errors.append(f"{what}: {error}")
            if time.monotonic() - started > 5:
                self.log(f"node: teardown: {what} took {time.monotonic() - started:.0f}s")

        attempt(self._delete_pods, "deleting the pods")
        for name in ("kubelet", "kube-proxy", "dns"):
            attempt(lambda name=name: self._stop_process(name), f"stopping {name}")
        attempt(lambda: teardown.remove_containers(self.ctr), "removing containers")
        attempt(lambda: self._stop_process("containerd"), "stopping containerd")
        attempt(self._unmount, "unmounting")
        attempt(teardown.cleanup_kube_proxy, "removing kube-proxy's chains")
        attempt(lambda: network.teardown(SAVED_SYSCTLS), "removing the bridge and the guard")
        if errors:
            raise NodeError("node teardown: " + "; ".join(errors))

    # -- images -----------------------------------------------------------------------------
    def load(self, image: images.Image) -> str:
        """Build ``image`` if needed and import it into containerd; returns its name."""
        self.load_all([image])
        return image.name

    def load_all(self, wanted: Iterable[images.Image]) -> None:
        marker = self.cache / "containerd" / "kubetune-images.json"
        imported = json.loads(marker.read_text()) if marker.exists() else {}
        present = set(self.ctr("images", "ls", "-q").split())
        for image in wanted:
            archive = self.builder.ensure(image)
            names = {self._normalized(name) for name in [image.name, *image.tags]}
            previous = imported.get(image.family) or {}
            if previous.get("key") == image.key and names <= present:
                continue
            started = time.monotonic()
            self.ctr("images", "import", str(archive), timeout=900)
            self._remove_older_builds(image)
            imported[image.family] = {"name": image.name, "key": image.key}
            marker.write_text(json.dumps(imported, indent=1))
            self.log(f"node: imported {image.name} in {time.monotonic() - started:.0f}s")

    def _remove_older_builds(self, image: images.Image) -> None:
        """Drop every other build of ``image``'s name from containerd, under both names an
        archive brings (``docker.io/library/x`` and buildah's ``localhost/x``): each code
        change builds a new tag, and the untagged layers of the old ones (about 700 MB per
        operator build) are only garbage-collected once no name refers to them."""
        repository, _, _ = image.name.rpartition(":")
        keep = {self._normalized(name) for name in [image.name, *image.tags]}
        keep |= {f"localhost/{name}" for name in [image.name, *image.tags]}
        repositories = {self._normalized(image.name).rpartition(":")[0], f"localhost/{repository}"}
        rows = [line.split()[:3] for line in self.ctr("images", "ls").splitlines()[1:]]
        stale = {ref for ref, _, _ in rows if ref.rpartition(":")[0] in repositories and ref not in keep}
        # the CRI plugin also names each image by its id (sha256:...): a build no other name
        # refers to any more is held only by that
        named = {digest for ref, _, digest in rows if not ref.startswith("sha256:") and ref not in stale}
        stale |= {ref for ref, _, digest in rows if ref.startswith("sha256:") and digest not in named}
        for ref in sorted(stale):
            self.ctr.attempt("images", "rm", ref, timeout=60)

    @staticmethod
    def _normalized(name: str) -> str:
        first = name.split("/")[0]
        if "/" not in name:
            return f"docker.io/library/{name}"
        return name if ("." in first or ":" in first or first == "localhost") else f"docker.io/{name}"

    # -- components -------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        record, popen = processes.spawn(name, argv, self.dir / "logs" / f"{name}.log",
                                        die_with_parent=self.plane.die_with_parent)
        self.records.append(record)
        self._popens[name] = popen
        (self.dir / "node.json").write_text(json.dumps([r.to_dict() for r in self.records], indent=1))

    def _stop_process(self, name: str) -> None:
        for record in [r for r in self.records if r.name == name]:
            processes.stop(record, self._popens.get(name))

    def _start_containerd(self) -> None:
        if self.socket.exists():
            if self.ctr.serves():
                raise NodeError(f"a containerd already serves {self.socket}: another node runs on this machine")
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        root = self.cache / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        network.write_cni_config(self.dir / "cni" / "net.d", self.dir / "cni")
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{root}"
state = "{RUN_DIR / 'state'}"
[grpc]
  address = "{self.socket}"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below ours
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.dir / 'cni' / 'net.d'}"
"""
        path = self.dir / "containerd.toml"
        path.write_text(config)
        self._spawn("containerd", ["containerd", "--config", str(path)])
        self._wait("containerd", "its socket", time.monotonic() + 60, self.ctr.serves)

    def _start_kube_proxy(self, binary: Path) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            # the --kubeconfig flag is ignored when --config is given
            "clientConnection": {"kubeconfig": str(self.plane.kubeconfig)},
            "mode": "iptables", "clusterCIDR": network.POD_CIDR, "hostnameOverride": NODE_NAME,
            "bindAddress": network.BRIDGE_IP,
            "healthzBindAddress": f"127.0.0.1:{processes.free_port()}",
            "metricsBindAddress": f"127.0.0.1:{processes.free_port()}",
            "conntrack": {"maxPerCore": 0},          # leave the machine's conntrack sysctls alone
            "nodePortAddresses": [f"{network.BRIDGE_IP}/32"],    # never on the uplink
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(binary), f"--config={path}", "--v=1"])

    def _start_kubelet(self, binary: Path) -> None:
        pki = self.plane._pki
        resolv = self.dir / "resolv.conf"
        resolv.write_text(f"nameserver {network.BRIDGE_IP}\n")
        self.kubelet_port = processes.free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": network.BRIDGE_IP, "port": self.kubelet_port, "readOnlyPort": 0, "healthzPort": 0,
            # only the apiserver (its kubelet client certificate, signed by the CA) gets in
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki.ca_cert)}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "failSwapOn": False, "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # the images cannot be pulled again: never collect them
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "clusterDNS": [network.BRIDGE_IP], "clusterDomain": "cluster.local", "resolvConf": str(resolv),
            "serializeImagePulls": False, "registerNode": True,
        }
        path = self.dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kubelet", [str(binary), f"--config={path}", f"--kubeconfig={self.plane.kubeconfig}",
                                f"--root-dir={self.dir / 'kubelet'}", f"--hostname-override={NODE_NAME}",
                                f"--node-ip={network.BRIDGE_IP}", "--v=1"])

    def _wait_ready(self, deadline: float) -> None:
        from kubernetes import client
        with self.plane.api_client() as api:
            core = client.CoreV1Api(api)

            def ready() -> bool:
                node = core.read_node(NODE_NAME)
                return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            self._wait("kubelet", f"node {NODE_NAME} Ready", deadline, ready)

    def advertise(self, resources: dict[str, int], timeout: float = 60.0) -> None:
        """Advertise extended resources (``{"nvidia.com/gpu": 2}``) in the node's capacity,
        as Kubernetes documents it ("Advertise Extended Resources for a Node"): the
        scheduler places pods that request them and the kubelet admits those pods.  No
        device is behind them: a pod gets none of the hardware, only the count, which
        is all Ray needs for logical GPUs (KubeRay's ``num-gpus`` from the limits).  The
        kubelet keeps such a resource through its status updates (only device plugins'
        resources are its own); waits until allocatable shows them."""
        from kubernetes import client
        patch = [{"op": "add", "path": "/status/capacity/" + name.replace("~", "~0").replace("/", "~1"),
                  "value": str(count)} for name, count in resources.items()]
        with self.plane.api_client() as api:
            core = client.CoreV1Api(api)
            core.patch_node_status(NODE_NAME, patch)     # a list: sent as a JSON patch

            def advertised() -> bool:
                allocatable = core.read_node(NODE_NAME).status.allocatable or {}
                return all(allocatable.get(name) == str(count) for name, count in resources.items())
            self._wait("kubelet", f"{resources} allocatable on {NODE_NAME}", time.monotonic() + timeout, advertised)
        self.log(f"node: {NODE_NAME} advertises {resources} (no devices behind them)")

    def _wait(self, component: str, what: str, deadline: float, check: Callable[[], bool]) -> None:
        last = ""
        while True:
            for record in self.records:
                if not record.is_alive():
                    raise NodeError(f"{record.name} exited while waiting for {what}:\n{record.log_tail()}")
            try:
                if check():
                    return
            except Exception as error:
                last = f" (last error: {error})"
            if time.monotonic() > deadline:
                record = next(r for r in self.records if r.name == component)
                raise NodeError(f"timed out waiting for {what}{last}:\n{record.log_tail()}")
            time.sleep(0.2)

    def _kubelet_running(self) -> bool:
        return any(r.name == "kubelet" and r.is_alive() for r in self.records)

    def _delete_pods(self) -> None:
        if self._kubelet_running() and self.plane.ready():
            teardown.delete_pods(self.plane, self.ctr)

    def _unmount(self) -> None:
        teardown.unmount((str(self.dir), str(RUN_DIR), str(self.cache / "containerd"), "/run/netns/cni-",
                          "/var/run/netns/cni-"))


def start_cluster(state_dir: Path, *, log: Log = print, die_with_parent: bool = False, timeout: float = 180.0):
    """A control plane serving on the bridge address, with a Ready node: ``(plane, node)``."""
    from kubetune.devcluster.controlplane import ControlPlane
    reason = why_not_here()
    if reason:
        raise NodeError(reason)
    packages.ensure(log)
    network.install_guard(SAVED_SYSCTLS)     # the apiserver binds on the bridge address
    plane = ControlPlane(state_dir, with_scheduler=True, address=network.BRIDGE_IP,
                         die_with_parent=die_with_parent, log=log)
    try:
        plane.start(timeout=timeout)
        return plane, Node(plane, log=log).start(timeout=timeout)
    except BaseException:
        plane.stop()
        network.teardown(SAVED_SYSCTLS)
        raise
