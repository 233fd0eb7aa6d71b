"""The records the router keeps: one ``Server`` per upstream server, its ``ServerSpeed``, and one
``Group`` per routing group.

A ``Server`` owns everything known of one server, and each of its fields has one writer:

- ``healthy``: ``mark`` (the health checker's verdict, through ``Pools``);
  ``failures`` and ``down_reason``: the health checker;
- ``in_flight``, its integral ``area`` (up to ``changed``), ``routed`` and ``routed_at``:
  ``admit`` and ``finish``, which the pool's leases call;
- ``speed``: the speed learner, once, when it is built;
- ``mate``: ``layout``, once (the server it shares GPUs with, under ``--pair``);
- ``limit_asked`` and ``poll_warned``: the metrics poller.

A ``Group`` is what one mode and one threshold apply to: the split layout is one group holding
every server, ``--pair`` makes one group per pair. It owns its mode, thresholds, switch count,
whether a probe is in flight and whether its learned threshold was held down; its load is read from
its servers (by the pool, which knows whether the load signal counts instead).

Nothing here does I/O or reads a clock: the times come from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dynspec.router.policy import POOLS, PoolName, other_pool
from dynspec.router.speed import BucketSet, SpeedCurve
from dynspec.router.thresholds import Thresholds


class ServerSpeed:
    """What is known of one server's speed; mutable, written by the speed learner only."""

    __slots__ = (
        "accept_length",
        "calibrated",
        "clock",
        "curve",
        "direct",
        "floor",
        "limit_profile",
        "limit_reported",
        "limit_seen",
        "mate_marks",
        "polled",
        "pool",
        "previous",
        "prior",
        "ratio",
        "reach",
        "scale",
        "seeded",
        "seen",
        "server",
        "url",
    )

    def __init__(
        self,
        url: str,
        pool: str,
        prior: tuple[float, ...],
        limit: int | None,
        keep: float,
        *,
        seeded: bool = False,
        now: float = 0.0,
    ) -> None:
        self.url = url
        self.pool = pool
        self.prior = prior
        # True when the prior came from a --speed-profile (it says something before any data).
        self.seeded = seeded
        # The learner's time of the last observation (or of its start): what a probe waits on.
        self.seen = now
        # The largest load an observation of it was learned at (0: none yet): how far its own
        # data, not the prior's shape, says what its speed is (``autothreshold.auto_bound``).
        self.reach = 0.0
        # The smallest load an observation of it was learned at (inf: none yet): below it the
        # curve is the prior's shape (``autothreshold.derive_threshold``'s floor).
        self.floor = math.inf
        # The server's record, when the learner was built from records (the live router).
        self.server: Server | None = None
        self.limit_profile = limit
        # From the server itself (/get_server_info), and from polls that saw a queue.
        self.limit_reported: int | None = None
        self.limit_seen: int | None = None
        self.direct = BucketSet(keep)
        self.polled = BucketSet(keep)
        # The last poll's (running, gen_throughput, whether they had moved since the poll before
        # it, requests running at that one): what tells a fresh, steady poll (``learning.steady``).
        self.previous: tuple[float, float, bool] | None = None
        # Its mate's request-seconds (``Server.mate_area``) at the poll before last and at the
        # last poll: a poll's gauges may cover the time since the poll before last, and it is
        # learned only if nothing else ran on the GPUs meanwhile (``learning``).
        self.mate_marks: tuple[float, float] | None = None
        self.ratio = 1.0  # router-clock TPOT / server-clock TPOT
        # Whether ``ratio`` was measured on this server (else it is borrowed, or 1).
        self.calibrated = False
        # The ratio its polls are put on the router's clock with: its own once calibrated, else
        # the calibrated servers' (one deployment, one clock); None while none is measured.
        self.clock: float | None = None
        self.scale: float | None = None  # measured level over the prior's
        self.accept_length: float | None = None
        self.curve: SpeedCurve = SpeedCurve(prior, limit)

    def learned(self, load: float, now: float) -> None:
        """An observation at ``load`` was learned: the loads its own data covers, and when."""
        self.reach = max(self.reach, load)
        self.floor = min(self.floor, load)
        self.seen = now

    @property
    def limit(self) -> int | None:
        if self.limit_reported is not None:
            return self.limit_reported
        if self.limit_seen is not None:
            return self.limit_seen
        return self.limit_profile


class Server:
    __slots__ = (
        "area",
        "changed",
        "down_reason",
        "failures",
        "healthy",
        "in_flight",
        "limit_asked",
        "mate",
        "poll_warned",
        "pool",
        "routed",
        "routed_at",
        "speed",
        "url",
    )

    def __init__(self, url: str, pool: PoolName, now: float = 0.0) -> None:
        self.url = url
        self.pool: PoolName = pool
        # Unknown until the first health check answers; the router starts with every server down.
        self.healthy = False
        # Failed health checks in a row, and why the last one failed (for the log line).
        self.failures = 0
        self.down_reason = ""
        self.in_flight = 0
        # The router's request count (``Pools.seq``) when it last got a request.
        self.routed = 0
        # The clock's time when it last got a request (what spaces probes out).
        self.routed_at = 0.0
        # The integral of in_flight over time (request-seconds) up to ``changed`` (the clock's
        # time of the last count change).
        self.area = 0.0
        self.changed = now
        self.speed: ServerSpeed | None = None
        # The server it shares GPUs with (the other server of its pair; None: split layout).
        self.mate: Server | None = None
        # The metrics poller's: whether /get_server_info was asked, whether a warning was logged.
        self.limit_asked = False
        self.poll_warned = False

    @property
    def curve(self) -> SpeedCurve | None:
        speed = self.speed
        return speed.curve if speed is not None else None

    def mark(self, healthy: bool) -> bool:
        """Mark it up or down; True when that changed its state."""
        if self.healthy == healthy:
            return False
        self.healthy = healthy
        return True

    def _account(self, now: float, delta: int) -> None:
        self.area += self.in_flight * (now - self.changed)
        self.changed = now
        self.in_flight += delta

    def admit(self, now: float, seq: int) -> None:
        """One more request in flight from ``now``; ``seq`` is the router's request count."""
        self._account(now, 1)
        self.routed = seq
        self.routed_at = now

    def finish(self, now: float) -> None:
        self._account(now, -1)

    def area_at(self, now: float) -> float:
        return self.area + self.in_flight * (now - self.changed)

    def mate_area(self, now: float) -> float:
        """The request-seconds its mate has run so far (0 without one): what a lease marks."""
        return self.mate.area_at(now) if self.mate is not None else 0.0

    def alone_since(self, mate_area: float, now: float) -> bool:
        """Whether nothing else ran on its GPUs since its mate had run ``mate_area``
        request-seconds (``mate_area(then)``), and nothing runs there now."""
        mate = self.mate
        return mate is None or (mate.area_at(now) - mate_area <= 0 and mate.in_flight == 0)


class Group:
    __slots__ = (
        "_by_pool",
        "calm_since",
        "derived",
        "held",
        "index",
        "label",
        "mode",
        "probing",
        "servers",
        "settings",
        "switches",
    )

    def __init__(
        self,
        index: int,
        servers: Sequence[Server],
        settings: Thresholds,
        label: str | None = None,
    ) -> None:
        self.index = index
        # Its ``pair`` label in the metrics (its index) under --pair; None for the split layout's
        # one group, whose metrics carry no pair label.
        self.label = label
        self.servers = tuple(servers)
        self._by_pool = {p: tuple(s for s in self.servers if s.pool == p) for p in POOLS}
        self.mode: PoolName = "eagle"
        self.settings = settings
        self.switches = 0
        # A probe request in flight (at most one per group).
        self.probing = False
        # --threshold auto: the last derived threshold was held down by its bound (the curves
        # allowed more), so a load past it derives again at once (``autothreshold.past_held``).
        self.held = False
        # --threshold auto: whether its settings came from its curves yet. Until then they are the
        # start value, a guess (``AUTO_START``), which the first derivation replaces even within
        # one hysteresis step of it (``autothreshold.learned_settings``).
        self.derived = False
        # In baseline mode: since when its load has been at or below the return bound
        # (threshold - hysteresis), as every routing decision and every release saw it; None
        # while it is above, or in eagle mode.
        # ``pool.Pools`` writes it, and a group returns to EAGLE once it is --return-delay old.
        self.calm_since: float | None = None

    @property
    def name(self) -> str:
        """What the log calls it."""
        return "pools" if self.label is None else f"pair {self.label}"

    @property
    def labels(self) -> dict[str, str]:
        """Its labels in the metrics that are kept per group."""
        return {} if self.label is None else {"pair": self.label}

    @property
    def load(self) -> int:
        """Requests this router has in flight on its servers."""
        return sum(s.in_flight for s in self.servers)

    def of(self, pool: PoolName) -> tuple[Server, ...]:
        return self._by_pool[pool]

    @property
    def eagle(self) -> Server | None:
        """Its first EAGLE server (a pair's only one): whose curve the learned threshold reads."""
        servers = self._by_pool["eagle"]
        return servers[0] if servers else None

    @property
    def baseline(self) -> Server | None:
        servers = self._by_pool["baseline"]
        return servers[0] if servers else None

    def can_take(self, pool: PoolName, drained: set[PoolName]) -> bool:
        """Whether the pool's servers in it may get new requests: not drained, one healthy."""
        return pool not in drained and any(s.healthy for s in self._by_pool[pool])

    def active_pool(self, drained: set[PoolName]) -> PoolName:
        """The pool its new requests go to: the mode's, unless it cannot take any and the other
        can."""
        other = other_pool(self.mode)
        if not self.can_take(self.mode, drained) and self.can_take(other, drained):
            return other
        return self.mode


def layout(
    servers: Sequence[Server], pairs: Sequence[tuple[str, str]], settings: Thresholds
) -> tuple[Group, ...]:
    """The routing groups: one holding every server (the split layout), or one per pair
    (``--pair EAGLE_URL,BASELINE_URL``), whose two servers are each other's mate."""
    if not pairs:
        return (Group(0, servers, settings),)
    by_url = {s.url: s for s in servers}
    groups = []
    for i, (e, b) in enumerate(pairs):
        eagle, baseline = by_url[e], by_url[b]
        eagle.mate, baseline.mate = baseline, eagle
        groups.append(Group(i, (eagle, baseline), settings, label=str(i)))
    return tuple(groups)


__all__ = ["Group", "Server", "ServerSpeed", "layout"]
