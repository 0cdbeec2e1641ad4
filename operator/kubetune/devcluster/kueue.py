"""Kueue's manager as a host process beside the devcluster's control plane, webhooks on.

    manager = KueueManager(plane.kubeconfig, state_dir).start()   # CRDs, webhooks, process
    ...
    manager.stop()

Kueue normally runs in-cluster behind a Service, with its own certificate manager
writing the serving certificate into a Secret.  Here the kube-apiserver runs on the
host too, so the manager serves its webhooks on a loopback port and:

- its internal cert management is off (``internalCertManagement.enable: false``): we
  write a CA and a serving certificate for 127.0.0.1 into ``certDir``;
- the webhook configurations and the CRDs' conversion webhooks are Kueue's own
  manifests (from the module source, the same release as the binary) with every
  ``clientConfig.service`` replaced by ``clientConfig.url: https://127.0.0.1:<port>/<path>``
  and that CA as ``caBundle``: the apiserver calls the host process directly, no
  Service, no Endpoints;
- only the webhooks of what this manager serves are registered (the Pod integration
  and Kueue's own kinds): a registered webhook whose path the manager does not serve
  would refuse every Job or Deployment in the cluster (failurePolicy: Fail);
- Admission Fair Sharing between the LocalQueues of a ClusterQueue is configured
  (``admissionFairSharing``; a ClusterQueue opts in with its ``admissionScope``);
- the visibility API (an aggregated API server that needs in-cluster authentication
  delegation) is off: ``VisibilityOnDemand=false``;
- its metrics server is off (``bindAddress: "0"``), but with cert management off the
  manager still loads a metrics certificate from the fixed path
  ``/etc/kueue/metrics/certs`` at start and exits without one: a self-signed pair is
  written there once if missing (never overwritten: several planes may share the
  machine; nothing serves with it).  That path needs root, as the real node does.

The Pod integration is the one enabled (kubetune's pod trials, ``executors/pods``); pods
in ``kube-system`` and ``kueue-system`` are left alone, as Kueue's own install does.
"""
from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from kubetune.devcluster import certs, processes
from kubetune.devcluster.crds import install_crds
from kubetune.devcluster.gobuild import Log
from kubetune.devcluster.kueue_build import crd_files, ensure_kueue, kueue_source

NAMESPACE = "kueue-system"
# the CRDs Kueue serves through its conversion webhook (config/components/crd/patches)
CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
# webhook paths of the Pod integration and of Kueue's own kinds
SERVED_PATHS = ("/mutate--v1-pod", "/validate--v1-pod", "-kueue-x-k8s-io-")
UNMANAGED_NAMESPACES = ("kube-system", NAMESPACE)
RECORD = "process.json"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")     # cmd/kueue/main.go, fixed


def configuration(*, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["pod"]},
        "featureGates": {"VisibilityOnDemand": False},
        # Admission Fair Sharing (beta, on by default in v0.15): a ClusterQueue with
        # admissionScope UsageBasedAdmissionFairSharing (examples/kueue/queues.yaml) admits
        # next from the LocalQueue (team) with the least recent usage.  Each admission adds
        # an entry penalty to its LocalQueue at once, so two saturating teams alternate;
        # the usage itself is sampled every 10 s and halves in 10 minutes (Kueue's own
        # example: 5 min and 7 days; a tuning queue turns over in minutes).
        "admissionFairSharing": {"usageHalfLifeTime": "10m", "usageSamplingInterval": "10s"},
    }


def _served(webhook: dict[str, Any]) -> bool:
    path = webhook["clientConfig"]["service"]["path"]
    return any(part in path for part in SERVED_PATHS)


def webhook_configurations(manifests: list[dict[str, Any]], base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, pointed at ``base_url`` (see the module's docstring)."""
    out = []
    for document in manifests:
        document = copy.deepcopy(document)
        document["metadata"]["name"] = f"kueue-{document['metadata']['name']}"
        hooks = []
        for hook in document.get("webhooks") or []:
            if not _served(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{base_url}{path}", "caBundle": ca_bundle}
            if hook["name"] in ("mpod.kb.io", "vpod.kb.io"):
                hook["namespaceSelector"] = {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                    "values": list(UNMANAGED_NAMESPACES)}]}
            hooks.append(hook)
        document["webhooks"] = hooks
        out.append(document)
    return out


def crds(base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs, the multi-version ones converted by the manager at ``base_url``."""
    documents = []
    for path in crd_files():
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"{base_url}/convert", "caBundle": ca_bundle},
                "conversionReviewVersions": ["v1"]}}
        documents.append(crd)
    return documents


class KueueManager(processes.HostProcess):
    """One Kueue manager process for the control plane of ``kubeconfig``."""

    name = "kueue"
    log_name = "kueue.log"
    record_name = RECORD
    log_lines = 40
    health_port = 0

    def start(self, timeout: float = 120.0) -> "KueueManager":
        binary = ensure_kueue(self.log)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cert_dir = self.state_dir / "certs"
        ca_pem = certs.webhook_serving(cert_dir)
        _ensure_metrics_cert(self.state_dir / "metrics-certs")
        import base64
        ca_bundle = base64.b64encode(ca_pem).decode()
        webhook_port, self.health_port = processes.free_port(), processes.free_port()
        base_url = f"https://127.0.0.1:{webhook_port}"
        config = self.state_dir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(configuration(webhook_port=webhook_port, health_port=self.health_port,
                                                       cert_dir=cert_dir)))
        manifests = [d for d in yaml.safe_load_all(
            (kueue_source() / "config" / "components" / "webhook" / "manifests.yaml").read_text()) if d]
        from kubernetes import config as kube_config
        with kube_config.new_client_from_config(config_file=str(self.kubeconfig)) as api:
            install_crds(api, documents=crds(base_url, ca_bundle))
            _ensure_namespace(api, NAMESPACE)
            # the manager first, then the webhooks: a webhook registered before its server
            # listens would refuse every pod created meanwhile
            self._spawn([str(binary), f"--config={config}", f"--kubeconfig={self.kubeconfig}"])
            deadline = time.monotonic() + timeout
            self.wait_until(deadline, lambda: processes.http_ok(f"http://127.0.0.1:{self.health_port}/readyz"),
                            "ready (/readyz)")
            _apply_webhooks(api, webhook_configurations(manifests, base_url, ca_bundle))
            self.wait_until(deadline, lambda: _webhook_answers(api), "answering its webhooks")
        return self

    @classmethod
    def attach(cls, state_dir: str | Path, log: Log = print) -> "KueueManager | None":
        """The manager `devcluster up --kueue` started in ``state_dir``; None if none."""
        manager = cls(Path(state_dir).parent / "kubeconfig", state_dir, die_with_parent=False, log=log)
        return manager if manager._load_record() else None


def _ensure_metrics_cert(scratch: Path) -> None:
    """The certificate Kueue's manager insists on loading (see the module's docstring)."""
    if (METRICS_CERT_DIR / "tls.crt").is_file() and (METRICS_CERT_DIR / "tls.key").is_file():
        return
    try:
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
        certs.webhook_serving(scratch)
        for name in ("tls.key", "tls.crt"):       # the key first: a reader that sees the cert finds both
            tmp = METRICS_CERT_DIR / f".{name}.{os.getpid()}"
            shutil.copyfile(scratch / name, tmp)
            os.replace(tmp, METRICS_CERT_DIR / name)
    except PermissionError as error:
        raise RuntimeError(f"Kueue's manager loads a metrics certificate from {METRICS_CERT_DIR} and exits "
                           f"without one; create it as root (or run as root): {error}") from error


def _ensure_namespace(api_client, name: str) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    try:
        client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
    except ApiException as error:
        if error.status != 409:
            raise


def _apply_webhooks(api_client, documents: list[dict[str, Any]]) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    admission = client.AdmissionregistrationV1Api(api_client)
    for document in documents:
        mutating = document["kind"] == "MutatingWebhookConfiguration"
        create = (admission.create_mutating_webhook_configuration if mutating
                  else admission.create_validating_webhook_configuration)
        try:
            create(document)
        except ApiException as error:
            if error.status != 409:
                raise
            name = document["metadata"]["name"]
            (admission.delete_mutating_webhook_configuration if mutating
             else admission.delete_validating_webhook_configuration)(name)
            create(document)


def _webhook_answers(api_client) -> bool:
    """A dry-run ResourceFlavor goes through Kueue's mutating and validating webhooks."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    try:
        client.CustomObjectsApi(api_client).create_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "resourceflavors",
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}},
            dry_run="All")
        return True
    except ApiException as error:
        return error.status == 409


__all__ = ["KueueManager", "NAMESPACE", "configuration", "crds", "ensure_kueue", "webhook_configurations"]
