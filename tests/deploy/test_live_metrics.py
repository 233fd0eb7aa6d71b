"""The dashboard and alerts against real data.

One stack per module: two ``dynspec-sim`` servers (eagle, baseline), a ``dynspec-router`` with a low
threshold in front of them, and, where the ``prometheus`` binary exists, a real Prometheus scraping
all three every second with the shipped alert rules loaded. Traffic ramps from 1 to 6 concurrent
streams and back, so the router switches to the baseline pool and back to eagle; one server fails
a few requests with 500 and one client leaves mid-stream. A second router holds the same two
servers as one ``--pair`` and gets a burst past its threshold, so the per-pair panels have data.
Then every dashboard query runs through Prometheus's HTTP API, and every metric name the dashboard
and alerts use is looked up in the routers' and the servers' own ``/metrics``.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from deploy_files import (
    ALERTS,
    PROMETHEUS_OWN,
    PROMETHEUS_YML,
    Query,
    alert_queries,
    dashboard,
    metric_names,
    panel_queries,
    parse_label_values,
    require_tool,
    substitute,
    variable_query,
    variables,
)
from prometheus_client.parser import text_string_to_metric_families
from utils import free_port, running

POOLS = ("eagle", "baseline")
MODEL = "dynspec-test"
THRESHOLD, HYSTERESIS = 2, 1
# The demo profile at 4x: a 128-token stream takes 0.3-1 s, so streams overlap; and it lasts over
# one simulated second, the window over which the servers report gen_throughput and accept length.
SPEED = 4.0
MAX_TOKENS = 128
SCRAPE_S = 1.0
RAMP = ((1, 1.5), (2, 1.5), (4, 2.0), (6, 2.0), (1, 2.0))  # (concurrent streams, seconds)
MAX_REQUESTS = 400  # a bound on the whole ramp, whatever the speed of the machine
# Grafana's variables as the test sets them. $__rate_interval: 4 s is what Grafana computes for a
# 1 s scrape interval; 1 m covers the whole ramp, so rates are not all zero.
RATE_INTERVALS = ("4s", "1m")
# (panel title, pool) pairs whose query may be empty for that pool: SGLang exports
# sglang:spec_accept_length only from a server running speculative decoding.
EMPTY_FOR_POOL = {("Speculative accept length", "baseline")}


@dataclass
class Stack:
    router: str
    pair_router: str
    servers: dict[str, str]  # pool -> base URL
    logs: Path
    prometheus: str | None = None
    instances: dict[str, str] = field(default_factory=dict)  # Prometheus instance -> role
    served_by: dict[str, int] = field(default_factory=dict)  # x-dynspec-backend -> requests
    # One keep-alive client for the many API queries (a connection each costs seconds in all).
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))


def _log_tails(logs: Path) -> str:
    parts = []
    for f in sorted(logs.glob("*.log")):
        lines = f.read_text(errors="replace").splitlines()[-15:]
        parts.append(f"--- {f.name}\n" + "\n".join(lines))
    return "\n".join(parts)


def _metrics(url: str) -> dict[str, Any]:
    r = httpx.get(url + "/metrics", timeout=10)
    r.raise_for_status()
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _sample_value(families: dict[str, Any], family: str, **labels: str) -> float:
    total = 0.0
    for s in families[family].samples:
        if s.name.endswith("_created"):
            continue
        if all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def _wait(what: str, check: Any, timeout: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s\n{_log_tails(logs)}")
        time.sleep(0.2)


def _prometheus_config(stack: Stack, prom_rules: Path) -> dict[str, Any]:
    """The shipped prometheus.yml with its targets moved to the test's ports."""
    cfg: dict[str, Any] = yaml.safe_load(PROMETHEUS_YML.read_text())
    every = f"{SCRAPE_S:g}s"
    cfg["global"] = {
        "scrape_interval": every,
        "scrape_timeout": every,
        "evaluation_interval": every,
    }
    cfg["rule_files"] = [str(prom_rules)]
    ports = {
        "127.0.0.1:8000": stack.router,
        "pair": stack.pair_router,
        "127.0.0.1:30001": stack.servers["eagle"],
        "127.0.0.1:30002": stack.servers["baseline"],
    }
    for job in cfg["scrape_configs"]:
        if job["job_name"] == "dynspec-router":
            job["static_configs"].append({"targets": ["pair"]})
        for sc in job["static_configs"]:
            sc["targets"] = [ports[t].removeprefix("http://") for t in sc["targets"]]
            for t in sc["targets"]:
                stack.instances[t] = job["job_name"] + "/" + sc.get("labels", {}).get("pool", "")
    return cfg


def _targets_up(prom: str, n: int) -> bool:
    r = httpx.get(prom + "/api/v1/targets", timeout=5).json()
    active = r["data"]["activeTargets"]
    return len(active) == n and all(t["health"] == "up" for t in active)


def _stream(client: openai.OpenAI, max_tokens: int) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    backend = raw.headers.get("x-dynspec-backend", "?")
    for _ in raw.parse():
        pass
    return backend


def _ramp(stack: Stack, client: openai.OpenAI) -> None:
    lock = threading.Lock()
    sent = [0]

    def worker(until: float) -> None:
        while time.monotonic() < until:
            with lock:
                if sent[0] >= MAX_REQUESTS:
                    return
                sent[0] += 1
            backend = _stream(client, MAX_TOKENS)
            with lock:
                stack.served_by[backend] = stack.served_by.get(backend, 0) + 1

    for concurrency, seconds in RAMP:
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=worker, args=(until,)) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=seconds + 30)
            assert not t.is_alive(), "a stream did not finish"


def _prometheus_has_router_count(stack: Stack, code: str | None = None) -> bool:
    """Prometheus holds the router's count of finished requests (with HTTP status ``code``) as
    it is now, and that count is not zero: a scrape came after them."""
    labels = {} if code is None else {"code": code}
    finished = _sample_value(_metrics(stack.router), "dynspec_requests", **labels)
    instance = stack.router.removeprefix("http://")
    selector = f'instance="{instance}"' + ("" if code is None else f',code="{code}"')
    got = _instant(stack, f"sum(dynspec_requests_total{{{selector}}})")
    return finished > 0 and got != [] and float(got[0]["value"][1]) == finished


def _faults(stack: Stack, client: openai.OpenAI) -> None:
    # Server errors: the eagle server (active at load 1) answers 500 to two requests, with a
    # scrape between them, so the error series moves between two scrapes as well as across them.
    eagle = stack.servers["eagle"]
    httpx.post(eagle + "/sim/faults", json={"fail_status": 500}, timeout=5).raise_for_status()
    try:
        for i in range(2):
            if i and stack.prometheus is not None:
                _wait(
                    "Prometheus scrapes the first failure",
                    lambda: _prometheus_has_router_count(stack, code="500"),
                    30,
                    stack.logs,
                )
            with contextlib.suppress(openai.APIStatusError):
                _stream(client, 8)
    finally:
        httpx.delete(eagle + "/sim/faults", timeout=5).raise_for_status()
    # A client that leaves after the first chunk of a long stream.
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell a long story."}],
        max_tokens=4000,
        stream=True,
    )
    next(iter(stream))
    stream.close()


def _pair_burst(stack: Stack) -> None:
    """Streams at once through the pair router, twice: its one pair goes past its threshold."""
    pair_client = openai.OpenAI(
        base_url=stack.pair_router + "/v1", api_key="unused", max_retries=0, timeout=30
    )
    with pair_client:
        for _ in range(2):
            threads = [
                threading.Thread(target=_stream, args=(pair_client, MAX_TOKENS))
                for _ in range(2 * THRESHOLD + 2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
                assert not t.is_alive(), "a pair stream did not finish"
    assert _sample_value(_metrics(stack.pair_router), "dynspec_mode_switches", to="baseline") >= 1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("deploy-live")
    logs = work / "logs"
    logs.mkdir()
    ports = {p: free_port() for p in ("router", "pair_router", "eagle", "baseline")}
    st = Stack(
        router=f"http://127.0.0.1:{ports['router']}",
        pair_router=f"http://127.0.0.1:{ports['pair_router']}",
        servers={p: f"http://127.0.0.1:{ports[p]}" for p in POOLS},
        logs=logs,
    )
    with contextlib.ExitStack() as es:
        es.enter_context(st.http)
        for pool in POOLS:
            argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(ports[pool])]
            argv += ["--mode", pool, "--profile", "demo", "--speed", str(SPEED), "--seed", "1"]
            argv += ["--served-model-name", MODEL, "--log-level", "warning"]
            es.enter_context(
                running(argv, st.servers[pool] + "/health_generate", 60, log=logs / f"{pool}.log")
            )
        argv = [sys.executable, "-m", "dynspec.router", "--host", "127.0.0.1"]
        argv += ["--port", str(ports["router"]), "--eagle-url", st.servers["eagle"]]
        argv += ["--baseline-url", st.servers["baseline"], "--threshold", str(THRESHOLD)]
        argv += ["--hysteresis", str(HYSTERESIS), "--health-interval", "0.5"]
        argv += ["--log-level", "warning"]
        es.enter_context(running(argv, st.router + "/health", 60, log=logs / "router.log"))
        # The same two servers as one pair, behind a router of their own.
        argv = [sys.executable, "-m", "dynspec.router", "--host", "127.0.0.1"]
        argv += ["--port", str(ports["pair_router"])]
        argv += ["--pair", f"{st.servers['eagle']},{st.servers['baseline']}"]
        argv += ["--threshold", str(THRESHOLD), "--hysteresis", str(HYSTERESIS)]
        argv += ["--health-interval", "0.5", "--log-level", "warning"]
        es.enter_context(
            running(argv, st.pair_router + "/health", 60, log=logs / "pair-router.log")
        )
        _wait(
            "the router sees both servers healthy",
            lambda: _sample_value(_metrics(st.router), "dynspec_server_up") == 2,
            30,
            logs,
        )

        # Without the binary the exporter-only tests still run; the others skip (fail in CI).
        binary = shutil.which("prometheus")
        if binary is not None:
            prom_port = free_port()
            st.prometheus = f"http://127.0.0.1:{prom_port}"
            cfg_file = work / "prometheus.yml"
            cfg_file.write_text(yaml.safe_dump(_prometheus_config(st, ALERTS)))
            argv = [binary, f"--config.file={cfg_file}", f"--storage.tsdb.path={work / 'tsdb'}"]
            argv += [f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"]
            es.enter_context(running(argv, st.prometheus + "/-/ready", 60, log=logs / "prom.log"))
            _wait("Prometheus scrapes all targets", lambda: _targets_up(st.prometheus, 4), 30, logs)

        client = openai.OpenAI(
            base_url=st.router + "/v1", api_key="unused", max_retries=0, timeout=30
        )
        with client:
            _ramp(st, client)
            _faults(st, client)
        _pair_burst(st)

        # Every request has ended (none left in flight), and Prometheus has scraped the end state.
        _wait(
            "the routers have nothing in flight",
            lambda: (
                _sample_value(_metrics(st.router), "dynspec_load") == 0
                and _sample_value(_metrics(st.pair_router), "dynspec_load") == 0
            ),
            30,
            logs,
        )
        if st.prometheus is not None:
            _wait(
                "Prometheus has the final request count",
                lambda: _prometheus_has_router_count(st),
                30,
                logs,
            )
        yield st


def _api(stack: Stack, path: str, params: dict[str, str]) -> Any:
    assert stack.prometheus is not None
    r = stack.http.get(stack.prometheus + path, params=params)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (params, body)
    return body["data"]


def _instant(stack: Stack, expr: str) -> list[dict[str, Any]]:
    data = _api(stack, "/api/v1/query", {"query": expr})
    assert data["resultType"] == "vector", (expr, data["resultType"])
    result: list[dict[str, Any]] = data["result"]
    return result


def _values(rate_interval: str, pool: str) -> dict[str, str]:
    return {
        "__rate_interval": rate_interval,
        "__interval": "1s",
        "__range": "5m",
        "pool": pool,
        "instance": ".*",
        "datasource": "prometheus",
    }


def _with_prometheus(stack: Stack) -> Stack:
    if stack.prometheus is None:
        require_tool("prometheus")  # skips here, fails in CI
    return stack


def test_traffic_crossed_the_threshold(stack: Stack) -> None:
    # Both pools served the ramp: the router switched to baseline under load and back.
    assert stack.served_by.get("eagle", 0) > 0 and stack.served_by.get("baseline", 0) > 0, (
        stack.served_by
    )
    m = _metrics(stack.router)
    assert _sample_value(m, "dynspec_mode_switches", to="baseline") >= 1
    assert _sample_value(m, "dynspec_mode_switches", to="eagle") >= 1


def _exported(stack: Stack) -> dict[str, tuple[str, str]]:
    """Every sample name the router and servers export -> (family, type)."""
    out: dict[str, tuple[str, str]] = {}
    for url in (stack.router, stack.pair_router, *stack.servers.values()):
        for fam in _metrics(url).values():
            for s in fam.samples:
                out[s.name] = (fam.name, fam.type)
    return out


def test_every_metric_name_is_exported(stack: Stack) -> None:
    exported = _exported(stack)
    dash = dashboard()
    used: dict[str, list[str]] = {}
    queries = [*panel_queries(dash), *alert_queries()]
    queries += [
        Query(f"variable {n}", parse_label_values(variable_query(v))[0])
        for n, v in variables(dash).items()
        if v["type"] == "query"
    ]
    for q in queries:
        for name in metric_names(q.expr):
            used.setdefault(name, []).append(q.where)
    assert used, "no metric names found"
    missing = {n: w for n, w in used.items() if n not in exported and n not in PROMETHEUS_OWN}
    assert not missing, f"used but exported by neither the router nor dynspec-sim: {missing}"
    # Buckets are read only from histograms; rate()/increase() only from counters or histograms.
    for name in used:
        if name.endswith("_bucket"):
            assert exported[name][1] == "histogram", name
    for q in queries:
        for name in metric_names(q.expr):
            if f"rate({name}" in q.expr or f"increase({name}" in q.expr:
                assert exported[name][1] in ("counter", "histogram"), (q.where, name)
    # `up` is allowed only where it comes from the scrape job in the shipped config.
    for name in used.keys() & PROMETHEUS_OWN:
        assert all(w.startswith("Dynspec") for w in used[name]), used[name]


def test_every_panel_query_returns_data(stack: Stack) -> None:
    stack = _with_prometheus(stack)
    empty: list[str] = []
    for q in panel_queries(dashboard()):
        title = q.where.rsplit(" [", 1)[0]
        for rate_interval in RATE_INTERVALS:
            for pool in (".*", *POOLS):
                result = _instant(stack, substitute(q.expr, _values(rate_interval, pool)))
                if not result and (title, pool) not in EMPTY_FOR_POOL:
                    empty.append(f"{q.where} with pool={pool}, rate interval {rate_interval}")
                if pool != ".*":
                    # the $pool filter works: nothing from the other pool comes through
                    seen = {r["metric"].get("pool", pool) for r in result}
                    assert seen <= {pool}, (q.where, pool, seen)
    assert not empty, "queries with no series:\n" + "\n".join(empty)


def _by_title(title: str, rate_interval: str = "1m") -> list[str]:
    qs = [q.expr for q in panel_queries(dashboard()) if q.where.startswith(title + " [")]
    assert qs, title
    return [substitute(e, _values(rate_interval, ".*")) for e in qs]


def test_panels_show_what_happened(stack: Stack) -> None:
    stack = _with_prometheus(stack)
    [active] = _by_title("Active pool")
    assert {r["metric"]["pool"] for r in _instant(stack, active)} == set(POOLS)
    [tokens] = _by_title("Output tokens/s per pool")
    rates = {r["metric"]["pool"]: float(r["value"][1]) for r in _instant(stack, tokens)}
    assert set(rates) == set(POOLS) and all(v > 0 for v in rates.values()), rates
    for expr in _by_title("Time to first token p50 / p99 per pool"):
        ttft = {r["metric"]["pool"]: float(r["value"][1]) for r in _instant(stack, expr)}
        assert set(ttft) == set(POOLS) and all(0 < v < 60 for v in ttft.values()), ttft
    [running_reqs] = _by_title("Running requests per server")
    assert {r["metric"]["pool"] for r in _instant(stack, running_reqs)} == set(POOLS)
    [accept] = _by_title("Speculative accept length")
    # A gauge of the last decode steps (0 once idle): read it over the ramp, as the panel does.
    end = time.time()
    ranged = _api(
        stack,
        "/api/v1/query_range",
        {"query": accept, "start": str(end - 60), "end": str(end), "step": "1"},
    )["result"]
    accepted = {r["metric"]["pool"]: max(float(v) for _, v in r["values"]) for r in ranged}
    assert set(accepted) == {"eagle"} and accepted["eagle"] >= 1, accepted
    # Both routers' series, added up by direction: the pair router's (pair="0") may never go
    # back to EAGLE (its 1-s return delay by default, cad4789), and a dict keyed by direction
    # alone kept whichever series came last.
    switches: dict[str, float] = {}
    for r in _instant(stack, "dynspec_mode_switches_total"):
        to = r["metric"]["to"]
        switches[to] = switches.get(to, 0.0) + float(r["value"][1])
    assert switches.get("baseline", 0) >= 1 and switches.get("eagle", 0) >= 1, switches
    [pair_threshold] = _by_title("Pair threshold")
    assert [float(r["value"][1]) for r in _instant(stack, pair_threshold)] == [THRESHOLD]
    [pair_mode] = _by_title("Pair mode")
    assert {r["metric"]["pool"] for r in _instant(stack, pair_mode)} == set(POOLS)
    [ratio] = _by_title("5xx ratio")
    value = float(_instant(stack, ratio)[0]["value"][1])
    assert 0 < value < 1 and not math.isnan(value), value
    [disconnects] = _by_title("Client disconnects/s per pool")
    assert any(float(r["value"][1]) > 0 for r in _instant(stack, disconnects))
    [predicted] = _by_title("Predicted time per output token per server")
    tpots = {r["metric"]["pool"]: float(r["value"][1]) for r in _instant(stack, predicted)}
    assert set(tpots) == set(POOLS) and all(0 < v < 60 for v in tpots.values()), tpots
    [decisions] = _by_title("Route decisions/s by pool and reason")
    decided = {
        (r["metric"]["pool"], r["metric"]["reason"]): float(r["value"][1])
        for r in _instant(stack, decisions)
    }
    # The threshold policy sent requests to each pool because the mode said so.
    assert decided.get(("eagle", "mode"), 0) > 0 and decided.get(("baseline", "mode"), 0) > 0, (
        decided
    )


def test_variable_queries_list_the_stack(stack: Stack) -> None:
    stack = _with_prometheus(stack)
    vs = variables(dashboard())
    values = _values("1m", ".*")
    found: dict[str, set[str]] = {}
    for name in ("instance", "pool"):
        selector, label = parse_label_values(variable_query(vs[name]))
        series = _api(stack, "/api/v1/series", {"match[]": substitute(selector, values)})
        found[name] = {s[label] for s in series if label in s}
    assert found["instance"] == set(stack.instances), found
    assert found["pool"] == set(POOLS), found


def test_every_alert_expression_evaluates(stack: Stack) -> None:
    stack = _with_prometheus(stack)
    for q in alert_queries():
        _instant(stack, q.expr)  # parses and evaluates; the result may well be empty
    # Prometheus loaded the shipped rules file and evaluates every rule without error.
    names = {q.where for q in alert_queries()}

    def rules() -> dict[str, dict[str, Any]]:
        groups = _api(stack, "/api/v1/rules", {"type": "alert"})["groups"]
        return {r["name"]: r for g in groups for r in g["rules"]}

    _wait(
        "every rule evaluated",
        lambda: all(r["health"] != "unknown" for r in rules().values()),
        15,
        stack.logs,
    )
    loaded = rules()
    assert set(loaded) == names
    bad = {n: r.get("lastError") for n, r in loaded.items() if r["health"] != "ok"}
    assert not bad, bad
