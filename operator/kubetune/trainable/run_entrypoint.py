"""``python -m kubetune.trainable.run_entrypoint package.module:function`` in a trial pod
(``spec.executor: pod``): runs a kubetune function, a Ray Tune function or a
``tune.Trainable`` class as that pod's trial, with no Ray cluster (issue 29).

The pod session (pod_session.py) takes the reports, to the operator's ingest or as
``KUBETUNE_RESULT`` lines with ``metricsCollector: stdout``; the config is the pod's
``/etc/kubetune/config.json``; a resumed attempt gets ``KUBETUNE_CHECKPOINT`` through
``get_checkpoint()``.  The exit status says how it ended: 0 when the function returned
after reporting (or was stopped), 1 when it raised or returned without reporting a
single result, with the reason in the container's termination message, which the
pod executor shows as the trial's failure.
"""
from __future__ import annotations

import argparse
import os
import sys

from kubetune.trainable import api, raytune
from kubetune.trainable.entrypoint import format_error, no_results_error, resolve_entrypoint, takes_arguments
from kubetune.trainable.pod_session import pod_session

TERMINATION_LOG = "/dev/termination-log"     # Kubernetes' default terminationMessagePath


def run(entrypoint: str) -> str:
    """Run the trial; "" when it succeeded, else why it failed."""
    session = pod_session()
    if session is None:
        return ("NoTrialError: not in a trial pod: KUBETUNE_INGEST_URL and KUBETUNE_TRIAL_TOKEN "
                "are set by kubetune's pod executor (KUBETUNE_TRIAL with KUBETUNE_METRICS_COLLECTOR=stdout "
                "by its local one)")
    try:
        raytune.serve_ray_api()
        function = raytune.adapt(resolve_entrypoint(entrypoint))
        try:
            if takes_arguments(function):
                function(session.get_config())
            else:
                function()
        except (api.TrialDone, api.TrialStopped):
            pass
    except BaseException as exc:  # noqa: BLE001 - the trial fails, saying why
        return format_error(exc, skip_frames=1)
    if session.reports == 0 and session.start_iteration == 0:
        return no_results_error(f"the entrypoint {entrypoint}")
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.trainable.run_entrypoint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("entrypoint", help="package.module:function (or :TrainableClass)")
    error = run(parser.parse_args(argv).entrypoint)
    if not error:
        return 0
    print(error, file=sys.stderr, flush=True)
    try:   # a trial process on the operator's host (executors/local) names a file of its own
        with open(os.environ.get("KUBETUNE_TERMINATION_LOG") or TERMINATION_LOG, "w") as handle:
            handle.write(error.split("\n", 1)[0][:4000])
    except OSError:
        pass        # not in a pod (or another path was set): stderr holds it
    return 1


if __name__ == "__main__":
    sys.exit(main())
