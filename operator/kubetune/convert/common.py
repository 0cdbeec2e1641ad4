"""What both converters share: refusals, notes, and writing a validated Experiment."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

API_VERSION = "kubetune.dev/v1alpha1"
_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Refusal:
    what: str        # the construct, as the user wrote it: "tune.sample_from(<lambda>)"
    where: str       # "train.py:42" or "spec.algorithm.algorithmName"
    why: str         # what kubetune lacks, and the fix when there is one

    def __str__(self) -> str:
        return f"{self.where}: {self.what}: {self.why}"


class ConversionError(Exception):
    def __init__(self, refusals: list[Refusal]) -> None:
        self.refusals = refusals
        super().__init__("cannot convert:\n" + "\n".join(f"  - {r}" for r in refusals))


@dataclass
class Conversion:
    """The Experiment being built, what was refused, and what maps only approximately."""
    source: str
    refusals: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def refuse(self, what: str, where: str, why: str) -> None:
        self.refusals.append(Refusal(what, where, why))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def dns_name(text: str, fallback: str = "experiment") -> str:
    """An Experiment name Kubernetes accepts (a DNS-1123 label, short enough for trial names)."""
    name = _DNS_LABEL.sub("-", str(text).lower().replace("_", "-")).strip("-")[:40].strip("-")
    return name or fallback


def render(conversion: Conversion, body: dict[str, Any]) -> str:
    """The YAML, after kubetune's own parser accepted its spec; raises ConversionError
    listing every refusal (a partial Experiment is never printed)."""
    if conversion.refusals:
        raise ConversionError(conversion.refusals)
    from kubetune.spec.model import SpecError
    from kubetune.spec.parse import parse_experiment
    try:
        parse_experiment(body["spec"])
    except SpecError as error:      # a converter bug or an input kubetune's spec rejects
        raise ConversionError([Refusal("the converted Experiment", conversion.source,
                                       f"kubetune's spec rejects it: {error}")]) from error
    head = [f"# Converted by `kubetune convert` from {conversion.source}."]
    head += [f"# note: {n}" for n in conversion.notes]
    return "\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=100)
