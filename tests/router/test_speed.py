"""Speed curves and their learning, deterministic: observations at chosen times in, curves out."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from speedkit import DEMO, B, Clock, E, feed, learner

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
