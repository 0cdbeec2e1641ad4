"""Trial functions that get things wrong the way a new user's might: each must end with
a message that names the mistake (README, troubleshooting).

- ``exits``          reports ``val_loss`` 0.25, then calls ``sys.exit(0)``.
- ``reports_text``   reports ``val_loss`` as the string ``"0.25"``.
- ``returns_metrics`` returns its metrics instead of reporting them (nothing reported).
- ``NOT_CALLABLE``   an entrypoint that names a constant, not a function.
- ``floods``         reports a 1 MB string metric, then ``results`` (default 5,000)
                     results as fast as it can: the Trial's status cuts the one and thins
                     the others, and says so (a Warning Event each).
"""
from __future__ import annotations

import sys

import kubetune

NOT_CALLABLE = 42


def exits(config: dict) -> None:
    kubetune.report({"val_loss": 0.25})
    sys.exit(0)


def reports_text(config: dict) -> None:
    kubetune.report({"val_loss": "0.25"})


def returns_metrics(config: dict) -> dict:
    return {"val_loss": 0.25}


def floods(config: dict) -> None:
    kubetune.report({"val_loss": 1.0, "log": "x" * 1_000_000})
    for step in range(int(config.get("results", 5_000))):
        kubetune.report({"val_loss": 1.0 / (step + 2)})
