"""The router's Prometheus metrics, on a registry the caller owns.

Counters and histograms are updated by the proxy once per request (never per chunk); the gauges
(in flight, load, threshold, active pool, draining, server up, predicted TPOT) are read from
``Pools`` when ``/metrics`` is scraped, so they can never disagree with the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from dynspec.router.policy import POOLS, PoolName
from dynspec.router.pool import Pools
from dynspec.router.server import Group

UPSTREAM_ERROR_KINDS = ("connect", "timeout", "status", "protocol")
CLIENT_TIMEOUT_KINDS = ("header", "body", "idle")
# The status recorded for a client that left before its response ended (as nginx does).
CLIENT_CLOSED = 499

TTFT_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0,
)  # fmt: skip
# The router's own delay is well under a millisecond when it keeps up, so its buckets start low.
DELAY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip


class _StateCollector(Collector):
    def __init__(self, pools: Pools) -> None:
        self._pools = pools

    def collect(self) -> Iterator[Metric]:
        pools = self._pools
        in_flight = GaugeMetricFamily(
            "dynspec_in_flight_requests", "Requests in flight", labels=["pool"]
        )
        active = GaugeMetricFamily(
            "dynspec_active_pool",
            "1 for the pool new requests go to, else 0 (balance has none: 0 for both)",
            labels=["pool"],
        )
        draining = GaugeMetricFamily(
            "dynspec_pool_draining",
            "1 while the pool is inactive with requests still in flight",
            labels=["pool"],
        )
        active_pool = pools.active_pool()
        for pool in POOLS:
            in_flight.add_metric([pool], pools.in_flight(pool))
            active.add_metric([pool], 1 if pool == active_pool else 0)
            draining.add_metric([pool], 1 if pools.draining(pool) else 0)
        up = GaugeMetricFamily(
            "dynspec_server_up", "1 when the server is healthy, else 0", labels=["pool", "server"]
        )
        predicted = GaugeMetricFamily(
            "dynspec_predicted_tpot_seconds",
            "Predicted time per output token of one more request on the server (its speed curve "
            "at in flight + 1)",
            labels=["pool", "server"],
        )
        for s in pools.servers:
            up.add_metric([s.pool, s.url], 1 if s.healthy else 0)
            if s.curve is not None:
                predicted.add_metric([s.pool, s.url], s.curve.at(s.in_flight + 1))
        yield predicted
        yield in_flight
        yield GaugeMetricFamily(
            "dynspec_load", "Requests in flight over all servers", value=pools.load
        )
        yield from _per_group(pools)
        yield active
        yield draining
        yield up


# -- per routing group: with --pair each metric kept per group carries the pair's index ------------


def _per_group(pools: Pools) -> Iterator[Metric]:
    # Every group has the same label names: none in the split layout, ``pair`` with --pair.
    threshold = GaugeMetricFamily(
        "dynspec_threshold",
        "Current threshold (of each pair with --pair)",
        labels=list(pools.groups[0].labels),
    )
    load = GaugeMetricFamily(
        "dynspec_pair_load", "Requests in flight on the pair's two servers", labels=["pair"]
    )
    mode = GaugeMetricFamily(
        "dynspec_pair_mode", "1 for the pair's current mode, else 0", labels=["pair", "pool"]
    )
    # Not in INTERFACE.md's table: what the "pair down" alert reads (0: the pair serves nothing).
    up = GaugeMetricFamily(
        "dynspec_pair_servers_up", "Healthy servers of the pair (0, 1 or 2)", labels=["pair"]
    )
    for g in pools.groups:
        threshold.add_metric(list(g.labels.values()), g.settings.threshold)
        if g.label is None:
            continue  # the split layout's group: the pools' gauges above say it all
        load.add_metric([g.label], g.load)
        up.add_metric([g.label], sum(1 for s in g.servers if s.healthy))
        for pool in POOLS:
            mode.add_metric([g.label, pool], 1 if g.mode == pool else 0)
    yield threshold
    # A family with no series (the split layout has no pair) is left out.
    yield from (family for family in (load, mode, up) if family.samples)


USUAL_CODES = (200, 400, 499, 500, 502, 503, 504)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, pools: Pools) -> None:
        self.registry = registry
        self.requests = Counter(
            "dynspec_requests",
            "Finished requests by HTTP status (499: the client left first)",
            ["pool", "code"],
            registry=registry,
        )
        # With --pair each switch is counted for its pair too (``pair`` = the pair's index).
        self.mode_switches = Counter(
            "dynspec_mode_switches",
            "Mode switches",
            [*pools.groups[0].labels, "to"],
            registry=registry,
        )
        self.ttft = Histogram(
            "dynspec_time_to_first_token_seconds",
            "Time to the first streamed token, as the client sees it",
            ["pool"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.delay = Histogram(
            "dynspec_router_delay_seconds",
            "The router's own share of TTFT: from a request's arrival to its last byte sent to "
            "the server that answered (body read, route chosen, connection taken)",
            ["pool"],
            buckets=DELAY_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "dynspec_request_duration_seconds",
            "Whole request, from arrival to the last byte",
            ["pool"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "dynspec_time_per_output_token_seconds",
            "(duration - TTFT) / (output tokens - 1), streamed requests",
            ["pool"],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Counter(
            "dynspec_output_tokens", "Output tokens, from usage", ["pool"], registry=registry
        )
        self.prompt_tokens = Counter(
            "dynspec_prompt_tokens", "Prompt tokens, from usage", ["pool"], registry=registry
        )
        self.upstream_errors = Counter(
            "dynspec_upstream_errors",
            "Upstream failures: connect, timeout, status (server answered 5xx), protocol",
            ["pool", "kind"],
            registry=registry,
        )
        self.route_decisions = Counter(
            "dynspec_route_decisions",
            "Routing decisions by the pool chosen and the policy's reason",
            ["pool", "reason"],
            registry=registry,
        )
        self.poll_errors = Counter(
            "dynspec_speed_poll_errors",
            "Server /metrics bodies that did not parse (skipped)",
            ["server"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "dynspec_client_disconnects",
            "Clients that left mid-request",
            ["pool"],
            registry=registry,
        )
        # -- client timeouts (router/downstream.py) --
        self.client_timeouts = Counter(
            "dynspec_client_timeouts",
            "Client connections closed for being too slow: header, body, idle",
            ["kind"],
            registry=registry,
        )
        self._timeouts = {k: self.client_timeouts.labels(k) for k in CLIENT_TIMEOUT_KINDS}
        # -- end client timeouts --
        # Children resolved once: a label lookup per request is a dict lookup, not a lock + hash.
        self._switches = {
            (g.index, to): self.mode_switches.labels(*g.labels.values(), to)
            for to in POOLS
            for g in pools.groups
        }
        self._ttft = {p: self.ttft.labels(p) for p in POOLS}
        self._delay = {p: self.delay.labels(p) for p in POOLS}
        self._duration = {p: self.duration.labels(p) for p in POOLS}
        self._tpot = {p: self.tpot.labels(p) for p in POOLS}
        self._output = {p: self.output_tokens.labels(p) for p in POOLS}
        self._prompt = {p: self.prompt_tokens.labels(p) for p in POOLS}
        self._disconnects = {p: self.client_disconnects.labels(p) for p in POOLS}
        self._errors = {
            (p, k): self.upstream_errors.labels(p, k) for p in POOLS for k in UPSTREAM_ERROR_KINDS
        }
        # The usual statuses exist from the start at 0, so the first error of a kind is an increase
        # that rate() and the error-ratio alert can see, not a series that appears already at 1.
        self._requests: dict[tuple[str, int], Any] = {
            (p, code): self.requests.labels(p, str(code)) for p in POOLS for code in USUAL_CODES
        }
        self._routes: dict[tuple[str, str], Any] = {
            (p, r): self.route_decisions.labels(p, r) for p in POOLS for r in pools.policy.reasons
        }
        for s in pools.servers:
            self.poll_errors.labels(s.url)
        registry.register(_StateCollector(pools))

    def routed(self, pool: PoolName, reason: str) -> None:
        child = self._routes.get((pool, reason))
        if child is None:
            child = self._routes[pool, reason] = self.route_decisions.labels(pool, reason)
        child.inc()

    def poll_error(self, server: str) -> None:
        self.poll_errors.labels(server).inc()

    def switched(self, to: PoolName, group: Group) -> None:
        self._switches[group.index, to].inc()

    def upstream_error(self, pool: PoolName, kind: str) -> None:
        self._errors[pool, kind].inc()

    def client_timeout(self, kind: str) -> None:
        self._timeouts[kind].inc()

    def client_disconnect(self, pool: PoolName) -> None:
        self._disconnects[pool].inc()

    def finished(
        self,
        pool: PoolName,
        code: int,
        *,
        duration: float,
        ttft: float | None,
        delay: float | None,
        prompt_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        child = self._requests.get((pool, code))
        if child is None:
            child = self._requests[pool, code] = self.requests.labels(pool, str(code))
        child.inc()
        self._duration[pool].observe(duration)
        if ttft is not None:
            self._ttft[pool].observe(ttft)
        if delay is not None:
            self._delay[pool].observe(delay)
        if prompt_tokens is not None:
            self._prompt[pool].inc(prompt_tokens)
        if output_tokens is not None:
            self._output[pool].inc(output_tokens)
            if ttft is not None and output_tokens > 1:
                self._tpot[pool].observe((duration - ttft) / (output_tokens - 1))


# --- The shared load signal (--load-signal servers; router/loadsignal.py) ---------------------
# Its own small class so it is registered only where the signal runs, next to RouterMetrics.


class LoadSignalMetrics:
    def __init__(self, registry: CollectorRegistry, servers: Iterable[str]) -> None:
        self.errors = Counter(
            "dynspec_load_signal_errors",
            "Load readings from a server that were unusable (the router counted its own)",
            ["server"],
            registry=registry,
        )
        # Every server's series exists at 0, so the first failure is an increase rate() sees.
        self._errors = {s: self.errors.labels(s) for s in servers}

    def error(self, server: str) -> None:
        child = self._errors.get(server)
        if child is None:
            child = self._errors[server] = self.errors.labels(server)
        child.inc()
