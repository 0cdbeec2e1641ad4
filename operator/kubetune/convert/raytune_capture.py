"""Run a Ray Tune script with ``Tuner`` (and ``tune.run``) intercepted: the script runs up
to the point where it would start tuning, and what it was about to tune is captured.

Nothing is tuned and no Ray is started (``ray.init`` does nothing while the script
runs).  The arguments of the schedulers and searchers the script builds are recorded
as it passes them (``record_arguments``), so the mapping reads what the user wrote,
not the classes' private state.  Everything patched is put back afterwards.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

# the classes whose constructor arguments the mapping needs: (module, class names)
RECORDED = (
    ("ray.tune.schedulers", ("FIFOScheduler", "AsyncHyperBandScheduler", "HyperBandScheduler",
                             "MedianStoppingRule", "PopulationBasedTraining", "HyperBandForBOHB",
                             "PopulationBasedTrainingReplay")),
    ("ray.tune.schedulers.pb2", ("PB2",)),
    ("ray.tune.search", ("ConcurrencyLimiter", "BasicVariantGenerator", "Repeater")),
    ("ray.tune.search.optuna", ("OptunaSearch",)),
    ("ray.tune.search.hyperopt", ("HyperOptSearch",)),
    ("ray.tune.search.bayesopt", ("BayesOptSearch",)),
)
ARGUMENTS = "_kubetune_arguments"     # set on each recorded instance
WRAPPED = "_kubetune_wrapped"         # set on what tune.with_parameters/with_resources return
LINE = "_kubetune_line"               # set on tune.sample_from domains: where it was written


class _Captured(BaseException):
    """Ends the script at the Tuner (a BaseException: a broad ``except`` in it cannot stop it)."""


@dataclass
class Captured:
    script: str
    line: str                             # "script.py:42", where the Tuner was made
    trainable: Any
    param_space: dict
    tune_config: Any = None
    run_config: Any = None
    via: str = "Tuner"                   # or "tune.run"
    run_kwargs: dict = field(default_factory=dict)    # tune.run's other arguments
    script_globals: dict = field(default_factory=dict)


class NoTuner(Exception):
    """The script ended without making a Tuner."""


def capture(script: str, args: list[str]) -> Captured:
    """Run ``script`` as ``__main__`` with ``args`` until it makes a Tuner (or calls tune.run)."""
    script = os.path.abspath(script)
    found: list[Captured] = []
    namespace: dict = {}
    with _patched(found, script, namespace):
        argv, path0 = sys.argv[:], sys.path[0] if sys.path else ""
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(script))
        try:
            namespace.update(runpy.run_path(script, run_name="__main__"))
        except _Captured:
            pass
        except SystemExit as exit_:     # argparse refusing the arguments, or the script's own exit
            if not found:
                raise NoTuner(f"{script} exited ({exit_.code}) before it created a Tuner; check the "
                              "arguments after `--`") from None
        except Exception as error:
            if not found:
                raise NoTuner(f"{script} raised {type(error).__name__}: {error} before it created a "
                              "Tuner (converting runs the script up to the Tuner, so its imports must be "
                              "installed here)") from error
        finally:
            sys.argv = argv
            if sys.path and sys.path[0] == os.path.dirname(script) and path0 != sys.path[0]:
                sys.path.pop(0)
    if not found:
        raise NoTuner(f"{script} ended without creating a ray.tune.Tuner (nor calling tune.run); "
                      "pass the arguments that make it tune after `--`")
    return found[0]


def _where(frame_depth: int = 2) -> str:
    frame = sys._getframe(frame_depth)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@contextlib.contextmanager
def _patched(found: list[Captured], script: str, namespace: dict) -> Iterator[None]:
    import ray
    from ray import tune
    import ray.tune.tuner as tuner_module

    def script_globals() -> dict:
        # the script's module namespace, as it is when the Tuner is made
        frame = sys._getframe(2)
        while frame is not None and os.path.abspath(frame.f_code.co_filename) != script:
            frame = frame.f_back
        return dict(frame.f_globals) if frame is not None else {}

    class Tuner:
        def __init__(self, trainable=None, *, param_space=None, tune_config=None, run_config=None, **_):
            found.append(Captured(script, _where(), trainable, dict(param_space or {}), tune_config,
                                  run_config, script_globals=script_globals()))
            raise _Captured()

        @classmethod
        def restore(cls, *args, **kwargs):
            raise _Captured()

        @classmethod
        def can_restore(cls, *args, **kwargs):
            return False

    def run(run_or_experiment, config=None, **kwargs):
        found.append(Captured(script, _where(), run_or_experiment, dict(config or {}), via="tune.run",
                              run_kwargs=kwargs, script_globals=script_globals()))
        raise _Captured()

    real_with_parameters, real_with_resources, real_sample_from = (
        tune.with_parameters, tune.with_resources, tune.sample_from)

    def with_parameters(trainable, **kwargs):
        wrapped = real_with_parameters(trainable, **kwargs)
        setattr(wrapped, WRAPPED, ("with_parameters", trainable, kwargs, _where()))
        return wrapped

    def with_resources(trainable, resources):
        wrapped = real_with_resources(trainable, resources)
        setattr(wrapped, WRAPPED, ("with_resources", trainable, resources, _where()))
        return wrapped

    def sample_from(func):
        domain = real_sample_from(func)
        setattr(domain, LINE, _where())
        return domain

    patches = [(ray, "init", lambda *a, **k: None), (ray, "shutdown", lambda *a, **k: None),
               (tune, "Tuner", Tuner), (tuner_module, "Tuner", Tuner), (tune, "run", run),
               (tune, "with_parameters", with_parameters), (tune, "with_resources", with_resources),
               (tune, "sample_from", sample_from)]
    for module_name, names in RECORDED:
        try:
            module = importlib.import_module(module_name)
        except ImportError:          # an optional searcher whose package is not installed
            continue
        for name in names:
            cls = getattr(module, name, None)
            if isinstance(cls, type) and "__init__" in vars(cls):
                patches.append((cls, "__init__", _recording(cls.__init__)))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _recording(init):
    signature = inspect.signature(init)

    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
            arguments.update(arguments.pop("kwargs", None) or {})
        except TypeError:
            arguments = dict(kwargs)
        if not hasattr(self, ARGUMENTS):      # a subclass's (outermost) call wins
            object.__setattr__(self, ARGUMENTS, {**arguments, "_line": _where()})
        init(self, *args, **kwargs)

    return __init__
