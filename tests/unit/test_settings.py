"""The operator's settings cannot be taken over by Kubernetes service-link variables.

The kubelet gives every container the variables of every Service in its namespace
(pkg/kubelet/envvars); the chart's Services ``<release>-metrics`` and
``<release>-ingest`` define ``KUBETUNE_METRICS_PORT=tcp://...`` and
``KUBETUNE_INGEST_PORT=tcp://...`` in the operator's pod, which once crash-looped it.
"""
from __future__ import annotations

import pytest

from kubetune import cli
from kubetune.results import default_url
from kubetune.settings import OperatorSettings, SettingError, env_fallback, from_args, service_link_name


def operator_settings(*argv: str) -> OperatorSettings:
    """The settings `kubetune operator ARGV` runs with (operator_main.main)."""
    return from_args(cli.build_parser().parse_args(["operator", *argv]))


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
    yield


def test_the_operator_command_line_parses_next_to_service_links(service_links):
    args = cli.build_parser().parse_args(["operator", "--metrics-port=8080", "--ray-address=ray://head:10001"])
    assert (args.metrics_port, args.ingest_port, args.ray_address) == (8080, 8081, "ray://head:10001")
    defaults = cli.build_parser().parse_args(["operator"])
    assert (defaults.metrics_port, defaults.ingest_port) == (0, 8081)


def test_the_handlers_settings_ignore_service_links(service_links):
    chosen = operator_settings()
    assert chosen.ingest_port == 8081 and not chosen.ingest_url.startswith("tcp://")
    assert chosen.ray_address == "local" and chosen.metrics_port == 0


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
    # "" in the settings: the store's own default, $KUBETUNE_RESULTS_URL (read in one place)
    assert operator_settings().results_url == "" and default_url() == "postgresql://kubetune:secret@db:5432/kubetune"
    flagged = cli.build_parser().parse_args(["operator", "--results-url=sqlite:////var/lib/kubetune/results.db"])
    assert flagged.results_url == "sqlite:////var/lib/kubetune/results.db"
    assert from_args(flagged).results_url == "sqlite:////var/lib/kubetune/results.db"


def test_the_settings_are_parsed_into_one_typed_object(monkeypatch):
    for name in ("KUBETUNE_TRIAL_LEASE_SECONDS", "KUBETUNE_LEADER_ELECTION", "KUBETUNE_ALLOW_LOCAL_RAY"):
        monkeypatch.delenv(name, raising=False)
    assert operator_settings() == OperatorSettings()   # the dataclass's defaults are the flags'
    chosen = operator_settings("-n", "a", "-n", "b", "--trial-lease-seconds=30", "--pod-executor",
                               "--pod-allow=hostPath", "--ingest-port=9000", "--log-level=debug")
    assert (chosen.namespaces, chosen.trial_lease_seconds, chosen.pod_executor, chosen.ingest_port,
            chosen.log_level) == (("a", "b"), 30.0, True, 9000, "DEBUG")
    assert chosen.pod_allow == {"hostPath"}
    monkeypatch.setenv("KUBETUNE_TRIAL_LEASE_SECONDS", "60")
    monkeypatch.setenv("KUBETUNE_LEADER_ELECTION", "true")
    monkeypatch.setenv("KUBETUNE_ALLOW_LOCAL_RAY", "0")
    from_env = operator_settings()
    assert (from_env.trial_lease_seconds, from_env.leader_election, from_env.allow_local_ray) == (60.0, True, False)
    with pytest.raises(AttributeError):
        from_env.ray_address = "auto"    # frozen: nothing changes it after the start


@pytest.mark.parametrize("argv, env, named", [
    ([], {"KUBETUNE_TRIAL_LEASE_SECONDS": "soon"}, "--trial-lease-seconds (or $KUBETUNE_TRIAL_LEASE_SECONDS)"),
    (["--trial-lease-seconds=-5"], {}, "--trial-lease-seconds"),
    (["--lease-duration-seconds=0"], {}, "--lease-duration-seconds"),
    (["--ingest-port=70000"], {}, "--ingest-port"),
    (["--metrics-port=-1"], {}, "--metrics-port"),
    ([], {"KUBETUNE_LEADER_ELECTION": "maybe"}, "--leader-election (or $KUBETUNE_LEADER_ELECTION)"),
    (["--log-level=LOUD"], {}, "--log-level"),
    (["--pod-allow=hostPath,rootUser"], {}, "--pod-allow: unknown rootUser"),
    (["--ray-address= "], {}, "--ray-address"),
])
def test_a_bad_value_is_an_error_naming_the_setting(monkeypatch, argv, env, named):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as error:
        operator_settings(*argv)
    assert named in str(error.value)
    # the operator exits with it; the other commands (which share the parser) are not affected
    with pytest.raises(SystemExit, match=named.split(" ")[0]):
        cli.main(["operator", *argv])
    assert cli.build_parser().parse_args(["results", "x"]).command == "results"


def test_the_handlers_take_their_settings_from_the_object_they_are_given():
    import kopf

    from kubetune import handlers
    registry = kopf.OperatorRegistry()
    handlers.register(OperatorSettings(cleanup_timeout_seconds=42.0), registry=registry)
    deletions = [handler for handler in registry._changing.get_all_handlers()
                 if getattr(handler, "reason", None) == "delete" or "deleted" in handler.id]
    # the operator gives up itself at 42 s (and releases what it held); kopf's own timeout is a backstop past it
    assert [handler.timeout for handler in deletions] == [42.0 + handlers.CLEANUP_BACKSTOP_SECONDS]


def test_the_dashboard_url_is_an_http_url_or_nothing():
    from kubetune.results.study_meta import experiment_link
    assert operator_settings().dashboard_url == ""
    chosen = operator_settings("--dashboard-url", "https://tuning.example.com/kt/")
    assert chosen.dashboard_url == "https://tuning.example.com/kt"
    assert experiment_link(chosen.dashboard_url, "team-a", "mnist") == "https://tuning.example.com/kt/experiments/team-a/mnist"
    for bad in ("tuning.example.com", "ftp://x", "https://x/?q=1", "https://x y", "https://" + "x" * 600):
        with pytest.raises(SettingError, match="--dashboard-url"):
            operator_settings("--dashboard-url", bad)
