"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager and optionally kube-scheduler, all in one state directory.

    plane = ControlPlane(tmp_dir).start()      # builds the binaries the first time
    api = plane.api_client()                   # kubernetes.client.ApiClient
    ...
    plane.stop()                               # stops what it started, removes tmp_dir

Another process can attach to a running plane with ``ControlPlane.load(state_dir)``
(the CLI's ``down`` and ``status`` do): the state directory's ``state.json`` records
the ports and the pid (and start time) of every process as soon as it is spawned.
"""
from __future__ import annotations

import base64
import http.client
import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

import yaml

from kubetune.devcluster import build, certs, processes
from kubetune.devcluster.processes import ProcessRecord

STATE_FILE = "state.json"
Log = Callable[[str], None]


class ControlPlaneError(RuntimeError):
    """A component failed to start; names the component and shows its log tail."""

    def __init__(self, component: str, problem: str, log_tail: str = "", log_path: str = ""):
        self.component = component
        self.log_tail = log_tail
        text = f"{component}: {problem}"
        if log_path:
            text += f"\n--- last lines of {log_path} ---\n{log_tail}"
        super().__init__(text)


class ControlPlane:
    def __init__(self, state_dir: str | Path, *, with_scheduler: bool = False, install_crds: bool = True,
                 crds_dir: str | Path | None = None, die_with_parent: bool = False, log: Log = print,
                 address: str = "127.0.0.1"):
        """``address``: where the apiserver listens; a real node's bridge address makes it
        the `kubernetes` Service's endpoint, reachable from pods (devcluster/node)."""
        self.state_dir = Path(state_dir).resolve()
        self.address = address
        self.with_scheduler = with_scheduler
        self.install_crds = install_crds
        self.crds_dir = Path(crds_dir) if crds_dir else None
        self.die_with_parent = die_with_parent
        self.log = log
        self.server: str | None = None
        self.records: list[ProcessRecord] = []
        self._popens: dict[str, subprocess.Popen] = {}

    # -- paths -----------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def _state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def _pki(self) -> certs.Pki:
        return certs.Pki.in_dir(self.state_dir / "pki")

    # -- attach ----------------------------------------------------------------------------
    @classmethod
    def load(cls, state_dir: str | Path, log: Log = print) -> "ControlPlane | None":
        """The plane recorded in ``state_dir``, or None if there is none."""
        plane = cls(state_dir, log=log)
        try:
            state = json.loads(plane._state_file.read_text())
        except (OSError, ValueError):
            return None
        plane.server = state.get("server")
        plane.address = urllib.parse.urlsplit(plane.server or "https://127.0.0.1").hostname or "127.0.0.1"
        plane.with_scheduler = state.get("with_scheduler", False)
        plane.records = [ProcessRecord.from_dict(r) for r in state.get("processes", [])]
        return plane

    def _save_state(self) -> None:
        state = {"server": self.server, "kubeconfig": str(self.kubeconfig), "with_scheduler": self.with_scheduler,
                 "versions": {"kubernetes": build.kubernetes_version(), "etcd": build.etcd_version()},
                 "processes": [r.to_dict() for r in self.records]}
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self._state_file)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> "ControlPlane":
        """Start every component and wait until the API is usable (CRDs Established)."""
        self._prepare_state_dir()
        names = ["etcd", "kube-apiserver", "kube-controller-manager"] + (["kube-scheduler"] if self.with_scheduler else [])
        binaries = build.ensure_binaries(names, log=self.log)
        started = time.monotonic()
        deadline = started + timeout
        try:
            pki = certs.generate(self.state_dir / "pki",
                                 addresses=() if self.address == "127.0.0.1" else (self.address,))
            etcd_url = self._start_etcd(binaries["etcd"], deadline)
            self._start_apiserver(binaries["kube-apiserver"], etcd_url, pki, deadline)
            self._write_kubeconfig(pki)
            if self.install_crds:
                # before the controller manager: its garbage collector discovers resource
                # types at start and then only every 30 s
                from kubetune.devcluster.crds import install_crds
                with self.api_client() as api:
                    install_crds(api, self.crds_dir, timeout=max(deadline - time.monotonic(), 5.0))
            self._spawn("kube-controller-manager", [
                str(binaries["kube-controller-manager"]), f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false", "--secure-port=0",
                f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}", f"--cluster-signing-key-file={pki.ca_key}",
                "--controllers=*",
                # its default is under /usr/libexec, which it would create
                f"--flex-volume-plugin-dir={self.state_dir / 'flexvolume'}",
            ])
            if self.with_scheduler:
                self._spawn("kube-scheduler", [
                    str(binaries["kube-scheduler"]), f"--kubeconfig={self.kubeconfig}",
                    "--leader-elect=false", "--secure-port=0",
                ])
            # the ServiceAccount admission plugin rejects pods until this exists
            self._wait("kube-controller-manager", "the default ServiceAccount to be created", deadline,
                       lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200)
        except BaseException:
            self._stop_processes()
            raise
        self.log(f"devcluster: control plane ready at {self.server} in {time.monotonic() - started:.1f}s "
                 f"(Kubernetes {build.kubernetes_version()}, etcd {build.etcd_version()})")
        return self

    def stop(self, remove_state: bool = True) -> None:
        """Stop exactly the processes this plane started; remove the state directory."""
        self._stop_processes()
        if remove_state and self.state_dir.exists():
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- inspection ------------------------------------------------------------------------
    def alive(self) -> dict[str, bool]:
        return {r.name: r.is_alive() for r in self.records}

    def is_running(self) -> bool:
        return bool(self.records) and all(self.alive().values())

    def ready(self) -> bool:
        """kube-apiserver answers /readyz with 200."""
        try:
            return self._get("/readyz")[0] == 200
        except Exception:
            return False

    def api_client(self):
        """A new ``kubernetes.client.ApiClient`` for the admin user."""
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    # -- internals -------------------------------------------------------------------------
    def _prepare_state_dir(self) -> None:
        existing = ControlPlane.load(self.state_dir, log=self.log)
        if existing is not None:
            if any(existing.alive().values()):
                raise ControlPlaneError("devcluster", f"a control plane is already running in {self.state_dir}; "
                                        "stop it first (`kubetune devcluster down`)")
            shutil.rmtree(self.state_dir)  # stale state of a plane whose processes are gone
        elif self.state_dir.exists() and any(self.state_dir.iterdir()):
            # never delete a directory this code did not create
            raise ControlPlaneError("devcluster", f"{self.state_dir} exists and is not a devcluster state directory")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        self.records = []
        self._popens = {}
        self._save_state()  # marks the directory as ours, even if the build below is interrupted

    def _spawn(self, name: str, argv: list[str]) -> ProcessRecord:
        record, popen = processes.spawn(name, argv, self.state_dir / "logs" / f"{name}.log",
                                        die_with_parent=self.die_with_parent)
        self.records.append(record)
        self._popens[name] = popen
        self._save_state()  # recorded at once, so `down` can stop it even if `up` dies now
        return record

    def _start_etcd(self, binary: Path, deadline: float) -> str:
        client_port, peer_port = processes.free_port(), processes.free_port()
        client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            str(binary), "--name=default", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}", "--unsafe-no-fsync", "--log-level=warn",
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as response:
                return json.loads(response.read()).get("health") == "true"

        self._wait("etcd", "/health", deadline, healthy)
        return client_url

    def _start_apiserver(self, binary: Path, etcd_url: str, pki: certs.Pki, deadline: float) -> None:
        port = processes.free_port()
        self.server = f"https://{self.address}:{port}"
        on_loopback = self.address == "127.0.0.1"
        self._spawn("kube-apiserver", [
            str(binary), f"--etcd-servers={etcd_url}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--secure-port={port}", f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--service-cluster-ip-range={certs.SERVICE_CIDR}", "--authorization-mode=RBAC",
            f"--service-account-issuer={self.server}/",
            f"--service-account-key-file={pki.sa_pub}", f"--service-account-signing-key-file={pki.sa_key}",
            "--allow-privileged=true", "--profiling=false",
            # logs, exec, port-forward: the kubelet authenticates the apiserver by this certificate
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            "--kubelet-preferred-address-types=InternalIP",
            # the `kubernetes` Endpoints may not hold a loopback address; with a node the
            # apiserver serves on the bridge address, which pods reach
            *(["--endpoint-reconciler-type=none"] if on_loopback else []),
        ])
        self._wait("kube-apiserver", "/readyz", deadline, lambda: self._get("/readyz")[0] == 200)

    def _wait(self, component: str, what: str, deadline: float, check: Callable[[], bool]) -> None:
        record = next(r for r in self.records if r.name == component)
        popen = self._popens.get(component)
        last_error = ""
        while True:
            exited = popen.poll() is not None if popen is not None else not record.is_alive()
            if exited:
                code = f" with code {popen.returncode}" if popen is not None else ""
                raise ControlPlaneError(component, f"exited{code} during start-up",
                                        record.log_tail(), record.log)
            try:
                if check():
                    return
            except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError is an OSError
                last_error = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise ControlPlaneError(component, f"timed out waiting for {what}{last_error}",
                                        record.log_tail(), record.log)
            time.sleep(0.1)

    def _ssl_context(self) -> ssl.SSLContext:
        pki = self._pki
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        return context

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"{self.server}{path}", timeout=2, context=self._ssl_context()) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _write_kubeconfig(self, pki: certs.Pki) -> None:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kubetune-dev",
                          "cluster": {"server": self.server, "certificate-authority-data": b64(pki.ca_cert)}}],
            "users": [{"name": "admin", "user": {"client-certificate-data": b64(pki.admin_cert),
                                                 "client-key-data": b64(pki.admin_key)}}],
            "contexts": [{"name": "kubetune-dev",
                          "context": {"cluster": "kubetune-dev", "user": "admin", "namespace": "default"}}],
            "current-context": "kubetune-dev",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _stop_processes(self) -> None:
        errors = []
        for record in reversed(self.records):  # dependents first, etcd last
            try:
                processes.stop(record, self._popens.get(record.name))
            except RuntimeError as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError("; ".join(errors))
