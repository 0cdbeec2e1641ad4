"""A ``ray.tune.Trainable`` class as a kubetune trial: Ray's class API, driven the way
Ray Tune drives it (issue 29).

One attempt: ``cls(config)`` (Ray's constructor, which calls ``setup``), then
``load_checkpoint`` if the trial resumes (after a retry, a pause, or a PBT exploit of
another trial's checkpoint), then ``step()`` until the scheduler stops the trial, a
result says ``done: True``, or ``spec.scheduler.maxIterations`` is reached; then
``cleanup`` (through Ray's ``stop()``).  Each result is reported with Ray's
auto-filled fields (raytune.report_result).

Checkpoints: ``save_checkpoint(dir)`` every ``__checkpoint_frequency__`` iterations (a
reserved config key, as Ray reserves ``__trial_info__``; default 1: PBT exploits the
latest checkpoint, so a trainable that saved none could not be exploited), at the end
unless ``__checkpoint_at_end__`` is false, and whenever a pause asks for one.  A
dict returned by ``save_checkpoint`` is written as JSON (pickled, as Ray does, if JSON
cannot hold it: only trials of the same Experiment read it back) and handed back to
``load_checkpoint`` as a dict.

``reset_config`` is not called: every attempt gets a fresh instance (setup +
load_checkpoint), which is what Ray does when ``reset_config`` returns False.
"""
from __future__ import annotations

import json
import os
import pickle
import tempfile
from typing import Any, Callable, Mapping

from kubetune.trainable import api
from kubetune.trainable.raytune import report_result

CHECKPOINT_FREQUENCY_KEY = "__checkpoint_frequency__"
CHECKPOINT_AT_END_KEY = "__checkpoint_at_end__"
DICT_JSON = "kubetune_dict_checkpoint.json"
DICT_PICKLE = "kubetune_dict_checkpoint.pkl"


def trainable_class_runner(cls: type) -> Callable[[dict], None]:
    def run(config: dict) -> None:
        config = dict(config)
        every = int(config.pop(CHECKPOINT_FREQUENCY_KEY, 1) or 0)
        at_end = bool(config.pop(CHECKPOINT_AT_END_KEY, True))
        trainable = cls(config=config)
        try:
            restored = api.get_checkpoint()
            if restored is not None:
                trainable.load_checkpoint(_read(restored))
            while True:
                result = trainable.step()
                if not isinstance(result, Mapping):
                    raise TypeError(f"{cls.__qualname__}.step() must return a dict of metrics, "
                                    f"got {type(result).__name__}")
                context = api.get_context()
                iteration = context.iteration + 1
                save = ((every and iteration % every == 0) or context.should_checkpoint
                        or (at_end and result.get("done") is True))
                if not save:
                    report_result(result, None)
                    continue
                with tempfile.TemporaryDirectory(prefix="kubetune-trainable-") as directory:
                    _write(directory, trainable.save_checkpoint(directory))
                    report_result(result, directory)
        except api.TrialDone:
            pass
        finally:
            trainable.stop()          # Ray's: cleanup(), then its own log files closed

    run.__qualname__ = run.__name__ = cls.__qualname__
    run.__module__ = cls.__module__
    return run


def _write(directory: str, saved: Any) -> None:
    if saved is None or (isinstance(saved, str) and os.path.abspath(saved) == os.path.abspath(directory)):
        return
    if isinstance(saved, str):
        raise TypeError("save_checkpoint() must write into the directory it is given and return "
                        f"None or a dict, not another path ({saved!r})")
    if not isinstance(saved, dict):
        raise TypeError(f"save_checkpoint() must return None or a dict, got {type(saved).__name__}")
    try:
        text = json.dumps(saved)
    except (TypeError, ValueError):
        with open(os.path.join(directory, DICT_PICKLE), "wb") as handle:
            pickle.dump(saved, handle)
        return
    with open(os.path.join(directory, DICT_JSON), "w") as handle:
        handle.write(text)


def _read(directory: str) -> Any:
    """What ``load_checkpoint`` gets: the dict ``save_checkpoint`` returned, or the directory."""
    if os.path.exists(os.path.join(directory, DICT_JSON)):
        with open(os.path.join(directory, DICT_JSON)) as handle:
            return json.load(handle)
    if os.path.exists(os.path.join(directory, DICT_PICKLE)):
        with open(os.path.join(directory, DICT_PICKLE), "rb") as handle:
            return pickle.load(handle)  # noqa: S301 - written by a trial of this same Experiment
    return directory
