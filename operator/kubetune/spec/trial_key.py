"""A trial's identity across the operator, its executors and the trial itself:
``<namespace>/<experiment>/<trial>``, the string Ray actor names, the pod ingest's
inbox and ``KUBETUNE_TRIAL`` carry.  Composed and taken apart here only."""
from __future__ import annotations

from typing import NamedTuple


class TrialKey(NamedTuple):
    namespace: str
    experiment: str
    trial: str

    @classmethod
    def parse(cls, text: str) -> "TrialKey":
        """``"ns/exp/trial"``; anything else is our own bug, so it fails loudly."""
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"not a trial key <namespace>/<experiment>/<trial>: {text!r}")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.experiment}/{self.trial}"

    @property
    def experiment_prefix(self) -> str:
        """What every key of this trial's Experiment starts with."""
        return f"{self.namespace}/{self.experiment}/"


class ExperimentKey(NamedTuple):
    """An Experiment's part of its trials' keys: their prefix ``<namespace>/<experiment>/``."""
    namespace: str
    experiment: str

    @classmethod
    def parse(cls, text: str) -> "ExperimentKey":
        """The Experiment of a key prefix ``"ns/exp/"`` or of a trial key; anything with
        fewer parts is our own bug, so it fails loudly."""
        namespace, _, rest = text.partition("/")
        experiment = rest.partition("/")[0]
        if not namespace or not experiment:
            raise ValueError(f"not an Experiment's key prefix <namespace>/<experiment>/: {text!r}")
        return cls(namespace, experiment)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.experiment}/"
