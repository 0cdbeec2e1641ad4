"""The ceiling of workload 2 on this machine: what Ray itself allows before any tuner.

Every slot needs a worker process, and a fresh Ray starts them a couple at a time
(``maximum_startup_concurrency`` is the number of physical cores).  This run creates
one bare actor per slot, the way a tuner would, hands each a trial's config (the first
argument a worker receives sets up Ray's deserialization: ~0.1 s of CPU per process
here, which every tuner pays) and records when each answered; the
best makespan any tuner could reach with those slots is then a list schedule of the
workload's trials on slots that open at those moments (``report.ceiling_makespan``).
Measured in a fresh process with a fresh Ray, like every other run (see ``one.py``)."""
from __future__ import annotations

import time
from typing import Any

import ray

from kubetune.bench.workloads import Workload


@ray.remote(num_cpus=1)
class _BareWorker:
    def ready(self, config: dict) -> float:
        return time.time()


def run(workload: Workload) -> dict[str, Any]:
    started = time.time()
    workers = [_BareWorker.remote() for _ in range(workload.concurrency)]
    ready = sorted(ray.get([worker.ready.remote(workload.config()) for worker in workers]))
    for worker in workers:
        ray.kill(worker)
    return {"started": started, "slot_ready_s": [t - started for t in ready]}
