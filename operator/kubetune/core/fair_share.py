"""Weighted fair queueing of the trials waiting on one shared cluster (issue 26).

The ledger (core/resources.py) serves its waiting requests in the order of the keys
made here, so that no Experiment and no namespace is starved by another that queued
more, or earlier:

1. ``spec.priority`` first, strictly (as before: a higher priority always goes first);
2. then the namespace whose *share* would be smallest once the request is granted:
   what the namespace holds plus its requests ahead of this one, as its dominant
   share of the cluster (the largest fraction of any resource, as in DRF), divided by
   the namespace's weight (operator setting ``--namespace-weights``; default 1);
3. inside a namespace, the same between its Experiments (equal weights);
4. then arrival order.

This is the virtual finish time of weighted fair queueing: two namespaces that keep
the queue full get capacity in the ratio of their weights, and a namespace that
arrives late is served before the one that holds most.  The keys depend on what is
held, so the ledger recomputes them whenever a holding changes (it rebuilds its line
then anyway).  Pure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Iterable, Mapping

from kubetune.spec.resources import Resources

INF = float("inf")
Key = tuple  # (-priority, namespace share, arrival order)


def groups(owner: str) -> tuple[str, str]:
    """The namespace and Experiment of a ledger owner ``<ns>/<experiment>/<trial>``
    (``"", "<experiment>/"`` for ``<experiment>/<trial>``; ``"", ""`` for a bare name)."""
    parts = owner.split("/")
    if len(parts) >= 3:
        return parts[0], f"{parts[0]}/{parts[1]}/"
    if len(parts) == 2:
        return "", f"{parts[0]}/"
    return "", ""


def dominant(amount: Resources, total: Resources) -> float:
    """The largest fraction of any resource of ``total`` that ``amount`` takes (a resource
    the cluster has none of counts one whole unit per unit asked)."""
    share = 0.0
    for kind in amount.kinds():
        have = total.amount(kind)
        share = max(share, amount.amount(kind) / have if have > 0 else amount.amount(kind))
    return share


@dataclass
class Request:
    owner: str
    demand: Resources     # all of its bundles together
    priority: int
    order: int


@dataclass
class FairState:
    """What the keys of the last built line summed, so a new arrival that goes last can
    get its key without a rebuild (one Experiment queueing 1,000 trials: O(1) each)."""
    total: Resources
    weights: Mapping[str, float]
    experiment_sum: dict[str, Resources] = field(default_factory=dict)   # held + waiting so far
    namespace_sum: dict[str, Resources] = field(default_factory=dict)
    namespace_last: dict[str, tuple] = field(default_factory=dict)     # last (-priority, exp share, order)

    def weight(self, namespace: str) -> float:
        weight = self.weights.get(namespace, 1.0)
        return weight if weight > 0 else 1.0


def fair_keys(waiting: Iterable[Request], held: Mapping[str, Resources], total: Resources,
              weights: Mapping[str, float]) -> tuple[dict[str, Key], FairState]:
    """Each waiting owner's key (sort ascending to get the line), and the sums for appends.
    ``held``: owner -> what it holds now."""
    state = FairState(total, weights)
    for owner, amount in held.items():
        namespace, experiment = groups(owner)
        state.experiment_sum[experiment] = state.experiment_sum.get(experiment, Resources()) + amount
        state.namespace_sum[namespace] = state.namespace_sum.get(namespace, Resources()) + amount
    by_experiment: dict[str, list[Request]] = {}
    for request in waiting:
        by_experiment.setdefault(groups(request.owner)[1], []).append(request)
    by_namespace: dict[str, list[tuple[tuple, Request]]] = {}
    for experiment, requests in by_experiment.items():
        for request in sorted(requests, key=lambda r: (-r.priority, r.order)):
            total_so_far = state.experiment_sum.get(experiment, Resources()) + request.demand
            state.experiment_sum[experiment] = total_so_far
            inner = (-request.priority, dominant(total_so_far, total), request.order)
            by_namespace.setdefault(groups(request.owner)[0], []).append((inner, request))
    keys: dict[str, Key] = {}
    for namespace, entries in by_namespace.items():
        entries.sort(key=lambda item: item[0])
        for inner, request in entries:
            keys[request.owner] = _namespace_key(state, namespace, request)
            state.namespace_last[namespace] = inner
    return keys, state


def append_key(state: FairState, request: Request) -> Key | None:
    """The key of a new arrival if it goes last in its Experiment's and its namespace's
    order (then the sums carry on); None if it would go earlier (rebuild the line)."""
    namespace, experiment = groups(request.owner)
    total_so_far = state.experiment_sum.get(experiment, Resources()) + request.demand
    inner = (-request.priority, dominant(total_so_far, state.total), request.order)
    last = state.namespace_last.get(namespace)
    if last is not None and inner < last:
        return None
    state.experiment_sum[experiment] = total_so_far
    state.namespace_last[namespace] = inner
    return _namespace_key(state, namespace, request)


def _namespace_key(state: FairState, namespace: str, request: Request) -> Key:
    total_so_far = state.namespace_sum.get(namespace, Resources()) + request.demand
    state.namespace_sum[namespace] = total_so_far
    return (-request.priority, dominant(total_so_far, state.total) / state.weight(namespace), request.order)


def kept_for_starting(experiment: str, starting: Collection[str], holding: Collection[str]) -> bool:
    """Whether a further trial of ``experiment`` waits because other Experiments are
    being built on the cluster (``starting``: built or restored, not asked yet) while it
    holds some already (``holding``: the Experiments that do).  The line orders only
    those that wait: without this, the Experiments built first in a burst (200 applied
    at once, or all restored after a restart) took their whole parallelism each, filled
    the cluster, and the ones built a moment later waited a whole round of trials for
    their first (issue 26: the last got half their fair share).  So while any is being
    built, everyone gets a first trial and nobody a second; after the burst the line
    shares out the rest.  Nothing is kept beyond the build of the last one."""
    return experiment in holding and any(other != experiment for other in starting)


@dataclass
class Line:
    """The waiting queue in fair order, and what blocks each place in it (core/resources.py)."""
    queue: list[tuple[str, Any]]
    keys: list[tuple]
    fair: FairState
    key_of: dict[str, tuple] = field(default_factory=dict)
    # [i]: a request ahead of place i fits now (one more entry than the queue: past its end)
    fits_before: list[bool] = field(default_factory=lambda: [False])
    first_short: dict[str, int] = field(default_factory=dict)   # kind -> first place short of it
    shorts: dict[tuple, frozenset[str]] = field(default_factory=dict)   # request shape -> short kinds


def unregistered_key(priority: int) -> Key:
    """Where an owner that never registered its wait stands: last of its priority."""
    return (-priority, INF, INF)
