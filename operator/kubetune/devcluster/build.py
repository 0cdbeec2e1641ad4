"""Find or build the control-plane binaries (etcd, kube-apiserver, ..., kubectl).

Where each binary comes from, first match wins:

1. ``KUBETUNE_BIN_DIR`` (a directory with the binaries),
2. ``KUBEBUILDER_ASSETS`` (controller-runtime envtest's layout: etcd, kube-apiserver,
   usually no kube-controller-manager),
3. the cache, ``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/k8s-<version>/``.

Whatever is still missing is built into the cache from the wrapper Go module in
``gomod/`` (go.mod pins the Kubernetes and etcd versions); see ``gobuild``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from kubetune.devcluster.gobuild import BuildError, GoModule, Log, cache_root, env_paths

__all__ = ["ALL_BINARIES", "NODE_BINARIES", "BuildError", "GOMOD_DIR", "KUBERNETES", "Log", "PACKAGES", "cache_root",
           "ensure_binaries", "etcd_version", "kubectl", "kubernetes_version"]

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"

# binary name -> Go package (the wrapper module's `tool` block)
PACKAGES = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    # the user's client: tests apply the examples with it, because it reads YAML 1.1
    # (`y:` becomes true) where PyYAML does not
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    # the real node (devcluster/node): built only when a node is asked for
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
}
NODE_BINARIES = ("kubelet", "kube-proxy")
ALL_BINARIES = tuple(name for name in PACKAGES if name not in NODE_BINARIES)


def _component_base_version(module: GoModule) -> dict[str, str]:
    version = module.version()
    return {
        "k8s.io/component-base/version.gitVersion": version,
        "k8s.io/component-base/version.gitMajor": version.lstrip("v").split(".")[0],
        "k8s.io/component-base/version.gitMinor": version.split(".")[1],
    }


KUBERNETES = GoModule(
    directory=GOMOD_DIR,
    cache_name="k8s",
    version_of="k8s.io/kubernetes",
    packages=PACKAGES,
    prebuilt_hint="point KUBETUNE_BIN_DIR (or KUBEBUILDER_ASSETS) at prebuilt binaries",
    overrides=lambda name: [directory / name for directory in env_paths("KUBETUNE_BIN_DIR", "KUBEBUILDER_ASSETS")],
    link_vars=_component_base_version,
    build_note="a cold build takes several minutes and ~2 GiB of memory",
)


def kubernetes_version() -> str:
    return KUBERNETES.version()


def etcd_version() -> str:
    return KUBERNETES.required_version("go.etcd.io/etcd/server/v3")


def kubectl(log: Log = print) -> Path:
    """The project's own kubectl (same version as the control plane), built if missing."""
    return KUBERNETES.ensure(["kubectl"], log)["kubectl"]


def ensure_binaries(names: Iterable[str] = ALL_BINARIES, log: Log = print) -> dict[str, Path]:
    """Return ``{name: path}`` for each binary, building the missing ones."""
    return KUBERNETES.ensure(names, log)
