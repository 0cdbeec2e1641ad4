"""The node's network: a bridge for the pods, the CNI configuration containerd uses,
and the egress guard.

Pods live on ``POD_CIDR`` behind the bridge ``BRIDGE`` (the node's address,
``BRIDGE_IP``, is the pods' gateway, the apiserver's and the DNS server's address).
Pod and Service traffic never leaves the machine: before any pod starts, the guard
drops every forwarded packet from or to the pod network that does not stay on the
bridge.  It sits in the mangle table, which the kernel walks before the filter table,
so no rule kube-proxy inserts (KUBE-FORWARD accepts its marked packets) can get in
front of it.  NAT masquerading is off: a pod address never appears on the uplink.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

BRIDGE = "kubetune0"
POD_CIDR = "10.244.0.0/16"
BRIDGE_IP = "10.244.0.1"
GUARD_CHAIN = "KUBETUNE-EGRESS-GUARD"
NETWORK_NAME = "kubetune"
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}


class NetworkError(RuntimeError):
    pass


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def cni_config(state_dir: Path) -> dict:
    return {
        "cniVersion": "1.0.0", "name": NETWORK_NAME,
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR, "gateway": BRIDGE_IP}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(state_dir / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def write_cni_config(conf_dir: Path, state_dir: Path) -> None:
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "10-kubetune.conflist").write_text(json.dumps(cni_config(state_dir), indent=1))


def guard_rules() -> list[list[str]]:
    return [["-s", POD_CIDR, "!", "-o", BRIDGE, "-j", "DROP"],
            ["-d", POD_CIDR, "!", "-i", BRIDGE, "-j", "DROP"]]


def install_guard(saved_sysctls: Path) -> None:
    """Create the bridge and the egress guard (idempotent); the sysctls it changes are
    saved in ``saved_sysctls`` (once) for ``teardown`` to restore."""
    if run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    if BRIDGE_IP not in run("ip", "-4", "addr", "show", "dev", BRIDGE).stdout:
        run("ip", "addr", "add", f"{BRIDGE_IP}/16", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    remove_guard_chain()
    run("iptables", "-w", "-t", "mangle", "-N", GUARD_CHAIN)
    for rule in guard_rules():
        run("iptables", "-w", "-t", "mangle", "-A", GUARD_CHAIN, *rule)
    run("iptables", "-w", "-t", "mangle", "-I", "FORWARD", "1", "-j", GUARD_CHAIN)
    if not saved_sysctls.exists():
        saved_sysctls.parent.mkdir(parents=True, exist_ok=True)
        saved_sysctls.write_text(json.dumps({key: Path("/proc/sys", key).read_text().strip() for key in SYSCTLS}))
    for key, value in SYSCTLS.items():    # only after the guard is in place
        Path("/proc/sys", key).write_text(value)


def remove_guard_chain() -> None:
    while run("iptables", "-w", "-t", "mangle", "-D", "FORWARD", "-j", GUARD_CHAIN, check=False).returncode == 0:
        pass
    run("iptables", "-w", "-t", "mangle", "-F", GUARD_CHAIN, check=False)
    run("iptables", "-w", "-t", "mangle", "-X", GUARD_CHAIN, check=False)


def teardown(saved_sysctls: Path) -> None:
    """Restore the sysctls, remove the bridge, then the guard (no pod is left to use it)."""
    if saved_sysctls.exists():
        for key, value in json.loads(saved_sysctls.read_text()).items():
            Path("/proc/sys", key).write_text(value)
        saved_sysctls.unlink()
    run("ip", "link", "delete", BRIDGE, check=False)
    remove_guard_chain()
