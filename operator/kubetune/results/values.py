"""A metric value <-> its (kind, value, text) columns: numbers stay numbers (NaN and
±Infinity included), ints keep every digit, anything else round-trips as JSON text.

``storable`` makes any text one every backend accepts: a lone surrogate (what
``surrogateescape`` puts in an error about a non-UTF-8 file name) cannot be encoded
to UTF-8 by either driver, and PostgreSQL refuses NUL in text.  Both become U+FFFD,
on SQLite too, so a result reads back the same whichever store holds it."""
from __future__ import annotations

import json
import math
import numbers
import re
from typing import Any

import orjson

REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with NUL and lone surrogates replaced (a valid surrogate pair, which only a
    str built by hand can hold, is joined into its character)."""
    if text.isascii():
        return text if "\x00" not in text else text.replace("\x00", REPLACEMENT)
    if not _UNSTORABLE.search(text):
        return text
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return joined.replace("\x00", REPLACEMENT)


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


def loads(text: str) -> Any:
    """``json.loads``, by orjson when it can (several times faster: a study view's cold
    read parses a params or last-values text per trial); NaN and Infinity, which Python's
    JSON writes, and integers over 64 bits only ``json.loads`` reads."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
