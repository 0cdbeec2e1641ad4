"""The operator chooses which Ray clusters it talks to (issue 25, N2): the allow-list, the
driver processes' cap and threads, and their scrubbed environment."""
from __future__ import annotations

import argparse
import asyncio
import os
import threading

import pytest

from kubetune.executors.base import ClusterResources
from kubetune.executors.platform import PlatformRegistry
from kubetune.executors.ray import sandbox
from kubetune.executors.ray.platform import RayAddressRefused, RayPlatforms
from kubetune.executors.ray.process import scrubbed_environment
from kubetune.operator_main import add_arguments
from kubetune.settings import SettingError, from_args
from kubetune.spec import ray_allowlist
from ray_fakes import FakeRayConnection

OWN = "ray://kuberay-head.kubetune:10001"


@pytest.mark.parametrize("address,namespace,allowed", [
    ("ray://head.team-a:10001", "team-a", True),
    ("ray://head.team-a.svc:10001", "team-a", True),
    ("ray://head.team-a.svc.cluster.local:10001", "team-a", True),
    ("ray://head.team-b:10001", "team-a", False),             # another tenant's Service
    ("ray://head.team-b.svc:10001", "team-a", False),
    ("ray://127.0.0.1:10001", "team-a", False),
    ("ray://10.0.0.7:10001", "team-a", False),
    ("ray://evil.example.com:10001", "team-a", False),
    ("ray://evil.example.team-a:10001", "team-a", False),     # not <service>.<namespace>
    ("ray://head.team-a.svc.cluster.local.evil.com:1", "team-a", False),
    ("ray://head.team-a:10001/x", "team-a", False),
    ("ray://head.team-a:10001", "", False),                    # no namespace: nothing of a namespace's
    ("head.team-a:6379", "team-a", False),                     # a GCS address: a driver of the operator's own
    ("auto", "team-a", False), ("local", "team-a", False),
])
def test_the_default_allows_services_of_the_experiments_own_namespace_only(address, namespace, allowed):
    entries = ray_allowlist.parse(ray_allowlist.DEFAULT)
    assert (ray_allowlist.match(address, namespace, entries) is not None) is allowed


def test_listed_addresses_carry_their_own_token_variable_and_bad_entries_are_named():
    entries = ray_allowlist.parse(["ray://shared.ml:10001=SHARED_RAY_TOKEN, namespace-services"])
    assert ray_allowlist.match("ray://shared.ml:10001", "x", entries).token_env == "SHARED_RAY_TOKEN"
    assert ray_allowlist.match("ray://shared.ml:10002", "x", entries) is None
    assert ray_allowlist.parse([""]) == ()           # Helm's empty list: no other cluster
    for bad, why in (("ray://a.b:1=not a name", "environment variable"), ("http://a.b", "expected namespace-services"),
                     ("ray://a.b", "expected namespace-services")):
        with pytest.raises(ValueError, match=why) as refused:
            ray_allowlist.parse([bad])
        assert repr(bad) in str(refused.value)


def settings(*flags: str):
    """The settings of `kubetune operator <flags>`, parsed by its own argument parser."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(["--ray-address", OWN, *flags]))


def test_the_settings_name_the_flag_of_a_bad_value_and_default_to_namespace_services():
    assert settings().ray_allowed_addresses == (ray_allowlist.Entry("namespace-services"),)
    assert settings("--ray-allowed-addresses=").ray_allowed_addresses == ()
    assert settings("--ray-allowed-addresses", "ray://a.b:1=T", "--ray-allowed-addresses", "any").ray_allowed_addresses \
        == (ray_allowlist.Entry("ray://a.b:1", "T"), ray_allowlist.Entry("any"))
    assert settings("--max-ray-drivers", "3").max_ray_drivers == 3
    with pytest.raises(SettingError, match="--ray-allowed-addresses"):
        settings("--ray-allowed-addresses", "ftp://x")
    with pytest.raises(SettingError, match="--max-ray-drivers"):
        settings("--max-ray-drivers", "0")


class Driver(FakeRayConnection):
    """A driver process's executor, as far as the platform calls it; counts connects."""

    def __init__(self, made: list, address: str, token_env: str = "") -> None:
        made.append((address, token_env))
        self.threads: list[str] = []

    def connect(self):
        self.threads.append(threading.current_thread().name)

    def cluster_resources(self):
        return ClusterResources({"CPU": 1.0}, {"CPU": 1.0}, [])

    def request_resources(self, bundles):
        pass

    def close(self):
        pass


def test_a_refused_address_fails_before_any_connection_and_names_the_allow_list():
    made: list = []
    providers = RayPlatforms(OWN, lambda a: Driver(made, a), separate_factory=lambda a, t: Driver(made, a, t),
                             allowed=ray_allowlist.parse(ray_allowlist.DEFAULT))
    registry = PlatformRegistry({"ray": providers})
    with pytest.raises(RayAddressRefused) as refused:
        providers.get("ray://127.0.0.1:6379", "team-a")
    assert refused.value.reason == "RayAddressRefused"
    assert "--ray-allowed-addresses" in str(refused.value) and "ray.allowedAddresses" in str(refused.value)
    # a deleted Experiment that named it: nothing to clean up there, and no connection either
    assert registry.cleanup_platform({"ray": {"address": "ray://head.team-b:1"}}, "team-a") is None
    # an address allowed to one namespace is not to another, even once connected
    assert providers.get("ray://head.team-a:10001", "team-a")
    with pytest.raises(RayAddressRefused):
        providers.get("ray://head.team-a:10001", "team-b")
    assert providers.get(OWN, "team-b").address == OWN      # its own: always
    assert made == []


def test_driver_processes_are_capped_run_on_threads_of_their_own_and_get_their_clusters_token():
    made: list = []
    providers = RayPlatforms(OWN, lambda a: Driver(made, a), separate_factory=lambda a, t: Driver(made, a, t),
                             allowed=ray_allowlist.parse(["any=OTHER_TOKEN"]), max_drivers=1)

    async def run():
        first = providers.get("ray://a.x:1", "x")
        second = providers.get("ray://b.x:1", "x")
        assert await first.ensure_connected()
        assert not await second.ensure_connected()
        assert "--max-ray-drivers" in second.last_error and "ray.maxDriverProcesses" in second.last_error
        assert second.executor is None
        assert made == [("ray://a.x:1", "OTHER_TOKEN")]
        assert first.executor.threads == ["ray ray://a.x:1_0"]     # not the loop's shared pool
        # once the first is retired (no Experiment needs it), the second may start
        assert await first.retire(first.uses)
        assert await second.ensure_connected()
        assert [a for a, _ in made] == ["ray://a.x:1", "ray://b.x:1"]
    asyncio.run(run())


def test_a_driver_process_gets_none_of_the_operators_credentials():
    environ = {"RAY_AUTH_TOKEN": "operator", "RAY_AUTH_MODE": "token", "KUBETUNE_RESULTS_URL": "postgresql://u:p@db",
               "AWS_SECRET_ACCESS_KEY": "s", "GITHUB_TOKEN": "t", "PGPASSWORD": "p", "OTHER_TOKEN": "o",
               "PATH": "/bin", "HOME": "/root", "PYTHONPATH": "/app"}
    assert scrubbed_environment(environ=environ) == {"PATH": "/bin", "HOME": "/root", "PYTHONPATH": "/app"}
    assert scrubbed_environment("cluster-token", environ) == {
        "PATH": "/bin", "HOME": "/root", "PYTHONPATH": "/app", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "cluster-token"}


@pytest.mark.parametrize("abi", [0, 5], ids=["no-landlock", "no-signal-scoping"])
def test_without_a_full_sandbox_no_driver_process_starts_unless_the_admin_allows_it_by_name(abi):
    """A driver process for another cluster runs sandboxed (executors/ray/sandbox.py); on a
    kernel without Landlock it is not started, and the Experiment's condition says which
    setting would start it anyway.  The operator's own cluster needs no driver process."""
    made: list = []
    refusing = RayPlatforms(OWN, lambda a: Driver(made, a), separate_factory=lambda a, t: Driver(made, a, t),
                            allowed=ray_allowlist.parse(["any"]), sandbox_abi=abi)
    allowing = RayPlatforms(OWN, lambda a: Driver(made, a), separate_factory=lambda a, t: Driver(made, a, t),
                            allowed=ray_allowlist.parse(["any"]), sandbox_abi=abi, allow_unsandboxed=True)

    async def run():
        other = refusing.get("ray://head.x:10001", "x")
        assert not await other.ensure_connected() and other.executor is None
        assert ("no Landlock" if abi == 0 else "Landlock ABI 5") in other.last_error
        assert "--allow-unsandboxed-ray-drivers" in other.last_error and "ray.allowUnsandboxedDrivers" in other.last_error
        assert await refusing.get(OWN, "x").ensure_connected()       # its own: in-process, unaffected
        assert made == [(OWN, "")]
        assert await allowing.get("ray://head.x:10001", "x").ensure_connected()
        assert made[-1] == ("ray://head.x:10001", "")
    asyncio.run(run())
    assert settings().allow_unsandboxed_ray_drivers is False
    assert settings("--allow-unsandboxed-ray-drivers").allow_unsandboxed_ray_drivers is True


def test_a_drivers_sandbox_confines_the_network_of_ray_client_addresses_and_never_opens_a_protected_path():
    assert sandbox.client_port("ray://head.team-a.svc:10002") == 10002
    assert sandbox.client_port("ray://head.team-a") == 10001
    assert sandbox.client_port("head.team-a:6379") is None and sandbox.client_port("local") is None
    paths = sandbox.python_paths()
    assert paths and not [p for p in paths if os.path.realpath(p) in ("/", "/var", "/run")]
    assert sandbox._covers_protected("/") and sandbox._covers_protected("/var/run")
    assert not sandbox._covers_protected("/usr/lib")
