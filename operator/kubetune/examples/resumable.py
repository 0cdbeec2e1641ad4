"""A deterministic trainable that resumes from its checkpoints: the recovery and PBT example.

The model is one number, a loss ``v`` that training with learning rate ``lr`` pulls
towards a floor of ``lr``: a large rate learns fast but stalls high, a small one ends
low but slowly. No fixed rate does as well as a decaying one, which is what Population
Based Training finds by exploiting and perturbing (see ``step``).

Every iteration ``i`` reports ``{"loss": v_i, "lr": lr, "pid": <process id>,
"attempt": <attempt>}`` and, every ``checkpoint_every`` iterations (default 1) or when
a pause asks for one, a checkpoint holding ``{"i": i, "v": v_i}``. A run continues from
``kubetune.get_checkpoint()`` (its own after a retry, another trial's after a PBT
exploit), so a history depends only on the parameters and, under PBT, the lineage:
``expected_losses`` computes it.

Config (all optional): ``lr`` (0.1), ``v0`` (10), ``iterations`` (20), ``interval``
(seconds before each report, 0.05), ``checkpoint_every`` (1), ``fail_at`` (raise
``RuntimeError`` right after reporting that iteration) on the attempts in
``fail_attempts`` (default ``[0]``; ``"all"``: every attempt) of the trials whose
``lr`` is ``fail_lr`` (default: every trial), ``hold_at`` and ``gate``
(after iteration ``hold_at``, wait until the file ``gate`` exists or a stop or pause
is asked for; with a list of iterations, after each iteration ``k`` wait for the file
``<gate>.<k>``).
"""
from __future__ import annotations

import json
import os
import time

import kubetune
from kubetune.examples._controls import hold, report
from kubetune.trainable.api import get_context


def step(v: float, lr: float) -> float:
    """One iteration of training: move ``v`` towards its floor ``lr``."""
    return lr + (v - lr) * (1.0 - min(lr, 0.9))


def expected_losses(lr: float, iterations: int, v0: float = 10.0) -> list[float]:
    """The losses a run from scratch with a fixed ``lr`` reports, iteration 1 first."""
    losses, v = [], v0
    for _ in range(iterations):
        v = step(v, lr)
        losses.append(v)
    return losses


def train(config: dict) -> None:
    lr = float(config.get("lr", 0.1))
    iterations = int(config.get("iterations", 20))
    interval = float(config.get("interval", 0.05))
    every = int(config.get("checkpoint_every", 1))
    fail_at = config.get("fail_at")
    fail_attempts = config.get("fail_attempts", [0])
    if config.get("fail_lr") is not None and float(config["fail_lr"]) != lr:
        fail_at = None
    holds = config.get("hold_at")
    if holds is None:
        gates = {}
    elif isinstance(holds, list):
        gates = {int(k): f"{config['gate']}.{int(k)}" for k in holds}
    else:
        gates = {int(holds): config["gate"]}
    context = get_context()
    i, v = 0, float(config.get("v0", 10.0))
    restored = kubetune.get_checkpoint()
    if restored is not None:
        with open(os.path.join(restored, "state.json")) as f:
            state = json.load(f)
        i, v = int(state["i"]), float(state["v"])
    if i != context.start_iteration:
        raise RuntimeError(f"the checkpoint holds iteration {i}, but the trial resumes "
                           f"after iteration {context.start_iteration}")
    while i < iterations:
        if i in gates:
            hold(gates[i])
        elif interval:
            time.sleep(interval)
        i, v = i + 1, step(v, lr)
        report({"loss": v, "lr": lr, "pid": os.getpid(), "attempt": context.attempt}, {"i": i, "v": v},
               iteration=i, checkpoint_every=every)
        if fail_at is not None and i == int(fail_at) and (
                fail_attempts == "all" or context.attempt in fail_attempts):
            raise RuntimeError(f"planned failure after iteration {i} (attempt {context.attempt})")
