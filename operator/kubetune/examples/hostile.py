"""Trial functions of a hostile tenant, for the security tests (issue 25): each attacks the
operator from inside its own trial process, the way any tenant's code could.

- ``plants_pickle``  makes its host's answers carry an object whose unpickling writes
  ``config["marker"]`` (with the pid of the process that unpickled it): ``how: answer``
  puts it into the answer the host encodes, ``how: return`` makes the actor method
  return it as Ray's own return value.  It keeps reporting until stopped.
- ``poisons``        reports NUL bytes, lone surrogates and a long string in its metrics,
  then fails with an error message made of them.
- ``claims``         makes its host describe itself as hosting ``config["claim"]``
  (another trial's key) and answer fetches for it, then reports until stopped.
"""
from __future__ import annotations

import time

import kubetune
from kubetune.trainable import api


class Planted:
    """Unpickling this runs code: it appends the unpickling process's pid to ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"import os; open({self.marker!r}, 'a').write(str(os.getpid()) + chr(10))",))


def _report_until_stopped(config: dict) -> None:
    for step in range(int(config.get("iterations", 100000))):
        kubetune.report({"loss": 1.0 / (step + 1)})
        time.sleep(float(config.get("interval", 0.05)))


def plants_pickle(config: dict) -> None:
    planted = Planted(config["marker"])
    kubetune.report({"loss": 1.0})
    if config.get("how") == "return":
        from kubetune.executors.ray.answers import RayTrialHost

        def fetch(self, answer_to, *args, _planted=planted, **kwargs):
            return {"results": [], "state": "running", "planted": _planted}
        # Ray calls the function object it took at the actor's creation: change its code
        RayTrialHost.fetch.__code__ = fetch.__code__
        RayTrialHost.fetch.__defaults__ = fetch.__defaults__
        RayTrialHost.fetch.__kwdefaults__ = fetch.__kwdefaults__
    else:
        session = api.current_session()
        original = session.fetch
        session.fetch = lambda *args, **kwargs: {**original(*args, **kwargs), "planted": planted}
    _report_until_stopped(config)


def _hosts() -> list:
    """The host objects of this process (their class may be a copy Ray made: found by shape)."""
    import gc
    return [o for o in gc.get_objects() if hasattr(type(o), "_describe_locked") and hasattr(o, "_runner")]


def claims(config: dict) -> None:
    for host in _hosts():
        cls = type(host)
        original = cls._describe_locked

        def describe(self, *args, _original=original, **kwargs):
            return {**_original(self, *args, **kwargs), "trial_key": config["claim"], "attempt": 0}
        cls._describe_locked = describe
        cls._runner_for = lambda self, trial_key: self._runner     # and answer fetches for it
    _report_until_stopped(config)


def poisons(config: dict) -> None:
    """Strings a database, an encoder or the API server may refuse, in results and an error."""
    kubetune.report({"loss": 1.0, "tag": "nul\0here", "odd": "lone\udcffsurrogate"})
    kubetune.report({"loss": 0.5, "long": "x" * (256 << 10), "nul\0name": 2.0})
    raise RuntimeError("poison\0\udcff" + "y" * (1 << 20))
