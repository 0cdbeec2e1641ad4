"""Durations ("1h30m") and Kubernetes memory quantities ("2Gi"), as users write them."""
from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_MEMORY = re.compile(r"^(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)([KMGTPE]i?|k)?$")
_MEMORY_FACTORS = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_duration(value: object) -> float:
    """Seconds from "90s", "30m", "2h", "1h30m", "1d" or a plain number of seconds.

    Raises ValueError with a message fit to show the user.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 90s, 30m, 2h or 1h30m (got {value!r})")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if not text or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"expected a duration like 90s, 30m, 2h or 1h30m (got {value!r})")
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"expected a duration like 90s, 30m, 2h or 1h30m (got {value!r})")
    if seconds <= 0:
        raise ValueError(f"must be a positive duration (got {value!r})")
    return seconds


def parse_memory(value: object) -> int:
    """Bytes from a Kubernetes quantity ("2Gi", "500M", "1.5Gi") or a plain integer."""
    if isinstance(value, bool):
        raise ValueError(f"expected bytes or a quantity like 2Gi or 500M (got {value!r})")
    if isinstance(value, (int, float)):
        amount = float(value)
    elif isinstance(value, str):
        match = _MEMORY.match(value.strip())
        if not match:
            raise ValueError(f"expected bytes or a quantity like 2Gi or 500M (got {value!r})")
        amount = float(match.group(1)) * _MEMORY_FACTORS[match.group(2)]
    else:
        raise ValueError(f"expected bytes or a quantity like 2Gi or 500M (got {value!r})")
    if amount <= 0:
        raise ValueError(f"must be more than 0 bytes (got {value!r})")
    return int(amount)


def format_memory(n_bytes: float) -> str:
    """The shortest exact-ish binary quantity: 2147483648 -> "2Gi"."""
    for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n_bytes >= factor:
            return f"{n_bytes / factor:.3g}{suffix}"
    return f"{int(n_bytes)}B"
