"""The Experiments of the scale shapes (pure: names and bodies, no I/O).

- ``many``: ``experiments`` Experiments spread round-robin over ``namespaces``
  namespaces, each ``trials`` trials of ``reports`` results at ``parallelism``;
- ``big``: one Experiment of ``trials`` one-result trials at ``parallelism``.
Every trial asks ``cpu`` (a fraction: many share one Ray CPU)."""
from __future__ import annotations

import dataclasses
from typing import Any

GROUP, VERSION = "kubetune.dev", "v1alpha1"
ENTRYPOINT = "kubetune.bench.scale.trials:tick"


@dataclasses.dataclass(frozen=True)
class Planned:
    """One Experiment to apply, with what it must end with."""
    namespace: str
    name: str
    trials: int
    reports: int
    parallelism: int
    cpu: float
    shape: str                       # "many" or "big"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def body(self, runs_dir: str = "") -> dict[str, Any]:
        config: dict[str, Any] = {"reports": self.reports}
        if runs_dir:
            config["runs_dir"] = runs_dir
        return {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {"kubetune.dev/bench": "scale", "kubetune.dev/shape": self.shape}},
            "spec": {
                "objective": {"metric": "loss", "mode": "min"},
                "searchSpace": {"x": {"uniform": [0.0, 1.0]}},
                "search": {"algorithm": "random", "seed": 0},
                "budget": {"maxTrials": self.trials, "parallelism": self.parallelism},
                "trial": {"entrypoint": ENTRYPOINT, "resources": {"cpu": self.cpu}, "config": config},
            },
        }


def many(*, experiments: int, namespaces: int, trials: int, reports: int, parallelism: int, cpu: float,
         prefix: str = "scale") -> list[Planned]:
    """Experiment ``i`` goes to namespace ``i % namespaces``: every namespace gets as many
    (give or take one), and the apply order alternates between namespaces."""
    if experiments < 1 or namespaces < 1:
        raise ValueError("experiments and namespaces must be at least 1")
    width = len(str(experiments - 1))
    return [Planned(namespace=f"{prefix}-{i % namespaces:02d}", name=f"e{i:0{width}d}", trials=trials,
                    reports=reports, parallelism=parallelism, cpu=cpu, shape="many")
            for i in range(experiments)]


def big(*, trials: int, parallelism: int, cpu: float, prefix: str = "scale") -> Planned:
    return Planned(namespace=f"{prefix}-big", name="big", trials=trials, reports=1,
                   parallelism=parallelism, cpu=cpu, shape="big")


def namespaces_of(planned: list[Planned]) -> list[str]:
    return sorted({p.namespace for p in planned})
