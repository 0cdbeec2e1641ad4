"""An embedded Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, optionally kube-scheduler) for the tests and the demo,
built from Go modules on first use.  See ``controlplane.ControlPlane``."""
from kubetune.devcluster.build import ensure_binaries, etcd_version, kubernetes_version
from kubetune.devcluster.controlplane import ControlPlane, ControlPlaneError
from kubetune.devcluster.crds import crds_dir, install_crds

__all__ = ["ControlPlane", "ControlPlaneError", "ensure_binaries", "install_crds", "crds_dir",
           "kubernetes_version", "etcd_version"]
