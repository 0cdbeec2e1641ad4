"""Kueue's manager, built once per machine from its Go module (``kueuemod/``).

The binary comes from ``KUBETUNE_KUEUE`` or the cache
(``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/kueue-<version>/kueue``); otherwise it is
built from the wrapper module (Kueue has its own Kubernetes client versions, so it
cannot share gomod/).  Its CRDs come from the same module's source in the Go module
cache (``config/components/crd/bases``), so binary and CRDs are always one release.
"""
from __future__ import annotations

from pathlib import Path

from kubetune.devcluster.gobuild import GoModule, Log, env_paths

KUEUE = GoModule(
    directory=Path(__file__).resolve().parent / "kueuemod",
    cache_name="kueue",
    version_of="sigs.k8s.io/kueue",
    packages={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
    prebuilt_hint="set KUBETUNE_KUEUE to a Kueue manager binary",
    overrides=lambda name: env_paths("KUBETUNE_KUEUE"),
    link_vars=lambda module: {"sigs.k8s.io/kueue/pkg/version.GitVersion": module.version()},
)


def ensure_kueue(log: Log = print) -> Path:
    """The Kueue manager binary, built (once per machine) if missing."""
    return KUEUE.ensure(["kueue"], log)["kueue"]


def kueue_source() -> Path:
    """The Kueue module's source tree in the Go module cache (downloaded if missing)."""
    return KUEUE.source()


def crd_files() -> list[Path]:
    return sorted((kueue_source() / "config" / "components" / "crd" / "bases").glob("*.yaml"))
