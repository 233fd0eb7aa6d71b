"""The learned threshold (``--threshold auto``): every rule of it, for one routing group at a time.

A group's threshold is derived from its two speed curves (``derive_threshold``): the largest load
at which EAGLE's predicted time per output token is no worse than the baseline's. The curves are
only as good as what was seen, so the rules around the derivation hold it to evidence:

- **floor**: loads below the lowest at which both servers were seen are not compared; where
  EAGLE already loses at it, the threshold is capped just below it, never raised to it;
- **extrapolation**: past the load EAGLE was seen at, its TPOT is judged against the baseline's;
- **bound**: the threshold goes at most twice past what EAGLE was seen serving, or, parked on
  its baseline, the load the group carries now as far as the baseline was seen serving it
  (``auto_bound``); in EAGLE mode the load is what the threshold let in, not evidence, so it
  never raises the bound (nor does the bound lower a threshold that stands); EAGLE's running
  limit does not bound it: the curves are a stay's time per token, queue wait included, so past
  the limit they show what it costs;
- **hysteresis**: at least a quarter of the threshold (``auto_hysteresis``);
- **step**: a change of one hysteresis step or less is not made (``learned_settings``), unless
  it would move the load an EAGLE-mode group carries now to the baseline, or it is the group's
  first derivation (the start value is a guess; the curves, a calibration's at a calibrated
  start, are the first measurement);
- **hold and early re-derive**: derived at most every ``AUTO_EVERY_S``, and at once when a new
  request would take an EAGLE-mode group past a threshold its bound held down (``past_held``);
- **probes**: a server nothing was learned of for a while gets one request at light load
  (``stale``), so its estimate is measured again instead of trusted for ever; in a pair, only
  while its mate (sharing its GPUs) is idle;
- **switch margin** (``--switch-margin M``, 0 unless set): in a pair, EAGLE keeps a load only
  where it is predicted at least M faster a token, so the switch away from it under a rising load
  comes with fewer of its requests left to drain beside the baseline on their shared GPUs.

Each function takes a group (or a server) and the load as arguments: the pool calls them and
applies the result; nothing here imports the pool, reads a clock or does I/O, so the rules are
tested as plain tables. Which real-GPU run found the need for which rule: ARCHITECTURE.md, "Why
the learned threshold's rules are what they are".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dynspec.router.server import Group, Server
from dynspec.router.speed import SpeedCurve
from dynspec.router.thresholds import Thresholds

AUTO_MIN = 1
AUTO_MAX = 512
# The start value, and the least the bound allows: the threshold of a router that knows nothing.
AUTO_START = 8
# How far past what was seen the bound lets the threshold go: each step up a growing load
# measures EAGLE where the next one is judged.
AUTO_GROWTH = 2.0
# The least hysteresis under a learned threshold, as a share of it: a threshold near the load a
# closed loop holds flips the mode on every request's noise with a hysteresis of a few requests.
AUTO_HYSTERESIS_SHARE = 0.25
# Past the load EAGLE was seen at, its TPOT over the baseline's grows as load**AUTO_SPEEDUP_DECAY
# (speculation pays less as the batch grows): the smallest local slope measured. Too small costs
# one trial of EAGLE where it then loses (the bound lets one happen, the measurement ends it); too
# large would keep EAGLE off loads where it wins, for good.
AUTO_SPEEDUP_DECAY = 0.2
# The threshold is derived again at most this often (router seconds), unless ``past_held``.
AUTO_EVERY_S = 2.0
# A server with nothing learned of its speed for this long (router seconds), or that got none of
# the last PROBE_AFTER_REQUESTS routed requests, gets a probe (at light load).
PROBE_AFTER_S = 30.0
PROBE_AFTER_REQUESTS = 200


def derive_threshold(
    eagle: SpeedCurve,
    baseline: SpeedCurve,
    eagle_servers: int = 1,
    baseline_servers: int = 1,
    *,
    reach: float | None = None,
    floor: int = AUTO_MIN,
    margin: float = 0.0,
) -> int:
    """The largest load up to which EAGLE's predicted time per token (a stay's) is no worse than
    the baseline's; with ``margin`` M, at least M faster (``e * (1 + M) <= b``).

    Load ``L`` is spread evenly over each pool's servers (one each in a pair). The crossover is the
    first load where EAGLE is predicted slower: the threshold is the load just below it (at least
    ``AUTO_MIN``), or ``AUTO_MAX`` when EAGLE is never slower up to it.

    With ``reach`` (the load one EAGLE server was seen serving; None: a profile covers every load),
    EAGLE past it is at least the baseline's TPOT times their ratio at ``reach``, grown by
    ``AUTO_SPEEDUP_DECAY``: there its curve is the prior's shape, which would carry its light-load
    lead to every load. Loads below ``floor`` (the lowest at which both servers were seen) are not
    compared: there a curve is its prior's shape scaled to what was seen above it, and since
    speculation's lead only grows as the load falls, the comparison at ``floor`` stands for them.
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
        if e * (1.0 + margin) > b:
            return max(AUTO_MIN, load - 1)
    return AUTO_MAX


def auto_bound(reach: float | None, load: int = 0) -> int:
    """The largest threshold the curves may set: ``AUTO_GROWTH`` times ``reach`` (the load EAGLE
    was seen serving; None: a profile says what lies beyond) or times the ``load`` a group parked
    on its baseline carries now (``relearn`` gives none in EAGLE mode), at least ``AUTO_START``.

    Past what was seen both curves are the prior's shape, which cannot say where the crossover
    is. The current load's share lets a group parked on its baseline at a load where the curves
    say EAGLE would win try EAGLE there once (the threshold goes up to twice that load, so the
    hysteresis lets the mode back): measured, the curves then keep it or switch back.

    EAGLE's running limit once capped it too, when the curves were decode TPOT, which shows no
    queue wait: they are a stay's time per token now, and past the limit they grow with the
    queue (``SpeedCurve.at``). On the H200 (pair-a) EAGLE at C=256, 128 running and 128 queued,
    made 10,716 tok/s to the baseline's 9,848."""
    bound = AUTO_MAX
    if reach is not None:
        bound = min(bound, max(AUTO_START, int(AUTO_GROWTH * max(reach, load))))
    return bound


def auto_hysteresis(threshold: int, configured: int) -> int:
    """The hysteresis under a learned threshold: the configured one, at least
    ``AUTO_HYSTERESIS_SHARE`` of the threshold, always below it."""
    share = int(threshold * AUTO_HYSTERESIS_SHARE + 0.5)
    return max(0, min(max(configured, share), threshold - 1))


def learned_settings(
    derived: int,
    current: tuple[int, int],
    configured_hysteresis: int,
    bound: int,
    eagle_load: int | None = None,
    *,
    first: bool = False,
) -> tuple[int, int] | None:
    """The (threshold, hysteresis) for a ``derived`` threshold held to ``bound``, or None to
    keep ``current``: a change of one current hysteresis step or less (at least 1) is not made,
    so the threshold does not flicker with every new observation.

    Unless ``eagle_load`` (the load of a group in EAGLE mode; None in baseline mode) is such that
    the next request would pass the new threshold and not the current one: then the curves say
    the load carried now runs on the slower server, and the step would keep it there for as long
    as the load holds (a closed loop at EAGLE's running limit, for good: on the H200, pair-b,
    derived 107-113 under a threshold of 128 with hysteresis 32 kept C=128 on EAGLE, where the
    baseline served 1.15x). Once switched, the mode's own hysteresis keeps the load where it is.

    Nor when ``first``: the group's first derivation replaces the start value whatever the step
    (a calibration whose curves cross at 10 kept the start value of 8 for good)."""
    threshold = min(max(derived, AUTO_MIN), bound, AUTO_MAX)
    moves_load = eagle_load is not None and threshold < eagle_load + 1 <= current[0]
    if abs(threshold - current[0]) <= max(current[1], 1) and not (moves_load or first):
        return None
    return threshold, auto_hysteresis(threshold, configured_hysteresis)


# -- one group -------------------------------------------------------------------------------------


def measured(s: Server) -> bool:
    """Whether the server's curve says something: seeded by a profile, or some data of its own."""
    speed = s.speed
    return speed is not None and (speed.seeded or speed.scale is not None)


def floor_of(eagle: Sequence[Server], baseline: Sequence[Server]) -> int:
    """The lowest load (the group's, over both pools) at which both were seen, from each pool's
    first server; a pool seeded by a profile is known at every load."""
    floor = AUTO_MIN
    for servers in (eagle, baseline):
        speed = servers[0].speed
        if speed is not None and not speed.seeded and speed.floor != math.inf:
            floor = max(floor, round(speed.floor * len(servers)))
    return floor


def relearn(
    group: Group, load: int, configured_hysteresis: int, margin: float = 0.0
) -> tuple[Thresholds | None, bool] | None:
    """The group's thresholds derived again from its curves at ``load`` (what it carries now):
    the new settings (None: keep its own) and whether the bound held the threshold below the
    curves' own; or None while a pool's first server has no curve that says anything.
    ``margin``: the switch margin, applied where the group's servers share GPUs (a pair: its
    EAGLE server has a mate); in a split group switching costs nothing, so it is not.

    A pool's speed is its first server's, its load spread over the pool's servers."""
    eagle, baseline = group.of("eagle"), group.of("baseline")
    if not eagle or not baseline or not (measured(eagle[0]) and measured(baseline[0])):
        return None
    speed, bspeed = eagle[0].speed, baseline[0].speed
    e, b = eagle[0].curve, baseline[0].curve
    assert speed is not None and bspeed is not None and e is not None and b is not None
    n = len(eagle)
    reach = None if speed.seeded else speed.reach
    floor = floor_of(eagle, baseline)
    shared = eagle[0].mate is not None
    derived = derive_threshold(
        e, b, n, len(baseline), reach=reach, floor=floor, margin=margin if shared else 0.0
    )
    current = group.settings
    if derived < floor:
        # EAGLE already loses at the floor: the crossover lies below it, where nothing was
        # compared, so floor - 1 is only a cap. A threshold below it stands (else a pair whose
        # baseline was seen only at 32 went from 8 to 31 and sent C=64 to EAGLE).
        derived = min(derived, current.threshold)
    if group.mode == "eagle":
        # The load an EAGLE-mode group carries is what its threshold let in, not what EAGLE was
        # seen serving: counted in the bound, each request past a held threshold derived it
        # again (``past_held``) at twice the load, and an opening burst ratcheted it up without
        # one observation there (simulated h200-8b-accept4 at C=64: 8 -> 15 -> 30 -> 60 within
        # milliseconds as a wave's requests came back, the whole level then on EAGLE, 0.80x the
        # best pair). Nor does the bound take back a threshold EAGLE is trying: the curves do.
        bound = max(auto_bound(reach * n if reach is not None else None), current.threshold)
    else:
        # Parked on its baseline, the load it carries counts as far as the baseline was seen
        # serving it: past that, both curves are guesses there. A pair that had just switched
        # at an opening burst (its baseline seen only to 11) derived 42 from its load of 21, 5 ms
        # after 20 from 11, and went back to EAGLE for the level (simulated h200-8b-accept4 C=64).
        carried = load if bspeed.seeded else min(load, round(bspeed.reach * len(baseline)))
        bound = auto_bound(reach * n if reach is not None else None, carried)
    new = learned_settings(
        derived, (current.threshold, current.hysteresis), configured_hysteresis, bound,
        eagle_load=load if group.mode == "eagle" else None, first=not group.derived,
    )  # fmt: skip
    return (Thresholds(*new) if new is not None else None), derived > bound


def past_held(group: Group, load: int) -> bool:
    """Whether a new request would take the EAGLE-mode group (carrying ``load``) past a
    threshold its bound held down. The bound grows with the load EAGLE was seen serving, but it
    was derived up to ``AUTO_EVERY_S`` ago: a closed loop that steps up crosses it before the
    next derivation, and each step would begin with a switch to the baseline and back. The load
    let in does not raise it (``relearn``): a burst past the threshold is not evidence."""
    return group.held and group.mode == "eagle" and load + 1 > group.settings.threshold


def stale(s: Server, now: float, seq: int) -> bool:
    """Whether the idle server is due a probe: ``PROBE_AFTER_S`` since the later of its last
    observation learned and its last request sent, or ``PROBE_AFTER_REQUESTS`` routed (``seq``)
    since it got one. Counting from the last request sent too spaces out probes that teach
    nothing (one beside a busy pair-mate is not learned): else a pair at light load would keep
    one in flight on its other server all the time, sharing the GPU."""
    speed = s.speed
    if speed is None or s.in_flight > 0:
        return False
    if s.mate is not None and s.mate.in_flight > 0:
        # A pair's two servers share their GPUs: a probe beside a busy mate is not learned (it
        # ran beside it) and slows every request of the mate's batch while it runs. On the H200
        # (pair-a-steady) probes at C=16, 0.5% of a level's requests, cost EAGLE 15% of its tok/s.
        return False
    since = now - max(speed.seen, s.routed_at)
    return since >= PROBE_AFTER_S or seq - s.routed >= PROBE_AFTER_REQUESTS
