"""``python -m kubetune.bench.http_fetch``: a browser's fetches, timed from another process.

A benchmark that serves a dashboard in its own process must not fetch from that process
too: the client's reading and parsing would compete with the server for the same
interpreter lock, as no browser does.  Each line read from stdin is a JSON list of
URLs; they are fetched in order (each body read to its last byte) and one JSON line is
written back: the seconds they took together, and a summary of the last body when it
is a study (trial, intermediate-value and best-trial counts; parsed after the timing)."""
from __future__ import annotations

import json
import sys
import time
import urllib.request


def fetch(urls: list[str]) -> dict:
    started = time.perf_counter()
    body = b""
    for url in urls:
        with urllib.request.urlopen(url, timeout=900) as response:
            body = response.read()
    seconds = time.perf_counter() - started
    answer: dict = {"seconds": seconds, "bytes": len(body)}
    try:
        data = json.loads(body)
    except ValueError:
        return answer
    if isinstance(data, dict) and "trials" in data:
        answer.update(trials=len(data["trials"]), best_trials=len(data.get("best_trials", [])),
                      intermediate_values=sum(len(t["intermediate_values"]) for t in data["trials"]))
    return answer


def main() -> int:
    for line in sys.stdin:
        print(json.dumps(fetch(json.loads(line))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
