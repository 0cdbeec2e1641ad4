"""``kubetune devcluster up | down | env | status``: one local control plane at a time,
its state in ``${KUBETUNE_CACHE:-~/.cache/kubetune}/devcluster/``.

Imports stay light here: ``kubetune --help`` loads this module.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def default_state_dir() -> Path:
    from kubetune.devcluster.build import cache_root
    return cache_root() / "devcluster"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "down", "env", "status", "build", "image"],
                        help="up: build (first time) and start; down: stop and clean up; "
                             "env: print `export KUBECONFIG=...`; status: show what runs; "
                             "build: only build (or find) the binaries; image: build the operator "
                             "image from this checkout's Dockerfile into the node (up --node) and "
                             "print its name, for `helm install --set image.repository=...`")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where the plane keeps its state (default: ${KUBETUNE_CACHE:-~/.cache/kubetune}/devcluster)")
    parser.add_argument("--with-scheduler", action="store_true",
                        help="also run kube-scheduler (needed for pod trials)")
    parser.add_argument("--node", action="store_true",
                        help="also run a real node (containerd, kubelet, kube-proxy, cluster DNS; Linux, root): "
                             "pods run as containers; implies --with-scheduler")
    parser.add_argument("--kueue", action="store_true",
                        help="also run Kueue's manager (built from its Go module) with its webhooks, for "
                             "Experiments with spec.queue; implies --with-scheduler")
    parser.add_argument("--kuberay", action="store_true",
                        help="also run the KubeRay operator (built from its Go module) with its CRDs: "
                             "RayClusters become Ray pods; implies --node")
    parser.add_argument("--gpus", type=int, default=0, metavar="N",
                        help="advertise N nvidia.com/gpu on the node (a count, no devices: Ray's logical "
                             "GPUs for examples/kuberay's GPU group); implies --node")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness (up)")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stop(plane) -> None:
    """Stop the plane, and first its node if it has one (pods before the kubelet, ...),
    and before that KubeRay (it would recreate the Ray pods the node deletes) and Kueue."""
    from kubetune.devcluster.kuberay import KubeRay
    from kubetune.devcluster.kueue import KueueManager
    from kubetune.devcluster.node.node import Node
    kuberay = KubeRay.attach(plane, log=_log)
    if kuberay is not None:
        kuberay.stop()
    manager = KueueManager.attach(plane.state_dir / "kueue", log=_log)
    if manager is not None:
        manager.stop()
    node = Node.attach(plane, log=_log)
    if node is not None:
        node.stop()
    plane.stop()


def _operator_image(plane) -> int:
    """The operator image, built (cached by content) and imported into the node's
    containerd: no registry is needed, so the chart runs it with pullPolicy Never."""
    from kubetune.devcluster.node import images
    from kubetune.devcluster.node.node import Node
    node = Node.attach(plane, log=_log) if plane is not None and plane.is_running() else None
    if node is None:
        _log("devcluster: no node is running; start one with `kubetune devcluster up --node` (Linux, root)")
        return 1
    print(node.load(images.operator_image(images.python_image())))
    return 0


def main(args: argparse.Namespace) -> int:
    from kubetune.devcluster.build import BuildError
    from kubetune.devcluster.controlplane import ControlPlane, ControlPlaneError

    if args.action == "build":
        from kubetune.devcluster.build import ALL_BINARIES, ensure_binaries
        from kubetune.devcluster.kueue_build import ensure_kueue
        try:
            for name, path in ensure_binaries(ALL_BINARIES, log=_log).items():
                print(f"{name}: {path}")
            print(f"kueue: {ensure_kueue(log=_log)}")
            # the GitOps tools' status readers, for tests/integration/test_gitops.py
            from kubetune.devcluster.gitops_tools import ensure_gitops_tools
            for name, path in ensure_gitops_tools(log=_log).items():
                print(f"{name}: {path}")
        except BuildError as exc:
            _log(f"devcluster: {exc}")
            return 1
        return 0

    state_dir = (args.state_dir or default_state_dir()).expanduser().resolve()
    plane = ControlPlane.load(state_dir, log=_log)
    export = f"export KUBECONFIG={shlex.quote(str(state_dir / 'kubeconfig'))}"

    if args.action == "up":
        if plane is not None and plane.is_running() and plane.ready():
            _log(f"devcluster: already running at {plane.server}")
            print(export)
            return 0
        if plane is not None:
            _stop(plane)  # leftovers of a crashed plane
        try:
            if args.node or args.kuberay or args.gpus:
                from kubetune.devcluster.node.node import start_cluster
                plane, node = start_cluster(state_dir, log=_log, timeout=max(args.timeout, 180.0))
                if args.gpus:
                    node.advertise({"nvidia.com/gpu": args.gpus})
            else:
                plane = ControlPlane(state_dir, with_scheduler=args.with_scheduler or args.kueue, log=_log)
                plane.start(timeout=args.timeout)
            if args.kueue:
                from kubetune.devcluster.kueue import KueueManager
                KueueManager(state_dir / "kubeconfig", state_dir / "kueue", die_with_parent=False,
                             log=_log).start(timeout=args.timeout)
            if args.kuberay:
                from kubetune.devcluster.kuberay import KubeRay
                KubeRay(plane, log=_log).start(timeout=max(args.timeout, 300.0))
        except (ControlPlaneError, BuildError, RuntimeError, TimeoutError) as exc:
            _log(f"devcluster: start failed: {exc}")
            return 1
        where = f" --state-dir {shlex.quote(str(state_dir))}" if args.state_dir else ""
        _log(f"devcluster: to use it, run:  eval \"$(kubetune devcluster env{where})\"")
        print(export)
        return 0

    if args.action == "down":
        if plane is None:
            _log(f"devcluster: nothing to stop in {state_dir}")
            return 0
        _stop(plane)
        _log(f"devcluster: stopped {', '.join(r.name for r in plane.records) or 'nothing'}; removed {state_dir}")
        return 0

    if args.action == "image":
        return _operator_image(plane)

    if args.action == "env":
        if plane is None or not plane.is_running():
            _log("devcluster: not running; start it with `kubetune devcluster up`")
            return 1
        print(export)
        return 0

    # status
    if plane is None:
        print(f"devcluster: not running (no state in {state_dir})")
        return 1
    alive = plane.alive()
    ready = plane.ready()
    print(f"server:     {plane.server}  ({'ready' if ready else 'NOT ready'})")
    print(f"kubeconfig: {plane.kubeconfig}")
    for record in plane.records:
        print(f"  {record.name:<24} pid {record.pid:<8} {'running' if alive[record.name] else 'EXITED'}  log {record.log}")
    from kubetune.devcluster.kueue import KueueManager
    kueue = KueueManager.attach(state_dir / "kueue", log=_log)
    if kueue is not None and kueue.record is not None:
        alive["kueue"] = kueue.record.is_alive()
        print(f"  {'kueue':<24} pid {kueue.record.pid:<8} {'running' if alive['kueue'] else 'EXITED'}  "
              f"log {kueue.record.log}")
    return 0 if ready and all(alive.values()) else 1
