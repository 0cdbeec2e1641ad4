"""Find or build the control-plane binaries (etcd, kube-apiserver, ...).

Where each binary comes from, first match wins:

1. ``KUBETUNE_BIN_DIR`` (a directory with the binaries),
2. ``KUBEBUILDER_ASSETS`` (controller-runtime envtest's layout: etcd, kube-apiserver,
   usually no kube-controller-manager),
3. the cache, ``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/k8s-<version>/``.

Whatever is still missing is built into the cache from the wrapper Go module in
``gomod/`` (go.mod pins the Kubernetes and etcd versions).  The build writes into a
temporary directory next to the cache and moves finished binaries in, so a killed
build never leaves half a binary behind; GOCACHE and GOMODCACHE keep their
defaults so a second build is quick.
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
from typing import Callable, Iterable

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"

# binary name -> Go package (from the wrapper module's `tool` block)
PACKAGES = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
}
ALL_BINARIES = tuple(PACKAGES)
# `go build -o dir/` names a main package by its last path element; for
# .../server/v3 that is "v3" or "server" depending on the Go release.
_ETCD_BUILD_NAMES = ("etcd", "server", "v3")

Log = Callable[[str], None]


class BuildError(RuntimeError):
    pass


def _required_version(module: str) -> str:
    text = (GOMOD_DIR / "go.mod").read_text()
    match = re.search(rf"^[ \t]*(?:require[ \t]+)?{re.escape(module)}[ \t]+(v\S+)", text, re.MULTILINE)
    if not match:
        raise BuildError(f"{module} is not required by {GOMOD_DIR / 'go.mod'}")
    return match.group(1)


def kubernetes_version() -> str:
    return _required_version("k8s.io/kubernetes")


def etcd_version() -> str:
    return _required_version("go.etcd.io/etcd/server/v3")


def cache_root() -> Path:
    return Path(os.environ.get("KUBETUNE_CACHE") or Path.home() / ".cache" / "kubetune").expanduser()


def cache_bin_dir() -> Path:
    return cache_root() / "bin" / f"k8s-{kubernetes_version()}"


def _search_dirs() -> list[Path]:
    dirs = [os.environ.get("KUBETUNE_BIN_DIR"), os.environ.get("KUBEBUILDER_ASSETS")]
    return [Path(d).expanduser() for d in dirs if d] + [cache_bin_dir()]


def _find(name: str) -> Path | None:
    for directory in _search_dirs():
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_binaries(names: Iterable[str] = ALL_BINARIES, log: Log = print) -> dict[str, Path]:
    """Return ``{name: path}`` for each binary, building the missing ones."""
    names = list(names)
    unknown = set(names) - set(PACKAGES)
    if unknown:
        raise ValueError(f"unknown control-plane binaries: {sorted(unknown)}")
    found = {name: _find(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        target = cache_bin_dir()
        target.parent.mkdir(parents=True, exist_ok=True)
        # one build at a time per machine (a test run and `devcluster up` may race)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            still_missing = [name for name in missing if _find(name) is None]
            if still_missing:
                build(still_missing, target, log=log)
        for name in missing:
            found[name] = _find(name)
            if found[name] is None:
                raise BuildError(f"{name} is still missing after the build (looked in {_search_dirs()})")
    return found  # type: ignore[return-value]


def build(names: list[str], target: Path, log: Log = print) -> None:
    """Build ``names`` from the wrapper module into ``target`` (created if needed)."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"missing {', '.join(names)} and no `go` on PATH to build them: install Go >= 1.24, "
            "or point KUBETUNE_BIN_DIR (or KUBEBUILDER_ASSETS) at prebuilt binaries"
        )
    version = kubernetes_version()
    ldflags = " ".join([
        "-s -w",
        f"-X k8s.io/component-base/version.gitVersion={version}",
        f"-X k8s.io/component-base/version.gitMajor={version.lstrip('v').split('.')[0]}",
        f"-X k8s.io/component-base/version.gitMinor={version.split('.')[1]}",
    ])
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0")
    env.pop("GOFLAGS", None)  # -mod=mod would rewrite the committed go.mod/go.sum
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        build_log = Path(tmp) / "go-build.log"
        cmd = [go, "build", "-trimpath", "-ldflags", ldflags, "-o", f"{out_dir}/",
               *(PACKAGES[name] for name in names)]
        log(f"devcluster: building {', '.join(names)} (Kubernetes {version}, etcd {etcd_version()}) "
            f"into {target}")
        log("devcluster: a cold build takes several minutes and ~2 GiB of memory; "
            "later runs reuse the binaries")
        started = time.monotonic()
        with open(build_log, "wb") as log_file:
            proc = subprocess.Popen(cmd, cwd=GOMOD_DIR, env=env, stdout=log_file,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                next_note = started + 30
                while proc.poll() is None:
                    time.sleep(0.5)
                    if time.monotonic() >= next_note:
                        log(f"devcluster: still building ... {time.monotonic() - started:.0f}s")
                        next_note += 30
            except BaseException:
                proc.terminate()
                proc.wait()
                raise
        if proc.returncode != 0:
            tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-30:])
            raise BuildError(f"go build failed (exit {proc.returncode}):\n{tail}")
        for name in names:
            candidates = _ETCD_BUILD_NAMES if name == "etcd" else (name,)
            built = next((out_dir / c for c in candidates if (out_dir / c).is_file()), None)
            if built is None:
                raise BuildError(f"go build produced no binary for {name} in {sorted(os.listdir(out_dir))}")
            os.replace(built, target / name)  # same filesystem: atomic
        log(f"devcluster: built {', '.join(names)} in {time.monotonic() - started:.0f}s")
