"""containerd's CLI (``ctr``) on the node's own socket, in the kubelet's namespace (k8s.io).

One place builds the command line, so the image loader, the start-up probe and the teardown
cannot disagree on the socket or the namespace.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

NAMESPACE = "k8s.io"      # the CRI plugin's: where the kubelet's images and containers live


class CtrError(RuntimeError):
    pass


class Ctr:
    def __init__(self, socket: Path):
        self.socket = socket

    def argv(self, *args: str) -> list[str]:
        return ["ctr", "--address", str(self.socket), "-n", NAMESPACE, *args]

    def __call__(self, *args: str, timeout: float = 120) -> str:
        """``ctr args...``'s output; raises CtrError with its stderr when it fails."""
        result = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise CtrError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def attempt(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """``ctr args...`` whose failure the caller weighs itself (clean-up goes on regardless)."""
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout)

    def serves(self) -> bool:
        """Whether a containerd answers on the socket."""
        return subprocess.run(["ctr", "--address", str(self.socket), "version"],
                              capture_output=True, timeout=10).returncode == 0
