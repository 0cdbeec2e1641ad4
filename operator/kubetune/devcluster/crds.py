"""Locate kubetune's CustomResourceDefinitions and install them into a cluster."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

CRD_FILES = ("experiment.yaml", "trial.yaml")


def crds_dir() -> Path:
    """``KUBETUNE_CRDS_DIR``, else the repository's ``crds/`` (editable install)."""
    override = os.environ.get("KUBETUNE_CRDS_DIR")
    if override:
        return Path(override).expanduser()
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "crds"
        if (candidate / CRD_FILES[0]).is_file():
            return candidate
    raise FileNotFoundError(
        "kubetune's crds/ directory was not found next to the package; set KUBETUNE_CRDS_DIR")


def load_crds(directory: Path | None = None) -> list[dict[str, Any]]:
    directory = directory or crds_dir()
    documents = []
    for name in CRD_FILES:
        for document in yaml.safe_load_all((directory / name).read_text()):
            if document:
                documents.append(document)
    return documents


def install_crds(api_client, directory: Path | None = None, timeout: float = 60.0,
                 documents: list[dict[str, Any]] | None = None) -> list[str]:
    """Create or replace each CRD (``documents``, else kubetune's from ``directory``),
    wait until all are Established; return their names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.ApiextensionsV1Api(api_client)
    names = []
    for crd in documents if documents is not None else load_crds(directory):
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            api.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != 409:
                raise
            current = api.read_custom_resource_definition(name)
            body = dict(crd, metadata=dict(crd["metadata"], resourceVersion=current.metadata.resource_version))
            api.replace_custom_resource_definition(name, body)
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        for name in sorted(pending):
            conditions = api.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                pending.discard(name)
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRDs not Established after {timeout:.0f}s: {sorted(pending)}")
            time.sleep(0.1)
    return names
