"""The API reference of a CustomResourceDefinition (crds/*.yaml): every field with its
type, default, constraints and description, as `kubectl explain` shows them one at a time."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import yaml

from kubetune.docgen.markdown import GENERATED, cell, table

# schema keywords shown in the Constraints column, with how each reads
CONSTRAINTS = (("enum", "one of {}"), ("minimum", ">= {}"), ("maximum", "<= {}"), ("minLength", "length >= {}"),
               ("maxLength", "length <= {}"), ("minItems", "items >= {}"), ("maxItems", "items <= {}"),
               ("minProperties", "keys >= {}"), ("maxProperties", "keys <= {}"), ("pattern", "matches `{}`"),
               ("format", "format {}"))


def type_of(schema: dict[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = schema.get("type")
    if kind == "array":
        return f"array of {type_of(schema.get('items') or {})}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {type_of(schema['additionalProperties'])}"
    if not kind and schema.get("x-kubernetes-preserve-unknown-fields"):
        return "any"
    return kind or "any"


def constraints_of(schema: dict[str, Any], required: bool) -> str:
    parts = ["required"] if required else []
    for key, form in CONSTRAINTS:
        if key in schema:
            value = schema[key]
            if key == "minimum" and schema.get("exclusiveMinimum"):
                form = "> {}"
            parts.append(form.format(", ".join(map(str, value)) if isinstance(value, list) else value))
    parts += [rule_text(rule) for rule in schema.get("x-kubernetes-validations") or [] if rule.get("message")]
    return "; ".join(parts)


def rule_text(rule: dict[str, Any]) -> str:
    """A CEL rule's message, with the field it is about (fieldPath) when it names one."""
    field = (rule.get("fieldPath") or "").lstrip(".")
    return f"{field}: {rule['message']}" if field else rule["message"]


def fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(path, schema, required) of every field below ``schema``, depth first."""
    required = set(schema.get("required") or [])
    for name, prop in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        yield where, prop, name in required
        yield from fields(prop, where)
    if isinstance(schema.get("items"), dict):
        yield from fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from fields(schema["additionalProperties"], f"{path}.<name>")


def render(crd_path: Path) -> str:
    crd = yaml.safe_load(crd_path.read_text())
    names = crd["spec"]["names"]
    kind = names["kind"]
    out = [f"# {kind} API reference\n\n", GENERATED.format(source=f"crds/{crd_path.name}")]
    for version in crd["spec"]["versions"]:
        group_version = f"{crd['spec']['group']}/{version['name']}"
        root = version["schema"]["openAPIV3Schema"]
        out.append(f"`apiVersion: {group_version}`, `kind: {kind}`, {crd['spec']['scope'].lower()}; "
                   f"`kubectl get {names['plural']}` (short names: "
                   f"{', '.join(f'`{n}`' for n in names.get('shortNames', []))}; "
                   f"category `{', '.join(names.get('categories', []))}`). "
                   f"`kubectl explain {names['singular']}.<field>` prints the same descriptions.\n\n")
        columns = version.get("additionalPrinterColumns") or []
        if columns:
            out.append("## Columns of `kubectl get`\n\n")
            out.append(table(["column", "field", "shown", "description"],
                             [(c["name"], f"`{c['jsonPath']}`", "with `-o wide`" if c.get("priority") else "always",
                               c.get("description", "")) for c in columns]))
            out.append("\n")
        for top in ("spec", "status"):
            if top not in (root.get("properties") or {}):
                continue
            section = root["properties"][top]
            out.append(f"## {top}\n\n{section.get('description', '')}\n\n")
            for rule in section.get("x-kubernetes-validations") or []:
                if rule.get("message"):
                    out.append(f"- rule: {cell(rule_text(rule))}\n")
            out.append("\n")
            rows = []
            for path, prop, required in fields(section, top):
                default = json.dumps(prop["default"]) if "default" in prop else ""
                rows.append((f"`{path}`", type_of(prop), f"`{default}`" if default else "",
                             constraints_of(prop, required), prop.get("description", "")))
            out.append(table(["field", "type", "default", "constraints", "description"], rows))
            out.append("\n")
    return "".join(out)
