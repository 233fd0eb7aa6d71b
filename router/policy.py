"""Routing policies: pure functions of a frozen snapshot, so they are tested with plain tables.

A policy sees the servers as immutable views plus the router's load and current mode, and returns
which server takes the request, what the mode is afterwards and why (the ``reason`` label of
``dynspec_route_decisions_total``). It holds no state, no clock and no I/O; ``pool.Pools`` owns the
state and applies the choice. A policy is a subclass of ``Policy`` registered in ``POLICIES``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from dynspec.router.speed import NEUTRAL_CURVE, SpeedCurve

PoolName = Literal["eagle", "baseline"]
POOLS: tuple[PoolName, PoolName] = ("eagle", "baseline")


def other_pool(pool: PoolName) -> PoolName:
    return "baseline" if pool == "eagle" else "eagle"


@dataclass(frozen=True, slots=True)
class ServerView:
    url: str
    pool: PoolName
    healthy: bool
    in_flight: int
    # False while an operator has drained the server's pool (POST /admin/drain/{pool}).
    accepting: bool = True
    # The server's predicted speed by load (``balance``); None: no estimate (the neutral curve).
    curve: SpeedCurve | None = None
    # True when a probe may go to it: nothing learned of its speed for ``PROBE_AFTER_S`` (or no
    # request for ``PROBE_AFTER_REQUESTS``), nothing in flight on it, and no other probe in flight
    # (``pool.Pools`` decides; False: never probe).
    stale: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    servers: tuple[ServerView, ...]
    # Requests in flight over all servers, counting the one being routed.
    load: int
    mode: PoolName
    threshold: int
    hysteresis: int
    # Requests routed so far, this one included: what deterministic exploration counts.
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Choice:
    # None when no server can take the request (every candidate unhealthy, drained or excluded).
    server: ServerView | None
    mode: PoolName
    reason: str = ""


class Policy(abc.ABC):
    name: ClassVar[str]
    # Every reason ``choose`` may give (the route-decision counter starts each at 0).
    reasons: ClassVar[tuple[str, ...]]
    # True: the mode is a routing state whose changes are logged and counted as switches.
    # False: the mode only records the pool the last request went to.
    switches_modes: ClassVar[bool] = True

    @abc.abstractmethod
    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        """Pick a server for one request; ``exclude`` holds URLs that just failed to connect."""


def least_in_flight(
    servers: Sequence[ServerView], pool: PoolName, exclude: frozenset[str]
) -> ServerView | None:
    best: ServerView | None = None
    for s in servers:
        if s.pool != pool or not s.healthy or not s.accepting or s.url in exclude:
            continue
        # Ties go to the first server listed, so the order of --eagle-url is the preference.
        if best is None or s.in_flight < best.in_flight:
            best = s
    return best


def probe_load(threshold: int) -> int:
    """The largest load (counting the new request) at which a probe may go out: light load."""
    return max(1, threshold // 4)


def _probe(servers: Sequence[ServerView], exclude: frozenset[str]) -> ServerView | None:
    for s in servers:
        if s.stale and s.healthy and s.accepting and s.url not in exclude:
            return s
    return None


class ThresholdPolicy(Policy):
    """Two modes with hysteresis: EAGLE while the load is light, baseline while it is heavy.

    In ``eagle`` mode a request whose load exceeds ``threshold`` switches to ``baseline``; in
    ``baseline`` mode a request whose load is at or below ``threshold - hysteresis`` switches back.
    The request goes to the least in-flight server of the mode's pool; a pool with no server that
    can take it is skipped, whatever the load. At light load (``probe_load``) a stale server of
    the other pool (``ServerView.stale``) gets the request instead, reason ``probe``.
    """

    name = "threshold"
    reasons = ("mode", "fallback", "probe")

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        mode = snapshot.mode
        if mode == "eagle" and snapshot.load > snapshot.threshold:
            mode = "baseline"
        elif mode == "baseline" and snapshot.load <= snapshot.threshold - snapshot.hysteresis:
            mode = "eagle"
        if snapshot.load <= probe_load(snapshot.threshold):
            other = other_pool(mode)
            probe = _probe([s for s in snapshot.servers if s.pool == other], exclude)
            if probe is not None:
                return Choice(server=probe, mode=mode, reason="probe")
        server = least_in_flight(snapshot.servers, mode, exclude)
        if server is not None:
            return Choice(server=server, mode=mode, reason="mode")
        server = least_in_flight(snapshot.servers, other_pool(mode), exclude)
        return Choice(server=server, mode=mode, reason="fallback" if server else "")


# Two predictions closer than this (relative) are equal: the tie-break decides.
TIE_EPSILON = 1e-9
# Every EXPLORE_EVERY-th request goes to the runner-up when its prediction is within
# EXPLORE_WITHIN of the best, so the curve of a server that is rarely chosen keeps being measured.
EXPLORE_EVERY = 50
EXPLORE_WITHIN = 1.2


_Entry = tuple[float, int, ServerView]


def _preference(entry: _Entry) -> tuple[int, int, int]:
    # Ties go to the EAGLE pool (lower latency at equal speed), then least in flight, then the
    # order the servers were listed in.
    s = entry[2]
    return (0 if s.pool == "eagle" else 1, s.in_flight, entry[1])


def _best(entries: list[_Entry]) -> tuple[_Entry, bool]:
    """The lowest prediction, ties broken by preference; and whether there was a tie."""
    best = entries[0]
    for e in entries:
        if e[0] < best[0]:
            best = e
    bound = best[0] * (1 + TIE_EPSILON)
    tied = [e for e in entries if e[0] <= bound]
    if len(tied) == 1:
        return best, False
    return min(tied, key=_preference), True


class BalancePolicy(Policy):
    """Each request to the server with the lowest predicted time per output token if admitted.

    A server that can take the request (healthy, not drained, not excluded, below its running
    limit when the limit is known) is predicted at its speed curve's value for its in-flight
    count plus one. Ties (within ``TIE_EPSILON``) go to EAGLE, then least in flight, then listing
    order. When every such server is at its running limit, all of them compete on the same terms
    (their curves grow with the queue), with the reason ``full``. Both pools serve at every load;
    only operator drains stop a pool.

    At light load (``probe_load`` of the threshold) a stale server (``ServerView.stale``: nothing
    learned of it for a while) gets the request whatever its prediction, reason ``probe``, so an
    estimate that may be out of date is measured again.

    Reasons: ``only`` (one candidate), ``fastest``, ``tie``, ``explore``, ``full``, ``probe``.
    """

    name = "balance"
    reasons = ("only", "fastest", "tie", "explore", "full", "probe")
    switches_modes = False

    def choose(self, snapshot: Snapshot, exclude: frozenset[str] = frozenset()) -> Choice:
        open_: list[_Entry] = []
        full: list[_Entry] = []
        for i, s in enumerate(snapshot.servers):
            if not s.healthy or not s.accepting or s.url in exclude:
                continue
            curve = s.curve or NEUTRAL_CURVE
            limit = curve.limit
            entry = (curve.at(s.in_flight + 1), i, s)
            if limit is not None and s.in_flight >= limit:
                full.append(entry)
            else:
                open_.append(entry)
        candidates = open_ or full
        if not candidates:
            return Choice(server=None, mode=snapshot.mode)
        if len(candidates) > 1 and snapshot.load <= probe_load(snapshot.threshold):
            probe = _probe([e[2] for e in candidates], exclude)
            if probe is not None:
                return Choice(probe, probe.pool, "probe")
        if len(candidates) == 1:
            server = candidates[0][2]
            return Choice(server, server.pool, "only" if open_ else "full")
        winner, tie = _best(candidates)
        if snapshot.seq % EXPLORE_EVERY == 0:
            second, _ = _best([e for e in candidates if e is not winner])
            if second[0] <= winner[0] * EXPLORE_WITHIN:
                return Choice(second[2], second[2].pool, "explore")
        server = winner[2]
        reason = "full" if not open_ else ("tie" if tie else "fastest")
        return Choice(server, server.pool, reason)


# -- pairs -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PairView:
    index: int
    eagle: ServerView
    baseline: ServerView
    # Requests in flight on both servers (not counting the one being routed).
    load: int
    mode: PoolName
    threshold: int
    hysteresis: int

    def server(self, pool: PoolName) -> ServerView:
        return self.eagle if pool == "eagle" else self.baseline


@dataclass(frozen=True, slots=True)
class PairChoice:
    # None when no pair has a server that can take the request.
    pair: int | None
    server: ServerView | None
    # The chosen pair's mode afterwards.
    mode: PoolName = "eagle"
    reason: str = ""


PAIR_REASONS = ThresholdPolicy.reasons


def _can_take(s: ServerView, exclude: frozenset[str]) -> bool:
    return s.healthy and s.accepting and s.url not in exclude


def choose_pair(pairs: Sequence[PairView], exclude: frozenset[str] = frozenset()) -> PairChoice:
    """The pair with the least load (ties: the order given) among those with a server that can
    take the request, then that pair's server as ``ThresholdPolicy`` picks a pool's: its mode is
    switched by its own load (counting this request) with its own threshold and hysteresis; the
    mode's server, else the other one (``fallback``); a stale other server at light load
    (``probe``)."""
    best: PairView | None = None
    for p in pairs:
        if not (_can_take(p.eagle, exclude) or _can_take(p.baseline, exclude)):
            continue
        if best is None or p.load < best.load:
            best = p
    if best is None:
        return PairChoice(None, None)
    load = best.load + 1
    mode = best.mode
    if mode == "eagle" and load > best.threshold:
        mode = "baseline"
    elif mode == "baseline" and load <= best.threshold - best.hysteresis:
        mode = "eagle"
    other = best.server(other_pool(mode))
    if load <= probe_load(best.threshold) and other.stale and _can_take(other, exclude):
        return PairChoice(best.index, other, mode, "probe")
    server = best.server(mode)
    if _can_take(server, exclude):
        return PairChoice(best.index, server, mode, "mode")
    return PairChoice(best.index, other, mode, "fallback")


# -- the learned threshold -------------------------------------------------------------------------

AUTO_MIN = 1
AUTO_MAX = 512
# Without a profile the learned threshold may go at most this far past the largest load the EAGLE
# server was seen serving alone, or past the load the pair (the pools) carries now, and never
# below the start value, 8: past what was seen, both curves are the prior's shape, which cannot
# say where the crossover is. On the real H200 an unbounded derivation jumped from 8 to 512 on
# light-load data alone, and the pair then kept EAGLE at 128-256 requests, where the baseline
# served more. Doubling follows a load that grows: each step measures EAGLE where the next one is
# judged. The current load's share lets a pair that sits on its baseline at a load where the
# curves say EAGLE would win try EAGLE there once (the threshold goes up to twice that load, so
# the hysteresis lets the mode back): measured, the curves then keep it or switch back, and no
# load is tried twice.
AUTO_START = 8
AUTO_GROWTH = 2.0
# Under --threshold auto the hysteresis is at least this share of the threshold: a learned
# threshold near the load a closed loop holds (126 at 128 streams) flipped the real pair's mode
# 25 times in 10 s with the configured 2.
AUTO_HYSTERESIS_SHARE = 0.25


# Past the load EAGLE was seen serving, its speed is judged against the baseline's: their TPOT
# ratio (EAGLE over baseline) at that load, grown as load**AUTO_SPEEDUP_DECAY, since speculation
# pays less as the batch grows. On the real H200 (accept 4.0) the ratio went 0.51, 0.72, 0.82,
# 1.10 at 8, 32, 64, 128 requests: local slopes of 0.25, 0.19 and 0.42 in log-log. The smallest
# is taken: a slope too small only costs a trial of EAGLE at a load where it then loses (the
# bound lets one happen, and the measurement ends it), one too large keeps EAGLE off loads where
# it wins, for good. Without it the prior's shape carried EAGLE's light-load lead to any load.
AUTO_SPEEDUP_DECAY = 0.2


def derive_threshold(
    eagle: SpeedCurve,
    baseline: SpeedCurve,
    eagle_servers: int = 1,
    baseline_servers: int = 1,
    *,
    reach: float | None = None,
    floor: int = AUTO_MIN,
) -> int:
    """The largest load up to which EAGLE's predicted TPOT is no worse than the baseline's.

    Load ``L`` is spread evenly over each pool's servers (one each in a pair). The crossover is the
    first load where EAGLE is predicted slower: the threshold is the load just below it (at least
    ``AUTO_MIN``), or ``AUTO_MAX`` when EAGLE is never slower up to it. With ``reach`` (the load
    one EAGLE server was seen serving; None: a profile covers every load), EAGLE past it is at
    least the baseline's TPOT times their ratio at ``reach``, grown by ``AUTO_SPEEDUP_DECAY``.
    Loads below ``floor`` (the lowest load at which both servers were seen) are not compared:
    there a curve is its prior's shape scaled to what was seen above, and speculation's lead only
    grows as the load falls (``AUTO_SPEEDUP_DECAY``), so the comparison at ``floor`` stands for
    them. On the real H200 a baseline seen only at 16 and 128 requests was predicted at 1.7 ms
    per token at load 1 (it runs 4.8 ms there), 0.02 ms under EAGLE's measured 1.74: threshold 1.
    """
    ratio = 0.0
    if reach is not None and reach >= 1:
        at_reach = baseline.at(-(-int(reach * eagle_servers) // baseline_servers))
        ratio = eagle.at(reach) / at_reach if at_reach > 0 else 0.0
    for load in range(min(max(AUTO_MIN, floor), AUTO_MAX), AUTO_MAX + 1):
        per_eagle = -(-load // eagle_servers)
        e = eagle.at(per_eagle)
        b = baseline.at(-(-load // baseline_servers))
        if ratio > 0 and reach is not None and per_eagle > reach:
            e = max(e, b * ratio * (per_eagle / reach) ** AUTO_SPEEDUP_DECAY)
        if e > b:
            return max(AUTO_MIN, load - 1)
    return AUTO_MAX


def auto_bound(reach: float | None, limit: int | None, load: int = 0) -> int:
    """The largest threshold the curves may set: ``AUTO_GROWTH`` times ``reach`` (the load EAGLE
    was seen serving; None: a profile says what lies beyond) or times the ``load`` carried now,
    at least ``AUTO_START``; and at most EAGLE's running ``limit`` (past it requests queue,
    which no measured TPOT shows)."""
    bound = AUTO_MAX
    if reach is not None:
        bound = min(bound, max(AUTO_START, int(AUTO_GROWTH * max(reach, load))))
    if limit is not None:
        bound = min(bound, max(AUTO_MIN, limit))
    return bound


def auto_hysteresis(threshold: int, configured: int) -> int:
    """The hysteresis under a learned threshold: the configured one, at least
    ``AUTO_HYSTERESIS_SHARE`` of the threshold, always below it."""
    share = int(threshold * AUTO_HYSTERESIS_SHARE + 0.5)
    return max(0, min(max(configured, share), threshold - 1))


def learned_settings(
    derived: int, current: tuple[int, int], configured_hysteresis: int, bound: int
) -> tuple[int, int] | None:
    """The (threshold, hysteresis) for a ``derived`` threshold held to ``bound``, or None to
    keep ``current``: a change of one current hysteresis step or less (at least 1) is not made,
    so the threshold does not flicker with every new observation."""
    threshold = min(max(derived, AUTO_MIN), bound, AUTO_MAX)
    if abs(threshold - current[0]) <= max(current[1], 1):
        return None
    return threshold, auto_hysteresis(threshold, configured_hysteresis)


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (ThresholdPolicy, BalancePolicy)}
