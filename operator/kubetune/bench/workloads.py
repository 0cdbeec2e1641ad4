"""The benchmark workloads: what each trial does, and how many of them run.

Every trial function exists once, written against a ``report`` callable, and is
wrapped twice: for kubetune (an entrypoint, ``kubetune.report``) and for Ray Tune
(``ray.tune.report``), so both tuners run the very same code.  Results carry
``offered_at``: the moment the function meant to report (its own schedule), which
the throughput workload compares with the moment the tuner processed the result,
and ``reported_at``: when it did report (later if the tuner or the CPU held it up).
"""
from __future__ import annotations

import dataclasses
import os
import time
import uuid
from typing import Any, Callable, Mapping

Report = Callable[[Mapping[str, Any]], None]


# ---------------------------------------------------------------- trial functions

def _tiny(config: Mapping[str, Any], report: Report) -> None:
    """A trivial function: ``reports`` results as fast as the tuner takes them."""
    x = float(config.get("x", 0.0))
    for step in range(1, int(config.get("reports", 10)) + 1):
        report({"loss": x + 1.0 / step})


def _paced(config: Mapping[str, Any], report: Report) -> None:
    """``reports`` results at ``rate`` per second on an absolute schedule: a late
    report (the tuner held the function up) is sent at once, not skipped.  With
    ``barrier_dir``, first wait until ``barrier_count`` trials got there, so that all
    of them report at once whatever the time their worker processes took to start."""
    x = float(config.get("x", 0.0))
    rate, reports = float(config["rate"]), int(config["reports"])
    if config.get("barrier_dir"):
        _barrier(config["barrier_dir"], int(config["barrier_count"]))
    start = time.time()
    for step in range(1, reports + 1):
        due = start + step / rate
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        report({"loss": x + 1.0 / step, "offered_at": due, "reported_at": time.time()})


def _barrier(directory: str, count: int, timeout_s: float = 300.0) -> None:
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, uuid.uuid4().hex), "w").close()
    deadline = time.time() + timeout_s
    while len(os.listdir(directory)) < count and time.time() < deadline:
        time.sleep(0.01)


def tiny(config: dict) -> None:
    import kubetune
    _tiny(config, kubetune.report)


def paced(config: dict) -> None:
    import kubetune
    _paced(config, kubetune.report)


def tiny_tune(config: dict) -> None:
    from ray import tune
    _tiny(config, tune.report)


def paced_tune(config: dict) -> None:
    from ray import tune
    _paced(config, tune.report)


KUBETUNE_ENTRYPOINTS = {"tiny": "kubetune.bench.workloads:tiny", "paced": "kubetune.bench.workloads:paced"}
TUNE_FUNCTIONS: dict[str, Callable[[dict], None]] = {"tiny": tiny_tune, "paced": paced_tune}


# ---------------------------------------------------------------- workloads

@dataclasses.dataclass(frozen=True)
class Workload:
    key: str                  # "tiny", "efficiency", "throughput"
    trials: int
    concurrency: int          # parallelism / max_concurrent_trials
    cpus: int                 # logical CPUs of the Ray instance (one per trial)
    function: str             # "tiny" or "paced"
    reports: int              # results per trial
    rate: float = 0.0         # results per second per trial (paced only)
    barrier: bool = False     # trials start reporting together (see _paced)

    def config(self, barrier_dir: str = "") -> dict[str, Any]:
        """The trial's constants; ``barrier_dir``: a fresh directory of this run."""
        config: dict[str, Any] = {"reports": self.reports}
        if self.function == "paced":
            config["rate"] = self.rate
        if self.barrier:
            config.update(barrier_dir=barrier_dir, barrier_count=self.trials)
        return config

    @property
    def results(self) -> int:
        return self.trials * self.reports

    @property
    def trial_seconds(self) -> float:
        """How long one trial runs by itself (0 for the trivial function)."""
        return self.reports / self.rate if self.rate else 0.0

    def with_trials(self, trials: int) -> "Workload":
        return dataclasses.replace(self, trials=trials)

    def kubetune_spec(self, barrier_dir: str = "") -> dict[str, Any]:
        """The Experiment spec kubetune runs: random search, FIFO, one CPU per trial."""
        return {
            "objective": {"metric": "loss", "mode": "min"},
            "searchSpace": {"x": {"uniform": [0.0, 1.0]}},
            "search": {"algorithm": "random", "seed": 0},
            "budget": {"maxTrials": self.trials, "parallelism": self.concurrency},
            "trial": {"entrypoint": KUBETUNE_ENTRYPOINTS[self.function], "resources": {"cpu": 1},
                      "config": self.config(barrier_dir)},
        }


def workloads(quick: bool = False) -> dict[str, Workload]:
    """Workloads 1-3 of issue 7; ``quick`` shrinks them for a smoke run."""
    if quick:
        return {
            "tiny": Workload("tiny", 40, 8, 8, "tiny", 10),
            "efficiency": Workload("efficiency", 48, 16, 16, "paced", 10, 10.0),
            "throughput": Workload("throughput", 8, 8, 8, "paced", 100, 20.0, barrier=True),
        }
    return {
        "tiny": Workload("tiny", 200, 8, 8, "tiny", 10),
        "efficiency": Workload("efficiency", 400, 16, 16, "paced", 10, 10.0),
        "throughput": Workload("throughput", 32, 32, 32, "paced", 400, 20.0, barrier=True),
    }
