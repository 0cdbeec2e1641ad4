"""The parsed Experiment: frozen dataclasses, snake_case, defaults already applied.

Field names are the CRD's (crds/experiment.yaml) in snake_case; ``parse.py`` builds them
from the CR's camelCase dict and is the only place that validates.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubetune.spec.resources import TrialResources

ALGORITHMS = ("random", "grid", "tpe", "cmaes", "gp", "qmc", "nsgaii", "auto")   # auto: spec/auto_search.py
# Optuna's samplers that cannot search several objectives at once
SINGLE_OBJECTIVE_ALGORITHMS = ("cmaes", "gp")
# scheduler names are not listed here: each scheduler's file in core/schedulers/ says its
# own (the package finds them), and core.schedulers.scheduler_class refuses other names
DISTRIBUTIONS = ("uniform", "loguniform", "quniform", "randint", "choice", "ordinal")
EXECUTORS = ("ray", "pod")
WARM_START_SPACES = ("full", "boundingBox")   # spec.warmStart.searchSpace
METRICS_COLLECTORS = ("push", "stdout")
# spec.budget.onExhausted: stop running trials at their next report, or let each finish its rung
BUDGET_EXHAUSTED_ACTIONS = ("stop", "finishRung")   # executor pod: how a trial pod's results reach the operator


class SpecError(ValueError):
    """A user-fixable problem in an Experiment spec, located by its field path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class Param:
    """One search-space entry.

    ``kind`` is the distribution name. ``uniform``/``loguniform``: floats in [low, high].
    ``quniform``: multiples of ``q`` from ``low`` up to ``high`` (ints when low, high and q
    are all integers). ``randint``: integers in [low, high) like Ray Tune.
    ``choice``: one of ``choices``, unordered. ``ordinal``: one of ``choices``, increasing
    numbers whose order the samplers use (Katib's ``discrete``): the samplers see its
    position in the list, 0..n-1 (core/samplers.py: to_study, from_study).
    """
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    q: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def is_integer(self) -> bool:
        if self.kind == "randint":
            return True
        return self.kind == "quniform" and all(isinstance(v, int) for v in (self.low, self.high, self.q))

    def grid_values(self) -> list[Any] | None:
        """Every value this parameter can take, or None when it is continuous.  For grid
        search only, whose size parse.py bounds: anything else uses ``grid_value`` and
        ``nearest_grid_value``, in O(1) memory (a PBT ``randint: [0, 2147483647]`` as a
        list is ~80 GiB)."""
        size = self.grid_size()
        return None if size is None else [self.grid_value(i) for i in range(size)]

    def grid_size(self) -> int | None:
        if self.kind in ("choice", "ordinal"):
            return len(self.choices)
        if self.kind == "randint":
            return int(self.high - self.low)
        if self.kind == "quniform":
            return int((self.high - self.low) / self.q + 1e-9) + 1
        return None

    def contains(self, value: Any) -> bool:
        """Is ``value`` one this parameter can take?  O(1): nothing is materialised (a
        ``randint: [0, 2147483647]`` as a list is tens of GiB)."""
        if self.kind == "choice":
            return any(type(c) is type(value) and c == value for c in self.choices)
        if self.kind == "ordinal":
            return not isinstance(value, bool) and isinstance(value, (int, float)) and value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind == "randint":
            return float(value).is_integer() and self.low <= value < self.high
        if not self.low <= value <= self.high:
            return False
        if self.kind == "quniform":
            return self.nearest_grid_value(value) == value or \
                abs(self.nearest_grid_value(value) - value) <= 1e-9 * max(abs(self.q), 1.0)
        return True

    def grid_value(self, index: int) -> Any:
        """The ``index``-th of ``grid_values()``, computed: 0 <= index < grid_size()."""
        if self.kind in ("choice", "ordinal"):
            return self.choices[index]
        if self.kind == "randint":
            return int(self.low) + index
        if self.kind == "quniform":
            value = self.low + index * self.q
            # Float steps drift (0.1 * 3 != 0.3); round to q's precision.
            return value if self.is_integer else round(value, 12)
        raise ValueError(f"a {self.kind} parameter has no grid")

    def nearest_grid_value(self, value: float) -> Any:
        """The grid value closest to ``value`` (the lower one on a tie), within bounds."""
        if self.kind == "randint":
            steps, origin = 1, int(self.low)
        elif self.kind == "quniform":
            steps, origin = self.q, self.low
        else:
            raise ValueError(f"a {self.kind} parameter has no numeric grid")
        index = math.ceil((value - origin) / steps - 0.5)
        return self.grid_value(min(max(index, 0), self.grid_size() - 1))


@dataclass(frozen=True)
class Objective:
    metric: str
    mode: str                      # "min" | "max"
    goal: float | None = None

    def better(self, a: float, b: float) -> bool:
        """True when ``a`` is strictly better than ``b`` in this objective's direction."""
        return a < b if self.mode == "min" else a > b

    def reached(self, value: float) -> bool:
        if self.goal is None:
            return False
        return value <= self.goal if self.mode == "min" else value >= self.goal


@dataclass(frozen=True)
class Constraint:
    """A bound on a reported metric: a trial is feasible when ``min <= value <= max``."""
    metric: str
    max: float | None = None
    min: float | None = None

    def violation(self, value: float | None) -> float:
        """Optuna's convention: <= 0 is feasible; a metric never reported is infeasible."""
        if value is None or value != value:
            return float("inf")
        over = value - self.max if self.max is not None else float("-inf")
        under = self.min - value if self.min is not None else float("-inf")
        return max(over, under)

    def describe(self, value: float | None) -> str:
        if value is None:
            return f"{self.metric} not reported"
        if self.max is not None and value > self.max:
            return f"{self.metric} {value:.6g} > max {self.max:g}"
        return f"{self.metric} {value:.6g} < min {self.min:g}"


@dataclass(frozen=True)
class WarmStart:
    """Earlier Experiments (same namespace) whose completed trials seed the search."""
    experiments: tuple[str, ...]
    max_trials: int = 1000
    # full: the spec's searchSpace; boundingBox: the box of their best trials (core/warm_box.py)
    search_space: str = "full"


@dataclass(frozen=True)
class SearchSpec:
    algorithm: str = "random"           # never "auto": parse resolves it (``auto`` says why)
    seed: int | None = None
    initial_points: tuple[Mapping[str, Any], ...] = ()   # asked first, in order (Optuna enqueue_trial)
    auto: str = ""                      # with algorithm: auto, what it chose and why; else ""


@dataclass(frozen=True)
class SchedulerSpec:
    type: str = "fifo"
    max_iterations: int | None = None
    grace_period: int = 1
    reduction_factor: int = 3
    perturbation_interval: int = 5
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25


@dataclass(frozen=True)
class Budget:
    max_trials: int = 10
    parallelism: int = 1
    max_failed_trials: int | None = None
    max_duration_s: float | None = None
    # with Kueue (spec.queue): at most this many trials wait for admission at once, so a
    # 1,000-trial Experiment does not flood the ClusterQueue (Kueue admits about one
    # workload per ClusterQueue per scheduling cycle)
    admission_window: int = 4
    # GPU- and CPU-hours the Experiment may use, counted from what its trials really ran
    # (core/budget.py); None: no limit
    gpu_hours: float | None = None
    cpu_hours: float | None = None
    on_exhausted: str = "stop"     # BUDGET_EXHAUSTED_ACTIONS


@dataclass(frozen=True)
class TrialTemplate:
    entrypoint: str | None = None
    resources: TrialResources = field(default_factory=TrialResources)
    max_failures: int = 0
    queue_timeout_s: float | None = None
    # each run of the trial may last this long; then it ends Failed (TimedOut), not retried
    timeout_s: float | None = None
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    template: Mapping[str, Any] | None = None   # executor pod: the PodTemplateSpec of one trial
    metrics_collector: str = "push"            # executor pod: push (HTTP) or stdout (log lines)
    expected_iteration_seconds: float | None = None   # what `kubetune plan` costs one iteration at


# a Kueue LocalQueue or WorkloadPriorityClass name, given to Kueue as a label value
KUEUE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")

# ``${params.<name>}`` in a pod template's command/args: replaced by the parameter's value
PARAM_REFERENCE = re.compile(r"\$\{params\.([^}]*)\}")

# A pod trial sees each parameter as the environment variable KUBETUNE_PARAM_<NAME>.
# The CRD allows these characters in a name (so its CEL rule can map names the same way)
# and refuses two names with one variable; spec/search_space.py checks the same for `kubetune run`.
PARAM_ENV_PREFIX = "KUBETUNE_PARAM_"
PARAM_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")


def param_env_name(name: str) -> str:
    return PARAM_ENV_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", str(name)).upper()


@dataclass(frozen=True)
class CheckpointSpec:
    storage: str | None = None
    keep_last: int = 2
    keep_best: int = 0
    delete_on_completion: bool = False


@dataclass(frozen=True)
class RaySpec:
    # The Ray auth token is the operator's, not an Experiment's: the chart gives it
    # RAY_AUTH_TOKEN from its ray.tokenSecretRef Secret (read by the kubelet, so the
    # operator needs no RBAC on Secrets), and a driver process inherits it.
    address: str | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    objective: Objective                 # the first of ``objectives``: the one a single-objective run has
    search_space: Mapping[str, Param]
    search: SearchSpec = field(default_factory=SearchSpec)
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    budget: Budget = field(default_factory=Budget)
    trial: TrialTemplate = field(default_factory=TrialTemplate)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    ray: RaySpec = field(default_factory=RaySpec)
    executor: str = "ray"
    priority: int = 0
    suspend: bool = False
    queue: str | None = None             # executor pod: the Kueue LocalQueue its trials wait in
    priority_class: str | None = None    # executor pod: a Kueue WorkloadPriorityClass
    # spec.objectives (several objectives) or (objective,) for the single form
    objectives: tuple[Objective, ...] = ()
    # one per objective, in the objectives' own directions; None: no hypervolume
    reference_point: tuple[float, ...] | None = None
    constraints: tuple[Constraint, ...] = ()
    warm_start: WarmStart | None = None

    def __post_init__(self) -> None:
        if not self.objectives:
            object.__setattr__(self, "objectives", (self.objective,))

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1
