"""The Ray platform's executor seam is typed (executors/ray/connection.py): ``RayPlatform``
calls ``RayConnection``'s methods with no ``getattr`` fallback, so each class that serves
it (this process's ``RayExecutor``, another cluster's ``DriverProcess``, and the unit
tests' ``FakeRayConnection``) must have every method, called the way the protocol says.
Read from the classes, and checked against planted violations."""
from __future__ import annotations

import inspect
import pathlib
import re
import typing

import pytest

import kubetune
from kubetune.executors.ray.connection import RayConnection
from kubetune.executors.ray.executor import RayExecutor
from kubetune.executors.ray.platform import RayPlatform, RayPlatforms
from kubetune.executors.ray.process import DriverProcess
from ray_fakes import FakeRayConnection


def protocol_methods(protocol: type) -> dict[str, inspect.Signature]:
    """The methods ``protocol`` declares, its bases' included, without ``self``."""
    methods = {}
    for base in reversed(protocol.__mro__):
        if base is object or base is typing.Protocol or base.__module__ == "typing":
            continue
        for name, member in vars(base).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                methods[name] = _without_self(inspect.signature(member))
    return methods


def _without_self(signature: inspect.Signature) -> inspect.Signature:
    parameters = list(signature.parameters.values())
    return signature.replace(parameters=parameters[1:])


def _signature(cls: type, name: str) -> inspect.Signature:
    static = inspect.getattr_static(cls, name)
    function = static.__func__ if isinstance(static, (staticmethod, classmethod)) else static
    signature = inspect.signature(function)
    return signature if isinstance(static, staticmethod) else _without_self(signature)


def breaches(cls: type, protocol: type = RayConnection) -> list[str]:
    """How ``cls`` falls short of ``protocol``: a method missing, or one that cannot be called
    as the protocol says (a parameter missing or of another kind, or an extra one without a
    default)."""
    found = []
    for name, wanted in protocol_methods(protocol).items():
        if not callable(getattr(cls, name, None)):
            found.append(f"{name}: missing")
            continue
        have = _signature(cls, name).parameters
        for parameter in wanted.parameters.values():
            mine = have.get(parameter.name)
            if mine is None or mine.kind != parameter.kind:
                found.append(f"{name}: parameter {parameter.name!r} missing or of another kind")
            elif parameter.default is not inspect.Parameter.empty and mine.default is inspect.Parameter.empty:
                found.append(f"{name}: parameter {parameter.name!r} needs a default")
        for extra in (p for n, p in have.items() if n not in wanted.parameters):
            if extra.default is inspect.Parameter.empty and extra.kind not in (extra.VAR_POSITIONAL, extra.VAR_KEYWORD):
                found.append(f"{name}: extra parameter {extra.name!r} without a default")
    return found


@pytest.mark.parametrize("cls", [RayExecutor, DriverProcess, FakeRayConnection], ids=lambda c: c.__name__)
def test_every_class_serving_a_ray_platform_has_the_whole_protocol(cls):
    assert breaches(cls) == []


def test_the_protocol_holds_what_the_platform_calls_beyond_a_trial_executor():
    assert {"gcs_endpoint", "node_types", "remaining", "close"} <= set(protocol_methods(RayConnection))
    assert {"start", "poll", "stop", "connect", "is_unavailable"} <= set(protocol_methods(RayConnection))


def test_the_protocol_check_sees_planted_breaches():
    class NoEndpoint(FakeRayConnection):
        gcs_endpoint = None

    class WrongShapes(FakeRayConnection):
        def node_types(self, address):           # a required argument the platform never passes
            return None

        def poll(self, cursors, wait_s=0.0, limit=1000):   # wait_s no longer keyword-only
            return {}

        def logs(self, trial_key, lines):        # the default the platform relies on is gone
            return ""

    assert breaches(NoEndpoint) == ["gcs_endpoint: missing"]
    assert breaches(WrongShapes) == [
        "poll: parameter 'wait_s' missing or of another kind", "poll: parameter 'limit' missing or of another kind",
        "logs: parameter 'lines' needs a default", "node_types: extra parameter 'address' without a default"]


def test_the_platform_is_typed_against_the_protocol():
    hints = typing.get_type_hints(RayPlatform.__init__)
    assert hints["executor_factory"] == typing.Callable[[str], RayConnection]
    assert typing.get_type_hints(RayPlatforms.__init__)["separate_factory"] == \
        typing.Optional[typing.Callable[[str, str], RayConnection]]


# the platforms reach their executor through its protocol: no getattr(executor, ...) fallback
EXECUTORS = pathlib.Path(kubetune.__file__).parent / "executors"
GETATTR_ON_EXECUTOR = re.compile(r"getattr\(\s*(self\.)?executor\b")


def executor_getattrs(paths: list[pathlib.Path]) -> list[str]:
    return [f"{path.name}: {line.strip()}" for path in paths for line in path.read_text().splitlines()
            if GETATTR_ON_EXECUTOR.search(line)]


def test_no_platform_reaches_past_its_executors_protocol():
    platforms = [EXECUTORS / "platform.py", EXECUTORS / "ray" / "platform.py", EXECUTORS / "pods" / "cluster.py"]
    assert all(path.exists() for path in platforms)
    assert executor_getattrs(platforms) == []


def test_the_getattr_rule_sees_a_planted_violation(tmp_path):
    planted = tmp_path / "platform.py"
    planted.write_text('endpoint = getattr(self.executor, "gcs_endpoint", None)\n'
                       'close = getattr(executor, "close", None) or executor.disconnect\n'
                       'cause = getattr(error, "cause", None)\n')
    assert executor_getattrs([planted]) == [
        'platform.py: endpoint = getattr(self.executor, "gcs_endpoint", None)',
        'platform.py: close = getattr(executor, "close", None) or executor.disconnect']
