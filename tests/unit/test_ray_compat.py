"""Ray's private names, used through executors/ray/ray_compat.py only: each is looked up
here in the installed Ray, with the parameters kubetune passes, so a Ray upgrade that
moves or changes one fails this file, by name, before the operator misreads a cluster."""
from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import kubetune
from kubetune.executors.ray import ray_compat


def resolve(name: tuple[str, str]):
    module, attribute = name
    return getattr(importlib.import_module(module), attribute)


def test_kuberay_autoscaling_config_names_resolve_with_the_parameters_used():
    derive = resolve(ray_compat.KUBERAY_AUTOSCALING_CONFIG)
    assert list(inspect.signature(derive).parameters) == ["ray_cr"]
    client = resolve(ray_compat.KUBERAY_API_CLIENT)
    assert "namespace" in inspect.signature(client.__init__).parameters
    assert list(inspect.signature(client.get).parameters) == ["self", "path"]


def test_the_head_function_imports_exactly_the_listed_names():
    # it runs on the head without kubetune, so it names them itself: they must agree
    source = (pathlib.Path(kubetune.__file__).parent / "executors/ray/autoscaler.py").read_text()
    for module, attribute in (ray_compat.KUBERAY_AUTOSCALING_CONFIG, ray_compat.KUBERAY_API_CLIENT):
        assert f"from {module} import {attribute}" in source


def test_per_node_resources_and_the_gcs_client_are_where_they_are_looked_for():
    state = importlib.import_module("ray._private.state")
    assert list(inspect.signature(state.available_resources_per_node).parameters) == []
    raylet = importlib.import_module("ray._raylet")
    # GcsClient(address=) hands its calls to the InnerGcsClient it connects
    assert "address" in inspect.signature(raylet.GcsClient.__init__).parameters or hasattr(raylet.GcsClient, "__getattr__")
    assert "timeout" in inspect.signature(raylet.InnerGcsClient.internal_kv_get).parameters


def test_the_settings_reload_is_where_it_is_looked_for():
    config = importlib.import_module("ray._raylet").Config
    assert list(inspect.signature(config.initialize).parameters) == ["config_list"]


def test_the_rpc_error_is_still_named_so():
    import grpc
    assert grpc.RpcError.__name__ in ray_compat.RPC_ERROR_NAMES


def test_no_private_ray_name_outside_the_adapters():
    """executors/ray/ray_compat.py (and the head function it lists) and, for the trial
    side, trainable/ray_private.py are the only places that name Ray's private modules."""
    private = re.compile(r"\bray\.(?:[\w.]*\.)?_(?!_)\w+")
    allowed = {"executors/ray/ray_compat.py", "executors/ray/autoscaler.py", "trainable/ray_private.py"}
    package = pathlib.Path(kubetune.__file__).parent
    found = {str(path.relative_to(package)): line.strip() for path in package.rglob("*.py")
             if str(path.relative_to(package)) not in allowed
             for line in path.read_text().splitlines() if private.search(line) and not line.strip().startswith("#")}
    assert found == {}
    assert private.search("from ray._private.state import available_resources_per_node")
    assert private.search("import ray.autoscaler._private.kuberay")
    assert not private.search("ray.get_runtime_context().gcs_address")
    assert not private.search('info["ray"] = ray.__version__')


def test_raw_object_and_error_info_readers_are_where_they_are_looked_for():
    worker = importlib.import_module("ray._private.worker")
    assert hasattr(worker, "global_worker")
    core_worker = importlib.import_module("ray._raylet").CoreWorker
    assert callable(core_worker.get_objects)
    context = importlib.import_module("ray._private.serialization").SerializationContext
    assert callable(context._deserialize_error_info)
