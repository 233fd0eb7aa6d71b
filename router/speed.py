"""Speed curves: a server's time per output token as a function of its requests in flight.

The time is a request's whole stay on the server (queue wait and prefill included) over its
output tokens: ``L / X`` at load ``L`` for a server making ``X`` tok/s, a profile's own quantity
(its closed-loop ``[C, tok/s]`` points), which the learner measures too (``learning.py``). The
names say TPOT (``tpots``, ``predicted_tpot_s``) for short; it is not the decode-only TPOT.

A ``SpeedCurve`` is immutable: the ``balance`` policy reads it from the routing snapshot, and the
learner (``learning.py``) replaces it with a new one when observations arrive. The load axis has
fixed buckets (1, 2, 3, 4, 6, 8, ... 512 requests in flight, queued ones included); a prediction
between two buckets is interpolated in log-load, beyond the last one it grows linearly with load,
and past the server's running limit the prior grows at least linearly too (``queued_shape``: the
batch stays at the limit and every request more waits its turn, ``L / X`` with ``X`` held).

``BucketSet`` keeps one source of observations as weighted means per bucket, older observations
weighed down by newer ones (never by wall time); ``build_curve`` combines the sources with a prior
(a profile's curve, or a neutral one) and makes the result monotone. Nothing here does I/O or
reads a clock.

A speed profile (``--speed-profile``, the simulator's format, written by ``dynspec-bench
profile``) is read by the one profile reader, ``dynspec.common.profile`` (pure, no I/O): per mode,
``throughput`` is ``[batch, tok/s]`` points (linear between them, flat past the last one), so one
request's time per token at load ``b`` is ``b / throughput(min(b, limit))``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# ProfileError and DEFAULT_RUNNING_LIMIT are this module's names too (router code imports them).
from dynspec.common.profile import (
    DEFAULT_RUNNING_LIMIT,
    ModeProfile,
    mode_from_dict,
    profile_from_dict,
)
from dynspec.common.profile import ProfileError as _ProfileError

# The router's name for a bad profile (config.py catches it from here): the one reader's error.
ProfileError = _ProfileError

BUCKETS: tuple[int, ...] = (
    1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512,
)  # fmt: skip
_LOGS: tuple[float, ...] = tuple(math.log(b) for b in BUCKETS)
_LAST = BUCKETS[-1]

# Each new observation in a bucket multiplies the weight of the older ones there by this: an
# estimate follows a changed workload within a few dozen observations (about as fast as a 15 s
# half-life at one poll a second did), and never decays to the prior just because its server got
# no traffic for a while (wall time alone changes nothing). A full bucket weighs about 33.
KEEP = 0.97
# The prior counts as this many observations: data wins as soon as there is a little of it.
PRIOR_WEIGHT = 1.0
# Without a profile both pools start from this one curve, so ties (and EAGLE) win until data
# says otherwise: 20 ms per token alone, growing with load like a typical decode step. It is a
# TPOT's shape, and a fair one of a stay's per-token time too: prefill adds about a constant share
# per token at light load and one growing with load (each request waits out the others'
# prefills), so both are affine in the load below the running limit; only the level differs, and
# the level is what the data sets (``prior_scale``). Past a known limit ``queued_shape`` makes it
# grow at least linearly.
NEUTRAL_TPOT_S = 0.02
NEUTRAL_KNEE = 16.0


@dataclass(frozen=True, slots=True)
class SpeedCurve:
    """Predicted time per output token (seconds, a stay's) per bucket, monotone
    non-decreasing, plus the running limit."""

    tpots: tuple[float, ...]
    # Requests the server runs at once; beyond it requests queue. None: not known.
    limit: int | None = None

    def at(self, load: float) -> float:
        """Predicted time per token with ``load`` requests in flight (counting the one being
        routed). Past the running limit the buckets hold the queue's wait already (measured, or
        the prior made to: ``queued_shape``)."""
        tpots = self.tpots
        if load <= 1:
            return tpots[0]
        if load >= _LAST:
            return tpots[-1] * load / _LAST
        i = bisect.bisect_right(BUCKETS, load)
        lo = tpots[i - 1]
        if load == BUCKETS[i - 1]:
            return lo
        f = (math.log(load) - _LOGS[i - 1]) / (_LOGS[i] - _LOGS[i - 1])
        return lo + (tpots[i] - lo) * f

    def points(self) -> list[list[float]]:
        """``[load, tpot]`` at every bucket, as the policy sees them (queueing included)."""
        return [[b, self.at(b)] for b in BUCKETS]


def neutral_prior() -> tuple[float, ...]:
    return tuple(NEUTRAL_TPOT_S * (1 + (b - 1) / NEUTRAL_KNEE) for b in BUCKETS)


NEUTRAL_CURVE = SpeedCurve(neutral_prior())


def queued_shape(prior: Sequence[float], limit: int | None) -> tuple[float, ...]:
    """``prior`` with a running limit's queue: past ``limit``, at least its value at the limit
    grown in proportion to the load (the batch holds, each request more waits its turn, so
    ``L / X`` with ``X`` held). A profile's prior is that already (``mode_speed``); the neutral
    one, which knows no limit, is not."""
    if limit is None:
        return tuple(prior)
    at_limit = SpeedCurve(tuple(prior)).at(limit)
    return tuple(
        max(p, at_limit * b / limit) if b > limit else p
        for b, p in zip(BUCKETS, prior, strict=True)
    )


# -- one source of observations --------------------------------------------------------------------


def _shares(load: float) -> tuple[tuple[int, float], ...]:
    """The buckets an observation at ``load`` belongs to, and its share of each (log-load)."""
    if load <= 1:
        return ((0, 1.0),)
    if load >= _LAST:
        return ((len(BUCKETS) - 1, 1.0),)
    i = bisect.bisect_right(BUCKETS, load)
    if load == BUCKETS[i - 1]:
        return ((i - 1, 1.0),)
    f = (math.log(load) - _LOGS[i - 1]) / (_LOGS[i] - _LOGS[i - 1])
    return ((i - 1, 1.0 - f), (i, f))


class BucketSet:
    """Weighted means of TPOT per load bucket, for one server and one source; each observation
    multiplies the weight of the bucket's older ones by ``keep`` (to the power of its share)."""

    __slots__ = ("keep", "sums", "weights")

    def __init__(self, keep: float = KEEP) -> None:
        n = len(BUCKETS)
        self.keep = keep
        self.weights = [0.0] * n
        self.sums = [0.0] * n

    def add(
        self,
        load: float,
        tpot: float,
        now: float = 0.0,
        shape: Sequence[float] | None = None,
        weight: float = 1.0,
    ) -> None:
        """One observation; between two buckets it counts for both, each share moved to its
        bucket's load along ``shape`` (TPOT per bucket, the prior) when one is given. ``now`` is
        not used: the weights do not depend on time."""
        shares = _shares(load)
        at_load = sum(share * shape[i] for i, share in shares) if shape is not None else 0.0
        for i, share in shares:
            decay = self.keep**share
            value = tpot * shape[i] / at_load if shape is not None and at_load > 0 else tpot
            w = share * weight
            self.weights[i] = self.weights[i] * decay + w
            self.sums[i] = self.sums[i] * decay + w * value

    def read(self, now: float = 0.0) -> list[tuple[float, float]]:
        """``(weight, mean)`` per bucket; weight 0 where nothing was seen."""
        return [
            (w, s / w) if w > 0 else (0.0, 0.0)
            for w, s in zip(self.weights, self.sums, strict=True)
        ]


# -- combining sources -----------------------------------------------------------------------------

# A scale fitted from less data than this (in observations) is not trusted.
MIN_FIT_WEIGHT = 0.5
# A ratio of the two sources needs this many observations of each where they overlap: one of
# each is a ratio of two noisy figures that rescales every load the polls saw. On the H200
# (pair-a, launch 3 at 4109b72) one probe of the idle baseline against one poll at the tail of a
# burst (4.98 against 10.3 ms a token) read 0.485, halved the baseline's whole curve and took the
# threshold from 34 to 4 (replayed; the router logged 32 and 10 in turn there, 30 s apart: the
# probes' period).
MIN_RATIO_WEIGHT = 3.0


def calibration(
    direct: Sequence[tuple[float, float]], server: Sequence[tuple[float, float]]
) -> float | None:
    """Router-time over server-time TPOT, where both sources saw the same loads; None if unknown.

    The router measures TPOT on its own clock; a server's ``gen_throughput`` uses the server's
    (a simulator may run faster than real time). The ratio puts the server's figures on the
    router's clock.
    """
    num = den = total = 0.0
    for (wd, md), (ws, ms) in zip(direct, server, strict=True):
        w = min(wd, ws)
        if w > 0 and ms > 0:
            num += w * md
            den += w * ms
            total += w
    if total < MIN_RATIO_WEIGHT or den <= 0:
        return None
    return num / den


def combine(
    direct: Sequence[tuple[float, float]],
    server: Sequence[tuple[float, float]],
    ratio: float,
) -> list[tuple[float, float]]:
    """One ``(weight, mean)`` per bucket from both sources, the server's put on the router's
    scale by the ratio of the two near that load (``local_ratios``; ``ratio`` where they never
    overlapped). Where both saw a bucket the router's own mean is the bucket's."""
    out: list[tuple[float, float]] = []
    ratios = local_ratios(direct, server, ratio)
    for (wd, md), (ws, ms), r in zip(direct, server, ratios, strict=True):
        w = wd + ws
        out.append((w, (wd * md + ws * ms * r) / w) if w > 0 else (0.0, 0.0))
    return out


def local_ratios(
    direct: Sequence[tuple[float, float]],
    server: Sequence[tuple[float, float]],
    fallback: float,
) -> list[float]:
    """Router-measured over server-reported time per bucket: where both sources saw the bucket
    (at least ``MIN_RATIO_WEIGHT`` each), their own ratio; elsewhere the nearest such bucket's (the
    mean of the two at a tie) up to a factor ``RATIO_REACH`` of load away, fading from there
    into ``fallback`` (the ratio pooled over every load both saw: the clocks'), reached at twice
    that distance in log-load.

    One ratio per server is the clocks' (a simulator at ``--speed 2``) only where the gauges are
    true; a real server's are not at every load (on the H200 the baseline's polls read about
    twice what its clients got at 256 in flight, and about right at 16), so the ratio is taken by
    load. Why is not known: SGLang 0.5.17's ``gen_throughput`` is the tokens of its last 40
    decode batches over the wall time since the log before, prefills included, and swung from
    3,500 to 20,800 tok/s from one log line to the next there; the polls the learner keeps (the
    running count held) may be the decode-only stretches.
    """
    known = [
        (i, md / ms)
        for i, ((wd, md), (ws, ms)) in enumerate(zip(direct, server, strict=True))
        if min(wd, ws) >= MIN_RATIO_WEIGHT and ms > 0
    ]
    out: list[float] = []
    for i in range(len(direct)):
        gap = min((abs(_LOGS[i] - _LOGS[j]) for j, _ in known), default=math.inf)
        near = [r for j, r in known if abs(_LOGS[i] - _LOGS[j]) == gap]
        # 1 within the reach, 0 at twice it (and with none known: gap inf), linear in log-load
        # between: no step in the curve.
        f = min(1.0, max(0.0, 2.0 - gap / _RATIO_REACH_LOG))
        out.append(f * sum(near) / len(near) + (1.0 - f) * fallback if f else fallback)
    return out


# A load's own ratio speaks in full for loads up to this factor away, and fades into the pooled
# ratio by this factor squared (``local_ratios``), no further: on the H100
# (traffic-day, 624866c) EAGLE's polls at 2 in flight read 5.5 ms a token where its requests
# took 3.0 (light-load gauges count the arrivals' prefills), and the moment that bucket's ratio
# (0.54) was known it was the nearest one to every load above, halved EAGLE's curve at 32-256
# and took the learned threshold from 74 to 512 for 7 s. Farther out the clocks' pooled ratio
# stands, which that one bucket moved by 1%; between, a blend, since a cut put a step in the
# curve there (the same log, a ratio of 1.11 known at 32 against a pooled 0.87: EAGLE's curve
# flat from 96 to 128, and the threshold 201 for 2 s).
RATIO_REACH = 2.0
_RATIO_REACH_LOG = math.log(RATIO_REACH)


# A measured profile (``--speed-profile``: a calibration of these servers) counts as this many
# observations at its own level when the level is fitted (``prior_scale``): a scale fitted from a
# handful of observations stays near the measurement, and many move it. On the H100
# (traffic-day-delay5, replayed from its router's debug log) one poll of the baseline at the end
# of the warm pass, 12.8 ms a token at load 30 against the calibration's 8.9, put the whole
# baseline curve 1.44x above it (10.2 ms alone, where it served 6.6): the learned threshold went
# from 103 to 512 and held the day's ramp on EAGLE up to 141 in flight. With the measurement
# counted as 5 to 33 observations, the same log derives 50-80 throughout. It never vanishes: a
# profile from other hardware, 2x off, keeps the unvisited loads' level about 5% of that gap from
# what a hundred observations (three full buckets) measured.
PROFILE_FIT_WEIGHT = 5.0


def prior_scale(
    data: Sequence[tuple[float, float]], prior: Sequence[float], anchor: float = 0.0
) -> float | None:
    """How much slower (>1) or faster (<1) than its prior a server measures; None without data.
    ``anchor``: the prior's own weight, in observations, at scale 1 (a measured profile's
    ``PROFILE_FIT_WEIGHT``; 0 for a guess, which the first data replaces)."""
    num = den = total = 0.0
    for (w, m), p in zip(data, prior, strict=True):
        if w > 0:
            num += w * m
            den += w * p
            total += w
    if total < MIN_FIT_WEIGHT or den <= 0:
        return None
    return (total * (num / den) + anchor) / (total + anchor)


def monotone(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-decreasing fit (pool adjacent violators), O(n)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks[-1]
            total = w1 + w2
            blocks[-1] = [(m1 * w1 + m2 * w2) / total, total, n1 + n2]
    out: list[float] = []
    for m, _, n in blocks:
        out.extend([m] * int(n))
    return out


def build_curve(
    data: Sequence[tuple[float, float]],
    prior: Sequence[float],
    scale: float,
    limit: int | None,
    prior_weight: float = PRIOR_WEIGHT,
) -> SpeedCurve:
    """Data where there is some, the prior (times ``scale``) elsewhere, made monotone."""
    values: list[float] = []
    weights: list[float] = []
    for (w, m), p in zip(data, prior, strict=True):
        values.append((w * m + prior_weight * scale * p) / (w + prior_weight))
        weights.append(w + prior_weight)
    return SpeedCurve(tuple(monotone(values, weights)), limit)


# -- profiles --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModeSpeed:
    """One mode of a profile: the prior curve (time per token per bucket) and the limit."""

    prior: tuple[float, ...]
    limit: int | None


@dataclass(frozen=True, slots=True)
class SpeedProfile:
    name: str
    modes: Mapping[str, ModeSpeed]


def mode_speed(mode: str, raw: object) -> ModeSpeed:
    """One mode of a profile (its JSON object) as a prior curve and a running limit."""
    return _mode_speed(mode, mode_from_dict(mode, raw))


def _mode_speed(mode: str, mp: ModeProfile) -> ModeSpeed:
    limit = mp.max_running_requests
    if limit is None:
        limit = DEFAULT_RUNNING_LIMIT.get(mode)
    prior: list[float] = []
    for b in BUCKETS:
        # Past the running limit the batch stays at the limit (the rest wait in the queue): the
        # tokens made are the limit's, shared by all ``b`` in flight.
        batch = min(b, limit) if limit is not None else b
        prior.append(b / mp.throughput_at(batch))
    return ModeSpeed(tuple(prior), limit)


def profile_from_json(raw: object) -> SpeedProfile:
    """The speed part of a profile (schema 1), read by the one reader (``common.profile``): the
    same checks as the simulator's, unknown keys rejected; ``name`` and ``source`` optional."""
    profile = profile_from_dict(raw, require_meta=False)
    return SpeedProfile(
        name=profile.name,
        modes={m: _mode_speed(m, mp) for m, mp in profile.modes.items()},
    )
