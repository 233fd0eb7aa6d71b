"""The servers, their in-flight counts and the routing modes: the only code that changes them.

Every request that reaches a server holds a ``Lease``; releasing it is the one way a count goes
down, and releasing twice is harmless, so the proxy releases in ``finally`` whatever happened
(success, upstream error, timeout, client gone, server dead mid-stream, cancellation).
Everything here is synchronous and runs on the one event loop, so no lock is needed.

Each server keeps the running integral of its in-flight count over time, updated on every
acquire and release (O(1)): a lease reads it at both ends, which gives the server's mean in-flight
count over that request's life, the load a finished request's speed is learned against; and the
pair-mate's, which says whether the request ran alone on the pair's GPUs.

Two layouts: pools (``--eagle-url``/``--baseline-url``: one mode for all, chosen by the policy)
and pairs (``--pair``: one mode and threshold per pair, ``policy.choose_pair``). With
``--threshold auto`` each threshold is derived from the speed curves (``policy.derive_threshold``)
at most every ``AUTO_EVERY_S``.

With ``--load-signal servers`` a ``LoadSignal`` is told of every lease taken and released, and the
load the policy compares (the pools' total, each pair's) is the signal's; without one (``local``)
it is the in-flight counts here, and no other per-request work is done.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from dynspec.router.errors import NoServer, Overloaded
from dynspec.router.loadsignal import LoadSignal
from dynspec.router.policy import (
    AUTO_MIN,
    POOLS,
    PairView,
    Policy,
    PoolName,
    ServerView,
    Snapshot,
    auto_bound,
    choose_pair,
    derive_threshold,
    learned_settings,
    other_pool,
)
from dynspec.router.server import Pair, Server
from dynspec.router.thresholds import Thresholds, validate_settings

logger = logging.getLogger(__name__)

# --threshold auto: the threshold is derived again at most this often (router seconds).
AUTO_EVERY_S = 2.0
# A server with nothing learned of its speed for this long (router seconds), or that got none of
# the last PROBE_AFTER_REQUESTS routed requests, gets a probe (at light load).
PROBE_AFTER_S = 30.0
PROBE_AFTER_REQUESTS = 200


class Lease:
    __slots__ = (
        "_area",
        "_mate_area",
        "_pools",
        "_released",
        "_since",
        "alone",
        "mean_in_flight",
        "pair",
        "probe",
        "server",
    )

    def __init__(
        self, pools: Pools, server: Server, now: float, pair: Pair | None, probe: bool
    ) -> None:
        self._pools = pools
        self.server = server
        self.pair = pair
        self.probe = probe
        self._released = False
        self._area = server.area
        mate = server.mate
        self._mate_area = mate.area_at(now) if mate is not None else 0.0
        self._since = now
        # The server's mean in-flight count over the lease's life (this request included),
        # known once the lease is released.
        self.mean_in_flight = 0.0
        # False when the pair-mate had requests in flight during this one (known at release):
        # its speed then is not the server's speed alone.
        self.alone = True

    @property
    def pool(self) -> PoolName:
        return self.server.pool

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        server = self.server
        now = self._pools._release(self)
        elapsed = now - self._since
        self.mean_in_flight = (
            (server.area - self._area) / elapsed if elapsed > 0 else float(server.in_flight + 1)
        )
        mate = server.mate
        if mate is not None:
            self.alone = mate.area_at(now) - self._mate_area <= 0 and mate.in_flight == 0


class Pools:
    def __init__(
        self,
        servers: Sequence[tuple[str, PoolName]],
        policy: Policy,
        *,
        threshold: int,
        hysteresis: int,
        max_concurrency: int = 0,
        pairs: Sequence[tuple[str, str]] = (),
        auto: bool = False,
        on_switch: Callable[[PoolName, Pair | None], None] | None = None,
        on_route: Callable[[PoolName, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        signal: LoadSignal | None = None,
    ) -> None:
        self.servers: tuple[Server, ...] = tuple(Server(url, pool) for url, pool in servers)
        by_url = {s.url: s for s in self.servers}
        self.policy = policy
        self.settings = Thresholds(threshold, min(hysteresis, max(threshold - 1, 0)))
        # The configured hysteresis: --threshold auto clamps it below each derived threshold.
        self.hysteresis = hysteresis
        self.auto = auto
        self.derived_at = float("-inf")
        # As ``Pair.held``, for the pools' one threshold (split layout).
        self.held = False
        self.max_concurrency = max_concurrency
        self._mode: PoolName = "eagle"
        self.load = 0
        self.drained: set[PoolName] = set()
        self.on_switch = on_switch
        self.on_route = on_route
        self.clock = clock
        # --load-signal servers: the shared load (None: this router's own counts).
        self.signal = signal
        self.probing = False
        self.pairs: tuple[Pair, ...] = tuple(
            Pair(i, by_url[e], by_url[b], self.settings) for i, (e, b) in enumerate(pairs)
        )
        # Requests routed so far (each acquire, retries included): the policy's exploration count.
        self.seq = 0
        now = clock()
        for s in self.servers:
            s.changed = now

    # -- requests ---------------------------------------------------------------------------------

    def acquire(self, exclude: frozenset[str] = frozenset(), *, limit: bool = True) -> Lease:
        """Route one request: raises ``Overloaded`` or ``NoServer`` before any count changes."""
        if limit and self.max_concurrency and self.load >= self.max_concurrency:
            raise Overloaded(f"the router already has {self.load} requests in flight")
        self.seq += 1
        now = self.clock()
        if self.auto:
            self.derive(now, force=self._past_held())
        if self.pairs:
            return self._acquire_pair(exclude, now)
        snapshot = Snapshot(
            servers=self.views(now, probes=not self.probing and self._probes()),
            load=self.policy_load() + 1,
            mode=self._mode,
            threshold=self.settings.threshold,
            hysteresis=self.settings.hysteresis,
            seq=self.seq,
        )
        choice = self.policy.choose(snapshot, exclude)
        if choice.mode != self._mode:
            if self.policy.switches_modes:
                self._log_switch("mode", self._mode, choice.mode, snapshot.load, self.settings)
                if self.on_switch is not None:
                    self.on_switch(choice.mode, None)
            self._mode = choice.mode
        if choice.server is None:
            raise NoServer("no healthy server can take the request")
        server = next(s for s in self.servers if s.url == choice.server.url)
        probe = choice.reason == "probe"
        if probe:
            self.probing = True
        return self._lease(server, choice.reason, now, None, probe)

    def _acquire_pair(self, exclude: frozenset[str], now: float) -> Lease:
        probes = self._probes()
        views = tuple(
            PairView(
                p.index,
                self._view(p.eagle, now, probes and not p.probing),
                self._view(p.baseline, now, probes and not p.probing),
                self.pair_load(p),
                p.mode,
                p.settings.threshold,
                p.settings.hysteresis,
            )
            for p in self.pairs
        )
        choice = choose_pair(views, exclude)
        if choice.pair is None or choice.server is None:
            raise NoServer("no pair has a healthy server that can take the request")
        pair = self.pairs[choice.pair]
        if choice.mode != pair.mode:
            self._log_switch(
                f"pair {pair.index}",
                pair.mode,
                choice.mode,
                self.pair_load(pair) + 1,
                pair.settings,
            )
            pair.switches += 1
            pair.mode = choice.mode
            if self.on_switch is not None:
                self.on_switch(choice.mode, pair)
        server = pair.server(choice.server.pool)
        probe = choice.reason == "probe"
        if probe:
            pair.probing = True
        return self._lease(server, choice.reason, now, pair, probe)

    def _lease(
        self, server: Server, reason: str, now: float, pair: Pair | None, probe: bool
    ) -> Lease:
        if self.on_route is not None:
            self.on_route(server.pool, reason)
        server.account(now, 1)
        server.routed = self.seq
        server.routed_at = now
        self.load += 1
        if self.signal is not None:
            self.signal.admitted(server.url)
        return Lease(self, server, now, pair, probe)

    def _release(self, lease: Lease) -> float:
        now = self.clock()
        lease.server.account(now, -1)
        self.load -= 1
        if self.signal is not None:
            self.signal.finished(lease.server.url)
        if lease.probe:
            if lease.pair is not None:
                lease.pair.probing = False
            else:
                self.probing = False
        return now

    @staticmethod
    def _log_switch(what: str, old: str, new: str, load: int, settings: Thresholds) -> None:
        logger.info(
            "%s %s -> %s at load %d (threshold %d, hysteresis %d)",
            what,
            old,
            new,
            load,
            settings.threshold,
            settings.hysteresis,
        )

    # -- probes and the learned threshold ----------------------------------------------------------

    def _probes(self) -> bool:
        """Probes go out under ``balance`` always, under ``threshold`` with ``--threshold auto``."""
        return self.auto or not self.policy.switches_modes

    def _stale(self, s: Server, now: float) -> bool:
        speed = s.speed
        if speed is None or s.in_flight > 0:
            return False
        # Time counts from the later of the last observation learned and the last request sent:
        # a probe whose observation could not be learned (its pair-mate was busy meanwhile, so it
        # was not the server's alone speed) must not be sent again at once, or a pair at light
        # load would keep one probe in flight on its other server all the time, sharing the GPU.
        since = now - max(speed.seen, s.routed_at)
        return since >= PROBE_AFTER_S or self.seq - s.routed >= PROBE_AFTER_REQUESTS

    def _view(self, s: Server, now: float, probes: bool = False) -> ServerView:
        stale = probes and self._stale(s, now)
        return ServerView(
            s.url, s.pool, s.healthy, s.in_flight, s.pool not in self.drained, s.curve, stale
        )

    def views(self, now: float | None = None, *, probes: bool = False) -> tuple[ServerView, ...]:
        now = self.clock() if now is None else now
        return tuple(self._view(s, now, probes) for s in self.servers)

    def _past_held(self) -> bool:
        """Whether a new request would take an EAGLE-mode load past a threshold that its bound
        held down. The bound grows with the load carried (``policy.auto_bound``), but it was
        derived up to ``AUTO_EVERY_S`` ago: a closed loop stepping from 8 to 16 streams crossed
        it before the next derivation on the real H200, and each level of the sweep began with
        a switch to the baseline and back, both servers sharing the GPU meanwhile."""
        if self.pairs:
            return any(
                p.held and p.mode == "eagle" and self.pair_load(p) + 1 > p.settings.threshold
                for p in self.pairs
            )
        return (
            self.held and self._mode == "eagle" and self.policy_load() + 1 > self.settings.threshold
        )

    def _auto_settings(
        self, eagle: Sequence[Server], baseline: Sequence[Server], current: Thresholds, load: int
    ) -> tuple[Thresholds | None, bool]:
        """The new settings derived from the curves (``policy.learned_settings``), held to twice
        what the EAGLE server was seen serving or the ``load`` carried now, and to its running
        limit (``policy.auto_bound``; the load spread over a pool's servers), or None to keep
        the current ones; and whether the bound held the threshold below the curves' own."""
        speed = eagle[0].speed
        n = len(eagle)
        reach = None if speed is None or speed.seeded else speed.reach
        derived = _derived(eagle, baseline, reach, _floor(eagle, baseline))
        limit = speed.limit if speed is not None else None
        bound = auto_bound(
            reach * n if reach is not None else None, limit * n if limit is not None else None, load
        )
        new = learned_settings(
            derived, (current.threshold, current.hysteresis), self.hysteresis, bound
        )
        return (Thresholds(*new) if new is not None else None), derived > bound

    def derive(self, now: float | None = None, *, force: bool = False) -> None:
        """Derive each threshold again from the curves (at most every ``AUTO_EVERY_S`` unless
        ``force``)."""
        now = self.clock() if now is None else now
        if not force and now - self.derived_at < AUTO_EVERY_S:
            return
        self.derived_at = now
        if self.pairs:
            for p in self.pairs:
                if not (_measured(p.eagle) and _measured(p.baseline)):
                    continue
                new, p.held = self._auto_settings(
                    [p.eagle], [p.baseline], p.settings, self.pair_load(p)
                )
                if new is not None:
                    logger.info(
                        "pair %d: threshold %d, hysteresis %d (learned)",
                        p.index,
                        new.threshold,
                        new.hysteresis,
                    )
                    p.settings = new
            return
        eagle = [s for s in self.servers if s.pool == "eagle"]
        baseline = [s for s in self.servers if s.pool == "baseline"]
        if not eagle or not baseline or not all(_measured(s) for s in eagle[:1] + baseline[:1]):
            return
        new, self.held = self._auto_settings(eagle, baseline, self.settings, self.policy_load())
        if new is not None:
            logger.info("threshold %d, hysteresis %d (learned)", new.threshold, new.hysteresis)
            self.settings = new

    # -- views ------------------------------------------------------------------------------------

    def policy_load(self) -> int:
        """The load the pools' mode is switched by: the signal's total, or this router's own."""
        signal = self.signal
        if signal is None:
            return self.load
        return signal.total(s.url for s in self.servers)

    def pair_load(self, p: Pair) -> int:
        """A pair's load for its mode: the signal's for both servers, or this router's own."""
        signal = self.signal
        if signal is None:
            return p.load
        return signal.load(p.eagle.url) + signal.load(p.baseline.url)

    def server_load(self, s: Server) -> int:
        """A server's load as the policy counts it (the signal's, or this router's in-flight)."""
        return s.in_flight if self.signal is None else self.signal.load(s.url)

    def in_flight(self, pool: PoolName) -> int:
        return sum(s.in_flight for s in self.servers if s.pool == pool)

    def can_take(self, pool: PoolName) -> bool:
        return pool not in self.drained and any(s.healthy for s in self.servers if s.pool == pool)

    @property
    def switches(self) -> bool:
        """Whether routing has a mode: the ``threshold`` policy and pairs do, ``balance`` not."""
        return bool(self.pairs) or self.policy.switches_modes

    @property
    def mode(self) -> PoolName | None:
        """The pools' mode; with pairs, the mode most pairs are in (a tie: pair 0's); None under
        a policy without modes (``balance``)."""
        if self.pairs:
            return _most([p.mode for p in self.pairs])
        return self._mode if self.policy.switches_modes else None

    @mode.setter
    def mode(self, value: PoolName) -> None:
        self._mode = value

    def active_pool(self) -> PoolName | None:
        """The pool new requests go to now: the mode's, unless it cannot take any.

        None under a policy without modes (``balance``: every request picks its server). With
        pairs: the active pool of most pairs (a tie: pair 0's).
        """
        if self.pairs:
            return _most([p.active_pool(self.drained) for p in self.pairs])
        if not self.policy.switches_modes:
            return None
        if not self.can_take(self._mode) and self.can_take(other_pool(self._mode)):
            return other_pool(self._mode)
        return self._mode

    def active_servers(self) -> list[Server]:
        """The healthy servers new requests go to: the active pool's, or each pair's active one;
        under ``balance`` (no active pool) every healthy server of a pool not drained."""
        if self.pairs:
            servers = [p.server(p.active_pool(self.drained)) for p in self.pairs]
            return [s for s in servers if s.healthy]
        active = self.active_pool()
        if active is None:
            return [s for s in self.servers if s.healthy and s.pool not in self.drained]
        return [s for s in self.servers if s.healthy and s.pool == active]

    def server_draining(self, s: Server) -> bool:
        """Inactive (or drained) with requests still in flight."""
        if s.in_flight == 0:
            return False
        if s.pool in self.drained:
            return True
        if s.mate is not None:
            pair = next(p for p in self.pairs if p.eagle is s or p.baseline is s)
            return s.pool != pair.active_pool(self.drained)
        return self.policy.switches_modes and s.pool != self.active_pool()

    def draining(self, pool: PoolName) -> bool:
        """Inactive (or drained by an operator) with requests still in flight.

        Under a policy without modes no pool is inactive: only an operator's drain counts. With
        pairs: one of the pool's servers is inactive in its pair and still holds requests.
        """
        if self.pairs:
            return any(self.server_draining(s) for s in self.servers if s.pool == pool)
        inactive = pool in self.drained or (
            self.policy.switches_modes and pool != self.active_pool()
        )
        return inactive and self.in_flight(pool) > 0

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self.servers)

    def server(self, url: str) -> Server:
        return next(s for s in self.servers if s.url == url)

    # -- operator and health controls --------------------------------------------------------------

    @staticmethod
    def mark(server: Server, healthy: bool) -> bool:
        """Mark a server up or down; True when that changed its state."""
        if server.healthy == healthy:
            return False
        server.healthy = healthy
        return True

    def set_healthy(self, url: str, healthy: bool) -> bool:
        return self.mark(self.server(url), healthy)

    def set_settings(self, threshold: int, hysteresis: int) -> None:
        """The operator's threshold, for the pools and every pair; turns --threshold auto off."""
        reason = validate_settings(threshold, hysteresis)
        if reason is not None:
            raise ValueError(reason)
        self.settings = Thresholds(threshold, hysteresis)
        self.hysteresis = hysteresis
        for p in self.pairs:
            p.settings = self.settings
        if self.auto:
            logger.info("threshold set by an operator: no longer learned")
        self.auto = False
        logger.info("threshold %d, hysteresis %d", threshold, hysteresis)

    def drain(self, pool: PoolName) -> None:
        self.drained.add(pool)
        logger.info("pool %s drained: no new requests until resumed", pool)

    def resume(self, pool: PoolName) -> None:
        self.drained.discard(pool)
        logger.info("pool %s resumed", pool)


def _most(pools: list[PoolName]) -> PoolName:
    eagle = sum(1 for p in pools if p == "eagle")
    baseline = len(pools) - eagle
    if eagle == baseline:
        return pools[0]
    return "eagle" if eagle > baseline else "baseline"


def _measured(s: Server) -> bool:
    """Whether the server's curve says something: seeded by a profile, or some data of its own."""
    speed = s.speed
    return speed is not None and (speed.seeded or speed.scale is not None)


def _floor(eagle: Sequence[Server], baseline: Sequence[Server]) -> int:
    """The lowest load (the pools' together) at which both were seen, from each pool's first
    server; a pool seeded by a profile is known at every load."""
    floor = AUTO_MIN
    for servers in (eagle, baseline):
        speed = servers[0].speed
        if speed is not None and not speed.seeded and speed.floor != math.inf:
            floor = max(floor, round(speed.floor * len(servers)))
    return floor


def _derived(
    eagle: Sequence[Server], baseline: Sequence[Server], reach: float | None, floor: int
) -> int:
    e, b = eagle[0].curve, baseline[0].curve
    if e is None or b is None:
        return AUTO_MIN
    return derive_threshold(e, b, len(eagle), len(baseline), reach=reach, floor=floor)


__all__ = ["POOLS", "Lease", "Pair", "Pools", "Server"]
