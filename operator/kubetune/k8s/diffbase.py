"""kopf's diff base for Experiments, bounded whatever the spec's size.

kopf stores the "last handled configuration" of an object (its spec, labels and
annotations) in an annotation, to tell a real change from its own writes. All
annotations of an object share a 256 KiB limit, so an Experiment with a large spec
made every patch fail with 422, again and again, including the patch that removes the
finalizer: ``kubectl delete`` never completed.

kubetune's only change handler (``spec_changed``) needs to know THAT the spec changed,
not how; so the essence kept is a digest per top-level field: a few hundred bytes for
any spec. kopf compares digests as it compared the copies: a changed spec gives a diff
on ``spec``, an unchanged one none.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

import kopf


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
                          .encode()).hexdigest()


class DigestDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """``AnnotationsDiffBaseStorage`` whose essence is ``{field: {"sha256": ...}}``."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        essence = super().build(body=body, extra_fields=extra_fields)
        digested: dict[str, Any] = {}
        for key, value in essence.items():
            if key == "metadata":   # labels and annotations: one digest each
                digested[key] = {name: {"sha256": digest(part)} for name, part in value.items()}
            else:
                digested[key] = {"sha256": digest(value)}
        return digested  # type: ignore[return-value]
