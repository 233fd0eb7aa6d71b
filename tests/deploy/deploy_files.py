"""The deploy/ files as data for the tests: dashboard queries, alert rules, PromQL metric names."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dynspec.json"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST = DEPLOY / "prometheus" / "alerts_test.yml"

# Series Prometheus writes itself for every target; no exporter has to provide them.
PROMETHEUS_OWN = frozenset({"up"})


def require_tool(name: str, package: str = "prometheus") -> str:
    """The tool's path; skip when it is missing here, fail in CI (which installs it)."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name} not found on PATH (Debian: apt-get install {package})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; CI must install it")
        pytest.skip(reason)
    return path


@dataclass(frozen=True)
class Query:
    where: str  # panel title and refId, or alert name
    expr: str


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        if p.get("type") == "row":
            out.extend(p.get("panels", []))  # collapsed rows hold their panels
        else:
            out.append(p)
    return out


def panel_queries(dash: dict[str, Any]) -> list[Query]:
    return [
        Query(f"{p['title']} [{t['refId']}]", t["expr"])
        for p in panels(dash)
        for t in p.get("targets", [])
    ]


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def variable_query(var: dict[str, Any]) -> str:
    q = var["query"]
    return str(q["query"] if isinstance(q, dict) else q)


_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>\w+)\)$")


def parse_label_values(query: str) -> tuple[str, str]:
    """``label_values(SELECTOR, LABEL)`` -> (selector, label), as Grafana's datasource reads it."""
    m = _LABEL_VALUES.match(query.strip())
    if m is None or not m.group("selector"):
        raise ValueError(f"not a label_values(selector, label) query: {query!r}")
    return m.group("selector"), m.group("label")


def alert_rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    return [r for g in data["groups"] for r in g["rules"] if "alert" in r]


def alert_queries() -> list[Query]:
    return [Query(r["alert"], r["expr"]) for r in alert_rules()]


_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana's ``$name`` / ``${name}`` variables; an unknown one is an error."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(one, expr)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r"__name__\s*=~?\s*\"([^\"]*)\"")
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan", "atan2"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords and labels left out)."""
    names: set[str] = set()
    for m in _NAME_MATCHER.finditer(expr):
        names.update(n for n in m.group(1).split("|") if n)
    rest = _BRACES.sub(" ", _STRING.sub('""', expr))
    rest = _GROUPING.sub(" ", _RANGE.sub(" ", rest))
    for m in _IDENT.finditer(rest):
        name, call = m.group(1), m.group(2)
        if call is None and name.lower() not in _KEYWORDS:
            names.add(name)
    return names
