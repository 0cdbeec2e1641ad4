"""The one place a trial touches a private name of Ray (issue 29; the Ray platform's are in
executors/ray/ray_compat.py): where Ray Tune's
public trial API (``ray.tune.report``, ``ray.tune.get_checkpoint``,
``ray.tune.get_context``, ``ray.air.session.report`` and, through Ray itself,
``ray.train.report`` under Train V1) finds the session of the trial it runs in.

In Ray 2.x every one of those functions calls ``ray.train._internal.session.get_session()``,
which returns the module global ``_session`` (None outside a Tune trial: the call then
only warns and returns, which made a Ray Tune function's reports vanish).  kubetune sets
that global to its own session object (trainable/raytune.py), which Ray then calls
``report(metrics, checkpoint=...)``, ``loaded_checkpoint``, ``trial_id``... on.

If a Ray upgrade moves these names, ``check()`` fails (tests/unit/test_raytune_compat.py
runs it against the installed Ray), so the upgrade is caught by the suite, not by users
whose reports go nowhere.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any, Callable

SESSION_MODULE = "ray.train._internal.session"
SESSION_GLOBAL = "_session"          # what get_session() returns
SESSION_GETTER = "get_session"
# the public modules whose import means the trial's code may call Ray Tune's API
RAY_API_MODULES = ("ray.tune", "ray.train", "ray.air")

_lock = threading.Lock()


class RayLayoutChanged(RuntimeError):
    """The installed Ray no longer has the private names this module relies on."""


def check(module: ModuleType | None = None) -> ModuleType:
    """The session module, after checking it still looks as this module expects."""
    module = module or importlib.import_module(SESSION_MODULE)
    if not hasattr(module, SESSION_GLOBAL) or not callable(getattr(module, SESSION_GETTER, None)):
        raise RayLayoutChanged(
            f"{SESSION_MODULE} has no {SESSION_GLOBAL} / {SESSION_GETTER}(): this Ray "
            "dispatches ray.tune.report() elsewhere; update kubetune/trainable/ray_private.py")
    return module


def install_session(session: Any) -> None:
    """Make ``session`` what Ray's trial API calls in this process (idempotent)."""
    module = check()
    with _lock:
        current = getattr(module, SESSION_GLOBAL)
        if current is not None and current is not session and not getattr(current, "kubetune", False):
            raise RuntimeError("a Ray Train/Tune session of Ray's own runs in this process: "
                               "kubetune cannot host a Ray Tune function here")
        setattr(module, SESSION_GLOBAL, session)
        if getattr(module, SESSION_GETTER)() is not session:
            raise RayLayoutChanged(f"{SESSION_MODULE}.{SESSION_GETTER}() does not return "
                                   f"{SESSION_GLOBAL}; update kubetune/trainable/ray_private.py")


def uses_ray_api() -> bool:
    """Whether code in this process imported Ray Tune's (or Train's, or AIR's) API."""
    return any(name in sys.modules for name in RAY_API_MODULES)


def when_session_module_loads(callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once the session module is imported (now if it is): a
    function that imports ``ray.tune`` only when it runs is served too."""
    module = sys.modules.get(SESSION_MODULE)
    if module is not None:
        callback(module)
        return
    with _lock:
        if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the session module with the other finders, and runs ``callback`` right
    after the module's own code (before anything can call into it)."""

    def __init__(self, callback: Callable[[ModuleType], None]) -> None:
        self.callback = callback

    def find_spec(self, name, path, target=None):  # noqa: ANN001 - the importlib protocol
        if name != SESSION_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_install(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_install   # type: ignore[method-assign]
        return spec
