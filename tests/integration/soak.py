"""Sizes of the soak tests: what ``make test`` runs, and the full sizes ``make soak`` runs.

A soak test checks properties that must hold at any size (nothing lost or run twice
across kills, bounded objects, flat write bytes, fair shares, a live leader).  Its
quick size still takes every path the full one does (kills mid-run, restores,
queues longer than the cluster, several namespaces), in a fraction of the time, which
keeps ``make test`` within CI's budget; the full sizes, those the issues name, run
under ``make soak`` (``KUBETUNE_TEST_SIZE=full``), in the same code with the same checks.
"""
from __future__ import annotations

import os

import pytest

__all__ = ["FULL", "size", "soak"]

FULL = os.environ.get("KUBETUNE_TEST_SIZE", "quick") == "full"

# `make soak` selects these (`-m soak`); `make test` runs them too, at the quick size
soak = pytest.mark.soak


def size(quick, full):
    """``full`` under ``make soak``, else ``quick``."""
    return full if FULL else quick
