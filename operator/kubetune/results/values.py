"""A metric value <-> its (kind, value, text) columns: numbers stay numbers (NaN and
±Infinity included), ints keep every digit, anything else round-trips as JSON text."""
from __future__ import annotations

import json
import math
import numbers
from typing import Any


def encode(value: Any) -> tuple[str, float | None, str | None]:
    if isinstance(value, bool):
        return "b", float(value), None
    if isinstance(value, numbers.Integral):   # numpy integers too
        value = int(value)
        # a float column for sorting and plotting; the digits for the exact value
        return "i", float(value) if abs(value) < 2 ** 1023 else math.copysign(math.inf, value), str(value)
    if isinstance(value, numbers.Real):
        return "f", float(value), None
    if isinstance(value, str):
        return "s", None, value
    return "j", None, json.dumps(value, default=str)


def decode(kind: str, value: float | None, text: str | None) -> Any:
    if kind == "f":
        return math.nan if value is None else value   # SQLite keeps a NaN as NULL (schema.Double)
    if kind == "i":
        return int(text)
    if kind == "b":
        return bool(value)
    if kind == "s":
        return text
    return json.loads(text)
