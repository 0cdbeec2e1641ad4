"""Kueue's API, read-only, for the pod executor: the Workloads of trial pods and their
LocalQueues.  The operator never writes a Kueue object (the chart's RBAC with
``podExecutor.kueue.enabled``: get, list, watch workloads and localqueues).  Answers are
plain dicts (the Kueue types are not in the Python client); a refusal is ``ApiError``.
Why Kueue stopped a pod is in an Event on the pod, read with ``PodApi.list_events``."""
from __future__ import annotations

import json
from typing import Any, Iterable

import kubernetes
from kubernetes.client.exceptions import ApiException

from kubetune.k8s.errors import ApiError
from kubetune.k8s.pods import REQUEST_TIMEOUT

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
WORKLOADS = "workloads"
LOCAL_QUEUES = "localqueues"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"   # on each Workload: the UID of the pod (job) it stands for
UIDS_PER_SELECTOR = 50
PAGE_SIZE = 500


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

    def list_workloads(self, namespace: str, pod_uids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The namespace's Workloads (one per Kueue-managed pod); ``pod_uids``: only those
        of these pods, selected by the label Kueue gives each Workload (its owner's UID),
        so a namespace full of other teams' Workloads is not read.  Paginated."""
        selectors = [""]
        if pod_uids is not None:
            uids = sorted(set(pod_uids))
            if not uids:
                return []
            selectors = [f"{JOB_UID_LABEL} in ({','.join(uids[i:i + UIDS_PER_SELECTOR])})"
                         for i in range(0, len(uids), UIDS_PER_SELECTOR)]
        found: list[dict[str, Any]] = []
        for selector in selectors:
            page = ""
            while True:
                options: dict[str, Any] = {"limit": PAGE_SIZE, "_preload_content": False,
                                           "_request_timeout": REQUEST_TIMEOUT}
                if selector:
                    options["label_selector"] = selector
                if page:
                    options["_continue"] = page
                try:
                    raw = json.loads(self.custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, WORKLOADS, **options).data)
                except ApiException as error:
                    raise ApiError.of(error) from error
                found += raw["items"]
                page = (raw.get("metadata") or {}).get("continue") or ""
                if not page:
                    break
        return found

    def local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A LocalQueue, or None if there is none of that name."""
        try:
            raw = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, LOCAL_QUEUES, name,
                                                           _preload_content=False,
                                                           _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status == 404:
                return None
            raise ApiError.of(error) from error
        return json.loads(raw.data)
