"""Speed curves and their learning, deterministic: observations at chosen times in, curves out."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from dynspec.router import speed
from dynspec.router.learning import SpeedLearner
from dynspec.router.server import Server
from dynspec.router.speed import (
    BUCKETS,
    NEUTRAL_CURVE,
    NEUTRAL_TPOT_S,
    PROFILE_FIT_WEIGHT,
    ProfileError,
    SpeedCurve,
    monotone,
    profile_from_json,
    queued_shape,
)

REPO = Path(__file__).resolve().parents[2]
DEMO = json.loads((REPO / "launcher/sim/profiles/demo.json").read_text())
E, B = "http://e", "http://b"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def learner(profile: Any = None, **kwargs: Any) -> tuple[SpeedLearner, Clock]:
    clock = Clock()
    sp = profile_from_json(profile) if profile is not None else None
    return SpeedLearner([(E, "eagle"), (B, "baseline")], sp, clock=clock, **kwargs), clock


def feed(
    lr: SpeedLearner,
    clock: Clock,
    url: str,
    load: float,
    tpot: float,
    *,
    n: int,
    every: float = 0.1,
) -> None:
    """``n`` finished requests of 10 tokens at ``load``, ``every`` seconds apart, each a stay of
    ``tpot`` a token."""
    for _ in range(n):
        clock.now += every
        lr.finished(url, load, stay=10 * tpot, output_tokens=10)
    lr.rebuild()


def polls(
    lr: SpeedLearner,
    clock: Clock,
    url: str,
    load: float,
    per_token: float,
    *,
    n: int,
    every: float = 0.25,
) -> None:
    """``n`` steady polls (the gauges move a little each time) of ``load`` running and none
    queued at ``per_token`` seconds a token, ``every`` seconds apart (no rebuild)."""
    for i in range(n):
        clock.now += every
        lr.polled(url, running=load, queued=0, gen_throughput=load / per_token + i % 2 / 1e6)


def non_decreasing(curve: SpeedCurve) -> bool:
    values = [curve.at(x) for x in range(1, 700)]
    return all(b >= a for a, b in itertools.pairwise(values))


# -- the curve -------------------------------------------------------------------------------------


def test_neutral_prior_same_for_both_pools() -> None:
    lr, _ = learner()
    assert lr.curve(E) == lr.curve(B) == NEUTRAL_CURVE
    assert lr.curve(E).at(1) == pytest.approx(NEUTRAL_TPOT_S)
    assert non_decreasing(lr.curve(E))


def test_interpolation_is_log_linear_between_buckets() -> None:
    curve = SpeedCurve(tuple(float(i + 1) for i in range(len(BUCKETS))))
    assert curve.at(4) == 4.0 and curve.at(6) == 5.0
    # 4.9 lies at log(4.9/4)/log(6/4) of the way from bucket 4 to bucket 6.
    assert curve.at(4.9) == pytest.approx(4 + math.log(4.9 / 4) / math.log(1.5))
    assert curve.at(0) == curve.at(1) == 1.0


def test_extrapolation_grows_linearly_past_the_last_bucket_and_the_limit() -> None:
    flat = SpeedCurve((0.01,) * len(BUCKETS))
    assert flat.at(1024) == pytest.approx(2 * flat.at(512))
    # Past the running limit the extra requests queue: twice the load, twice the time per token.
    # The prior's shape says so (``queued_shape``), not the curve: measured buckets past the
    # limit hold the queue's wait already, and ``at`` reads them as they are.
    capped = SpeedCurve(queued_shape((0.01,) * len(BUCKETS), 8), limit=8)
    assert capped.at(16) == pytest.approx(2 * capped.at(8))
    assert capped.at(8) == flat.at(8)
    assert non_decreasing(capped)
    assert SpeedCurve((0.01,) * len(BUCKETS), limit=8).at(16) == 0.01
    # A prior growing faster than that past the limit keeps its own shape.
    steep = tuple(0.01 * b for b in BUCKETS)
    assert queued_shape(steep, 8) == steep
    assert queued_shape(steep, None) == steep


def test_monotone_pools_adjacent_violators() -> None:
    assert monotone([1, 3, 2, 4], [1, 1, 1, 1]) == [1, 2.5, 2.5, 4]
    assert monotone([5, 1], [3, 1]) == [4, 4]
    assert monotone([1, 2, 3], [1, 1, 1]) == [1, 2, 3]


# -- learning --------------------------------------------------------------------------------------


def test_observations_take_over_their_bucket_and_stay_monotone() -> None:
    lr, clock = learner()
    feed(lr, clock, E, 4, 0.030, n=40)
    feed(lr, clock, E, 8, 0.025, n=40)  # noisy: faster at a higher load
    feed(lr, clock, E, 1, 0.010, n=40)
    curve = lr.curve(E)
    assert curve.at(1) == pytest.approx(0.010, rel=0.05)
    # The violating pair is pooled: both near their weighted mean, never decreasing.
    assert curve.at(4) == pytest.approx(curve.at(8), rel=0.01)
    assert 0.025 < curve.at(4) < 0.030
    assert non_decreasing(curve)


def test_observation_between_buckets_is_shared_by_both() -> None:
    lr, clock = learner()
    feed(lr, clock, E, 5, 0.040, n=60)
    curve = lr.curve(E)
    assert curve.at(5) == pytest.approx(0.040, rel=0.1)


def test_observation_between_buckets_follows_the_prior_shape() -> None:
    lr, clock = learner(DEMO)
    demo_eagle = lr.curve(E)
    # At load 5 (between buckets 4 and 6), twice the profile: each bucket gets twice its own.
    feed(lr, clock, E, 5, 2 * demo_eagle.at(5), n=200)
    curve = lr.curve(E)
    for load in (4, 5, 6):
        assert curve.at(load) == pytest.approx(2 * demo_eagle.at(load), rel=0.01)


def test_new_observations_take_over_a_bucket_within_a_few_dozen() -> None:
    lr, clock = learner()
    feed(lr, clock, E, 4, 0.010, n=300)
    assert lr.curve(E).at(4) == pytest.approx(0.010, rel=0.02)
    feed(lr, clock, E, 4, 0.030, n=5)  # moving, not there
    mid = lr.curve(E).at(4)
    assert 0.011 < mid < 0.024
    feed(lr, clock, E, 4, 0.030, n=200)
    assert lr.curve(E).at(4) == pytest.approx(0.030, rel=0.05)


def test_unvisited_loads_follow_the_prior_at_the_measured_level() -> None:
    lr, clock = learner(DEMO)
    demo_eagle = lr.curve(E)
    assert demo_eagle.at(1) == pytest.approx(1 / 93.8)
    assert demo_eagle.at(8) == pytest.approx(8 / 266.7)
    # The server measures at half the profile's time per token (a simulator at --speed 2).
    for load in (1, 2, 4):
        feed(lr, clock, E, load, demo_eagle.at(load) / 2, n=30)
    learned = lr.curve(E)
    # The profile is a measurement: it counts as PROFILE_FIT_WEIGHT observations at its own
    # level, against about 20 of each of the three loads fed (30 at KEEP 0.97).
    fed = 3 * sum(0.97**i for i in range(30))
    scale = (fed * 0.5 + PROFILE_FIT_WEIGHT) / (fed + PROFILE_FIT_WEIGHT)
    assert 0.5 < scale < 0.55
    assert learned.at(32) == pytest.approx(demo_eagle.at(32) * scale, rel=0.02)
    # The baseline has no data: it borrows the eagle server's level (the same clock).
    assert lr.curve(B).at(8) == pytest.approx(8 / 266.7 * scale, rel=0.02)
    assert non_decreasing(learned) and non_decreasing(lr.curve(B))


def test_one_observation_barely_moves_a_measured_profile_but_replaces_a_guess() -> None:
    """On the H100 one poll of the baseline at load 30, 1.44x its calibration, rescaled the whole
    calibrated curve and sent the learned threshold from 103 to 512 (speed.PROFILE_FIT_WEIGHT)."""
    seeded, clock = learner(DEMO)
    profile_at_64 = seeded.curve(B).at(64)
    feed(seeded, clock, B, 30, seeded.curve(B).at(30) * 1.44, n=1)
    assert seeded.curve(B).at(64) == pytest.approx(
        profile_at_64 * (1.44 + PROFILE_FIT_WEIGHT) / (1 + PROFILE_FIT_WEIGHT), rel=0.01
    )
    guess, clock = learner()
    neutral_at_64 = guess.curve(B).at(64)
    feed(guess, clock, B, 30, guess.curve(B).at(30) * 1.44, n=1)
    assert guess.curve(B).at(64) == pytest.approx(neutral_at_64 * 1.44, rel=0.01)


def test_only_finished_requests_with_a_token_count_count() -> None:
    lr, clock = learner()
    before = lr.curve(E)
    clock.now += 1
    lr.finished(E, 3, stay=1.0, output_tokens=0)
    lr.finished(E, 3, stay=1.0, output_tokens=None)
    lr.finished(E, 3, stay=0.0, output_tokens=50)
    lr.finished("http://unknown", 3, stay=1.0, output_tokens=50)
    lr.rebuild()
    assert lr.curve(E) == before


def test_a_request_s_first_token_wait_counts() -> None:
    """A stay's time per token, not decode TPOT: two servers decoding at 10 ms a token, the
    baseline's first token 0.5 s later (prefill, queue): its curve is 0.5 s / 64 tokens slower
    a token. Decode TPOT ((duration - TTFT) / (tokens - 1)) saw them tied (h200-8b-accept4's
    C=64 in the simulator, where the baseline's lead is its prefill)."""
    lr, clock = learner()
    for _ in range(30):
        clock.now += 0.1
        lr.finished(E, 16, stay=0.6 + 63 * 0.010, output_tokens=64)
        lr.finished(B, 16, stay=0.1 + 63 * 0.010, output_tokens=64)
    lr.rebuild()
    assert lr.curve(E).at(16) == pytest.approx((0.6 + 0.63) / 64, rel=0.01)
    assert lr.curve(E).at(16) - lr.curve(B).at(16) == pytest.approx(0.5 / 64, rel=0.02)


def test_a_poll_s_queue_shares_the_tokens_made() -> None:
    """128 running and 128 queued at 10,000 tok/s: each of the 256 in flight stays 25.6 ms a
    token (the running batch's TPOT is 12.8 ms); the queue made the limit 128, and past it the
    measured bucket stands as it is."""
    lr, clock = learner()
    for i in range(30):
        clock.now += 1
        lr.polled(E, running=128, queued=128, gen_throughput=10_000.0 + i % 2)
    lr.rebuild()
    curve = lr.curve(E)
    assert curve.limit == 128
    assert curve.at(256) == pytest.approx(256 / 10_000, rel=0.01)


def test_rebuilt_at_most_every_interval_onto_the_server_record() -> None:
    clock = Clock()
    record = Server(E, "eagle")
    lr = SpeedLearner([record], clock=clock, rebuild_s=1.0)
    assert record.speed is lr.servers[E] and record.curve == NEUTRAL_CURVE
    clock.now += 2
    lr.finished(E, 1, stay=1.0, output_tokens=100)  # rebuilt: the first in 1 s
    first = record.curve
    assert first is not None and first.at(1) < NEUTRAL_TPOT_S
    clock.now += 0.1
    lr.finished(E, 1, stay=3.0, output_tokens=100)  # within 1 s: waits
    assert record.curve == first
    lr.refresh()  # what the poller does after each round
    assert record.curve != first and record.curve == lr.curve(E)


def test_a_poll_is_not_learned_while_the_pair_mate_runs() -> None:
    clock = Clock()
    eagle, baseline = Server(E, "eagle"), Server(B, "baseline")
    eagle.mate, baseline.mate = baseline, eagle
    lr = SpeedLearner([eagle, baseline], clock=clock)
    before, seen = lr.curve(E), lr.servers[E].seen
    baseline.in_flight = 1
    for i in range(10):
        clock.now += 1
        lr.polled(E, running=4, queued=0, gen_throughput=40.0 + i / 100)
    lr.rebuild()
    assert lr.curve(E) == before and lr.servers[E].seen == seen
    baseline.in_flight = 0
    lr.polled(E, running=4, queued=0, gen_throughput=40.0)
    lr.rebuild()
    assert lr.curve(E) != before and lr.servers[E].seen == clock.now


def test_a_poll_whose_interval_the_pair_mate_ran_in_is_not_learned() -> None:
    """The gauges a poll reads may cover the time since the poll before last: a mate idle at
    the poll but busy in that interval shared the GPUs behind the reading. On a simulated shared
    pair (h200-8b-accept4, calibrated, C=256) a baseline's first poll after its EAGLE mate
    drained read 838 ms a token at load 128 (63 ms at the next): its whole curve went 2.6x
    above the calibration, and the pairs derived 512 and held the level on EAGLE."""
    clock = Clock()
    eagle, baseline = Server(E, "eagle"), Server(B, "baseline")
    eagle.mate, baseline.mate = baseline, eagle
    lr = SpeedLearner([eagle, baseline], clock=clock)
    seen = lr.servers[B].seen
    eagle.admit(clock.now, 1)  # the mate runs...
    clock.now += 1
    lr.polled(B, running=128, queued=0, gen_throughput=2_000.0)
    clock.now += 1
    lr.polled(B, running=128, queued=0, gen_throughput=2_001.0)
    clock.now += 0.5
    eagle.finish(clock.now)  # ...and is done just before the next poll
    clock.now += 0.5
    lr.polled(B, running=128, queued=0, gen_throughput=150.0)  # steady, idle mate, not learned
    assert lr.servers[B].seen == seen
    clock.now += 1
    # The mate ran since the poll before last: not learned.
    lr.polled(B, running=128, queued=0, gen_throughput=150.5)
    assert lr.servers[B].seen == seen
    clock.now += 1
    lr.polled(B, running=128, queued=0, gen_throughput=2_000.0)  # idle over its whole interval
    assert lr.servers[B].seen == clock.now


def test_polls_feed_the_curve_on_the_router_clock() -> None:
    lr, clock = learner()
    # The server's own clock runs twice as fast: its figures are twice the router's.
    for i in range(40):
        clock.now += 0.25
        lr.polled(E, running=4, queued=0, gen_throughput=4 / 0.040 + i % 2 / 1e6)
        lr.finished(E, 4, stay=0.2, output_tokens=10)  # 20 ms, router clock
    lr.rebuild()
    assert lr.curve(E).at(4) == pytest.approx(0.020, rel=0.02)
    # Then only polls, at a higher load: put on the router's clock too.
    polls(lr, clock, E, 16, 0.100, n=40)
    lr.rebuild()
    assert lr.curve(E).at(16) == pytest.approx(0.050, rel=0.05)


def test_gauges_wrong_only_at_high_load_are_corrected_there() -> None:
    """The H200's baseline (pair-a, db4e51c): its gauges matched its clients at light load and
    read about twice what they got at 256 in flight (the cause not known). Where
    the router's own requests saw a load, theirs is the figure; a load only polls saw takes the
    ratio nearest it, not one ratio averaged over all loads (which put the baseline at 256 a
    quarter too fast, ahead of an EAGLE that was faster)."""
    lr, clock = learner()
    for load, gauges, clients in ((16, 0.010, 0.010), (256, 0.0128, 0.0256)):
        for i in range(40):
            clock.now += 0.25
            lr.polled(B, running=load, queued=0, gen_throughput=load / gauges + i % 2 / 1e6)
            lr.finished(B, load, stay=10 * clients, output_tokens=10)
    lr.rebuild()
    curve = lr.curve(B)
    assert curve.at(16) == pytest.approx(0.010, rel=0.05)  # pooled with the prior above it
    assert curve.at(256) == pytest.approx(0.0256, rel=0.02)
    # A load only polls saw (384) is put on the scale of the nearest one both saw (256).
    polls(lr, clock, B, 384, 0.016, n=40)
    lr.rebuild()
    assert lr.curve(B).at(384) == pytest.approx(0.032, rel=0.05)


def test_one_probe_against_one_poll_does_not_rescale_the_curve() -> None:
    """The H200's idle baseline (pair-a, launch 3 at 4109b72): one poll at 1 running read the
    tail of a burst (10.3 ms a token), one probe request there took 4.98 ms. Their ratio (0.485)
    put on every load the polls saw halved the baseline's curve at 16-64 and took the learned
    threshold from 34 to 4. One observation of each is not a ratio: the polls stand as read."""
    lr, clock = learner()
    for load, per_token in ((1, 0.0103), (64, 0.012), (128, 0.016)):
        polls(lr, clock, B, load, per_token, n=8, every=1.0)
    lr.rebuild()
    before = lr.curve(B).at(128)
    lr.finished(B, 1, stay=128 * 0.00498, output_tokens=128)
    lr.rebuild()
    assert lr.servers[B].calibrated is False
    assert lr.curve(B).at(128) == pytest.approx(before, rel=0.02)


def test_a_poll_is_learned_only_when_fresh_and_steady() -> None:
    """The real H200's tail polls (running 1, gen_throughput of the batch that just finished)
    taught a baseline 1.5 ms at load 1 where it runs 4.8 ms; a learned threshold of 1 followed."""
    lr, clock = learner()
    before = lr.curve(E)
    # A burst's tail: the running count falls faster than the throughput gauge follows.
    for running, throughput in ((128, 10_000.0), (60, 9_000.0), (10, 8_000.0), (2, 5_000.0)):
        clock.now += 1
        lr.polled(E, running=running, queued=0, gen_throughput=throughput)
    # Then the server idles and its gauges hold their last values.
    for _ in range(5):
        clock.now += 1
        lr.polled(E, running=2, queued=0, gen_throughput=5_000.0)
    lr.rebuild()
    assert lr.curve(E) == before and lr.servers[E].reach == 0
    # Steady and fresh: learned, at 4 / 200 tok/s = 20 ms.
    for i in range(20):
        clock.now += 1
        lr.polled(E, running=4 + i % 2, queued=0, gen_throughput=(4 + i % 2) / 0.020)
    lr.rebuild()
    assert lr.curve(E).at(4) == pytest.approx(0.020, rel=0.05)
    assert 4 <= lr.servers[E].reach <= 5


def test_a_running_count_that_moves_under_a_held_throughput_is_not_fresh() -> None:
    """A ramp's prefills move the running count while the throughput gauge holds the last decode
    interval's figure: a simulated shared baseline (h200-8b-accept2, calibrated) read 22,118 and
    1,996 ms a token at 63 and 66 running that way, where its requests took 92."""
    lr, clock = learner()
    before = lr.curve(B)
    for running, throughput in ((60, 3.0), (63, 2.85), (66, 2.85), (66, 33.0), (67, 33.0)):
        clock.now += 1
        lr.polled(B, running=running, queued=0, gen_throughput=throughput)
    lr.rebuild()
    assert lr.curve(B) == before and lr.servers[B].reach == 0
    # A new interval at each of two polls: learned.
    for throughput in (2_000.0, 2_001.0):
        clock.now += 1
        lr.polled(B, running=67, queued=0, gen_throughput=throughput)
    lr.rebuild()
    assert lr.servers[B].reach == 67


def test_a_poll_whose_interval_spans_an_idle_spell_is_not_learned() -> None:
    """EAGLE's gauges on the H200 (pair-a-calibrated, eagle.log): 64 running at ~9,400 tok/s, then
    30 s idle with the gauges held, then its first log line of the next level, 56 running at
    231 tok/s: the interval since the last line spans the idle spell. Learned, that read 242 ms
    a token at load 56 where EAGLE runs 7 ms, and the threshold fell from 128 to 20."""
    lr, clock = learner()
    for i in range(10):  # steady under load: learned
        clock.now += 1
        lr.polled(E, running=64, queued=0, gen_throughput=9_400.0 + i)
    lr.rebuild()
    at_load = lr.curve(E).at(56)
    for _ in range(30):  # idle: the gauges hold their last values
        clock.now += 1
        lr.polled(E, running=64, queued=0, gen_throughput=9_409.0)
    for running, throughput in ((56, 231.27), (64, 8_582.13)):
        clock.now += 1
        lr.polled(E, running=running, queued=0, gen_throughput=throughput)
    lr.rebuild()
    assert lr.curve(E).at(56) < 1.5 * at_load  # learned, it reads several times more
    # The next steady polls are learned again: 64 / 8,582 tok/s = 7.5 ms.
    for i in range(10):
        clock.now += 1
        lr.polled(E, running=64, queued=0, gen_throughput=8_582.0 + i)
    lr.rebuild()
    assert lr.curve(E).at(64) == pytest.approx(64 / 8_582, rel=0.1)


def test_a_poll_after_an_idle_spell_s_end_is_not_learned() -> None:
    """Idle (nothing running, the throughput decayed to 0), then a burst of 128: the first poll
    sees the gauges move from idle (the running count, the throughput back to its last value),
    the next a throughput whose interval spans the idle spell. Learned, a simulated baseline
    read 1,103 ms a token at load 128 where it runs about 60, and its curve went 3x up."""
    lr, clock = learner()
    for i in range(10):  # steady under load: learned
        clock.now += 1
        lr.polled(E, running=128, queued=0, gen_throughput=2_000.0 + i)
    lr.rebuild()
    at_load = lr.curve(E).at(128)
    for _ in range(20):  # idle
        clock.now += 1
        lr.polled(E, running=0, queued=0, gen_throughput=0.0)
    for throughput in (2_009.0, 116.0):  # the burst: its last value back, then the idle's
        clock.now += 1
        lr.polled(E, running=128, queued=0, gen_throughput=throughput)
    lr.rebuild()
    assert lr.curve(E).at(128) == pytest.approx(at_load)
    for i in range(10):  # steady again: learned
        clock.now += 1
        lr.polled(E, running=128, queued=0, gen_throughput=1_000.0 + i)
    lr.rebuild()
    assert lr.curve(E).at(128) > 1.3 * at_load


def test_a_poll_far_off_the_servers_own_curve_is_not_learned() -> None:
    """A simulated shared pair's baseline (h200-8b-accept2, calibrated) read 9,061 and 12,819 ms
    a token at load 30 in steady polls where its requests took 30: learned, its curve went 43x
    up. Once the server's clock ratio is measured, a poll more than 8x off its curve is not
    learned; one 2x off is."""
    lr, clock = learner(DEMO)
    for i in range(12):  # requests and polls at the same load: the clock ratio is measured
        feed(lr, clock, B, 30, 0.030, n=1)
        clock.now += 0.25
        lr.polled(B, running=30, queued=0, gen_throughput=30 / 0.030 + i % 2 / 1e6)
    lr.rebuild()
    assert lr.servers[B].calibrated
    before = lr.curve(B).at(30)

    def polled_weight() -> float:
        return sum(w for w, _ in lr.servers[B].polled.read(clock.now))

    weight = polled_weight()
    polls(lr, clock, B, 30, 9.061, n=6)
    lr.rebuild()
    assert lr.curve(B).at(30) == pytest.approx(before)
    assert polled_weight() == pytest.approx(weight)
    polls(lr, clock, B, 30, 0.060, n=6)
    assert polled_weight() > weight + 4


def test_a_far_off_poll_is_not_learned_once_another_servers_clock_is_known() -> None:
    """A server whose own requests and polls never saw the same load (a pair's baseline between
    levels: 6 running at 1,234 and 1,735 ms a token) takes the deployment's clock from the
    servers that were calibrated, and with it the outlier rule."""
    lr, clock = learner(DEMO)
    for i in range(12):  # EAGLE's requests and polls at one load: the clock is measured
        feed(lr, clock, E, 8, 0.012, n=1)
        clock.now += 0.25
        lr.polled(E, running=8, queued=0, gen_throughput=8 / 0.012 + i % 2 / 1e6)
    lr.rebuild()
    assert lr.servers[E].calibrated and not lr.servers[B].calibrated
    before = lr.curve(B).at(6)
    polls(lr, clock, B, 6, 1.234, n=6)
    lr.rebuild()
    assert lr.curve(B).at(6) == pytest.approx(before)


def test_a_far_off_poll_is_learned_while_the_servers_clock_is_unknown() -> None:
    """Before its requests and polls overlap, the server's clock (a simulator's --speed) may be
    any multiple of the router's: its polls are learned as they come."""
    lr, clock = learner(DEMO)
    before = lr.curve(B).at(30)
    polls(lr, clock, B, 30, 20 * before, n=6)
    lr.rebuild()
    assert lr.curve(B).at(30) > 2 * before


def test_polls_learn_the_running_limit_and_accept_length() -> None:
    lr, clock = learner()
    clock.now += 1
    lr.polled(E, running=0, queued=0, gen_throughput=0.0, accept_length=2.7)
    assert lr.servers[E].accept_length == 2.7
    assert lr.curve(E).limit is None
    lr.polled(E, running=12, queued=3, gen_throughput=300.0)
    lr.rebuild()
    assert lr.curve(E).limit == 12
    lr.set_limit(E, 24)  # what the server reports wins over what a queue suggested
    assert lr.curve(E).limit == 24
    # A server that exports nothing changes nothing.
    before = lr.curve(B)
    lr.polled(B, running=None, queued=None, gen_throughput=None)
    lr.rebuild()
    assert lr.curve(B) == before


def test_an_estimate_does_not_decay_when_its_server_gets_no_traffic() -> None:
    # The real-H200 failure: EAGLE idle for 90 s while the baseline served, and its learned curve
    # had gone back to the neutral prior. Time alone now changes nothing.
    lr, clock = learner()
    feed(lr, clock, E, 1, 0.010, n=20)
    learned = lr.curve(E)
    clock.now += 600
    feed(lr, clock, B, 1, 0.030, n=200)
    assert lr.curve(E) == learned
    assert lr.curve(E).at(1) == pytest.approx(0.010, rel=0.1)


# -- the profile reader ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "a profile must be a JSON object"),
        ({"modes": {}}, "non-empty 'modes'"),
        ({"modes": {"medusa": {"throughput": [[1, 1.0]]}}}, "unknown mode 'medusa'"),
        ({"modes": {"eagle": {"throughput": [[2, 1.0]]}}}, "must start at batch 1"),
        ({"modes": {"eagle": {"throughput": [[1, 1.0], [1, 2.0]]}}}, "strictly ascending"),
        ({"modes": {"eagle": {"throughput": [[1, -1.0]]}}}, "positive"),
        ({"modes": {"eagle": {"throughput": [[1, "fast"]]}}}, "must be a number"),
        ({"modes": {"eagle": {"throughput": "fast"}}}, "list of [batch, tok/s]"),
        ({"schema": 2, "modes": {"eagle": {"throughput": [[1, 1.0]]}}}, "schema 2"),
        (
            {"modes": {"eagle": {"throughput": [[1, 1.0]], "max_running_requests": 0}}},
            "max_running_requests",
        ),
    ],
)
def test_profile_errors(raw: Any, message: str) -> None:
    with pytest.raises(ProfileError, match=message.replace("[", r"\[")):
        profile_from_json(raw)


def test_profile_curves_and_limits() -> None:
    sp = profile_from_json(DEMO)
    assert set(sp.modes) == {"eagle", "baseline"}
    # null max_running_requests: SGLang's own defaults.
    assert sp.modes["eagle"].limit == 48 and sp.modes["baseline"].limit == 1024
    eagle = SpeedCurve(sp.modes["eagle"].prior, sp.modes["eagle"].limit)
    # Past the last throughput point the throughput stays flat: TPOT grows with the batch.
    assert eagle.at(48) == pytest.approx(48 / 341.7)
    assert eagle.at(96) == pytest.approx(2 * eagle.at(48))
    one = {
        "modes": {"baseline": {"throughput": [[1, 50.0], [3, 100.0]], "max_running_requests": 2}}
    }
    base = profile_from_json(one).modes["baseline"]
    assert base.limit == 2 and base.prior[0] == pytest.approx(1 / 50)
    assert base.prior[1] == pytest.approx(2 / 75)  # interpolated throughput at batch 2
    # Past the limit the running batch stays at 2 and the third request waits: its tokens are
    # batch 2's, shared by 3 in flight (a stay's time per token, as a closed loop measures it).
    assert base.prior[2] == pytest.approx(3 / 75)


def test_a_loads_ratio_reaches_twice_its_load_and_fades_into_the_pooled_one() -> None:
    """speed.local_ratios: a bucket both sources saw gives its own ratio up to RATIO_REACH
    (2x) of load away, the pooled ``fallback`` from twice that (4x) on, a blend between; with
    nothing known, the fallback everywhere."""
    n = len(speed.BUCKETS)
    at = {b: i for i, b in enumerate(speed.BUCKETS)}
    direct = [(0.0, 0.0)] * n
    server = [(0.0, 0.0)] * n
    direct[at[2]], server[at[2]] = (10.0, 0.003), (4.0, 0.006)  # 0.5 at 2 in flight
    ratios = speed.local_ratios(direct, server, 0.9)
    assert ratios[at[2]] == pytest.approx(0.5)
    assert [ratios[at[1]], ratios[at[4]]] == pytest.approx([0.5] * 2)  # 2x away: its own
    assert ratios[at[3]] == pytest.approx(0.5)
    assert 0.5 < ratios[at[6]] < 0.9  # 3x: between
    assert [ratios[at[b]] for b in (8, 64, 512)] == pytest.approx([0.9] * 3)  # 4x and more
    assert speed.local_ratios([(0.0, 0.0)] * n, server, 0.9) == [0.9] * n
