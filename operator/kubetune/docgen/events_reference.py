"""The metrics and Events reference. Metrics come from the operator's Prometheus
registry (``kubetune.metrics``); Events from the calls that post them, found in the
source: every call or tuple whose arguments are ``"Normal"`` or ``"Warning"`` followed
by a reason, with the literal parts of its message (``…`` marks what is filled in)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from kubetune.docgen.markdown import GENERATED, table

PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class EventSite:
    type: str
    reason: str
    on: str          # Experiment or Trial
    message: str
    module: str


def _text(node: ast.AST | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "…" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.Subscript):         # message[:MAX]
        return _text(node.value)
    return "…"


def _is_reason(node: ast.AST) -> bool:
    """A CamelCase string constant, as Event reasons are."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value[:1].isupper() and node.value.isalnum())


def event_sites(package: Path = PACKAGE) -> list[EventSite]:
    sites: list[EventSite] = []
    for path in sorted(package.rglob("*.py")):
        if "docgen" in path.parts:
            continue
        module = str(path.relative_to(package.parent)).removesuffix(".py").replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                args, name = node.args, ast.unparse(node.func)
            elif isinstance(node, ast.Tuple):
                args, name = node.elts, ""
            else:
                continue
            keywords = {k.arg: k.value for k in getattr(node, "keywords", [])}
            if isinstance(keywords.get("type"), ast.Constant) and isinstance(keywords.get("reason"), ast.Constant):
                # kopf.event(body, type="Warning", reason="...", message=...)
                sites.append(EventSite(keywords["type"].value, keywords["reason"].value, "Experiment",
                                       _text(keywords.get("message")), module))
            if name.endswith("_warn") and len(args) >= 3 and _is_reason(args[1]):
                # a platform's warning on the Trial: _warn(pod, "Reason", message)
                sites.append(EventSite("Warning", args[1].value, "Trial", _text(args[2]), module))
            for i, arg in enumerate(args[:-1]):
                nxt = args[i + 1]
                if (isinstance(arg, ast.Constant) and arg.value in ("Normal", "Warning")
                        and _is_reason(nxt)):
                    on = "Trial" if "trial" in name.lower() else "Experiment"
                    message = _text(args[i + 2]) if len(args) > i + 2 else ""
                    sites.append(EventSite(arg.value, nxt.value, on, message, module))
    return sites


def render_events() -> str:
    sites = sorted(set(event_sites()), key=lambda s: (s.reason, s.type, s.on, s.module))
    return ("# Events\n\n" + GENERATED.format(source="the operator's calls that post Events")
            + "`kubectl describe experiment NAME` (or `trial NAME`) lists them; "
              "`kubectl get events --field-selector reason=REASON` finds them. A Warning is something to act "
              "on; the same event repeated is counted by Kubernetes, not posted anew. `…` stands for what the "
              "operator fills in (names, counts, the error). Besides these, a trial that stops or ends posts an "
              "Event whose reason is the Trial's `status.reason` (e.g. `EarlyStopped`), and a refused spec or a "
              "scheduler that cannot act posts one with the reason of its condition.\n\n"
            + table(["reason", "type", "on", "message", "posted by"],
                    [(f"`{s.reason}`", s.type, s.on, s.message, f"`{s.module}`") for s in sites]))


def render_metrics() -> str:
    from kubetune import metrics
    metrics.watch_state(lambda: None)          # the scrape-time gauges, with no state: their names
    rows = []
    for family in metrics.REGISTRY.collect():
        labels = sorted({key for sample in family.samples for key in sample.labels})
        if family.type == "counter" and not labels:
            labels = sorted(getattr(metrics.REGISTRY._names_to_collectors.get(family.name + "_total"),
                                    "_labelnames", ()) or ())
        name = family.name + ("_total" if family.type == "counter" else "")
        if not name.startswith("kubetune_"):
            continue
        rows.append((f"`{name}`", family.type, ", ".join(f"`{label}`" for label in labels), family.documentation))
    return ("# Metrics\n\n" + GENERATED.format(source="operator/kubetune/metrics.py")
            + "The operator serves Prometheus metrics on `--metrics-port` (the chart: `:8080/metrics`, the "
              "Service `kubetune-metrics`, an optional ServiceMonitor: `metrics.*` in the "
              "[Helm values](helm-values.md)). Label values come from small fixed sets (phases, resource "
              "kinds, reasons), never from Experiment or Trial names. The Python process metrics "
              "(`process_*`, `python_*`) are served too.\n\n"
            + table(["metric", "type", "labels", "meaning"], rows))
