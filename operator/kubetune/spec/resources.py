"""The one resource type: ``Resources`` (CPU, GPU, memory bytes, custom; Ray's names)
with the arithmetic the ledger (core/resources.py) does on capacity, free and used
amounts, and ``TrialResources``, what one trial asks for: those amounts per bundle and
how many bundles.  From the spec (spec/parse.py) to the executors (a Ray placement
group, a pod's requests) and the ledger, the same type.  Pure."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kubetune.spec.quantities import format_memory

# Ray accounts resources in units of 1/10000; rounding to that keeps repeated
# add/sub of 0.1 CPU from drifting into "0.30000000000000004 free".
_PRECISION = 4


def _round(value: float) -> float:
    return round(value, _PRECISION)


def _fmt(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Resources:
    """CPU, GPU, memory (bytes) and custom resources. Never negative."""
    cpu: float = 0.0
    gpu: float = 0.0
    memory: float = 0.0
    custom: Mapping[str, float] = field(default_factory=dict)

    def _amounts(self) -> dict[str, float]:
        return {"CPU": self.cpu, "GPU": self.gpu, "memory": self.memory, **self.custom}

    @staticmethod
    def _from_amounts(amounts: Mapping[str, float]) -> "Resources":
        custom = {k: v for k, v in amounts.items() if k not in ("CPU", "GPU", "memory") and v > 0}
        return Resources(cpu=amounts.get("CPU", 0.0), gpu=amounts.get("GPU", 0.0),
                         memory=amounts.get("memory", 0.0), custom=custom)

    def __add__(self, other: "Resources") -> "Resources":
        if not self.custom and not other.custom:     # the common case, without dicts
            return Resources(_round(self.cpu + other.cpu), _round(self.gpu + other.gpu),
                             _round(self.memory + other.memory))
        a, b = self._amounts(), other._amounts()
        return Resources._from_amounts({k: _round(a.get(k, 0.0) + b.get(k, 0.0)) for k in a.keys() | b.keys()})

    def __sub__(self, other: "Resources") -> "Resources":
        """Subtracting more than there is leaves zero: a free amount is never negative."""
        if not self.custom and not other.custom:
            return Resources(max(0.0, _round(self.cpu - other.cpu)), max(0.0, _round(self.gpu - other.gpu)),
                             max(0.0, _round(self.memory - other.memory)))
        a, b = self._amounts(), other._amounts()
        return Resources._from_amounts({k: max(0.0, _round(a.get(k, 0.0) - b.get(k, 0.0))) for k in a})

    def scaled(self, factor: float) -> "Resources":
        return Resources._from_amounts({k: _round(v * factor) for k, v in self._amounts().items()})

    def fits(self, capacity: "Resources") -> bool:
        """True when this amount fits inside ``capacity`` in every resource."""
        if not self.custom:
            return (self.cpu <= capacity.cpu + 1e-9 and self.gpu <= capacity.gpu + 1e-9
                    and self.memory <= capacity.memory + 1e-9)
        have = capacity._amounts()
        return all(v <= have.get(k, 0.0) + 1e-9 for k, v in self._amounts().items() if v > 0)

    def ratio(self, capacity: "Resources") -> float:
        """How full ``capacity`` would be with this amount: the largest used fraction
        over the resources ``capacity`` has (inf if this needs something it lacks)."""
        have = capacity._amounts()
        worst = 0.0
        for k, v in self._amounts().items():
            if v <= 0:
                continue
            if have.get(k, 0.0) <= 0:
                return float("inf")
            worst = max(worst, v / have[k])
        return worst

    def kinds(self) -> list[str]:
        """Names of the resources this amount asks for (Ray's spelling)."""
        return [k for k, v in self._amounts().items() if v > 0]

    def amount(self, kind: str) -> float:
        return self._amounts().get(kind, 0.0)

    def to_ray(self) -> dict[str, float]:
        """The dict Ray's ``resources=`` / placement-group bundles / ``request_resources`` take."""
        return {k: v for k, v in self._amounts().items() if v > 0}

    @staticmethod
    def from_ray(amounts: Mapping[str, float]) -> "Resources":
        """From a Ray resource dict (``ray.nodes()[i]["Resources"]``); Ray's internal
        per-node markers such as ``node:10.0.0.1`` are not schedulable amounts."""
        return Resources._from_amounts({k: float(v) for k, v in amounts.items()
                                        if not k.startswith("node:") and k != "object_store_memory"})

    def describe(self) -> str:
        parts = [f"{_fmt(self.cpu)} CPU" if self.cpu else "", f"{_fmt(self.gpu)} GPU" if self.gpu else "",
                 f"{format_memory(self.memory)} memory" if self.memory else ""]
        parts += [f"{_fmt(v)} {k}" for k, v in sorted(self.custom.items()) if v]
        return ", ".join(p for p in parts if p) or "nothing"


@dataclass(frozen=True)
class TrialResources(Resources):
    """What one trial asks for: ``bundles`` identical bundles of these amounts (one CPU
    unless it says otherwise).  ``bundles`` > 1 reserves them in one placement group;
    the trial's own process takes bundle 0, the rest are for the workers it starts."""
    cpu: float = 1.0
    bundles: int = 1

    @property
    def memory_bytes(self) -> int | None:
        """The memory of one bundle in whole bytes (what Ray and a pod's requests take); None: none asked."""
        return int(self.memory) if self.memory else None

    def per_bundle(self) -> Resources:
        """One bundle, as the amount the ledger adds and subtracts (``amount(kind)`` is
        one bundle's amount of one kind, as for any ``Resources``)."""
        return Resources(cpu=self.cpu, gpu=self.gpu, memory=self.memory, custom=dict(self.custom))

    @classmethod
    def of(cls, resources: Any) -> "TrialResources":
        """``resources`` as given to an executor: itself, None (the defaults) or its
        dict form (a driver process or a Ray actor hands it over as JSON)."""
        if resources is None:
            return cls()
        if isinstance(resources, TrialResources):
            return resources
        get = resources.get if isinstance(resources, Mapping) else \
            (lambda name, default=None: getattr(resources, name, default))
        cpu = get("cpu", None)
        return cls(cpu=1.0 if cpu is None else float(cpu),
                   gpu=float(get("gpu", 0.0) or 0.0),
                   memory=float(get("memory", None) or get("memory_bytes", None) or 0.0),
                   custom=dict(get("custom", None) or {}),
                   bundles=int(get("bundles", 1) or 1))

    def bundle(self) -> dict[str, float]:
        """One bundle in Ray's resource names (CPU always, even 0: Ray's default is 1)."""
        amounts: dict[str, float] = {"CPU": self.cpu}
        if self.gpu:
            amounts["GPU"] = self.gpu
        if self.memory:
            amounts["memory"] = float(self.memory)
        amounts.update({k: float(v) for k, v in self.custom.items()})
        return amounts

    def total(self) -> dict[str, float]:
        return {k: v * self.bundles for k, v in self.bundle().items()}
