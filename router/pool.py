"""The servers, their in-flight counts and the routing groups' modes: the only code changing them.

Every request that reaches a server holds a ``Lease``; releasing it is the one way a count goes
down, and releasing twice is harmless, so the proxy releases in ``finally`` whatever happened
(success, upstream error, timeout, client gone, server dead mid-stream, cancellation).
Everything here is synchronous and runs on the one event loop, so no lock is needed.

Each server keeps the running integral of its in-flight count over time (``Server.admit`` and
``finish``, O(1)): a lease reads it at both ends, which gives the server's mean in-flight count
over that request's life, the load a finished request's speed is learned against; and its mate's,
which says whether the request ran alone on its GPUs.

Both layouts route the same way (``server.layout``: one group holding every server, or one group
per ``--pair``): the least-loaded group that can take the request (``policy.least_loaded``), then
the registered policy on that group's snapshot, which switches that group's mode. With
``--threshold auto`` each group's threshold is learned: the rules are ``autothreshold``'s, and
this module only calls them and applies what they return.

With ``--load-signal servers`` a ``LoadSignal`` is told of every lease taken and released, and the
load the policy compares (each group's) is the signal's; without one (``local``) it is the
in-flight counts here, and no other per-request work is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from dynspec.router.autothreshold import AUTO_EVERY_S, past_held, relearn, stale
from dynspec.router.errors import NoServer, Overloaded
from dynspec.router.loadsignal import LoadSignal
from dynspec.router.policy import POOLS, Policy, PoolName, ServerView, Snapshot, least_loaded
from dynspec.router.server import Group, Server, layout
from dynspec.router.thresholds import Thresholds, validate_settings
from dynspec.router.trend import LoadTrend

logger = logging.getLogger(__name__)


class Lease:
    __slots__ = (
        "_area",
        "_mate_area",
        "_pools",
        "_released",
        "_since",
        "alone",
        "group",
        "mean_in_flight",
        "probe",
        "server",
        "stay",
    )

    def __init__(self, pools: Pools, server: Server, now: float, group: Group, probe: bool) -> None:
        self._pools = pools
        self.server = server
        self.group = group
        self.probe = probe
        self._released = False
        self._area = server.area
        self._mate_area = server.mate_area(now)
        self._since = now
        # The server's mean in-flight count over the lease's life (this request included),
        # known once the lease is released.
        self.mean_in_flight = 0.0
        # Seconds from routing to release (the pool's clock): the request's stay on the server,
        # over which ``mean_in_flight`` is taken; known once the lease is released.
        self.stay = 0.0
        # False when its mate had requests in flight during this one (known at release): its
        # speed then is not the server's speed alone.
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
        self.stay = elapsed
        self.mean_in_flight = (
            (server.area - self._area) / elapsed if elapsed > 0 else float(server.in_flight + 1)
        )
        self.alone = server.alone_since(self._mate_area, now)


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
        on_switch: Callable[[PoolName, Group], None] | None = None,
        on_route: Callable[[PoolName, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        signal: LoadSignal | None = None,
        return_delay: float = 0.0,
        switch_margin: float = 0.0,
        switch_lead: float = 0.0,
    ) -> None:
        now = clock()
        self.servers: tuple[Server, ...] = tuple(Server(url, pool, now) for url, pool in servers)
        self.policy = policy
        # What every group starts from, and what an operator's PUT sets (``settings``).
        self._settings = Thresholds(threshold, min(hysteresis, max(threshold - 1, 0)))
        # The configured hysteresis: --threshold auto clamps it below each derived threshold.
        self.hysteresis = hysteresis
        self.auto = auto
        self.derived_at = float("-inf")
        self.max_concurrency = max_concurrency
        # --return-delay: seconds a group's load must stay at or below its return bound before
        # its new requests go back to EAGLE (0: at once).
        self.return_delay = return_delay
        # --switch-margin: in a pair, EAGLE keeps a load only where it is predicted this much
        # faster (``autothreshold.relearn``).
        self.switch_margin = switch_margin
        # --switch-lead: how many EAGLE stays ahead a group's rising load is judged (0: off).
        self.switch_lead = switch_lead
        self.load = 0
        self.drained: set[PoolName] = set()
        self.on_switch = on_switch
        self.on_route = on_route
        self.clock = clock
        # --load-signal servers: the shared load (None: this router's own counts).
        self.signal = signal
        self.groups = layout(self.servers, pairs, self._settings)
        # The split layout's one group (None with --pair): its mode and thresholds are the
        # router's, which two rules below keep as they were before there were groups.
        self._whole = self.groups[0] if self.groups[0].label is None else None
        # Requests routed so far (each acquire, retries included): the policy's exploration count.
        self.seq = 0
        # Each group's load over time (--switch-lead), by group index; empty without it.
        self.trends = {g.index: LoadTrend(now) for g in self.groups} if switch_lead else {}

    # -- requests ---------------------------------------------------------------------------------

    def acquire(self, exclude: frozenset[str] = frozenset(), *, limit: bool = True) -> Lease:
        """Route one request: raises ``Overloaded`` or ``NoServer`` before any count changes."""
        if limit and self.max_concurrency and self.load >= self.max_concurrency:
            raise Overloaded(f"the router already has {self.load} requests in flight")
        self.seq += 1
        now = self.clock()
        if self.auto:
            self.derive(now, force=any(past_held(g, self.group_load(g)) for g in self.groups))
        for g in self.groups:
            self._calm(g, now)
        snapshots = [self._snapshot(g, now) for g in self.groups]
        i = least_loaded(snapshots, exclude, self.seq - 1)
        if i is None:
            if self._whole is None:
                raise NoServer("no pair has a healthy server that can take the request")
            # The split layout's group is shown the request all the same, so its mode follows
            # the load while no server can take any (a pair that cannot take it is not).
            i = 0
        group, snapshot = self.groups[i], snapshots[i]
        choice = self.policy.choose(snapshot, exclude)
        if choice.mode != group.mode:
            if self.policy.switches_modes:
                logger.info(
                    "%s: mode %s -> %s at load %d%s (threshold %d, hysteresis %d)",
                    group.name,
                    group.mode,
                    choice.mode,
                    snapshot.load,
                    f" heading {snapshot.load + snapshot.ahead:.1f}" if self.trends else "",
                    snapshot.threshold,
                    snapshot.hysteresis,
                )
                group.switches += 1
                if self.on_switch is not None:
                    self.on_switch(choice.mode, group)
            group.mode = choice.mode
            group.calm_since = None
        if choice.server is None:
            raise NoServer("no healthy server can take the request")
        url = choice.server.url
        server = next(s for s in group.servers if s.url == url)
        probe = choice.reason == "probe"
        if probe:
            group.probing = True
        if self.on_route is not None:
            self.on_route(server.pool, choice.reason)
        server.admit(now, self.seq)
        self.load += 1
        if self.signal is not None:
            self.signal.admitted(url)
        trend = self.trends.get(group.index)
        if trend is not None:
            trend.observe(now, self.group_load(group))
        return Lease(self, server, now, group, probe)

    def _release(self, lease: Lease) -> float:
        now = self.clock()
        lease.server.finish(now)
        self.load -= 1
        if self.signal is not None:
            self.signal.finished(lease.server.url)
        if lease.probe:
            lease.group.probing = False
        trend = self.trends.get(lease.group.index)
        if trend is not None:
            if lease.pool == "eagle":
                trend.stayed(now - lease._since)
            trend.observe(now, self.group_load(lease.group))
        # The return delay counts from when the load fell, not from the next request: after a
        # busy spell ends with no arrival, a quiet start's first requests went to the baseline
        # for the whole delay (one H100, p54 day at 1a53ba8: 0.51 of the night window on EAGLE
        # in the routed runs that came after one at 40 req/s).
        self._calm(lease.group, now)
        return now

    def _snapshot(self, group: Group, now: float) -> Snapshot:
        # Probes go out under ``balance`` always, under ``threshold`` with --threshold auto; one
        # at a time per group. A group in baseline mode probes EAGLE only once its load has
        # stayed low for the return delay, as it would go back: the mate idle at one instant is
        # a wave's dip as often as a light load (a closed loop's 128 requests end in one step
        # and the next 128 come within milliseconds), and a probe then runs beside the mate's
        # next batch, slows all of it and is not learned (simulated h200-8b-accept2 C=256: one
        # probe a pair a wave, PROBE_AFTER_REQUESTS being less than a wave, 0.94x 2x-baseline).
        probes = (self.auto or not self.policy.switches_modes) and not group.probing
        if probes and self.policy.switches_modes and group.mode == "baseline":
            probes = self._may_return(group, now)
        settings = group.settings
        return Snapshot(
            servers=tuple(self._view(s, now, probes) for s in group.servers),
            load=self.group_load(group) + 1,
            mode=group.mode,
            threshold=settings.threshold,
            hysteresis=settings.hysteresis,
            seq=self.seq,
            may_return=self._may_return(group, now),
            ahead=self._ahead(group, now),
        )

    def _ahead(self, group: Group, now: float) -> float:
        trend = self.trends.get(group.index)
        return 0.0 if trend is None else trend.ahead(now, self.switch_lead)

    def _calm(self, group: Group, now: float) -> None:
        """Start or stop the clock of a group in baseline mode whose load (a request routed now
        counted) is at or below its return bound: at every request routed and every release."""
        if group.mode != "baseline" or not self.return_delay:
            group.calm_since = None
            return
        settings = group.settings
        low = self.group_load(group) + 1 <= settings.threshold - settings.hysteresis
        if not low:
            group.calm_since = None
        elif group.calm_since is None:
            group.calm_since = now

    def _may_return(self, group: Group, now: float) -> bool:
        if not self.return_delay:
            return True
        since = group.calm_since
        return since is not None and now - since >= self.return_delay

    def _view(self, s: Server, now: float, probes: bool) -> ServerView:
        due = probes and stale(s, now, self.seq)
        return ServerView(
            s.url, s.pool, s.healthy, s.in_flight, s.pool not in self.drained, s.curve, due
        )

    # -- the learned threshold ---------------------------------------------------------------------

    def derive(self, now: float | None = None, *, force: bool = False) -> None:
        """Derive each group's threshold again (``autothreshold.relearn``), at most every
        ``AUTO_EVERY_S`` unless ``force``."""
        now = self.clock() if now is None else now
        if not force and now - self.derived_at < AUTO_EVERY_S:
            return
        self.derived_at = now
        for g in self.groups:
            found = relearn(g, self.group_load(g), self.hysteresis, self.switch_margin)
            if found is None:
                continue
            new, g.held = found
            g.derived = True
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("%s: at load %d %s", g.name, self.group_load(g), _curves(g))
            if new is not None:
                logger.info(
                    "%s: threshold %d, hysteresis %d (learned)",
                    g.name,
                    new.threshold,
                    new.hysteresis,
                )
                g.settings = new

    # -- views ------------------------------------------------------------------------------------

    def policy_load(self) -> int:
        """The load over every server: the signal's total, or this router's own."""
        signal = self.signal
        if signal is None:
            return self.load
        return signal.total(s.url for s in self.servers)

    def group_load(self, g: Group) -> int:
        """A group's load for its mode: the signal's for its servers, or this router's own."""
        signal = self.signal
        if signal is None:
            return g.load
        return signal.total(s.url for s in g.servers)

    def server_load(self, s: Server) -> int:
        """A server's load as the policy counts it (the signal's, or this router's in-flight)."""
        return s.in_flight if self.signal is None else self.signal.load(s.url)

    def in_flight(self, pool: PoolName) -> int:
        return sum(s.in_flight for s in self.servers if s.pool == pool)

    @property
    def settings(self) -> Thresholds:
        """The router's thresholds: the split layout's group's (learned under --threshold auto);
        with --pair the ones every pair started from, or an operator's last (each pair learns
        its own). ``PUT /admin/threshold`` keeps this hysteresis when it names none."""
        whole = self._whole
        return whole.settings if whole is not None else self._settings

    @settings.setter
    def settings(self, value: Thresholds) -> None:
        self._settings = value
        if self._whole is not None:
            self._whole.settings = value

    @property
    def switches(self) -> bool:
        """Whether routing has a mode: the ``threshold`` policy does, ``balance`` not."""
        return self.policy.switches_modes

    @property
    def mode(self) -> PoolName | None:
        """The mode most groups are in (a tie: group 0's); None under a policy without modes
        (``balance``)."""
        if not self.policy.switches_modes:
            return None
        return _most([g.mode for g in self.groups])

    def active_pool(self) -> PoolName | None:
        """The pool new requests go to now in most groups (a tie: group 0's): a group's mode's,
        unless it cannot take any. None under a policy without modes (``balance``: every request
        picks its server)."""
        if not self.policy.switches_modes:
            return None
        return _most([g.active_pool(self.drained) for g in self.groups])

    def active_servers(self) -> list[Server]:
        """The healthy servers new requests go to: each group's active pool's; under
        ``balance`` (no active pool) every healthy server of a pool not drained."""
        if not self.policy.switches_modes:
            return [s for s in self.servers if s.healthy and s.pool not in self.drained]
        return [s for g in self.groups for s in g.of(g.active_pool(self.drained)) if s.healthy]

    def group_of(self, s: Server) -> Group:
        return next(g for g in self.groups if s in g.servers)

    def server_draining(self, s: Server) -> bool:
        """Inactive in its group (or drained) with requests still in flight. Under a policy
        without modes no pool is inactive: only an operator's drain counts."""
        if s.in_flight == 0:
            return False
        if s.pool in self.drained:
            return True
        active = self.group_of(s).active_pool(self.drained)
        return self.policy.switches_modes and s.pool != active

    def draining(self, pool: PoolName) -> bool:
        """One of the pool's servers is inactive (or drained) and still holds requests."""
        return any(self.server_draining(s) for s in self.servers if s.pool == pool)

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self.servers)

    def server(self, url: str) -> Server:
        return next(s for s in self.servers if s.url == url)

    # -- operator and health controls --------------------------------------------------------------

    def set_healthy(self, url: str, healthy: bool) -> bool:
        return self.server(url).mark(healthy)

    def set_settings(self, threshold: int, hysteresis: int) -> None:
        """The operator's threshold, for every group; turns --threshold auto off."""
        reason = validate_settings(threshold, hysteresis)
        if reason is not None:
            raise ValueError(reason)
        self._settings = Thresholds(threshold, hysteresis)
        self.hysteresis = hysteresis
        for g in self.groups:
            g.settings = self._settings
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


def _curves(g: Group) -> str:
    """Each of the group's pools' first server's curve at a few loads, ms a token (debug)."""
    out = []
    for pool in POOLS:
        servers = g.of(pool)
        speed = servers[0].speed if servers else None
        if speed is not None:
            at = ", ".join(f"{b}: {speed.curve.at(b) * 1e3:.1f}" for b in (1, 8, 16, 32, 64))
            out.append(f"{pool} {{{at}}} seen {speed.floor:g}-{speed.reach:g}")
    return "; ".join(out)


def _most(pools: list[PoolName]) -> PoolName:
    eagle = sum(1 for p in pools if p == "eagle")
    baseline = len(pools) - eagle
    if eagle == baseline:
        return pools[0]
    return "eagle" if eagle > baseline else "baseline"


__all__ = ["POOLS", "Group", "Lease", "Pools", "Server"]
