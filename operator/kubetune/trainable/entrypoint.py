"""Calling a user's training function: its entrypoint resolved, and its failure worded.

Shared by the two ways a function runs: in a trial host's thread (function_runner.py) and as
a pod's main program (run_entrypoint.py).  A failure's first line names its class
(core/failures.py groups trials by it), the rest is the traceback, bounded.
"""
from __future__ import annotations

import importlib
import inspect
import traceback
from typing import Any, Callable

# The whole traceback reaches the operator, which keeps it in the results store; the
# Trial's status shows only a capped tail.  The cap bounds one fetch, not a normal error.
TRACEBACK_TAIL_CHARS = 1 << 20
ERROR_MESSAGE_CHARS = 2000
# A trial that reported nothing is no success: most often its reports went to an API
# kubetune does not serve, which would otherwise pass without a word (issue 29)
NO_RESULTS = "NoResultsReported"
REPORTING_CALLS = ("kubetune.report(metrics), or Ray Tune's ray.tune.report(metrics), ray.train.report, "
                   "ray.air.session.report, or a tune.Trainable whose step() returns its metrics")


def no_results_error(what: str) -> str:
    """The failure of a trial whose function returned without one report (first line: the class)."""
    return (f"{NO_RESULTS}: {what} returned without reporting a single result; a trial reports "
            f"once per iteration with {REPORTING_CALLS}")


class EntrypointError(ImportError):
    """spec.trial.entrypoint does not name an importable function."""


def resolve_entrypoint(entrypoint: str) -> Callable[..., Any]:
    module_name, sep, attr_path = entrypoint.partition(":")
    if not sep or not module_name or not attr_path:
        raise EntrypointError(
            f"entrypoint {entrypoint!r} must look like 'package.module:function'")
    try:
        target: Any = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except (ImportError, AttributeError) as exc:
        raise EntrypointError(
            f"cannot load entrypoint {entrypoint!r}: {type(exc).__name__}: {exc}") from exc
    except (Exception, SystemExit) as exc:   # the module itself raised: every trial would
        raise EntrypointError(                 # fail the same way (core/failures.py)
            f"cannot load entrypoint {entrypoint!r}: importing {module_name} raised "
            f"{type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise EntrypointError(f"entrypoint {entrypoint!r} is not callable")
    return target


def takes_arguments(function: Callable[..., Any]) -> bool:
    try:
        return bool(inspect.signature(function).parameters)
    except (TypeError, ValueError):   # builtins without a signature
        return True


def describe(function: Callable[..., Any] | str) -> str:
    if isinstance(function, str):
        return f"the entrypoint {function}"
    return f"the function {getattr(function, '__qualname__', repr(function))}"


def format_error(exc: BaseException, skip_frames: int = 0) -> str:
    """``"{ExcType}: {msg}\\n{traceback tail}"``: the message first, then where it came from."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    full = message = str(exc)
    if len(message) > ERROR_MESSAGE_CHARS:    # an exception may carry a whole tensor or log
        message = message[:ERROR_MESSAGE_CHARS] + f" ... [{len(message) - ERROR_MESSAGE_CHARS} characters cut]"
        text = text.replace(full, message)   # the traceback's last line repeats it
    if len(text) > TRACEBACK_TAIL_CHARS:
        text = "...\n" + text[-TRACEBACK_TAIL_CHARS:]
    if isinstance(exc, SystemExit):   # sys.exit(0) is no success: the function must return
        return (f"SystemExit: the function called sys.exit({repr(exc.code)[:200]}); a trial function returns "
                f"when it is done (or raises), it must not exit the process\n{text}")
    return f"{type(exc).__name__}: {message}\n{text}"
