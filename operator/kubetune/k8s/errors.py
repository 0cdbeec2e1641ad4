"""The errors of API calls, as the callers above k8s/ see them (they never import the
Kubernetes client).  ``WriteRefused`` is here, not in controller/, because
k8s/store.py raises it and the controller catches it: a layer below the controller
may not import the controller."""
from __future__ import annotations

import json
from typing import Any


class WriteRefused(Exception):
    """The API server did not take a write (or could not be reached: ``status`` 0).
    ``reason`` is the API's own word (Invalid, TooManyRequests, Forbidden, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @property
    def transient(self) -> bool:
        """Worth retrying soon: throttling, server errors, timeouts, conflicts."""
        return self.status in (0, 409, 429) or self.status >= 500


class StaleTrial(Exception):
    """A Trial of the same name, owned by an earlier Experiment, is still being deleted:
    the create is retried later, and this is no failure worth a Warning."""


class ApiError(Exception):
    """A call the API server answered with an error (k8s/pods.py): its HTTP ``status``
    and its own ``message`` (``pods "x" is forbidden: ...``), which is what a user reads."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message

    @classmethod
    def of(cls, error: Any) -> "ApiError":
        """From the client's ApiException: the message in its JSON body, else its text."""
        try:
            message = json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            message = str(error)
        return cls(int(getattr(error, "status", 0) or 0), message)


def forbidden(error: BaseException) -> str | None:
    """The API's own words for a 403, which name the verb, resource and group the
    caller lacks (``pods is forbidden: User "..." cannot list resource "pods" in API
    group "" in the namespace "ml"``); None when ``error`` is no 403."""
    if getattr(error, "status", None) != 403:
        return None
    body = getattr(error, "body", None) or ""
    try:
        text = json.loads(body).get("message") or ""
    except (ValueError, AttributeError):
        text = str(body)
    return text or str(error)
