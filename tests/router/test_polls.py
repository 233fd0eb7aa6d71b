"""The learner's poll rules, deterministic: which polls of a server's ``/metrics`` are learned
(fresh, steady, alone, plausible) and what they teach."""

from __future__ import annotations

import pytest
from speedkit import DEMO, B, Clock, E, feed, learner, polls

from dynspec.router.learning import SpeedLearner
from dynspec.router.server import Server


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
