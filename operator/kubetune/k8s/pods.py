"""The Kubernetes API calls of the pod executor (executors/pods/): Pods, their logs,
Secrets, ConfigMaps, Events, Nodes, the Namespace's labels and the Trial that owns
them.  Small typed functions over one client, synchronous (the executor runs in a
thread).  Answers are plain dicts, the JSON the API server sent (read with
``_preload_content=False``: the client's models cost more CPU than the calls); a
refusal is ``ApiError``, with the API's status and its own message.

Each function makes exactly the call it did inside the executor before, so the
chart's RBAC rules (charts/kubetune, tested by test_chart_pods.py) still name every
verb the operator uses."""
from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Protocol

import kubernetes
from kubernetes.client.exceptions import ApiException

from kubetune.k8s.client import GROUP, TRIALS, VERSION
from kubetune.k8s.errors import ApiError


class LogStream(Protocol):
    """An open pods/log response: read in chunks, then release the connection."""
    def stream(self, amt: int) -> Iterator[bytes]: ...
    def release_conn(self) -> None: ...
    def close(self) -> None: ...


def _json(response: Any) -> Any:
    return json.loads(response.data)


# (connect, read) seconds of every call but a followed log: a half-open connection to the
# API server must not hang the executor's thread (and with it its Experiment's cycles)
REQUEST_TIMEOUT = (10.0, 60.0)
MAX_LOG_TAIL_BYTES = 16 * 1024   # a failed pod's log tail, whatever its lines hold (binary output)


class PodApi:
    """One API client's worth of the calls above; the client is made on first use."""

    def __init__(self, api_client: Any = None, *, request_timeout: tuple[float, float] = REQUEST_TIMEOUT) -> None:
        self._api_client = api_client
        self._core: Any = None
        self._custom: Any = None
        self.timeout = request_timeout

    def _apis(self) -> tuple[Any, Any]:
        if self._core is None:
            client = self._api_client or kubernetes.client.ApiClient()
            self._core = kubernetes.client.CoreV1Api(client)
            self._custom = kubernetes.client.CustomObjectsApi(client)
        return self._core, self._custom

    @property
    def core(self) -> Any:
        return self._apis()[0]

    # ---------------------------------------------------------------- Trial, Namespace

    def trial_uid(self, namespace: str, trial: str) -> str:
        """The UID of Trial ``trial``: what a pod, Secret and ConfigMap are owned by."""
        custom = self._apis()[1]
        with _refusals():
            return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, TRIALS, trial,
                                                       _request_timeout=self.timeout)["metadata"]["uid"]

    def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of Namespace ``name``; with watchNamespaces the chart's Role in that
        namespace grants ``get`` on this one Namespace object, nothing cluster-wide."""
        with _refusals():
            return dict(_json(self.core.read_namespace(name, _preload_content=False,
                                                               _request_timeout=self.timeout))["metadata"].get("labels") or {})

    # ---------------------------------------------------------------- Pods

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """True if created, False if a pod of that name exists already."""
        return self._create(self.core.create_namespaced_pod, namespace, body)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete with the pod's own grace period (SIGTERM, then SIGKILL); gone already is fine."""
        try:
            self.core.delete_namespaced_pod(name, namespace, _request_timeout=self.timeout)
        except ApiException as error:
            if error.status != 404:
                raise ApiError.of(error) from error

    def list_pods(self, namespace: str | None, *, label_selector: str = "",
                  field_selector: str = "") -> list[dict[str, Any]]:
        """Pods of ``namespace`` (None: of every namespace) matching the selectors."""
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        if label_selector:
            options["label_selector"] = label_selector
        if field_selector:
            options["field_selector"] = field_selector
        with _refusals():
            if namespace:
                return _json(self.core.list_namespaced_pod(namespace, **options))["items"]
            return _json(self.core.list_pod_for_all_namespaces(**options))["items"]

    def pod_log_tail(self, namespace: str, name: str, lines: int, max_bytes: int = MAX_LOG_TAIL_BYTES) -> str:
        """The last ``lines`` lines of the pod's log, at most ``max_bytes`` of them (asked of
        the kubelet as limitBytes, and read no further whatever it sends)."""
        with _refusals():
            response = self.core.read_namespaced_pod_log(name, namespace, tail_lines=lines, limit_bytes=max_bytes,
                                                         _preload_content=False, _request_timeout=self.timeout)
        try:
            return response.read(max_bytes).decode("utf-8", errors="replace")
        finally:
            response.release_conn()

    def open_pod_log(self, namespace: str, name: str, container: str, *, follow: bool,
                     timeout: tuple[float, float]) -> LogStream:
        """The container's log as a stream (never held whole); ``follow`` keeps it open."""
        options: dict[str, Any] = {"container": container, "_preload_content": False, "_request_timeout": timeout}
        if follow:
            options["follow"] = True
        with _refusals():
            return self.core.read_namespaced_pod_log(name, namespace, **options)

    # ---------------------------------------------------------------- Secrets, ConfigMaps

    def create_secret(self, namespace: str, body: Mapping[str, Any]) -> bool:
        return self._create(self.core.create_namespaced_secret, namespace, body)

    def read_secret(self, namespace: str, name: str) -> dict[str, Any]:
        with _refusals():
            return _json(self.core.read_namespaced_secret(name, namespace, _preload_content=False,
                                                                 _request_timeout=self.timeout))

    def create_config_map(self, namespace: str, body: Mapping[str, Any]) -> bool:
        return self._create(self.core.create_namespaced_config_map, namespace, body)

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any]:
        with _refusals():
            return _json(self.core.read_namespaced_config_map(name, namespace, _preload_content=False,
                                                                     _request_timeout=self.timeout))

    def patch_config_map_data(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        with _refusals():
            self.core.patch_namespaced_config_map(name, namespace, {"data": dict(data)},
                                                  _request_timeout=self.timeout)

    # ---------------------------------------------------------------- Events, Nodes

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """False if an Event of that name exists (the same warning, posted before)."""
        return self._create(self.core.create_namespaced_event, namespace, body)

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        with _refusals():
            return _json(self.core.list_namespaced_event(namespace, field_selector=field_selector,
                                                         _preload_content=False, _request_timeout=self.timeout))["items"]

    def list_nodes(self) -> list[dict[str, Any]]:
        with _refusals():
            return _json(self.core.list_node(_preload_content=False, _request_timeout=self.timeout))["items"]

    def _create(self, call: Any, namespace: str, body: Mapping[str, Any]) -> bool:
        try:
            call(namespace, body, _request_timeout=self.timeout)
            return True
        except ApiException as error:
            if error.status == 409:
                return False
            raise ApiError.of(error) from error


class _refusals:
    """Turns the client's ApiException into ``ApiError`` (a context manager, so each
    function above stays one call)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        if isinstance(error, ApiException):
            raise ApiError.of(error) from error
        return False
