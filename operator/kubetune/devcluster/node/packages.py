"""The Debian packages a real node needs, installed with apt-get only when missing.

containerd and runc run the containers, containernetworking-plugins wires them to a
bridge, iptables carries kube-proxy's Services and kubetune's egress guard, buildah
builds the images from the project's Dockerfile, and debootstrap makes the base root
filesystems (no registry is reachable: every image is built here).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

# package -> a file it installs (present: the package is there)
PACKAGES = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
    "buildah": "/usr/bin/buildah",
    "debootstrap": "/usr/sbin/debootstrap",
    "conntrack": "/usr/sbin/conntrack",   # kube-proxy clears stale UDP entries (DNS) with it
    "busybox-static": "/bin/busybox",     # the busybox:1.36 image of examples/pod-stdout.yaml
}


class PackageError(RuntimeError):
    pass


def missing(packages: dict[str, str] = PACKAGES) -> list[str]:
    return [name for name, marker in packages.items() if not Path(marker).exists()]


def why_not_here() -> str | None:
    """Why this machine cannot install and run a node, or None if it can."""
    if os.uname().sysname != "Linux":
        return f"a real node needs Linux (this is {os.uname().sysname})"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, iptables, mounts)"
    if missing() and shutil.which("apt-get") is None:
        return f"missing {', '.join(missing())} and no apt-get to install them"
    return None


def ensure(log: Callable[[str], None] = print) -> None:
    """apt-get install whatever is missing (idempotent: nothing runs when all are there)."""
    needed = missing()
    if not needed:
        return
    log(f"node: installing Debian packages {', '.join(needed)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # the packages' service scripts must not start a system containerd: kubetune runs
    # its own, with its own configuration (exit 101: "action forbidden by policy")
    policy = Path("/usr/sbin/policy-rc.d")
    ours = not policy.exists()
    if ours:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        for attempt in ("update", "install"):
            argv = (["apt-get", "update", "-q"] if attempt == "update" else
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *needed])
            result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
            if result.returncode != 0:
                raise PackageError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-3000:]}"
                                   f"\n{result.stderr[-3000:]}")
    finally:
        if ours:
            policy.unlink(missing_ok=True)
    still = missing()
    if still:
        raise PackageError(f"still missing after apt-get install: {', '.join(still)}")
