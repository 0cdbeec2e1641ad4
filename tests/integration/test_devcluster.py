"""`kubetune devcluster` and the ControlPlane API: start, attach, stop, clean up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client, config

from kubetune.devcluster import ControlPlane, ControlPlaneError, build
from kubetune.devcluster.processes import ProcessRecord

pytestmark = pytest.mark.integration

# these start control planes of their own, from the binaries the fixture provides
own_control_plane = pytest.mark.skipif(
    bool(os.environ.get("KUBETUNE_TEST_KUBECONFIG")),
    reason="KUBETUNE_TEST_KUBECONFIG: tests use an existing cluster, no embedded control plane")


def kubetune(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubetune.cli", "devcluster", *args],
                          capture_output=True, text=True, timeout=timeout)


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


@own_control_plane
def test_cli_up_env_status_down(tmp_path, kube_cluster):
    # kube_cluster: the binaries are there, so `up` does not build
    state_dir = tmp_path / "plane"

    up = kubetune("up", "--state-dir", str(state_dir))
    assert up.returncode == 0, up.stderr
    kubeconfig = state_dir / "kubeconfig"
    assert up.stdout.strip() == f"export KUBECONFIG={kubeconfig}"
    assert "control plane ready" in up.stderr

    with config.new_client_from_config(config_file=str(kubeconfig)) as api:
        names = {crd.metadata.name for crd in client.ApiextensionsV1Api(api).list_custom_resource_definition().items}
        assert {"experiments.kubetune.dev", "trials.kubetune.dev"} <= names
        assert client.VersionApi(api).get_code().git_version == build.kubernetes_version()

    again = kubetune("up", "--state-dir", str(state_dir))
    assert again.returncode == 0 and "already running" in again.stderr

    env = kubetune("env", "--state-dir", str(state_dir))
    assert env.returncode == 0 and env.stdout.strip() == f"export KUBECONFIG={kubeconfig}"

    status = kubetune("status", "--state-dir", str(state_dir))
    assert status.returncode == 0, status.stdout
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        assert name in status.stdout

    records = [ProcessRecord.from_dict(r) for r in json.loads((state_dir / "state.json").read_text())["processes"]]
    assert [r.name for r in records] == ["etcd", "kube-apiserver", "kube-controller-manager"]
    assert all(r.is_alive() for r in records)
    assert sorted(processes_mentioning(str(state_dir))) == sorted(r.pid for r in records)

    down = kubetune("down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert not any(r.is_alive() for r in records)
    assert processes_mentioning(str(state_dir)) == []
    assert not state_dir.exists()

    assert kubetune("status", "--state-dir", str(state_dir)).returncode == 1
    assert kubetune("env", "--state-dir", str(state_dir)).returncode == 1
    assert kubetune("down", "--state-dir", str(state_dir)).returncode == 0  # nothing to do


def fake_binary(path: Path, script: str) -> None:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


@own_control_plane
def test_crashed_component_is_named_with_its_log(tmp_path, monkeypatch, kube_cluster):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = build.ensure_binaries(["etcd"])["etcd"]
    (bin_dir / "etcd").symlink_to(real)
    fake_binary(bin_dir / "kube-apiserver", "echo 'E0101 flag provided but not defined: -boom' >&2; exit 3")
    monkeypatch.setenv("KUBETUNE_BIN_DIR", str(bin_dir))
    state_dir = tmp_path / "plane"

    plane = ControlPlane(state_dir, log=lambda message: None)
    with pytest.raises(ControlPlaneError) as info:
        plane.start(timeout=60)
    assert info.value.component == "kube-apiserver"
    assert "exited with code 3" in str(info.value)
    assert "flag provided but not defined: -boom" in str(info.value)
    # etcd, which did start, was stopped again
    assert [r.name for r in plane.records] == ["etcd", "kube-apiserver"]
    assert not any(r.is_alive() for r in plane.records)
    assert processes_mentioning(str(state_dir)) == []
    plane.stop()
    assert not state_dir.exists()


def test_prebuilt_binaries_are_used_without_building(tmp_path, monkeypatch):
    # envtest's layout has etcd and kube-apiserver only; the rest comes from the cache
    assets, cache = tmp_path / "assets", tmp_path / "cache"
    cached = cache / "bin" / f"k8s-{build.kubernetes_version()}"
    assets.mkdir()
    cached.mkdir(parents=True)
    for name in ("etcd", "kube-apiserver"):
        fake_binary(assets / name, "exit 0")
    for name in build.ALL_BINARIES:
        fake_binary(cached / name, "exit 0")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("KUBETUNE_CACHE", str(cache))
    monkeypatch.delenv("KUBETUNE_BIN_DIR", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # a build attempt would fail: no `go`

    found = build.ensure_binaries(log=pytest.fail)
    assert found == {"etcd": assets / "etcd", "kube-apiserver": assets / "kube-apiserver",
                     "kube-controller-manager": cached / "kube-controller-manager",
                     "kube-scheduler": cached / "kube-scheduler", "kubectl": cached / "kubectl"}

    override = tmp_path / "override"
    override.mkdir()
    fake_binary(override / "etcd", "exit 0")
    monkeypatch.setenv("KUBETUNE_BIN_DIR", str(override))
    assert build.ensure_binaries(["etcd"], log=pytest.fail)["etcd"] == override / "etcd"


def test_missing_binaries_without_go_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBETUNE_CACHE", str(tmp_path))
    monkeypatch.delenv("KUBETUNE_BIN_DIR", raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(build.BuildError, match="KUBETUNE_BIN_DIR"):
        build.ensure_binaries(["etcd"], log=lambda message: None)


def test_refuses_a_directory_it_did_not_create(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(ControlPlaneError, match="not a devcluster state directory"):
        ControlPlane(tmp_path, log=lambda message: None).start()
    assert precious.read_text() == "keep me"


def test_fixture_cluster_is_healthy(kube_cluster):
    with kube_cluster.api_client() as api:
        response = client.ApiClient.call_api(api, *api.param_serialize("GET", "/readyz", auth_settings=["BearerToken"]))
        assert response.status == 200
        # the controller manager runs: it created the default ServiceAccount
        client.CoreV1Api(api).read_namespaced_service_account("default", "default")
    if kube_cluster.plane is not None:
        assert kube_cluster.plane.is_running()
        assert os.stat(kube_cluster.kubeconfig).st_mode & 0o077 == 0  # holds the admin key
