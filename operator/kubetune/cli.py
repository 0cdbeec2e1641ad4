"""The ``kubetune`` command.  Each sub-command lives in its own module and only
registers its arguments here, so importing the CLI does not import Ray or kopf."""
from __future__ import annotations

import argparse
import importlib
import sys

# sub-command -> module that defines ``add_arguments(parser)`` and ``main(args) -> int``
SUBCOMMANDS = {
    "operator": ("kubetune.operator_main", "run the operator against the current KUBECONFIG"),
    "run": ("kubetune.local_run", "run an Experiment file on embedded Ray, no Kubernetes"),
    "devcluster": ("kubetune.devcluster.cli", "start/stop an embedded Kubernetes control plane"),
    "demo": ("kubetune.devcluster.demo", "the quickstart: control plane + operator + example Experiment"),
    "plan": ("kubetune.plan_command", "what an Experiment will cost before it runs: trials, rungs, GPU-hours"),
    "results": ("kubetune.results.command", "an Experiment's results from the results store: table, JSON, CSV, plots"),
    "convert": ("kubetune.convert.command", "an Experiment from a Ray Tune script or a Katib Experiment"),
    "dashboard": ("kubetune.dashboard.command", "optuna-dashboard over the results store, in a browser (read-only)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubetune", description="Hyperparameter tuning on Kubernetes and Ray.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
