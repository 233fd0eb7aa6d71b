"""The learned threshold past EAGLE's running limit: the curves are a stay's time per output
token, queue wait included, so past the limit they show what the queue costs, and the running
limit is no cap (it was while the curves were decode TPOT). Each test fails on the decode-TPOT
learner with the cap."""

from __future__ import annotations

from pairkit import B0, E0, one_pair_pools

from dynspec.router.learning import SpeedLearner


def test_threshold_auto_goes_past_eagle_s_running_limit_to_where_its_queue_loses() -> None:
    """EAGLE's running limit (40) is not a cap: past it EAGLE's curve grows with the queue (a
    stay's time per token), and the threshold is where that meets the baseline's. It once
    stopped at the limit, when the curves were decode TPOT and showed no queue."""
    now = [0.0]
    pools = one_pair_pools(now, threshold=2, hysteresis=1)
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    for _ in range(20):
        for load in (1, 40):
            lr.finished(E0, load, stay=1.0 + load / 40, output_tokens=100)  # 10 to 20 ms
        for load in (1, 200):
            lr.finished(B0, load, stay=3.0 + load / 200, output_tokens=100)  # 30 to 40 ms
    lr.set_limit(E0, 40)
    lr.set_limit(B0, 256)
    now[0] = 3.0
    pools.derive()
    e, b = lr.curve(E0), lr.curve(B0)
    threshold = pools.groups[0].settings.threshold
    assert 40 < threshold < 80  # EAGLE at load 80: 20 ms x 80 / 40 = 40 ms, the baseline's
    assert e.at(threshold) <= b.at(threshold) and e.at(threshold + 1) > b.at(threshold + 1)


def test_h200_pair_a_c256_polls_keep_eagle_with_its_queue() -> None:
    """The H200 pair-a run at C=256, as polls that read what the clients got: EAGLE 128 running
    + 128 queued making 10,716 tok/s, the baseline 256 running making 9,848 (its own gauges read
    about twice that, which polls alone cannot correct). Per token of a stay EAGLE is 23.9 ms, the
    baseline 26.0 ms: the threshold keeps 256 on EAGLE. (Decode TPOT put EAGLE at 11.9 ms, but
    the threshold stopped at EAGLE's running limit of 128 and sent 256 to the baseline.)"""
    now = [0.0]
    pools = one_pair_pools(now, threshold=2, hysteresis=1)
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    for i in range(30):
        now[0] += 1
        lr.polled(E0, running=128, queued=128, gen_throughput=10_716.0 + i % 2)
        lr.polled(B0, running=256, queued=0, gen_throughput=9_848.0 + i % 2)
    lr.rebuild()
    now[0] += 3
    pools.derive()
    assert lr.curve(E0).at(256) < lr.curve(B0).at(256)
    assert pools.groups[0].settings.threshold >= 256
