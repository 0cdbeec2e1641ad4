"""The error a write to the API server ends in, as the controller sees it.

Here, not in controller/, because k8s/store.py raises it and the controller catches
it: a layer below the controller may not import the controller."""
from __future__ import annotations


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
