"""Katib's metrics collection in a trial pod, as kubetune's stdout collector reads it.

A converted Katib Experiment (katib.py) runs its training container as
``python3 -c <this file> <json settings> <original command...>``: the original command
runs as a child, its output passes through unchanged, and the metrics Katib would
have collected become ``KUBETUNE_RESULT {json}`` lines (executors/pods/stdout_results.py):

- ``StdOut``: lines of the child's output that Katib's filter matches (by default
  ``name=value`` pairs, as Katib's own);
- ``File``: the file Katib's collector would read, once the child has ended (as Katib's
  sidecar does), as TEXT (the same filter) or JSON (one object per line).

Only the Experiment's metrics count (objective and additional ones).  One result is
written each time the objective metric is seen, carrying the latest value of every
other metric seen since, so each result is one step of the objective, as Katib's
observation log orders them.  The exit status is the child's.

Standard library only, and this file alone: the trial's image needs Python 3, not kubetune.
"""
import json
import os
import re
import signal
import subprocess
import sys

# Katib's default metrics format (pkg/metricscollector/v1beta1/common/const.go)
DEFAULT_FORMAT = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
PREFIX = "KUBETUNE_RESULT"


class Collector:
    def __init__(self, objective, metrics, formats, output):
        self.objective = objective
        self.metrics = set(metrics) | {objective}
        self.patterns = [re.compile(f) for f in (formats or [DEFAULT_FORMAT])]
        self.output = output
        self.pending = {}
        self.results = 0

    def text_line(self, line):
        for pattern in self.patterns:
            for match in pattern.finditer(line):
                name, value = match.group(1).strip(), match.group(2).strip()
                self.observe(name, value)

    def json_line(self, line):
        try:
            fields = json.loads(line)
        except ValueError:
            return
        if isinstance(fields, dict):
            for name in sorted(fields, key=lambda key: key != self.objective):
                if name != self.objective:
                    self.observe(name, fields[name])
            if self.objective in fields:
                self.observe(self.objective, fields[self.objective])

    def observe(self, name, value):
        if name not in self.metrics:
            return
        try:
            number = float(value)
        except (TypeError, ValueError):
            return
        self.pending[name] = number
        if name == self.objective:
            self.output.write(f"{PREFIX} {json.dumps(self.pending)}\n")
            self.output.flush()
            self.pending = {}
            self.results += 1


def main(argv):
    settings, command = json.loads(argv[0]), argv[1:]
    out = sys.stdout
    collector = Collector(settings["objective"], settings.get("metrics", []), settings.get("formats"), out)
    source = settings.get("source", "StdOut")
    # unbuffered: a Python child writing into a pipe would hold its lines until it ends
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=None, text=True, errors="replace",
                             bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # a stopped trial's pod gets SIGTERM (this process is its PID 1): pass it on
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    for line in child.stdout:
        out.write(line)
        out.flush()
        if source == "StdOut":
            collector.text_line(line)
    code = child.wait()
    if source == "File":
        try:
            with open(settings["path"], errors="replace") as handle:
                for line in handle:
                    if settings.get("format") == "JSON":
                        collector.json_line(line)
                    else:
                        collector.text_line(line)
        except OSError as error:
            print(f"katib metrics: cannot read {settings['path']}: {error}", file=sys.stderr)
            return code or 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
