"""The GitOps tools' own status readers, built once per machine from their Go modules,
for the tests of issue 33 (tests/integration/test_gitops.py):

- ``kstatus``: sigs.k8s.io/cli-utils' kstatus (``status.Compute``), what Flux, kpt and
  ``kstatus``-based waits read (module ``kstatusmod/``);
- ``argocd-health``: Argo CD's own health evaluation (gitops-engine's
  ``health.GetResourceHealth`` with argo-cd's Lua overrides, ``util/lua``), run with the
  health customizations of an argocd-cm ConfigMap (module ``argocdmod/``);
- ``flux-health``: Flux's own evaluation of a Kustomization's ``healthCheckExprs``
  (``github.com/fluxcd/pkg/runtime/cel``; module ``fluxmod/``).

Each wrapper module's go.mod/go.sum pin every dependency; its small ``main.go`` is
ours, so the cache directory is named by the pinned version and a digest of main.go
(an edit of it builds anew).  A binary is looked up first in ``KUBETUNE_KSTATUS`` /
``KUBETUNE_ARGOCD_HEALTH`` / ``KUBETUNE_FLUX_HEALTH``, then in the cache (see ``gobuild``)."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any, Mapping

from kubetune.devcluster.gobuild import GoModule, Log, env_paths

HERE = Path(__file__).resolve().parent


def _source_digest(directory: Path) -> str:
    return hashlib.sha256((directory / "main.go").read_bytes()).hexdigest()[:10]


KSTATUS = GoModule(
    directory=HERE / "kstatusmod",
    cache_name=f"kstatus-{_source_digest(HERE / 'kstatusmod')}",
    version_of="sigs.k8s.io/cli-utils",
    packages={"kstatus": "kubetune.dev/kstatus"},
    prebuilt_hint="set KUBETUNE_KSTATUS to a build of operator/kubetune/devcluster/kstatusmod",
    overrides=lambda name: env_paths("KUBETUNE_KSTATUS"),
    build_note="a cold build takes about a minute of CPU",
)

ARGOCD_HEALTH = GoModule(
    directory=HERE / "argocdmod",
    cache_name=f"argocd-health-{_source_digest(HERE / 'argocdmod')}",
    version_of="github.com/argoproj/argo-cd/v3",
    packages={"argocd-health": "kubetune.dev/argocdhealth"},
    prebuilt_hint="set KUBETUNE_ARGOCD_HEALTH to a build of operator/kubetune/devcluster/argocdmod",
    overrides=lambda name: env_paths("KUBETUNE_ARGOCD_HEALTH"),
    build_note="a cold build compiles part of Argo CD: minutes on 2 cores",
)

FLUX_HEALTH = GoModule(
    directory=HERE / "fluxmod",
    cache_name=f"flux-health-{_source_digest(HERE / 'fluxmod')}",
    version_of="github.com/fluxcd/pkg/runtime",
    packages={"flux-health": "kubetune.dev/fluxhealth"},
    prebuilt_hint="set KUBETUNE_FLUX_HEALTH to a build of operator/kubetune/devcluster/fluxmod",
    overrides=lambda name: env_paths("KUBETUNE_FLUX_HEALTH"),
    build_note="a cold build compiles CEL and the Kubernetes API types: minutes on 2 cores",
)


def ensure_gitops_tools(log: Log = print) -> dict[str, Path]:
    """``{"kstatus": path, "argocd-health": path, "flux-health": path}``, built (once per
    machine) if missing."""
    return {**KSTATUS.ensure(["kstatus"], log), **ARGOCD_HEALTH.ensure(["argocd-health"], log),
            **FLUX_HEALTH.ensure(["flux-health"], log)}


def _verdicts(command: list[str], objects: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    done = subprocess.run(command, input=json.dumps(objects), capture_output=True, text=True, timeout=60,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited {done.returncode}: {done.stderr.strip()}")
    return {item["name"]: {"status": item["status"], "message": item["message"]}
            for item in map(json.loads, done.stdout.splitlines())}


def kstatus(binary: Path, objects: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """kstatus of each object (``objects``: one, or a List) by name: {"status", "message"}."""
    return _verdicts([str(binary)], objects)


def argocd_health(binary: Path, argocd_cm: Path, objects: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Argo CD's health of each object by name, with the customizations in ``argocd_cm``
    (a ConfigMap as JSON)."""
    return _verdicts([str(binary), str(argocd_cm)], objects)


def flux_health(binary: Path, kustomization: Path, objects: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Flux's health of each object by name, with the ``healthCheckExprs`` of the
    Kustomization in ``kustomization`` (as JSON)."""
    return _verdicts([str(binary), str(kustomization)], objects)
