"""The deploy/ files on their own: shape, variables, required panels and alerts, references."""

from __future__ import annotations

import configparser
import json
import re
from typing import Any

import pytest
import yaml
from deploy_files import (
    ALERTS,
    DASHBOARD,
    DEPLOY,
    PROMETHEUS_YML,
    alert_rules,
    dashboard,
    metric_names,
    panel_queries,
    panels,
    parse_label_values,
    substitute,
    variable_query,
    variables,
)

# The panels an operator needs, by title: which pool serves and why (load against threshold),
# how fast each pool answers, and whether each server is up, busy and accepting drafts.
REQUIRED_PANELS = (
    "Active pool",
    "Load against threshold",
    "In flight per pool",
    "Requests/s by pool and status",
    "Time to first token p50 / p99 per pool",
    "Time per output token p50 / p99 per pool",
    "Output tokens/s per pool",
    "Mode switches",
    "Server up",
    "Upstream errors/s by pool and kind",
    "Client disconnects/s per pool",
    "Running requests per server",
    "Queued requests per server",
    "Generation throughput per server",
    "Speculative accept length",
    "Predicted time per output token per server",
    "Route decisions/s by pool and reason",
)
REQUIRED_ALERTS = (
    "DynspecNoHealthyServer",
    "DynspecPoolDown",
    "DynspecHighErrorRatio",
    "DynspecModeFlapping",
    "DynspecPoolDrainingTooLong",
    "DynspecHighTTFT",
)
DEFAULT_PORTS = {"router": 8000, "eagle": 30001, "baseline": 30002}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (pool) (rate(a_total{pool=~"$pool", x="by (b)"}[$__rate_interval]))', {"a_total"}),
        (
            "histogram_quantile(0.99, sum by (pool, le) (rate(h_bucket[5m]))) > 2",
            {"h_bucket"},
        ),
        ("(sum(rate(a[1m])) or vector(0)) / sum(rate(b[1m]))", {"a", "b"}),
        ("x / on (pool) group_left (server) y offset 5m", {"x", "y"}),
        ('sglang:num_running_reqs{pool="eagle"} + 1e3', {"sglang:num_running_reqs"}),
        ('{__name__=~"dynspec_load|sglang:token_usage"}', {"dynspec_load", "sglang:token_usage"}),
        ("sum(x) without (instance) > bool 0 and inf", {"x"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_substitute_fails_on_unknown_variable() -> None:
    values = {"__rate_interval": "1m", "pool": ".*"}
    assert substitute("a[$__rate_interval]{p=~'${pool}'}", values) == "a[1m]{p=~'.*'}"
    with pytest.raises(KeyError):
        substitute("rate(a[$__interval])", values)


def test_dashboard_identity_and_variables() -> None:
    dash = dashboard()
    assert dash["uid"] == "dynspec"
    assert dash["title"]
    vs = variables(dash)
    assert vs["datasource"]["type"] == "datasource"
    assert vs["datasource"]["query"] == "prometheus"
    for name in ("pool", "instance"):
        v = vs[name]
        assert v["type"] == "query"
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
        parse_label_values(variable_query(v))
    assert parse_label_values(variable_query(vs["pool"]))[1] == "pool"
    assert parse_label_values(variable_query(vs["instance"]))[1] == "instance"


def test_dashboard_has_required_panels_with_unique_ids() -> None:
    ps = panels(dashboard())
    titles = [p["title"] for p in ps]
    missing = [t for t in REQUIRED_PANELS if t not in titles]
    assert not missing, f"panels missing: {missing}"
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_every_panel_uses_the_datasource_variable() -> None:
    for p in panels(dashboard()):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]


def _walk_strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _walk_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _walk_strings(v)]
    return []


def test_dashboard_has_no_hard_coded_hosts() -> None:
    for s in _walk_strings(dashboard()):
        assert not re.search(r"localhost|127\.0\.0\.1|\b\d+\.\d+\.\d+\.\d+\b|:\d{4,5}\b", s), s


def test_panel_queries_filter_by_variables_and_use_rate_interval() -> None:
    for q in panel_queries(dashboard()):
        assert '$instance"' in q.expr, q.where
        for window in re.findall(r"\b(?:rate|increase)\([^\[]*\[([^\]]*)\]", q.expr):
            assert window in ("$__rate_interval", "$__range"), (q.where, window)
        # Series without a pool label (the pair ones: per pair, not per pool).
        unpooled = (
            "dynspec_mode_switches",
            "dynspec_load",
            "dynspec_threshold",
            "dynspec_pair_load",
        )
        if not any(name in q.expr for name in unpooled):
            assert 'pool=~"$pool"' in q.expr, q.where


def test_alerts_have_summary_and_description() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    missing = [a for a in REQUIRED_ALERTS if a not in rules]
    assert not missing, f"alerts missing: {missing}"
    for name, r in rules.items():
        assert r["labels"]["severity"] in ("critical", "warning"), name
        assert r["annotations"]["summary"].strip(), name
        # "says what to check"
        assert "Check" in r["annotations"]["description"], name


def test_alert_thresholds_match_the_issue() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert rules["DynspecPoolDown"]["for"] == "1m"
    assert rules["DynspecPoolDrainingTooLong"]["for"] == "10m"
    assert re.search(r">\s*0\.05\b", rules["DynspecHighErrorRatio"]["expr"])
    assert "[5m]" in rules["DynspecModeFlapping"]["expr"]


def test_prometheus_config_scrapes_the_launcher_default_ports() -> None:
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert cfg["rule_files"] == [ALERTS.name]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    router = jobs["dynspec-router"]["static_configs"]
    assert [t for sc in router for t in sc["targets"]] == [f"127.0.0.1:{DEFAULT_PORTS['router']}"]
    pools = {sc["labels"]["pool"]: sc["targets"] for sc in jobs["sglang"]["static_configs"]}
    assert pools == {
        "eagle": [f"127.0.0.1:{DEFAULT_PORTS['eagle']}"],
        "baseline": [f"127.0.0.1:{DEFAULT_PORTS['baseline']}"],
    }


def test_compose_and_grafana_provisioning_fit_together() -> None:
    # No Docker engine runs in CI: this checks the YAML and its references, not a running stack.
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"prometheus", "grafana"}
    mounts: dict[str, str] = {}
    for svc in services.values():
        assert svc["network_mode"] == "host"
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", svc["image"]), "pin image versions"
        for vol in svc["volumes"]:
            src, dst = vol.split(":")[:2]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), src
                mounts[dst] = src
    assert mounts["/etc/prometheus"] == "./prometheus"
    prom_cmd = " ".join(services["prometheus"]["command"])
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom_cmd
    listen = re.search(r"--web.listen-address=([\w.]+):(\d+)", prom_cmd)
    assert listen

    prov = DEPLOY / "grafana" / "provisioning"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    ds_files = list((prov / "datasources").glob("*.yml"))
    assert ds_files
    ds = yaml.safe_load(ds_files[0].read_text())["datasources"]
    prom = [d for d in ds if d["type"] == "prometheus"]
    assert len(prom) == 1 and prom[0]["isDefault"]
    # Grafana (host network) reaches Prometheus where the compose file makes it listen.
    assert prom[0]["url"].rstrip("/").endswith(f":{listen.group(2)}")
    scrape = yaml.safe_load(PROMETHEUS_YML.read_text())["global"]["scrape_interval"]
    assert prom[0]["jsonData"]["timeInterval"] == scrape

    providers = yaml.safe_load((prov / "dashboards" / "dynspec.yml").read_text())["providers"]
    path = providers[0]["options"]["path"]
    dash_mounts = [d for d, s in mounts.items() if s == "./grafana/dynspec.json"]
    assert dash_mounts and all(d.startswith(path.rstrip("/") + "/") for d in dash_mounts)
    json.loads(DASHBOARD.read_text())


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "dynspec.service")
    return unit


def test_systemd_unit_lets_the_launcher_drain_before_systemd_kills() -> None:
    svc = _unit()["Service"]
    assert svc["ExecStart"].split()[0].endswith("/dynspec-launch")
    assert svc["KillSignal"] in ("SIGTERM", "SIGINT")
    # mixed: the signal goes to the launcher only; SIGKILL to the cgroup only after the timeout.
    assert svc["KillMode"] == "mixed"
    from dynspec.launcher.config import build_parser  # the launcher's own defaults

    p = build_parser()
    drain, grace = float(p.get_default("drain_timeout")), float(p.get_default("kill_grace"))
    assert float(svc["TimeoutStopSec"]) > drain + grace + 10


def test_systemd_sandbox_keeps_what_sglang_needs() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    text = (DEPLOY / "systemd" / "dynspec.service").read_text()
    # DeviceAllow and SystemCallFilter repeat; a plain parser keeps the last, so read them here.
    allowed = [
        line.split("=", 1)[1] for line in text.splitlines() if line.startswith("DeviceAllow=")
    ]
    unit.read_string(text)
    svc = unit["Service"]
    assert svc["NoNewPrivileges"] == "yes" and svc["ProtectSystem"] == "strict"
    assert svc.get("User") == "dynspec" and svc["CapabilityBoundingSet"] == ""
    # GPUs: the NVIDIA device nodes stay reachable (PrivateDevices would hide them).
    assert svc.get("PrivateDevices", "no") == "no"
    if svc.get("DevicePolicy", "auto") != "auto":
        assert "char-nvidia* rw" in allowed
    # Triton, FlashInfer and torch compile kernels at run time: W+X memory and a writable cache.
    assert svc.get("MemoryDenyWriteExecute", "no") == "no"
    cache = svc["CacheDirectory"]
    assert f"TRITON_CACHE_DIR=/var/cache/{cache}/" in text
    assert f"XDG_CACHE_HOME=/var/cache/{cache}" in text
    # Logs go where the service may write; HOME and downloads in the state directory.
    assert f"--log-dir /var/log/{svc['LogsDirectory']}" in svc["ExecStart"]
    assert f"HOME=/var/lib/{svc['StateDirectory']}" in text
    assert "AF_NETLINK" in svc["RestrictAddressFamilies"]  # NCCL lists interfaces through it
