"""Find or build the Helm CLI (for ``helm lint`` / ``helm template`` of charts/kubetune).

Where it comes from, first match wins:

1. ``KUBETUNE_HELM`` (path to a helm binary),
2. the cache, ``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/helm-<version>/helm``.

Otherwise it is built into the cache from the wrapper Go module in ``helmmod/``
(go.mod pins helm.sh/helm/v3; go.sum pins every dependency), the way
``devcluster.build`` builds the control plane: a cross-process lock, a temporary
directory next to the cache, an atomic move of the finished binary.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kubetune.devcluster.build import BuildError, Log, cache_root

HELM_MODULE_DIR = Path(__file__).resolve().parent / "helmmod"
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"


def _required(module: str) -> str:
    text = (HELM_MODULE_DIR / "go.mod").read_text()
    match = re.search(rf"^[ \t]*(?:require[ \t]+)?{re.escape(module)}[ \t]+(v\S+)", text, re.MULTILINE)
    if not match:
        raise BuildError(f"{module} is not required by {HELM_MODULE_DIR / 'go.mod'}")
    return match.group(1)


def helm_version() -> str:
    return _required("helm.sh/helm/v3")


def helm_cache_path() -> Path:
    return cache_root() / "bin" / f"helm-{helm_version()}" / "helm"


def find_helm() -> Path | None:
    override = os.environ.get("KUBETUNE_HELM")
    candidates = [Path(override).expanduser()] if override else []
    candidates.append(helm_cache_path())
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_helm(log: Log = print) -> Path:
    """The helm binary, built (once per machine) if missing."""
    found = find_helm()
    if found is not None:
        return found
    target = helm_cache_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent.parent / f".{target.parent.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if find_helm() is None:
            build_helm(target, log=log)
    found = find_helm()
    if found is None:
        raise BuildError(f"helm is still missing after the build ({target})")
    return found


def build_helm(target: Path, log: Log = print) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError("helm is missing and there is no `go` on PATH to build it: install Go >= 1.24, "
                         "or set KUBETUNE_HELM to a helm v3 binary")
    version = helm_version()
    k8s_minor = _required("k8s.io/client-go").split(".")[1]     # v0.34.2 -> Kubernetes 1.34
    ldflags = " ".join([
        "-s -w",
        f"-X helm.sh/helm/v3/internal/version.version={version}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
        f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={k8s_minor}",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={k8s_minor}",
    ])
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0")
    env.pop("GOFLAGS", None)   # -mod=mod would rewrite the committed go.mod/go.sum
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent.parent) as tmp:
        out = Path(tmp) / "helm"
        build_log = Path(tmp) / "go-build.log"
        log(f"devcluster: building helm {version} into {target.parent} "
            "(2-3 minutes cold on 2 cores; later runs reuse it)")
        started = time.monotonic()
        with open(build_log, "wb") as log_file:
            proc = subprocess.Popen(
                [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out), HELM_PACKAGE],
                cwd=HELM_MODULE_DIR, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
            try:
                next_note = started + 30
                while proc.poll() is None:
                    time.sleep(0.5)
                    if time.monotonic() >= next_note:
                        log(f"devcluster: still building helm ... {time.monotonic() - started:.0f}s")
                        next_note += 30
            except BaseException:
                proc.terminate()
                proc.wait()
                raise
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-30:])
            raise BuildError(f"go build of helm failed (exit {proc.returncode}):\n{tail}")
        os.replace(out, target)
        log(f"devcluster: built helm {version} in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":   # `python -m kubetune.devcluster.helm`: print the path (build if needed)
    import sys
    try:
        print(ensure_helm(log=lambda message: print(message, file=sys.stderr, flush=True)))
    except BuildError as error:
        print(f"devcluster: {error}", file=sys.stderr)
        sys.exit(1)
