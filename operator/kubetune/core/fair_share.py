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
4. on equal shares, the Experiment then the namespace served fewer trials so far (the
   ledger's grants): an early Experiment's second trial does not go before a late
   one's first only because it arrived first (issue 26: the last applied waited
   through hundreds of completions);
5. then arrival order.

This is the virtual finish time of weighted fair queueing: two namespaces that keep
the queue full get capacity in the ratio of their weights, and a namespace that
arrives late is served before the one that holds most.  The keys depend on what is
held, so the ledger recomputes them whenever a holding changes (it rebuilds its line
then anyway).  Pure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import add
from typing import Any, Collection, Iterable, Mapping

from kubetune.spec.resources import Resources

INF = float("inf")
Key = tuple  # (-priority, namespace share, served experiment, served namespace, arrival order)


def groups(owner: str) -> tuple[str, str]:
    """The namespace and Experiment of a ledger owner ``<ns>/<experiment>/<trial>``
    (``"", "<experiment>/"`` for ``<experiment>/<trial>``; ``"", ""`` for a bare name)."""
    parts = owner.split("/")
    if len(parts) >= 3:
        return parts[0], f"{parts[0]}/{parts[1]}/"
    if len(parts) == 2:
        return "", f"{parts[0]}/"
    return "", ""


@dataclass
class Request:
    owner: str
    demand: Resources     # all of its bundles together
    priority: int
    order: int
    # Derived once: the ledger keeps a request across rebuilds of its line
    namespace: str = field(init=False)
    experiment: str = field(init=False)
    kinds: frozenset[str] = field(init=False)
    _vectors: dict[tuple[str, ...], "Vector | None"] = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.namespace, self.experiment = groups(self.owner)
        self.kinds = frozenset(self.demand.kinds())

    def vector(self, kinds: tuple[str, ...]) -> "Vector | None":
        if kinds not in self._vectors:
            self._vectors = {kinds: _vector(self.demand, kinds)}     # the kinds seldom change
        return self._vectors[kinds]


# The sums below are over every waiting request each time the line is rebuilt (after
# every grant and release: hundreds of requests with 200 Experiments on one cluster), so
# they are kept as tuples of integers, in units of 1/10,000 (the precision Resources
# rounds to) over the kinds anybody asks for, not as Resources objects: exact sums, so
# equal shares tie exactly, and a tenth of the cost.
SCALE = 10_000
Vector = tuple  # of int, one per FairState.kinds


def _vector(amount: Resources, kinds: tuple[str, ...]) -> Vector | None:
    """``amount`` in units of 1/SCALE over ``kinds``; None if it asks for another kind."""
    amounts = amount.to_ray()
    if any(kind not in kinds for kind in amounts):
        return None
    return tuple(round(amounts.get(kind, 0.0) * SCALE) for kind in kinds)


def _plus(a: Vector, b: Vector) -> Vector:
    return tuple(map(add, a, b))


def dominant(amount: Vector, total: Vector) -> float:
    """The largest fraction of any resource of ``total`` that ``amount`` takes (a resource
    the cluster has none of counts one whole unit per unit asked): DRF's dominant share."""
    share = 0.0
    for asked, have in zip(amount, total):
        if asked > 0:
            share = max(share, asked / have if have > 0 else asked / SCALE)
    return share


@dataclass
class FairState:
    """What the keys of the last built line summed, so a new arrival that goes last can
    get its key without a rebuild (one Experiment queueing 1,000 trials: O(1) each)."""
    total: Resources
    weights: Mapping[str, float]
    served: Mapping[str, int] = field(default_factory=dict)   # Experiment or namespace -> trials granted
    kinds: tuple[str, ...] = ()            # what the vectors count: every kind asked for or held
    total_vector: Vector = ()
    experiment_sum: dict[str, Vector] = field(default_factory=dict)   # held + waiting so far
    namespace_sum: dict[str, Vector] = field(default_factory=dict)
    namespace_last: dict[str, tuple] = field(default_factory=dict)     # last (-priority, exp share, order)

    def weight(self, namespace: str) -> float:
        weight = self.weights.get(namespace, 1.0)
        return weight if weight > 0 else 1.0

    def zero(self) -> Vector:
        return (0,) * len(self.total_vector)


def fair_keys(waiting: Iterable[Request], held: Mapping[str, Resources], total: Resources,
              weights: Mapping[str, float], served: Mapping[str, int] | None = None) -> tuple[dict[str, Key], FairState]:
    """Each waiting owner's key (sort ascending to get the line), and the sums for appends.
    ``held``: owner -> what it holds now; ``served``: Experiment (``"ns/exp/"``) or
    namespace -> the trials granted to it so far."""
    waiting = list(waiting)
    kinds = tuple(sorted(frozenset().union(*(r.kinds for r in waiting),
                                           *(amount.kinds() for amount in held.values()))))
    total_vector = tuple(round(total.amount(kind) * SCALE) for kind in kinds)
    state = FairState(total, weights, served or {}, kinds, total_vector)
    zero = state.zero()
    for owner, amount in held.items():
        namespace, experiment = groups(owner)
        vector = _vector(amount, kinds)
        state.experiment_sum[experiment] = _plus(state.experiment_sum.get(experiment, zero), vector)
        state.namespace_sum[namespace] = _plus(state.namespace_sum.get(namespace, zero), vector)
    by_experiment: dict[str, list[Request]] = {}
    for request in waiting:
        by_experiment.setdefault(request.experiment, []).append(request)
    by_namespace: dict[str, list[tuple[tuple, Request, Vector]]] = {}
    for experiment, requests in by_experiment.items():
        for request in sorted(requests, key=lambda r: (-r.priority, r.order)):
            demand = request.vector(kinds)
            total_so_far = _plus(state.experiment_sum.get(experiment, zero), demand)
            state.experiment_sum[experiment] = total_so_far
            inner = _inner_key(state, request, total_so_far)
            by_namespace.setdefault(request.namespace, []).append((inner, request, demand))
    keys: dict[str, Key] = {}
    for namespace, entries in by_namespace.items():
        entries.sort(key=lambda item: item[0])
        for inner, request, demand in entries:
            keys[request.owner] = _namespace_key(state, namespace, request, demand)
            state.namespace_last[namespace] = inner
    return keys, state


def append_key(state: FairState, request: Request) -> Key | None:
    """The key of a new arrival if it goes last in its Experiment's and its namespace's
    order (then the sums carry on); None if it would go earlier (rebuild the line)."""
    namespace, experiment = request.namespace, request.experiment
    demand = request.vector(state.kinds)
    if demand is None:          # a kind the line has not seen: rebuild
        return None
    total_so_far = _plus(state.experiment_sum.get(experiment, state.zero()), demand)
    inner = _inner_key(state, request, total_so_far)
    last = state.namespace_last.get(namespace)
    if last is not None and inner < last:
        return None
    state.experiment_sum[experiment] = total_so_far
    state.namespace_last[namespace] = inner
    return _namespace_key(state, namespace, request, demand)


def _inner_key(state: FairState, request: Request, experiment_sum: Vector) -> tuple:
    """Its order among its namespace's requests."""
    return (-request.priority, dominant(experiment_sum, state.total_vector), state.served.get(request.experiment, 0),
            request.order)


def _namespace_key(state: FairState, namespace: str, request: Request, demand: Vector) -> Key:
    total_so_far = _plus(state.namespace_sum.get(namespace, state.zero()), demand)
    state.namespace_sum[namespace] = total_so_far
    served = state.served
    return (-request.priority, dominant(total_so_far, state.total_vector) / state.weight(namespace),
            served.get(request.experiment, 0), served.get(namespace, 0), request.order)


@dataclass
class Waiting:
    """A request waiting in the ledger's line: its bundles, priority and arrival order."""
    bundles: list[Resources]
    priority: int
    order: int            # arrival order: smaller waited longer
    # Made once per request, not at every rebuild of the line (which sums and groups them all)
    demand: Resources = field(init=False, compare=False)
    shape: tuple = field(init=False, compare=False)
    request: Request | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        demand = Resources()
        for bundle in self.bundles:
            demand = demand + bundle
        self.demand = demand
        self.shape = tuple(tuple(sorted(b.to_ray().items())) for b in self.bundles)

    def request_of(self, owner: str) -> Request:
        if self.request is None:
            self.request = Request(owner, self.demand, self.priority, self.order)
        return self.request


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
    return (-priority, INF, INF, INF, INF)
