"""The Kubernetes objects a pod trial has besides its pods, owned by its Trial: the
Secret holding its token (the ingest endpoint takes its results only with it) and the
ConfigMap holding its config (mounted at ``/etc/kubetune/config.json``).  spec.py renders
them; this creates, checks and reads them, through k8s/pods.py."""
from __future__ import annotations

import base64
import secrets
from typing import Any, Mapping

from kubetune.executors.base import ExecutorError
from kubetune.executors.pods import spec as pod_spec
from kubetune.k8s.errors import ApiError
from kubetune.k8s.pods import PodApi


class TrialObjects:
    def __init__(self, api: PodApi) -> None:
        self.api = api

    def ensure_secret(self, namespace: str, experiment: str, trial: str, uid: str) -> str:
        """The trial's token: kept across attempts and operator restarts."""
        token = secrets.token_urlsafe(32)
        body = pod_spec.secret_body(namespace, experiment, trial, uid, token)
        try:
            if self.api.create_secret(namespace, body):
                return token
        except ApiError as error:
            raise ExecutorError(f"cannot create Secret {pod_spec.secret_name(trial)}: {error.message}") from error
        existing = self.api.read_secret(namespace, pod_spec.secret_name(trial))
        check_owned(existing["metadata"], trial, uid, "Secret")
        return decode_token(existing)

    def token(self, namespace: str, trial: str) -> str:
        """The token of a trial this process did not start (the operator restarted)."""
        uid = self.api.trial_uid(namespace, trial)
        secret = self.api.read_secret(namespace, pod_spec.secret_name(trial))
        check_owned(secret["metadata"], trial, uid, "Secret")
        return decode_token(secret)

    def ensure_config_map(self, namespace: str, experiment: str, trial: str, uid: str,
                          config: Mapping[str, Any]) -> None:
        """Create or update: a PBT exploit relaunches the trial with new parameters."""
        body = pod_spec.config_map_body(namespace, experiment, trial, uid, config)
        try:
            if self.api.create_config_map(namespace, body):
                return
        except ApiError as error:
            raise ExecutorError(f"cannot create ConfigMap {body['metadata']['name']}: {error.message}") from error
        existing = self.api.read_config_map(namespace, body["metadata"]["name"])
        check_owned(existing["metadata"], trial, uid, "ConfigMap")
        if (existing.get("data") or {}) != body["data"]:
            self.api.patch_config_map_data(namespace, body["metadata"]["name"], body["data"])


def check_owned(metadata: Mapping[str, Any], trial: str, uid: str, kind: str) -> None:
    if not any(ref.get("uid") == uid for ref in metadata.get("ownerReferences") or []):
        raise ExecutorError(f"{kind} {metadata.get('name')} exists and does not belong to Trial {trial}; "
                            "rename or delete it")


def decode_token(secret: Mapping[str, Any]) -> str:
    return base64.b64decode((secret.get("data") or {})[pod_spec.TOKEN_KEY]).decode()
