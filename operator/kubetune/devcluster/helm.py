"""Find or build the Helm CLI (for ``helm lint`` / ``helm template`` of charts/kubetune).

Where it comes from, first match wins:

1. ``KUBETUNE_HELM`` (path to a helm binary),
2. the cache, ``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/helm-<version>/helm``.

Otherwise it is built into the cache from the wrapper Go module in ``helmmod/``
(go.mod pins helm.sh/helm/v3; go.sum pins every dependency); see ``gobuild``.
"""
from __future__ import annotations

from pathlib import Path

from kubetune.devcluster.gobuild import BuildError, GoModule, Log, env_paths


def _version_vars(module: GoModule) -> dict[str, str]:
    k8s_minor = module.required_version("k8s.io/client-go").split(".")[1]   # v0.34.2 -> Kubernetes 1.34
    return {
        "helm.sh/helm/v3/internal/version.version": module.version(),
        "helm.sh/helm/v3/internal/version.gitTreeState": "clean",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor": "1",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor": k8s_minor,
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor": "1",
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor": k8s_minor,
    }


HELM = GoModule(
    directory=Path(__file__).resolve().parent / "helmmod",
    cache_name="helm",
    version_of="helm.sh/helm/v3",
    packages={"helm": "helm.sh/helm/v3/cmd/helm"},
    prebuilt_hint="set KUBETUNE_HELM to a helm v3 binary",
    overrides=lambda name: env_paths("KUBETUNE_HELM"),
    link_vars=_version_vars,
)


def ensure_helm(log: Log = print) -> Path:
    """The helm binary, built (once per machine) if missing."""
    return HELM.ensure(["helm"], log)["helm"]


if __name__ == "__main__":   # `python -m kubetune.devcluster.helm`: print the path (build if needed)
    import sys
    try:
        print(ensure_helm(log=lambda message: print(message, file=sys.stderr, flush=True)))
    except BuildError as error:
        print(f"devcluster: {error}", file=sys.stderr)
        sys.exit(1)
