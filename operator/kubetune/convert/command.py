"""``kubetune convert raytune SCRIPT.py [-- ARGS]`` and ``kubetune convert katib FILE.yaml``:
print the equivalent Experiment (or write it with ``--output``); exit 2, naming each
construct that has no equivalent and where it came from, when one does not map."""
from __future__ import annotations

import argparse
import sys

from kubetune.convert.common import ConversionError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sources = parser.add_subparsers(dest="source", required=True)
    raytune = sources.add_parser("raytune", help="a Ray Tune script (ray.tune.Tuner or tune.run)",
                                 description="Run SCRIPT with ray.tune.Tuner intercepted (nothing is tuned, "
                                 "no Ray starts) and print the Experiment it describes.")
    raytune.add_argument("script", help="the Python script that calls Tuner(...).fit()")
    raytune.add_argument("args", nargs=argparse.REMAINDER,
                         help="arguments for the script, after `--` (e.g. -- --smoke-test)")
    katib = sources.add_parser("katib", help="a Katib v1beta1 Experiment (YAML)",
                               description="Print the kubetune Experiment equivalent to a Katib Experiment.")
    katib.add_argument("file", help="the Katib Experiment manifest")
    for sub in (raytune, katib):
        sub.add_argument("--output", "-o", default="-", help="write the Experiment here (default: stdout)")
        sub.add_argument("--name", default="", help="the Experiment's name (default: from the source)")


def main(args: argparse.Namespace) -> int:
    try:
        text = _convert(args)
    except ConversionError as error:
        print(f"kubetune convert {args.source}: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        print(f"kubetune convert {args.source}: {error}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as handle:
            handle.write(text)
    return 0


def _convert(args: argparse.Namespace) -> str:
    from kubetune.convert.common import dns_name, render
    if args.source == "raytune":
        from kubetune.convert.raytune_capture import NoTuner, capture
        from kubetune.convert.raytune_map import to_experiment
        script_args = args.args[1:] if args.args[:1] == ["--"] else args.args
        try:
            captured = capture(args.script, script_args)
        except NoTuner as error:
            raise ValueError(str(error)) from None
        body, conversion = to_experiment(captured)
    else:
        from kubetune.convert.katib import from_katib
        body, conversion = from_katib(args.file)
    if args.name:
        body["metadata"]["name"] = dns_name(args.name)
    return render(conversion, body)
