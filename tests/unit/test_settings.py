"""The operator's settings cannot be taken over by Kubernetes service-link variables.

The kubelet gives every container the variables of every Service in its namespace
(pkg/kubelet/envvars); the chart's Services ``<release>-metrics`` and
``<release>-ingest`` define ``KUBETUNE_METRICS_PORT=tcp://...`` and
``KUBETUNE_INGEST_PORT=tcp://...`` in the operator's pod, which once crash-looped it.
"""
from __future__ import annotations

import pytest

from kubetune import cli, settings
from kubetune.settings import env_fallback, service_link_name


def service_link_env(name: str, ip: str, ports: list[tuple[str, int, str]]) -> dict[str, str]:
    """The variables the kubelet derives from one Service (envvars.FromServices)."""
    prefix = name.upper().replace("-", "_")
    found = {f"{prefix}_SERVICE_HOST": ip, f"{prefix}_SERVICE_PORT": str(ports[0][1])}
    for port_name, port, protocol in ports:
        found[f"{prefix}_SERVICE_PORT_{port_name.upper().replace('-', '_')}"] = str(port)
        link = f"{prefix}_PORT_{port}_{protocol}"
        found.update({link: f"{protocol.lower()}://{ip}:{port}", f"{link}_PROTO": protocol.lower(),
                      f"{link}_PORT": str(port), f"{link}_ADDR": ip})
    found[f"{prefix}_PORT"] = f"{ports[0][2].lower()}://{ip}:{ports[0][1]}"
    return found


# what the chart's operator pod received from its own Services (release "kubetune")
CHART_SERVICES = {**service_link_env("kubetune-metrics", "10.0.0.235", [("metrics", 8080, "TCP")]),
                  **service_link_env("kubetune-ingest", "10.0.0.236", [("ingest", 8081, "TCP")]),
                  **service_link_env("kubetune", "10.0.0.237", [("http", 80, "TCP")])}


@pytest.fixture
def service_links(monkeypatch):
    for key, value in CHART_SERVICES.items():
        monkeypatch.setenv(key, value)
    settings.configure(None)
    yield
    settings.configure(None)


def test_the_operator_command_line_parses_next_to_service_links(service_links):
    args = cli.build_parser().parse_args(["operator", "--metrics-port=8080", "--ray-address=ray://head:10001"])
    assert (args.metrics_port, args.ingest_port, args.ray_address) == (8080, 8081, "ray://head:10001")
    defaults = cli.build_parser().parse_args(["operator"])
    assert (defaults.metrics_port, defaults.ingest_port) == (0, 8081)


def test_the_handlers_settings_ignore_service_links(service_links):
    chosen = settings.current()
    assert chosen.ingest_port == 8081 and not chosen.ingest_url.startswith("tcp://")
    assert chosen.ray_address == "local"


def test_no_environment_setting_has_a_name_a_service_can_define():
    assert all(service_link_name(key) for key in CHART_SERVICES)
    for name in ("KUBETUNE_RAY_ADDRESS", "KUBETUNE_CHECKPOINT_STORAGE", "KUBETUNE_LOG_LEVEL",
                 "KUBETUNE_INGEST_ADVERTISE_URL", "KUBETUNE_CRDS_DIR", "KUBETUNE_RESULTS_URL"):
        assert not service_link_name(name), name
    with pytest.raises(ValueError, match="service links"):
        env_fallback("KUBETUNE_METRICS_PORT", "0")
    assert env_fallback("KUBETUNE_LOG_LEVEL", "INFO", {"KUBETUNE_LOG_LEVEL": "DEBUG"}) == "DEBUG"


def test_the_results_store_url_comes_from_a_flag_or_the_secret_backed_variable(service_links, monkeypatch):
    # even a Service named kubetune-results would define KUBETUNE_RESULTS_PORT..., never _URL
    # (and `make test` runs this after tests/integration/conftest.py set the variable)
    monkeypatch.delenv("KUBETUNE_RESULTS_URL", raising=False)
    for key, value in service_link_env("kubetune-results", "10.0.0.238", [("http", 80, "TCP")]).items():
        monkeypatch.setenv(key, value)
    assert cli.build_parser().parse_args(["operator"]).results_url == ""
    monkeypatch.setenv("KUBETUNE_RESULTS_URL", "postgresql://kubetune:secret@db:5432/kubetune")
    assert cli.build_parser().parse_args(["operator"]).results_url == "postgresql://kubetune:secret@db:5432/kubetune"
    assert settings.current().results_url == "postgresql://kubetune:secret@db:5432/kubetune"
    flagged = cli.build_parser().parse_args(["operator", "--results-url=sqlite:////var/lib/kubetune/results.db"])
    assert flagged.results_url == "sqlite:////var/lib/kubetune/results.db"
