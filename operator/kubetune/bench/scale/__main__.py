"""``python -m kubetune.bench.scale``: the scale benchmark of issue 26 (see __init__.py).

Writes ``<out>/scale.json`` (every figure, per Experiment and per namespace included)
and ``<out>/scale.md`` (the table for BENCHMARKS.md); exits 1 if anything was lost or
duplicated, or an Experiment did not succeed."""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from pathlib import Path

from kubetune.bench.scale import report
from kubetune.bench.scale.harness import ScaleRun, Settings


def parse(argv: list[str] | None) -> argparse.Namespace:
    d = Settings()
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(d.shapes), help="many, big or both (run at once)")
    parser.add_argument("--experiments", type=int, default=d.experiments, help="many: Experiments")
    parser.add_argument("--namespaces", type=int, default=d.namespaces, help="many: namespaces they spread over")
    parser.add_argument("--trials", type=int, default=d.trials, help="many: trials per Experiment")
    parser.add_argument("--reports", type=int, default=d.reports, help="many: results per trial")
    parser.add_argument("--parallelism", type=int, default=d.parallelism, help="many: parallelism")
    parser.add_argument("--big-trials", type=int, default=d.big_trials, help="big: one-result trials")
    parser.add_argument("--big-parallelism", type=int, default=d.big_parallelism, help="big: parallelism")
    parser.add_argument("--cpu", type=float, default=d.cpu, help="CPU each trial asks for")
    parser.add_argument("--ray-cpus", type=int, default=d.ray_cpus, help="logical CPUs of the Ray head")
    parser.add_argument("--no-restart", action="store_true", help="do not SIGKILL the operator half way")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds until the run is given up")
    parser.add_argument("--out", default="bench-results", help="directory for scale.json and scale.md")
    return parser.parse_args(argv)


def _exit_on_sigterm(signum, frame) -> None:
    # as SystemExit, so that the operator, the Ray head and the control plane are ended
    # by the finally blocks (a background job's SIGINT is ignored; SIGTERM is not)
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = parse(argv)
    chosen = [s.strip() for s in args.shapes.split(",") if s.strip()]
    if not chosen or set(chosen) - {"many", "big"}:
        raise SystemExit(f"--shapes: choose from many,big (got {args.shapes!r})")
    settings = Settings(shapes=tuple(chosen), experiments=args.experiments, namespaces=args.namespaces,
                        trials=args.trials, reports=args.reports, parallelism=args.parallelism,
                        big_trials=args.big_trials, big_parallelism=args.big_parallelism, cpu=args.cpu,
                        ray_cpus=args.ray_cpus, restart=not args.no_restart, timeout_s=args.timeout)
    command = "python -m kubetune.bench.scale " + shlex.join(argv if argv is not None else sys.argv[1:])
    figures = ScaleRun(settings, log=lambda message: print(message, flush=True)).run()
    figures["command"] = command.strip()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(figures, indent=1, default=str))
    table = report.markdown(figures, figures["command"])
    (out / "scale.md").write_text(table + "\n")
    print(table)
    return 1 if figures["verdict"]["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
