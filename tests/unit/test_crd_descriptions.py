"""Every property of every CRD has a description, so `kubectl explain` answers.

`kubectl explain experiment.spec.scheduler` prints the description of each field the
schema reaches: named properties, the schema of an array's items and of a map's values
(additionalProperties). A field added without one fails here, naming its path.
"""
from pathlib import Path

import pytest
import yaml

CRDS = sorted((Path(__file__).resolve().parents[2] / "crds").glob("*.yaml"))


def undescribed(schema: dict, path: str) -> list[str]:
    """The paths below `schema` whose property has no (non-blank) description."""
    missing = []
    for name, prop in (schema.get("properties") or {}).items():
        where = f"{path}.{name}"
        if not str(prop.get("description") or "").strip():
            missing.append(where)
        missing += undescribed(prop, where)
    # an array's items and a map's values: kubectl explain shows their fields
    if isinstance(schema.get("items"), dict):
        missing += undescribed(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        missing += undescribed(schema["additionalProperties"], f"{path}.<name>")
    for key in ("allOf", "anyOf", "oneOf"):
        for i, sub in enumerate(schema.get(key) or []):
            missing += undescribed(sub, f"{path}({key}[{i}])")
    return missing


@pytest.mark.parametrize("crd_file", CRDS, ids=[p.name for p in CRDS])
def test_every_crd_property_has_a_description(crd_file):
    crd = yaml.safe_load(crd_file.read_text())
    kind = crd["spec"]["names"]["kind"]
    for version in crd["spec"]["versions"]:
        root = version["schema"]["openAPIV3Schema"]
        # the root's metadata is the standard ObjectMeta: the API server publishes its
        # description and refuses a CRD that says anything there but name/generateName
        missing = [path for path in undescribed(root, kind.lower()) if path != f"{kind.lower()}.metadata"]
        assert not missing, (
            f"{crd_file.name} ({version['name']}): {len(missing)} properties have no description "
            f"(kubectl explain shows nothing for them); add one to each:\n  " + "\n  ".join(missing))


def test_the_walk_finds_nested_items_and_map_values():
    """The check itself: a missing description deep in items/additionalProperties is found."""
    schema = {"properties": {
        "a": {"description": "x", "type": "array", "items": {"properties": {"b": {"type": "string"}}}},
        "m": {"description": "x", "additionalProperties": {"properties": {"c": {"type": "integer"}}}},
        "ok": {"description": "fine", "type": "string"},
        "blank": {"description": "  ", "type": "string"}}}
    assert undescribed(schema, "t") == ["t.a[].b", "t.m.<name>.c", "t.blank"]


def test_crds_are_found():
    assert {p.name for p in CRDS} >= {"experiment.yaml", "trial.yaml"}
