"""Kueue's API, read-only, for the pod executor: the Workloads of trial pods and their
LocalQueues.  The operator never writes a Kueue object (the chart's RBAC with
``podExecutor.kueue.enabled``: get, list, watch workloads and localqueues).  Answers are
plain dicts (the Kueue types are not in the Python client); a refusal is ``ApiError``.
Why Kueue stopped a pod is in an Event on the pod, read with ``PodApi.list_events``."""
from __future__ import annotations

import json
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from kubetune.k8s.errors import ApiError

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
WORKLOADS = "workloads"
LOCAL_QUEUES = "localqueues"


class KueueApi:
    """The calls above over one API client, made on first use."""

    def __init__(self, api_client: Any = None) -> None:
        self._api_client = api_client
        self._custom: Any = None

    @property
    def custom(self) -> Any:
        if self._custom is None:
            self._custom = kubernetes.client.CustomObjectsApi(self._api_client or kubernetes.client.ApiClient())
        return self._custom

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's Workloads (one per Kueue-managed pod)."""
        try:
            raw = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, WORKLOADS,
                                                            _preload_content=False)
        except ApiException as error:
            raise ApiError.of(error) from error
        return json.loads(raw.data)["items"]

    def local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A LocalQueue, or None if there is none of that name."""
        try:
            raw = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, LOCAL_QUEUES, name,
                                                           _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise ApiError.of(error) from error
        return json.loads(raw.data)
