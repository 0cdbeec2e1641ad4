"""Whether a trial's bundles could ever run on a cluster's nodes (or the node types its
autoscaler adds), and if not, why, in words naming the resource and the largest node;
where bundles go on nodes (first fit).  The ledger's words for a waiting trial live here
too (core/resources.py); pure."""
from __future__ import annotations

from typing import Callable, Iterable

from kubetune.spec.quantities import format_memory
from kubetune.spec.resources import Resources, TrialResources, _fmt


# A queued Trial's words are written to its status, and each change is a write of every
# queued Trial (issue 26: 9.3 status PATCHes per trial with 200 Experiments): they name what
# the trial waits for and behind what, never what moves with each grant or release (the
# free amount, its place in line, whether the room just freed is someone else's turn).
# The exact free amounts are live in the metrics (kubetune_cluster_free).
WAITING_AHEAD = "in use, or kept for requests ahead in line (fair sharing)"


def waiting_for_room(kind: str, amount: float, total: float) -> str:
    """A trial the cluster could hold, waiting while others use or go before it: the same
    words whether the room is taken right now or just freed for the one first in line
    (higher priority, the namespace and Experiment holding the least, a starting
    Experiment's first trial: core/fair_share.py)."""
    return f"waiting for {describe_amount(kind, amount)} of the cluster's {amount_only(kind, total)}: {WAITING_AHEAD}"


def waiting_for_growth(kind: str, amount: float, total: float) -> str:
    """A trial asking for more than the cluster's nodes offer now (it can grow into it)."""
    return f"waiting for {describe_amount(kind, amount)}: the cluster has {describe_amount(kind, total)}"


def waiting_for_one_node(kind: str, amount: float, nodes: int) -> str:
    """Enough is free in all, but no one node holds a bundle."""
    return (f"waiting for {describe_amount(kind, amount)} on one node "
            f"(enough is free in all, split across {nodes_text(nodes)})")


def trial_bundles(resources: TrialResources) -> list[Resources]:
    """The bundles one trial asks for: ``bundles`` copies of the per-bundle amount."""
    return [resources.per_bundle()] * resources.bundles


def total_of(bundles: Iterable[Resources]) -> Resources:
    total = Resources()
    for bundle in bundles:
        total = total + bundle
    return total


def first_fit(bundles: list[Resources], free_per_node: list[Resources]) -> list[int] | None:
    """Node index for each bundle, placing each on the first node with room; None if any cannot."""
    free = list(free_per_node)
    placement = []
    for bundle in bundles:
        for index, node_free in enumerate(free):
            if bundle.fits(node_free):
                free[index] = node_free - bundle
                placement.append(index)
                break
        else:
            return None
    return placement


def short_kinds(bundles: list[Resources], free_per_node: list[Resources],
                free: Callable[[], Resources]) -> set[str]:
    """The resources a request is blocked on right now (empty if it would fit):
    those short in total (``free()``: what the whole cluster has free), else, when it is
    enough in total but fragmented across nodes, those no single node has enough of."""
    free_nodes = list(free_per_node)
    if first_fit(bundles, free_nodes) is not None:
        return set()
    demand, free_now = total_of(bundles), free()
    short = {k for k in demand.kinds() if demand.amount(k) > free_now.amount(k) + 1e-9}
    if not short:
        short = {k for b in bundles for k in b.kinds()
                 if b.amount(k) > max((n.amount(k) for n in free_nodes), default=0.0) + 1e-9}
    return short or set(demand.kinds())


def describe_amount(kind: str, value: float) -> str:
    return f"{format_memory(value)} memory" if kind == "memory" else f"{_fmt(value)} {kind}"


def nodes_text(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def infeasibility(bundles: list[Resources], nodes: list[Resources],
                  node_types: list[Resources] | None) -> str | None:
    """None if each bundle fits some node or node type (and, on a cluster that cannot
    grow, the bundles together fit the nodes together); otherwise why not."""
    shapes = nodes + (node_types or [])
    what = "node type" if node_types else "node"
    for bundle in bundles:
        if any(bundle.fits(shape) for shape in shapes):
            continue
        for kind in bundle.kinds():
            largest = max((shape.amount(kind) for shape in shapes), default=0.0)
            if bundle.amount(kind) > largest + 1e-9:
                return (f"needs {describe_amount(kind, bundle.amount(kind))} per bundle; "
                        f"the largest {what} offers {describe_amount(kind, largest)}")
        return (f"needs {bundle.describe()} per bundle; no single {what} offers all of it "
                f"(closest: {min(shapes, key=bundle.ratio).describe()})")
    return _group_infeasibility(bundles, nodes, node_types)


def _group_infeasibility(bundles: list[Resources], nodes: list[Resources],
                         node_types: list[Resources] | None) -> str | None:
    """The placement group is all-or-nothing: on a cluster that cannot grow (no
    autoscaler node types), its bundles together must fit the nodes together."""
    if node_types is not None or len(bundles) < 2:
        return None
    needed = sum(bundles, Resources())
    offered = sum(nodes, Resources())
    for kind in needed.kinds():
        if needed.amount(kind) > offered.amount(kind) + 1e-9:
            return (f"needs {len(bundles)} bundles, {describe_amount(kind, needed.amount(kind))} in all, "
                    f"placed together; the whole cluster ({nodes_text(len(nodes))}) offers "
                    f"{describe_amount(kind, offered.amount(kind))}")
    return None


def kind_order(kind: str) -> tuple[int, str]:
    # GPU first: when several resources are short, the scarce accelerator is the news.
    return ({"GPU": 0, "CPU": 1, "memory": 2}.get(kind, 3), kind)


def amount_only(kind: str, value: float) -> str:
    return format_memory(value) if kind == "memory" else _fmt(value)
