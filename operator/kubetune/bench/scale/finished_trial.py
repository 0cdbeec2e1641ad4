"""A finished Trial as the operator writes it, for the ``kubectl get trials`` benchmark.

Not a hand-written guess: the Experiment of the scale bench's ``big`` shape is parsed by
the operator's spec parser, its own ``TrialRunner`` creates, launches and completes one
trial fed ``results`` results, and ``controller/render.py`` renders its body and status
(with the runner's ``decisionState``), as ``controller/status_writer.py`` does.  So the
status carries what a real one carries: the downsampled curve (``core/curve.py``, at most
64 points), the study's steps, usage, times."""
from __future__ import annotations

import copy
import time
from typing import Any, Mapping

from kubetune.controller import render
from kubetune.core.runner import TrialRunner
from kubetune.core.types import LaunchTrial, Result
from kubetune.spec import parse_experiment


def finished_status(spec_body: Mapping[str, Any], results: int, experiment: str = "big") -> dict[str, Any]:
    """The status the operator writes for a Succeeded trial of ``results`` results."""
    spec = parse_experiment(dict(spec_body))
    began = time.time()
    runner = TrialRunner(spec, experiment=experiment, start_time=began)
    launch = next(d for d in runner.step(began) if isinstance(d, LaunchTrial))
    name, now = launch.name, began + 1.0
    runner.on_trial_launched(name, now)
    runner.on_trial_usage(name, launch.attempt, now, now)
    for i in range(1, results + 1):
        now += 0.5
        value = 0.3 + 1.0 / i     # a learning curve, so every point is a distinct float
        runner.on_trial_result(name, Result(seq=launch.last_result_seq + i, iteration=i,
                                            metrics={"loss": value}, timestamp=now, attempt=launch.attempt), now)
    # the run's end as its host reports it (controller/result_pump.py: ended=True)
    runner.on_trial_usage(name, launch.attempt, began + 1.0, now + 0.1, ended=True)
    runner.on_trial_completed(name, now + 0.1)
    return render.trial_status(runner.trials[name], objective=spec.objective.metric,
                               decision_state=runner.decision_state(name))


def trial_body(namespace: str, experiment: Mapping[str, Any], index: int, x: float) -> dict[str, Any]:
    """The Trial's create body (the status goes in by a PATCH of the status subresource,
    as the operator writes it)."""
    name = f"{experiment['metadata']['name']}-{index}"
    resources = copy.deepcopy(experiment["spec"]["trial"].get("resources") or {})
    return render.trial_body(namespace=namespace, experiment=experiment, name=name, index=index,
                             params={"x": x}, resources=resources)
