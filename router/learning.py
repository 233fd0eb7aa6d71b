"""Online speed learning: each server's per-token time by load, from what the router sees.

The quantity learned is a profile's own (``common.profile``: closed-loop ``[C, tok/s]`` points):
the time a request stays on the server per output token at load ``L``, ``L / X`` for a server
delivering ``X`` tok/s with ``L`` requests in flight (Little's law), queue wait and prefill
included. Two sources feed it, both O(1) per observation:
- each finished request (the proxy's finish hook): its stay, the lease's life from routing to
  the response's end, over its output tokens, against the server's mean in-flight count over
  that same stay (the ``L`` whose time average Little's law pairs with it);
- each poll of a server's ``/metrics`` (``poller.py``): (running + queued) / gen_throughput at the
  load running + queued when the gauges moved at this poll and the one before and the running
  count held (``steady``), the limit it runs at (queue > 0), and EAGLE's accept length.

Decode time alone (a request's TPOT after its first token, a poll's running / gen_throughput)
was learned before: it hides what queueing and prefill cost, which is where a server with the
same decode speed and a faster prefill (or more requests running) wins.

The curves are rebuilt from the buckets (``speed.build_curve``, O(buckets) per server) at most
every ``REBUILD_S`` when observations arrive, never per routed request. Each server's
``ServerSpeed`` hangs on its ``server.Server`` record, where the routing snapshot reads the curve.

An observation made while something else ran on the server's GPUs (its pair-mate had requests in
flight) is not its speed alone, and is not learned: a finished request says so through its lease
(``alone``, over the request's life), a poll through the server's record (``Server.alone_since``,
since the poll before last, whose interval the poll's gauges may cover), and both end in the
same check (``_learn``). The time comes from the clock passed in,
so tests feed observations at chosen times and read the curves.

The two sources run on different clocks when a server's time is not real time (a simulator at
``--speed 2``), and a real server's gauges are not its clients' view at every load (on the H200,
SGLang's baseline read about twice what its clients got at 256 in flight, and right at 16): the
server's figures are scaled by the ratio of the two at the nearest load where both saw it, if
it is within a factor of two (``speed.local_ratios``; farther, the ratio pooled over every
load both saw), so where the router's own requests saw a load theirs is the figure. A
profile (or the neutral prior) gives the
shape where nothing was seen, scaled to the server's measured level (a profile, being a
measurement, counts as ``PROFILE_FIT_WEIGHT`` observations there; the neutral guess as none); a
server with no data at
all borrows the other servers' level, so that both pools are compared on the same clock from the
first observation on.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from dynspec.router.server import Server, ServerSpeed
from dynspec.router.speed import (
    KEEP,
    NEUTRAL_CURVE,
    PROFILE_FIT_WEIGHT,
    BucketSet,
    SpeedCurve,
    SpeedProfile,
    build_curve,
    calibration,
    combine,
    neutral_prior,
    prior_scale,
    queued_shape,
)

logger = logging.getLogger(__name__)

REBUILD_S = 0.05
# A poll whose server runs no request says nothing about its speed.
_MIN_RUNNING = 1
# A poll is learned when the running count moved by at most this share since the last (``steady``).
STEADY_SHARE = 0.25
# A poll reading more than this factor off what the server's own data already say at that load
# is a gauge artefact, not its speed (``plausible``).
OUTLIER = 8.0


def moved(
    previous: tuple[float, float, bool] | None, running: float, gen_throughput: float
) -> bool:
    """Whether a decode-log interval ended since the poll before: the throughput changed. The
    running count alone moves at every prefill (SGLang sets both gauges when it logs a prefill
    too, the throughput as it was): on a simulated shared baseline taking a pair's ramp, polls
    whose running count rose 63 -> 66 under one throughput read 22,118 and 1,996 ms a token
    (its requests took 92) and were learned as fresh."""
    return previous is not None and previous[1] != gen_throughput


def steady(
    previous: tuple[float, float, bool] | None, running: float, gen_throughput: float
) -> bool:
    """Whether a poll's gen_throughput is the server's tok/s with ``running`` requests running.

    The check is on the running count, not the load (running + queued): the tokens made depend
    on the batch only, and a queue that grew or drained at a full batch leaves the reading
    right (the requests in flight now share the batch's tokens).

    SGLang's ``gen_throughput`` is the tokens of the last decode-log interval (40 decode batches)
    over its length, since the log line before, while ``num_running_reqs`` is the batch at its
    end; both gauges keep their values while the server idles (for 30 s). Two ways that reads
    wrong:
    - At the tail of a burst the interval's tokens came from many more requests than the one left
      running, which reads as a fast server at low load. So the running count must not have moved
      by more than ``STEADY_SHARE`` of it, or one request, across the poll interval.
    - The first interval after an idle spell spans the idle time: the H200 read 56 running at
      231 tok/s (242 ms a token, against 7 ms) as EAGLE's first log line after 30 s idle, and a
      learned threshold fell from 128 to 20 on it. So the gauges must have moved at this poll
      (fresh) AND at the poll before, with requests running at the poll before that (``polled``
      keeps the flag): then the interval began after the poll before last, while the server was
      already logging. A move from idle is the burst's start (the running count set by a
      prefill, the throughput back from its idle 0), not a log interval: counted, a simulated
      baseline's first poll after a burst ended its idle spell read 1,103 ms a token at load
      128 (about 60 ms steady), its curve went 3x up and a pair learned 29 where the crossover
      is 2. An idle spell shorter than one poll interval is not caught; it dilutes one reading
      by the share of the interval it took."""
    if previous is None or not moved(previous, running, gen_throughput):
        return False  # not updated since the last poll: nothing new, or an idle server's last
    before, _, moved_before = previous
    if not moved_before:
        return False  # the gauges had held still: this interval may span an idle spell
    return abs(running - before) <= max(1.0, STEADY_SHARE * max(running, before))


def plausible(speed: ServerSpeed, load: float, per_token: float) -> bool:
    """Whether a poll's reading (server time a token) lies within ``OUTLIER`` of the server's
    curve at that load, put on the server's clock (``speed.clock``); any reading passes until
    that clock's ratio to the router's is measured, on this server or another of the deployment
    (its requests and polls saw the same loads: ``speed.calibration``). A steady poll can still
    read wrong: on a simulated shared pair (h200-8b-accept2, calibrated) a baseline's polls at
    load 30 read 9,061 and 12,819 ms a token where its requests took 30 (22-429x its curve);
    mixed in, they took the baseline's curve 43x up and the learned threshold to 512. A server
    that truly slows down moves its curve through its finished requests, which this rule does
    not filter, and its polls agree again."""
    if speed.clock is None:
        return True
    expected = speed.curve.at(load) / speed.clock
    return expected / OUTLIER <= per_token <= expected * OUTLIER


class SpeedLearner:
    def __init__(
        self,
        servers: Sequence[Server | tuple[str, str]],
        profile: SpeedProfile | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        keep: float = KEEP,
        rebuild_s: float = REBUILD_S,
    ) -> None:
        """``servers``: the router's records (each gets its ``speed``), or (url, pool) pairs."""
        self.clock = clock
        self.rebuild_s = rebuild_s
        self.profile = profile
        # An index for the URL-keyed entry points; the state itself is on each ServerSpeed.
        self.servers: dict[str, ServerSpeed] = {}
        now = clock()
        for entry in servers:
            url, pool = entry if isinstance(entry, tuple) else (entry.url, entry.pool)
            seeded = profile is not None and pool in profile.modes
            if profile is not None and seeded:
                mode = profile.modes[pool]
                prior, limit = mode.prior, mode.limit
            else:
                prior, limit = neutral_prior(), None
            speed = ServerSpeed(url, pool, prior, limit, keep, seeded=seeded, now=now)
            if not isinstance(entry, tuple):
                speed.server = entry
                entry.speed = speed
            self.servers[url] = speed
        self._built = float("-inf")
        self._dirty = False
        self.rebuild()

    # -- observations ------------------------------------------------------------------------------

    def finished(
        self,
        url: str,
        mean_in_flight: float,
        stay: float,
        output_tokens: int | None,
        alone: bool = True,
    ) -> None:
        """One finished request: ``stay`` seconds on the server (its lease's life) at a mean of
        ``mean_in_flight`` requests there, ``alone`` when nothing else ran on its GPUs
        meanwhile; one with no token count (or none) says nothing."""
        if output_tokens is None or output_tokens < 1 or stay <= 0:
            return
        speed = self.servers.get(url)
        if speed is None:
            return
        per_token = stay / output_tokens
        self._learn(speed, speed.direct, mean_in_flight, per_token, alone, "request")

    def polled(
        self,
        url: str,
        *,
        running: float | None,
        queued: float | None,
        gen_throughput: float | None,
        accept_length: float | None = None,
    ) -> None:
        """One poll of a server's metrics (None: the server does not export that one)."""
        speed = self.servers.get(url)
        if speed is None:
            return
        if accept_length is not None and accept_length > 0:
            speed.accept_length = accept_length
        previous, speed.previous = speed.previous, None
        if running is not None and gen_throughput is not None:
            # Moved while the server was busy at the poll before: a move from idle is the
            # burst's start, not a log interval (``steady``).
            busy = previous is not None and previous[0] >= _MIN_RUNNING
            fresh = busy and moved(previous, running, gen_throughput)
            speed.previous = (running, gen_throughput, fresh)
        alone = self._alone_since_polls(speed)
        if running is None or running < _MIN_RUNNING:
            return
        if queued is not None and queued > 0:
            # A queue while requests run: the server runs as many as it will.
            n = int(running)
            if speed.limit_seen is None or n > speed.limit_seen:
                speed.limit_seen = n
        if gen_throughput is None or gen_throughput <= 0:
            return
        if not steady(previous, running, gen_throughput):
            return
        # Every request there, queued ones included, gets its share of the tokens made: its stay
        # per token (``L / X``) at this load.
        load = running + (queued or 0.0)
        per_token = load / gen_throughput
        if not plausible(speed, load, per_token):
            logger.debug(
                "%s (%s): poll, %.2f ms a token at load %.1f: not learned, %.0fx its curve",
                speed.url, speed.pool, per_token * 1e3, load,
                per_token * (speed.clock or 1.0) / speed.curve.at(load),
            )  # fmt: skip
            return
        self._learn(speed, speed.polled, load, per_token, alone, "poll")

    def _alone_since_polls(self, speed: ServerSpeed) -> bool:
        """Whether nothing else ran on the server's GPUs since the poll before last: the
        interval a steady poll's gauges cover (``steady``) may begin there, so a mate that ran
        in it shared the GPUs behind the reading, though it may be idle at the poll. On a
        simulated shared pair (h200-8b-accept4, calibrated, C=256) a baseline's first poll
        after its EAGLE mate drained read 838 ms a token at load 128 (63 ms a poll later): it
        put the baseline's whole curve 2.6x above its calibration and both pairs derived 512."""
        server = speed.server
        if server is None or server.mate is None:
            return True
        now = self.clock()
        marks, mark = speed.mate_marks, server.mate_area(now)
        speed.mate_marks = (marks[1] if marks is not None else mark, mark)
        return marks is not None and server.alone_since(marks[0], now)

    def _learn(  # noqa: PLR0917 - one call from each source
        self,
        speed: ServerSpeed,
        source: BucketSet,
        load: float,
        per_token: float,
        alone: bool,
        what: str,
    ) -> None:
        if not alone:
            return  # not the server's speed alone: its GPUs were shared meanwhile
        logger.debug(
            "%s (%s): %s, %.2f ms a token at load %.1f", speed.url, speed.pool, what,
            per_token * 1e3, load,
        )  # fmt: skip
        self.learn(speed, source, load, per_token)

    def learn(self, speed: ServerSpeed, source: BucketSet, load: float, per_token: float) -> None:
        """One observation that passed the checks, into ``source`` of ``speed``, now (what the
        debug log's lines say, so ``replay --observations`` feeds them here again)."""
        now = self.clock()
        source.add(load, per_token, now, speed.prior)
        speed.learned(load, now)
        self._changed(now)

    def set_limit(self, url: str, limit: int | None) -> None:
        """The running limit the server itself reports (its ``max_running_requests``)."""
        speed = self.servers.get(url)
        if speed is None or limit is None or limit < 1 or limit == speed.limit_reported:
            return
        speed.limit_reported = limit
        self._dirty = True
        self.rebuild()

    def _changed(self, now: float) -> None:
        self._dirty = True
        if now - self._built >= self.rebuild_s:
            self.rebuild(now)

    # -- curves ------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Rebuild if observations arrived since the last rebuild (the poller calls this)."""
        if self._dirty:
            self.rebuild()

    def rebuild(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self._built = now
        self._dirty = False
        data: dict[str, list[tuple[float, float]]] = {}
        shapes: dict[str, tuple[float, ...]] = {}
        sources: dict[str, tuple[list[tuple[float, float]], list[tuple[float, float]]]] = {}
        for speed in self.servers.values():
            direct = speed.direct.read(now)
            polled = speed.polled.read(now)
            ratio = calibration(direct, polled)
            if ratio is not None:
                speed.ratio = ratio
                speed.calibrated = True
            sources[speed.url] = (direct, polled)
        # A server whose own requests never overlapped its polls (a pair's baseline at light
        # load: its probes ran beside EAGLE's requests, so none was learned) takes the clock
        # ratio of those that were calibrated: the servers of one deployment share a clock (real
        # time, or one simulator speed), and its polls alone are on the server's clock.
        ratios = [s.ratio for s in self.servers.values() if s.calibrated]
        shared = sum(ratios) / len(ratios) if ratios else None
        for speed in self.servers.values():
            direct, polled = sources[speed.url]
            speed.clock = speed.ratio if speed.calibrated else shared
            merged = combine(direct, polled, speed.ratio if speed.clock is None else speed.clock)
            data[speed.url] = merged
            shapes[speed.url] = shape = queued_shape(speed.prior, speed.limit)
            anchor = PROFILE_FIT_WEIGHT if speed.seeded else 0.0
            speed.scale = prior_scale(merged, shape, anchor)
        known = [s.scale for s in self.servers.values() if s.scale is not None]
        borrowed = sum(known) / len(known) if known else None
        for speed in self.servers.values():
            scale = speed.scale
            if scale is None:
                # No data of its own: the others' level (same clock), else the server's clock
                # ratio if one was measured, else the prior as it is.
                scale = borrowed if borrowed is not None else speed.ratio
            speed.curve = build_curve(data[speed.url], shapes[speed.url], scale, speed.limit)

    def curve(self, url: str) -> SpeedCurve:
        speed = self.servers.get(url)
        return speed.curve if speed is not None else NEUTRAL_CURVE

    def status(self, url: str, in_flight: int) -> dict[str, object]:
        speed = self.servers[url]
        curve = speed.curve
        return {
            "predicted_tpot_s": curve.at(in_flight + 1),
            "curve": curve.points(),
            "running_limit": curve.limit,
            "learned_reach": speed.reach,
            "learned_floor": speed.floor if speed.floor != math.inf else None,
            "spec_accept_length": speed.accept_length,
        }
