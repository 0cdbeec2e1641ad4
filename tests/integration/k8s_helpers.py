"""Small helpers the operator tests share: create Experiments, read Trials, wait."""
from __future__ import annotations

import json
from typing import Any

from kubernetes.client.rest import ApiException

from kube_fixtures import wait_for

GROUP, VERSION = "kubetune.dev", "v1alpha1"


def experiment(name: str, *, entrypoint: str = "kubetune.examples.quadratic:train",
               search_space: dict | None = None, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": name},
        "spec": {
            "objective": {"metric": "val_loss", "mode": "min"},
            "searchSpace": search_space or {"x": {"uniform": [-3, 3]}, "y": {"uniform": [-3, 3]}},
            "search": {"algorithm": "random", "seed": 1},
            "trial": {"entrypoint": entrypoint, "resources": {"cpu": 0.1}},
        },
    }
    for key, value in spec.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return body


def create(api, namespace: str, body: dict) -> dict:
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", body)


def get_experiment(api, namespace: str, name: str) -> dict:
    return api.get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)


def experiment_gone(api, namespace: str, name: str) -> bool:
    """Whether the Experiment no longer exists (its deletion waits for the operator's finalizer)."""
    try:
        get_experiment(api, namespace, name)
    except ApiException as error:
        return error.status == 404
    return False


def trials(api, namespace: str, name: str) -> list[dict]:
    items = api.list_namespaced_custom_object(GROUP, VERSION, namespace, "trials",
                                              label_selector=f"kubetune.dev/experiment={name}")["items"]
    return sorted(items, key=lambda t: t["spec"]["index"])


def condition(body: dict, type_: str) -> dict | None:
    for item in (body.get("status") or {}).get("conditions") or []:
        if item["type"] == type_:
            return item
    return None


def wait_condition(api, namespace: str, name: str, type_: str, *, timeout: float, operator=None) -> dict:
    def reached():
        body = get_experiment(api, namespace, name)
        found = condition(body, type_)
        return body if found and found["status"] == "True" else None
    try:
        return wait_for(reached, timeout=timeout, interval=0.5, message=f"{name} condition {type_}")
    except BaseException:
        if operator is not None:
            print(operator.log()[-8000:])
        print(get_experiment(api, namespace, name).get("status"))
        raise


def table(api, namespace: str, plural: str) -> tuple[list[str], list[list]]:
    """What `kubectl get <plural>` renders: the server-side Table."""
    request = api.param_serialize(
        "GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"])
    response = api.call_api(*request)
    response.read()
    data = json.loads(response.data)
    return [c["name"] for c in data["columnDefinitions"] if c["priority"] == 0], \
        [row["cells"] for row in data["rows"]]
