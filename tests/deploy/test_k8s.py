"""deploy/k8s without a cluster: it renders, every object is valid for its API type, the commands
accept the flags it gives them, and the properties the issue asks for hold."""

from __future__ import annotations

import copy
import json
import subprocess
from functools import cache
from typing import Any

import pytest
import yaml
from deploy_files import DASHBOARD, DEPLOY, require_tool
from k8s_schema import SchemaError, validate

from dynspec.launcher.config import build_parser as launcher_parser
from dynspec.launcher.config import load_config
from dynspec.router.config import build_parser as router_parser
from dynspec.router.config import parse_config

K8S = DEPLOY / "k8s"
# Flags the manifests use that another branch adds (issue 19's --no-router): until it is merged
# the flag test is an expected failure that names them; after, it parses for real.
PENDING = {"dynspec-launch": frozenset({"--no-router"})}


@cache
def _rendered() -> tuple[dict[str, Any], ...]:
    kubectl = require_tool("kubectl", "kubernetes-client")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d is not None)


def rendered() -> list[dict[str, Any]]:
    return copy.deepcopy(list(_rendered()))


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"no {kind}/{name} in deploy/k8s")


def test_every_object_is_valid_for_its_api_type() -> None:
    objs = rendered()
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == [
        ("ConfigMap", "dynspec-dashboard"),
        ("ConfigMap", "dynspec-router"),
        ("Deployment", "dynspec-router"),
        ("Namespace", "dynspec"),
        ("PodDisruptionBudget", "dynspec-router"),
        ("Service", "dynspec-router"),
        ("Service", "dynspec-servers"),
        ("ServiceMonitor", "dynspec-router"),
        ("ServiceMonitor", "dynspec-servers"),
        ("StatefulSet", "dynspec-servers"),
    ]
    for o in objs:
        validate(o)
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "dynspec", o["metadata"]


def _deployment() -> dict[str, Any]:
    return find(rendered(), "Deployment", "dynspec-router")


@pytest.mark.parametrize(
    ("where", "change", "message"),
    [
        ("container", lambda c: c.update(imagePullPolcy="Always"), "unknown field"),
        ("container", lambda c: c["ports"][0].update(containerPort="8000"), "expected int"),
        ("container", lambda c: c.update(args="--load-signal servers"), "expected a list"),
        ("container", lambda c: c["securityContext"].update(readOnlyRootFilesystem="yes"), "bool"),
        ("container", lambda c: c.pop("name"), "required|must not be"),
        ("spec", lambda s: s.update(replicas="2"), "expected int"),
        ("spec", lambda s: s.update(replica=2), "unknown field"),
        ("pod", lambda p: p.update(automountServiceAcountToken=False), "unknown field"),
    ],
)
def test_a_misspelled_field_or_a_wrong_type_fails(where: str, change: Any, message: str) -> None:
    obj = _deployment()
    validate(copy.deepcopy(obj))  # the untouched object passes
    spec = obj["spec"]
    pod = spec["template"]["spec"]
    target = {"spec": spec, "pod": pod, "container": pod["containers"][0]}[where]
    change(target)
    with pytest.raises(SchemaError, match=message):
        validate(obj)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(endpoint=s.pop("endpoints")),
        lambda s: s["endpoints"][0].update(intervl="15s"),
        lambda s: s["endpoints"][0].update(path=["/metrics"]),
        lambda s: s["selector"].update(matchLabel={"a": "b"}),
    ],
)
def test_a_broken_service_monitor_fails(change: Any) -> None:
    sm = find(rendered(), "ServiceMonitor", "dynspec-router")
    change(sm["spec"])
    with pytest.raises(SchemaError):
        validate(sm)


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    containers = obj["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def _unknown(parser: Any, args: list[str]) -> set[str]:
    return _flags(args) - set(parser._option_string_actions)


def test_the_router_accepts_its_flags_and_configmap() -> None:
    objs = rendered()
    c = _container(find(objs, "Deployment", "dynspec-router"))
    assert c["command"] == ["dynspec-router"]
    assert not _unknown(router_parser(), c["args"])
    env = dict(find(objs, "ConfigMap", "dynspec-router")["data"])
    assert all(k.startswith("DYNSPEC_") for k in env)
    config = parse_config(c["args"], environ=env)
    assert config.load_signal == "servers"
    assert config.host == "0.0.0.0"
    assert config.eagle_urls == ("http://dynspec-servers-0.dynspec-servers:30001",)
    assert config.baseline_urls == ("http://dynspec-servers-0.dynspec-servers:30002",)
    port = next(p for p in c["ports"] if p["name"] == "http")["containerPort"]
    assert config.port == port


def test_the_launcher_accepts_its_flags() -> None:
    c = _container(find(rendered(), "StatefulSet", "dynspec-servers"))
    assert c["command"] == ["dynspec-launch"]
    unknown = _unknown(launcher_parser(), c["args"])
    assert not unknown - PENDING["dynspec-launch"], f"flags the launcher does not know: {unknown}"
    if unknown:
        pytest.xfail(f"{sorted(unknown)}: added by the launcher branch, not merged here yet")
    config = load_config(c["args"], environ={})
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (config.eagle_port, config.baseline_port) == (ports["eagle"], ports["baseline"])
    assert config.backend_host == "0.0.0.0"
    gpus = int(c["resources"]["limits"]["nvidia.com/gpu"])
    assert len(config.eagle_gpus) + len(config.baseline_gpus) == gpus


def test_pods_run_locked_down() -> None:
    for kind, name in (("Deployment", "dynspec-router"), ("StatefulSet", "dynspec-servers")):
        pod = find(rendered(), kind, name)["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            # Every writable mount is an emptyDir; the rest are read-only.
            for m in c["volumeMounts"]:
                assert "emptyDir" in volumes[m["name"]] or m.get("readOnly") is True, m
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), name


def test_servers_and_router_have_what_the_issue_asks() -> None:
    objs = rendered()
    sts = find(objs, "StatefulSet", "dynspec-servers")
    pod = sts["spec"]["template"]["spec"]
    c = _container(sts)
    assert (
        c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"]
    )
    for probe in ("startupProbe", "readinessProbe"):
        assert "/health_generate" in " ".join(c[probe]["exec"]["command"])
    drain = int(c["args"][c["args"].index("--drain-timeout") + 1])
    assert pod["terminationGracePeriodSeconds"] > drain
    headless = find(objs, "Service", "dynspec-servers")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == "dynspec-servers"

    dep = find(objs, "Deployment", "dynspec-router")
    assert dep["spec"]["replicas"] == 2
    rc = _container(dep)
    for probe in ("readinessProbe", "livenessProbe"):
        assert rc[probe]["httpGet"]["path"] == "/health"
    rdrain = int(rc["args"][rc["args"].index("--drain-timeout") + 1])
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > rdrain
    labels = dep["spec"]["selector"]["matchLabels"]
    assert find(objs, "PodDisruptionBudget", "dynspec-router")["spec"]["selector"] == {
        "matchLabels": labels
    }
    assert find(objs, "Service", "dynspec-router")["spec"]["selector"] == labels


def test_the_dashboard_configmap_is_the_one_dashboard() -> None:
    cm = find(rendered(), "ConfigMap", "dynspec-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["dynspec.json"]) == json.loads(DASHBOARD.read_text())
