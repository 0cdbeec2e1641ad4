"""``kubectl wait --for=condition=<type> <plural>/<name>`` with the Python client, for
machines without kubectl.  Same algorithm as kubectl (k8s.io/kubectl/pkg/cmd/wait,
ConditionalWait): GET the object; if the condition is not met, WATCH it by
``metadata.name`` field selector from that resourceVersion and test every version
seen.  A condition is met when an entry of ``.status.conditions`` has the type
(case-insensitive) and status "True" (case-insensitive), and — when it carries
``observedGeneration`` — that equals ``metadata.generation`` (a condition about an
older spec does not count)."""
from __future__ import annotations

import time
from typing import Any

from kubernetes import watch


class WaitTimeout(TimeoutError):
    pass


def condition_met(body: dict[str, Any], condition: str, value: str = "True") -> bool:
    generation = (body.get("metadata") or {}).get("generation")
    for item in (body.get("status") or {}).get("conditions") or []:
        if str(item.get("type", "")).lower() != condition.lower():
            continue
        if "observedGeneration" in item and generation is not None and item["observedGeneration"] != generation:
            continue
        return str(item.get("status", "")).lower() == value.lower()
    return False


def wait_for_condition(custom_api, group: str, version: str, namespace: str, plural: str, name: str,
                       condition: str, *, timeout: float) -> dict[str, Any]:
    """The object once ``condition`` is True; ``WaitTimeout`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    body = custom_api.get_namespaced_custom_object(group, version, namespace, plural, name)
    if condition_met(body, condition):
        return body
    resource_version = body["metadata"]["resourceVersion"]
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"timed out waiting for the condition on {plural}/{name}")
        stream = watch.Watch()
        try:
            for event in stream.stream(custom_api.list_namespaced_custom_object, group, version, namespace,
                                       plural, field_selector=f"metadata.name={name}",
                                       resource_version=resource_version,
                                       timeout_seconds=max(1, int(remaining))):
                obj = event["object"]
                if event["type"] == "ERROR":   # e.g. 410 Gone: start over from a fresh GET
                    obj = custom_api.get_namespaced_custom_object(group, version, namespace, plural, name)
                elif event["type"] == "DELETED":
                    raise WaitTimeout(f"{plural}/{name} was deleted while waiting")
                resource_version = obj["metadata"]["resourceVersion"]
                if condition_met(obj, condition):
                    return obj
                if time.monotonic() >= deadline:
                    break
        finally:
            stream.stop()
