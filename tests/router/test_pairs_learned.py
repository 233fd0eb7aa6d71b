"""Pairs (``--pair``) with the learned threshold, in-process: the threshold derived from two
curves, ``Pools`` with pairs switching, waiting, probing and learning per pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pairkit import B0, B1, E0, E1, one_pair_pools

from dynspec.router.autothreshold import (
    AUTO_MAX,
    AUTO_SPEEDUP_DECAY,
    AUTO_START,
    PROBE_AFTER_REQUESTS,
    PROBE_AFTER_S,
    auto_hysteresis,
    derive_threshold,
    learned_settings,
)
from dynspec.router.config import PAIR_RETURN_DELAY_S, parse_config
from dynspec.router.learning import SpeedLearner
from dynspec.router.policy import (
    ThresholdPolicy,
)
from dynspec.router.pool import Lease, Pools
from dynspec.router.speed import BUCKETS, NEUTRAL_CURVE, SpeedCurve, profile_from_json
from dynspec.router.thresholds import Thresholds

# -- the learned threshold -------------------------------------------------------------------------


def curve(f: object) -> SpeedCurve:
    return SpeedCurve(tuple(f(b) for b in BUCKETS))  # type: ignore[operator]


def test_derive_threshold_is_the_last_load_before_eagle_is_slower() -> None:
    # EAGLE: 10 ms alone, +2 ms per request; baseline: 20 ms alone, +1 ms: equal at load 11.
    eagle = curve(lambda b: 0.010 + 0.002 * (b - 1))
    baseline = curve(lambda b: 0.020 + 0.001 * (b - 1))
    t = derive_threshold(eagle, baseline)
    assert eagle.at(t) <= baseline.at(t) and eagle.at(t + 1) > baseline.at(t + 1)
    assert 10 <= t <= 12
    # Two servers per pool: the load is spread, the crossover moves out.
    assert derive_threshold(eagle, baseline, 2, 2) >= 2 * t - 1
    # EAGLE never slower: the top; always slower: the bottom.
    assert derive_threshold(NEUTRAL_CURVE, NEUTRAL_CURVE) == AUTO_MAX
    assert derive_threshold(baseline, eagle) == 1


def test_derive_threshold_past_reach_grows_eagle_s_ratio_to_the_baseline() -> None:
    """Both curves the same shape, EAGLE 0.8x the baseline's TPOT everywhere: the curves alone
    say EAGLE never loses, but past the load it was seen at (8) the ratio grows as
    load**AUTO_SPEEDUP_DECAY and reaches 1 at 8 * 0.8**-5 = 24.4."""
    baseline = curve(lambda b: 0.020 + 0.001 * (b - 1))
    eagle = curve(lambda b: 0.8 * (0.020 + 0.001 * (b - 1)))
    assert derive_threshold(eagle, baseline) == AUTO_MAX
    assert AUTO_SPEEDUP_DECAY == 0.2
    assert derive_threshold(eagle, baseline, reach=8) == 24
    # Seen further: the same ratio holds further.
    assert derive_threshold(eagle, baseline, reach=32) == 97
    # Two servers per pool: reach is one server's load, the threshold the pools' total.
    assert derive_threshold(eagle, baseline, 2, 2, reach=8) in (48, 49)


# /status of the real H200 pair after its first sweep (bench/results/h200/pair-a, 2026-12-02):
# EAGLE seen at 1..64, the baseline at 16 and 105..256 only; below 16 its curve is the neutral
# prior's shape scaled to what was seen above (1.72 ms at load 1, where it runs 4.8 ms).
H200_EAGLE = (1.74, 2.0, 2.0, 2.0, 2.0, 2.17, 2.35, 2.7, 3.76, 3.89, 5.55, 6.52, 9.66, 12.45,
              18.67, 24.89, 37.34, 49.78)  # fmt: skip
H200_BASELINE = (1.72, 1.83, 1.93, 2.04, 2.26, 2.47, 3.09, 5.86, 11.6, 11.6, 11.6, 11.6, 11.6,
                 11.6, 21.91, 30.46, 42.87, 56.63)  # fmt: skip


def test_derive_threshold_compares_only_where_both_were_seen() -> None:
    eagle = SpeedCurve(tuple(t / 1000 for t in H200_EAGLE))
    baseline = SpeedCurve(tuple(t / 1000 for t in H200_BASELINE))
    # Compared at every load, the baseline's extrapolated 1.72 ms beat EAGLE's 1.74 at load 1.
    assert derive_threshold(eagle, baseline, reach=64) == 1
    # From 16 on (the baseline's lowest load seen): EAGLE leads up to its measured ~100.
    t = derive_threshold(eagle, baseline, reach=64, floor=16)
    assert 64 <= t <= 128
    # A floor where EAGLE already loses: the crossover lies below it, so just below.
    assert derive_threshold(baseline, eagle, floor=16) == 15


def pair_pools(auto: bool = False, clock: list[float] | None = None) -> Pools:
    now = clock if clock is not None else [0.0]
    pools = Pools(
        [(E0, "eagle"), (B0, "baseline"), (E1, "eagle"), (B1, "baseline")],
        ThresholdPolicy(),
        threshold=2,
        hysteresis=1,
        pairs=[(E0, B0), (E1, B1)],
        auto=auto,
        clock=lambda: now[0],
    )
    for s in pools.servers:
        s.healthy = True
    return pools


def test_pools_with_pairs_switch_each_pair_by_its_own_load() -> None:
    switched: list[tuple[str, str | None]] = []
    pools = pair_pools()
    pools.on_switch = lambda to, pair: switched.append((to, pair.label if pair else None))
    leases = [pools.acquire() for _ in range(6)]
    # Alternating by least load: 0,1,0,1 to EAGLE (loads 1,1,2,2), then pair 0 at load 3 > 2.
    assert [(x.group.index if x.group else None, x.pool) for x in leases] == [
        (0, "eagle"), (1, "eagle"), (0, "eagle"), (1, "eagle"), (0, "baseline"), (1, "baseline"),
    ]  # fmt: skip
    assert switched == [("baseline", "0"), ("baseline", "1")]
    assert [p.load for p in pools.groups] == [3, 3] and pools.load == 6
    assert pools.mode == "baseline" and pools.active_pool() == "baseline"
    # Pair 0's EAGLE server still holds two: it drains.
    assert pools.server_draining(pools.groups[0].eagle) and pools.draining("eagle")
    for lease in leases:
        lease.release()
    assert pools.load == 0 and not pools.draining("eagle")
    # Drain applies to that pool's server in every pair.
    pools.drain("eagle")
    lease = pools.acquire()
    assert lease.pool == "baseline"
    lease.release()


def one_at_a_time_leases(pools: Pools, now: list[float], every: float, n: int) -> list[Lease]:
    """The leases of ``n`` requests sent alone, ``every`` seconds apart on clock ``now``."""
    leases = []
    for _ in range(n):
        now[0] += every
        lease = pools.acquire()
        leases.append(lease)
        lease.release()
    return leases


def one_at_a_time(pools: Pools, now: list[float], every: float, n: int) -> list[str]:
    """The pool of each of ``n`` requests sent alone, ``every`` seconds apart on clock ``now``."""
    return [lease.pool for lease in one_at_a_time_leases(pools, now, every, n)]


def test_pairs_wait_before_going_back_to_eagle_so_a_wave_s_dip_stays_on_the_baseline() -> None:
    """With --pair the return delay is PAIR_RETURN_DELAY_S unless given: a closed loop's wave
    ends all at once, the load falls to 0, and the next wave's first requests went to EAGLE,
    which shares the GPU with the baseline's next batch (simulated h200-8b-accept2, the share
    read as a step goes on: 1-2 a dip made paired-auto 0.81x 2x-baseline at C=64). A load that
    stays low that long goes back; the split layout (GPUs of their own) goes back at once."""
    cfg = parse_config(["--pair", f"{E0},{B0}", "--threshold", "auto"], {})
    assert cfg.return_delay == PAIR_RETURN_DELAY_S > 0
    assert parse_config(["--pair", f"{E0},{B0}", "--return-delay", "0"], {}).return_delay == 0
    assert parse_config(["--eagle-url", E0, "--baseline-url", B0], {}).return_delay == 0
    assert cfg.pairs == ((E0, B0),)
    now = [0.0]
    pools = one_pair_pools(
        now, threshold=4, hysteresis=1, auto=False, return_delay=cfg.return_delay
    )
    wave = [pools.acquire() for _ in range(32)]
    assert pools.mode == "baseline"
    for n in range(3):  # three waves: each ends at once, the next one comes 5 ms later
        now[0] += 1.0
        for lease in wave:
            lease.release()
        now[0] += 0.005
        wave = [pools.acquire() for _ in range(32)]
        assert [x.pool for x in wave] == ["baseline"] * 32, n
    for lease in wave:
        lease.release()
    # A light load that lasts: back to EAGLE once it has for the delay, counted from the last
    # wave's end (the releases), not from the first light request.
    assert one_at_a_time(pools, now, 0.4, 4) == ["baseline", "baseline", "eagle", "eagle"]


def test_one_request_at_a_time_goes_to_every_pair_in_turn() -> None:
    """C=1: each request finds both pairs idle. Ties to the first pair sent all of them to pair
    0, so pair 1 was never seen at light load and kept its start threshold (simulated
    ``h200-8b-accept2``, 0.875x the best pair at C=16)."""
    pools = pair_pools()
    served = []
    for _ in range(6):
        lease = pools.acquire()
        served.append(lease.group.index)
        lease.release()
    assert served == [0, 1, 0, 1, 0, 1]


def test_one_request_at_a_time_teaches_every_pair() -> None:
    """With --threshold auto at C=1, each pair's EAGLE serves and its idle baseline is probed, so
    every pair learns its own threshold from light load."""
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    now[0] = PROBE_AFTER_S + 1  # nothing learned for a while: every server due a probe
    seen: dict[str, int] = {}
    for _ in range(8):
        lease = pools.acquire()
        now[0] += 1.0
        lease.release()
        seen[lease.server.url] = seen.get(lease.server.url, 0) + 1
        # EAGLE 10 ms a token, the baseline 30 ms (alone, load 1).
        tpot = 0.010 if lease.pool == "eagle" else 0.030
        lr.finished(lease.server.url, 1, stay=tpot * 100, output_tokens=100)
    assert set(seen) == {E0, B0, E1, B1}
    lr.rebuild()
    pools.derive()
    # Both pairs measured both servers at load 1, EAGLE the faster: each derived its own.
    assert all(g.settings.threshold == AUTO_START for g in pools.groups)


def test_a_lease_knows_whether_its_pair_mate_ran_meanwhile() -> None:
    now = [0.0]
    pools = pair_pools(clock=now)
    pools.settings = pools.groups[0].settings  # threshold 2
    a = pools.acquire()  # pair 0 eagle
    now[0] = 1.0
    a.release()
    assert a.alone
    # Pair 0 again (pair 1 down), then over its threshold to its baseline server.
    pools.groups[1].eagle.healthy = pools.groups[1].baseline.healthy = False
    x, y, z = pools.acquire(), pools.acquire(), pools.acquire()
    assert (x.pool, y.pool, z.pool) == ("eagle", "eagle", "baseline")
    now[0] = 2.0
    for lease in (x, y, z):
        lease.release()
    assert not x.alone and not z.alone


def test_threshold_auto_learns_per_pair_and_an_operator_turns_it_off() -> None:
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    # Nothing measured: the start value stays.
    pools.derive()
    assert [p.settings.threshold for p in pools.groups] == [2, 2]
    # Pair 0 measured: EAGLE 10 ms, baseline 30 ms at load 1 (the neutral shape scaled).
    for _ in range(20):
        lr.finished(E0, 1, stay=1.0, output_tokens=100)
        lr.finished(B0, 1, stay=3.0, output_tokens=100)
    lr.rebuild()
    pools.derive()  # within AUTO_EVERY_S of the last: not yet
    assert pools.groups[0].settings.threshold == 2
    now[0] = 3.0
    pools.derive()
    # The curves say EAGLE is faster at every load (both the prior's shape past load 1), but
    # EAGLE was seen at load 1 only: the threshold may go no further than the start value.
    p0 = pools.groups[0].settings
    assert (p0.threshold, p0.hysteresis) == (AUTO_START, auto_hysteresis(AUTO_START, 1))
    assert pools.groups[1].settings.threshold == 2  # not measured
    # EAGLE seen serving 12 at once, still faster: the bound doubles past it.
    for _ in range(20):
        lr.finished(E0, 12, stay=1.5, output_tokens=100)
    lr.rebuild()
    now[0] = 6.0
    pools.derive()
    assert pools.groups[0].settings.threshold == 24
    pools.set_settings(5, 1)
    assert not pools.auto and all(p.settings.threshold == 5 for p in pools.groups)


def test_a_load_past_a_bound_held_threshold_derives_again_at_once() -> None:
    """A closed loop stepping past a threshold its bound held down stays on EAGLE when what
    EAGLE was seen serving since allows it (on the real H200 each sweep level began with a
    switch to the baseline and back, up to AUTO_EVERY_S later); past the curves' own crossover
    it switches."""
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    pools.groups[1].eagle.healthy = pools.groups[1].baseline.healthy = False
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    for _ in range(20):  # EAGLE 10 ms, baseline 30 ms, both seen at load 1
        lr.finished(E0, 1, stay=1.0, output_tokens=100)
        lr.finished(B0, 1, stay=3.0, output_tokens=100)
    lr.rebuild()
    now[0] = 3.0
    leases = [pools.acquire() for _ in range(AUTO_START)]
    pair = pools.groups[0]
    assert pair.settings.threshold == AUTO_START and pair.held
    # EAGLE then seen serving 8, still the faster; within AUTO_EVERY_S of that derivation the
    # step past it is derived again at once: twice what EAGLE was seen serving, still EAGLE.
    for _ in range(20):
        lr.finished(E0, AUTO_START, stay=1.2, output_tokens=100)
    lr.rebuild()
    now[0] = 3.5
    leases += [pools.acquire() for _ in range(AUTO_START)]
    assert [x.pool for x in leases] == ["eagle"] * 2 * AUTO_START
    assert pair.mode == "eagle" and pair.switches == 0
    assert pair.settings.threshold == 2 * AUTO_START
    # EAGLE measured slower than the baseline from load 12 on: the curves' crossover is below
    # the load, not held by the bound, and the next request past it switches.
    for _ in range(40):
        lr.finished(E0, 12, stay=6.0, output_tokens=100)
        lr.finished(B0, 12, stay=4.0, output_tokens=100)
    lr.rebuild()
    now[0] = 6.0
    pools.acquire()
    assert not pair.held and pair.settings.threshold < 2 * AUTO_START
    assert pair.mode == "baseline" and pair.switches == 1
    for lease in leases:
        lease.release()


def test_a_burst_does_not_ratchet_a_held_threshold_up() -> None:
    """The load an EAGLE-mode group carries is what its threshold let in: a burst past a held
    threshold is derived again at once, but not bounded by the load it brings. Before, each
    request past it doubled the bound (simulated h200-8b-accept4 at C=64: 8 -> 15 -> 30 -> 60
    within milliseconds, EAGLE seen only up to 8; the level then ran on EAGLE, 0.80x the best
    pair)."""
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    pools.groups[1].eagle.healthy = pools.groups[1].baseline.healthy = False
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    for _ in range(20):  # EAGLE 10 ms, baseline 30 ms, both seen at load 1: EAGLE wins on
        lr.finished(E0, 1, stay=1.0, output_tokens=100)
        lr.finished(B0, 1, stay=3.0, output_tokens=100)
    lr.rebuild()
    now[0] = 3.0
    pair = pools.groups[0]
    leases = [pools.acquire() for _ in range(64)]
    assert pair.settings.threshold == AUTO_START and pair.held
    assert [x.pool for x in leases] == ["eagle"] * AUTO_START + ["baseline"] * (64 - AUTO_START)
    assert pair.switches == 1
    for lease in leases:
        lease.release()


def test_parked_on_its_baseline_a_group_tries_eagle_at_the_load_carried() -> None:
    """The load's share of the bound stays for a group in baseline mode, as far as its baseline
    was seen serving it: where the curves say EAGLE wins at the load it carries, the threshold
    goes up to twice that load, once. A burst just switched to the baseline is not parked: in
    the simulated h200-8b-accept4 at C=64 a pair derived 20 at load 11, then 42 at 21 within
    5 ms, its baseline seen at neither."""
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    pools.groups[1].eagle.healthy = pools.groups[1].baseline.healthy = False
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    for _ in range(20):
        lr.finished(E0, 1, stay=1.0, output_tokens=100)
        lr.finished(B0, 1, stay=3.0, output_tokens=100)
    lr.rebuild()
    pair = pools.groups[0]
    pair.settings = Thresholds(AUTO_START, 2)
    pair.mode = "baseline"
    leases = [pools.acquire() for _ in range(20)]
    now[0] = 3.0
    pools.derive()
    assert pair.settings.threshold == AUTO_START  # the baseline seen only at 1: a burst
    for _ in range(20):
        lr.finished(B0, 20, stay=4.0, output_tokens=100)
    lr.rebuild()
    now[0] = 6.0
    pools.derive()
    assert pair.settings.threshold == 40  # parked: twice the 20 carried
    for lease in leases:
        lease.release()


def test_a_baseline_seen_only_at_high_load_does_not_win_low_load() -> None:
    """EAGLE seen at 1, 8 and 20 requests (5, 6, 8 ms), the baseline at 40 only (15 ms; the
    neutral shape puts it at 4.3 ms at load 1, under EAGLE's 4.9): the pair's threshold is not
    set by the baseline's extrapolated low-load speed, and EAGLE still leads at 40."""
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    lr = SpeedLearner(pools.servers, clock=lambda: now[0])
    for _ in range(20):
        for load, seconds in ((1, 0.5), (8, 0.6), (20, 0.8)):
            lr.finished(E0, load, stay=seconds, output_tokens=100)
        lr.finished(B0, 40, stay=1.5, output_tokens=100)
    lr.rebuild()
    assert (lr.servers[E0].floor, lr.servers[B0].floor) == (1, 40)
    assert lr.curve(B0).at(1) < lr.curve(E0).at(1)  # the extrapolation that misled
    now[0] = 3.0
    pools.derive()
    assert pools.groups[0].settings.threshold == 40  # twice EAGLE's reach of 20, not 1


@pytest.mark.parametrize(
    "threshold, configured, hysteresis",
    [(1, 2, 0), (2, 2, 1), (8, 2, 2), (8, 0, 2), (16, 2, 4), (126, 2, 32), (100, 40, 40)],
)
def test_auto_hysteresis_is_a_share_of_the_threshold(
    threshold: int, configured: int, hysteresis: int
) -> None:
    assert auto_hysteresis(threshold, configured) == hysteresis


@pytest.mark.parametrize(
    "derived, current, bound, expected",
    [
        (512, (8, 2), 16, (16, 4)),  # held to the bound
        (10, (8, 2), 512, None),  # within one hysteresis step: kept
        (11, (8, 2), 512, (11, 3)),
        (100, (126, 32), 512, None),  # 26 below a threshold whose hysteresis is 32: kept
        (51, (126, 32), 512, (51, 13)),
        (0, (8, 2), 512, (1, 0)),
    ],
)
def test_learned_settings(
    derived: int, current: tuple[int, int], bound: int, expected: tuple[int, int] | None
) -> None:
    assert learned_settings(derived, current, 2, bound) == expected


@pytest.mark.parametrize(
    "derived, eagle_load, expected",
    [
        (107, 127, (107, 27)),  # the next request (128) passes 107, not 128: made
        (107, 128, None),  # it passes 128 already: the mode switches without the change
        (107, 100, None),  # 101 passes neither: kept, as in baseline mode
        (107, None, None),  # baseline mode: the mode's hysteresis keeps the load where it is
        (126, 127, (126, 32)),  # one request's worth is enough
    ],
)
def test_learned_settings_give_way_where_they_keep_the_load_on_the_slower_server(
    derived: int, eagle_load: int | None, expected: tuple[int, int] | None
) -> None:
    assert learned_settings(derived, (128, 32), 2, 128, eagle_load) == expected


PAIR_B_PROFILE = (
    Path(__file__).parents[2]
    / "bench/results/h200/pair-b-calibrated/calibration-llama8b-random-eb45906f4b10a464.json"
)


def test_a_held_threshold_gives_way_to_the_curves_at_the_load_carried() -> None:
    """On the H200 (pair-b) the router learned 128, EAGLE's running limit, with hysteresis 32;
    later derivations read 107-113, within one step of it, so the step rule kept the closed loop
    of 128 on EAGLE for two runs (9,746 and 9,442 tok/s), where the baseline alone served 11,195
    and 9,830. With the launch's own calibration as the curves (crossover at 105), the same
    state now gives way at the next derivation and the next request goes to the baseline."""
    now = [0.0]
    pools = one_pair_pools(now, hysteresis=2)
    profile = profile_from_json(json.loads(PAIR_B_PROFILE.read_text()))
    SpeedLearner(pools.servers, profile, clock=lambda: now[0])
    group = pools.groups[0]
    group.settings = Thresholds(128, 32)  # what that router held, learned
    group.derived = True
    leases = [pools.acquire() for _ in range(127)]
    assert {x.pool for x in leases} == {"eagle"}
    now[0] = 10.0
    pools.derive()
    assert group.settings.threshold == 105
    assert pools.acquire().pool == "baseline"


def test_a_stale_other_server_gets_one_probe_at_light_load() -> None:
    now = [0.0]
    pools = pair_pools(auto=True, clock=now)
    SpeedLearner(pools.servers, clock=lambda: now[0])
    now[0] = PROBE_AFTER_S + 1
    probe = pools.acquire()
    assert probe.probe and probe.pool == "baseline" and probe.group is pools.groups[0]
    # Pair 1 probes too (its own); pair 0's next request goes to its mode's server.
    other = pools.acquire()
    assert other.probe and other.group is pools.groups[1]
    third = pools.acquire()
    assert not third.probe and third.pool == "eagle"
    for lease in (probe, other, third):
        lease.release()
    assert not pools.groups[0].probing


def test_a_pair_server_is_probed_only_while_its_mate_is_idle() -> None:
    """A probe beside a busy pair-mate is not learned (mixed speed) and slows the mate's batch
    while it runs (the two share the GPU): it waits until the mate is idle.

    Before, a stale baseline got a probe at any load up to a quarter of the threshold: on the
    H200 (bench/results/h200/pair-a-steady) 0.5% of the requests at C=16 went to the baseline
    beside EAGLE's 15 and the level served 0.85x of EAGLE alone; earlier, in the simulator, a
    probe in flight all the time at C=4 had halved the pair's tok/s."""
    now = [0.0]
    # Threshold 8: light load for a probe is at most 2 in flight on the pair, counting it.
    pools = one_pair_pools(now, hysteresis=1)
    SpeedLearner(pools.servers, clock=lambda: now[0])
    busy = pools.acquire()  # the pair's EAGLE server holds a request...
    assert not busy.probe and busy.pool == "eagle"
    now[0] = PROBE_AFTER_S + 1
    beside = pools.acquire()  # ...so its stale baseline gets no probe beside it
    assert (beside.pool, beside.probe) == ("eagle", False)
    for lease in (busy, beside):
        lease.release()
    probe = pools.acquire()  # the mate idle: the probe goes, and is learned alone
    assert probe.probe and probe.pool == "baseline"
    probe.release()


def test_in_baseline_mode_a_pair_probes_eagle_only_after_the_return_delay() -> None:
    """A wave's dip leaves the pair's baseline idle for milliseconds, so the probe rule (mate
    idle) let a stale EAGLE server get one request a wave at C=256 (PROBE_AFTER_REQUESTS is
    less than a wave), beside the baseline's next batch: not learned, and it slowed the batch
    (simulated h200-8b-accept2, 0.94x 2x-baseline with no other request on EAGLE), once the
    return delay kept the mode on the baseline there. In baseline mode the probe waits as the
    mode does: until the load has stayed low for the return delay."""
    now = [0.0]
    pools = one_pair_pools(now, threshold=8, hysteresis=2, return_delay=1.0)
    SpeedLearner(pools.servers, clock=lambda: now[0])
    wave = [pools.acquire() for _ in range(128)]
    assert pools.mode == "baseline"
    now[0] = PROBE_AFTER_S + 1  # EAGLE is stale
    for lease in wave:
        lease.release()
    now[0] += 0.005
    wave = [pools.acquire() for _ in range(128)]  # the dip: load 1, the mate idle
    assert [(x.pool, x.probe) for x in wave] == [("baseline", False)] * 128
    for lease in wave:
        lease.release()
    # A light load that lasts: the mode goes back to EAGLE once the delay has passed since the
    # load fell (no probe before, nor needed after, to measure it).
    routed = [(x.pool, x.probe) for x in one_at_a_time_leases(pools, now, 0.6, 3)]
    assert routed == [("baseline", False), ("eagle", False), ("eagle", False)]


def test_a_server_left_out_of_many_requests_gets_a_probe() -> None:
    pools = pair_pools(auto=True)
    SpeedLearner(pools.servers)
    pools.groups[1].eagle.healthy = pools.groups[1].baseline.healthy = False
    reasons = []
    for _ in range(PROBE_AFTER_REQUESTS):
        lease = pools.acquire()
        reasons.append((lease.pool, lease.probe))
        lease.release()
    # Idle pair, one at a time: EAGLE every time until the baseline has missed enough of them.
    assert reasons[:-1] == [("eagle", False)] * (PROBE_AFTER_REQUESTS - 1)
    assert reasons[-1] == ("baseline", True)
