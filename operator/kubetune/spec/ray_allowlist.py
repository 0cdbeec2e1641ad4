"""Which Ray clusters an Experiment may name (issue 25, N2): the operator's allow-list.

The operator connects to a Ray cluster on an Experiment's behalf, from a process of
its own, so the address is the operator's choice, not the tenant's.  An Experiment may
name:

- the operator's own ``--ray-address`` (always);
- with the entry ``namespace-services`` (the default), a Service in the Experiment's own
  namespace: ``ray://<service>.<namespace>[.svc[.cluster.local]]:<port>``;
- an address listed exactly (``ray://head.ml-platform:10001``), or every address with
  ``any`` (a single-tenant operator only).

An entry may end in ``=ENV``: the driver process for that cluster authenticates with the
token in the operator's environment variable ``ENV`` (from a Secret of that cluster's).
The operator's own Ray token and results-store URL never reach any other cluster's
driver (executors/ray/process.py scrubs its environment).

Pure: no I/O.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

NAMESPACE_SERVICES = "namespace-services"
ANY = "any"
DEFAULT = (NAMESPACE_SERVICES,)
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"      # a DNS-1123 label: a Service's or namespace's name
_SERVICE = re.compile(rf"^ray://(?P<service>{_LABEL})\.(?P<namespace>{_LABEL})(\.svc(\.cluster\.local)?)?"
                      r":(?P<port>[0-9]{1,5})$")
_ADDRESS = re.compile(r"^(auto|ray://[^\s:/=]+:[0-9]{1,5}|[^\s:/=]+:[0-9]{1,5})$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Entry:
    pattern: str            # an address, NAMESPACE_SERVICES or ANY
    token_env: str = ""     # the environment variable holding that cluster's token ("": none)


def parse(items: list[str] | tuple[str, ...]) -> tuple[Entry, ...]:
    """``--ray-allowed-addresses`` values (each may hold several, comma-separated);
    raises ValueError naming the bad entry.  No entry at all allows no other cluster."""
    entries = []
    for item in items:
        for raw in str(item).split(","):
            raw = raw.strip()
            if not raw:
                continue
            pattern, _, env = raw.partition("=")
            if env and not _ENV_NAME.match(env):
                raise ValueError(f"{raw!r}: after = comes the name of an environment variable holding the token")
            if pattern not in (NAMESPACE_SERVICES, ANY) and not _ADDRESS.match(pattern):
                raise ValueError(f"{raw!r}: expected {NAMESPACE_SERVICES}, {ANY}, or an address such as "
                                 "ray://head.ml:10001 (optionally =ENV_VAR_WITH_ITS_TOKEN)")
            entries.append(Entry(pattern, env))
    return tuple(entries)


def match(address: str, namespace: str, entries: tuple[Entry, ...]) -> Entry | None:
    """The entry that lets an Experiment of ``namespace`` name ``address``, or None."""
    for entry in entries:
        if entry.pattern == address or entry.pattern == ANY:
            return entry
        if entry.pattern == NAMESPACE_SERVICES:
            service = _SERVICE.match(address)
            if service is not None and service.group("namespace") == namespace:
                return entry
    return None


def refusal(address: str, own: str, entries: tuple[Entry, ...]) -> str:
    """The message of a refused address: what the allow-list holds and how to change it."""
    listed = ", ".join(e.pattern for e in entries) or "no other"
    return (f"spec.ray.address {address!r} is not a Ray cluster this operator connects to: its allow-list "
            f"holds its own ({own!r}) and {listed} (operator flag --ray-allowed-addresses, Helm value "
            f"ray.allowedAddresses; {NAMESPACE_SERVICES} allows ray://<service>.<this namespace>[.svc]:<port>); "
            "name an allowed address, or ask the operator's admin to add this one; no connection was attempted")
