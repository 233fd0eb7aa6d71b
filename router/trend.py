"""Where a routing group's load is heading (``--switch-lead F``): the switch ahead of a rising load.

A request admitted to EAGLE now stays there until it ends, about one EAGLE stay later (the mean
time from routing to release of the group's EAGLE requests, ``stay``). If the load rises past the
threshold before then, the group switches with that request among the EAGLE requests left to
drain beside the baseline on their shared GPUs, which is what a switch costs (one H100 without
MPS: 69-132 of them drained on the day's ramp, and the day lost 0.12 of the baseline's goodput).
So under a rising load the switch should come before the load reaches the threshold, by about
what the load will gain over a stay.

``LoadTrend`` keeps two exponential averages of the group's load over time, one with a time
constant of half a stay and one of a whole stay. On a ramp of slope ``s`` each trails the load by
its time constant times ``s``, so their difference is ``s * stay / 2``, and the load a stay ahead
is the load now plus twice that difference. ``ahead(now, lead)`` returns that gain for ``lead``
stays (never negative: a falling load never delays a switch), which the policy adds to the load
it compares with the threshold.

It starts from a measurement: until one EAGLE request of the group has finished, no stay is known
and it predicts no gain (the averages follow the load exactly, so the first stay starts them from
where the load is). A step (a closed loop starting C requests at once) reads as a rise for about a
stay, by at most half the step at a lead of one stay (the averages' difference peaks at a quarter
of it).

Synchronous, O(1) per event, no clock of its own: ``pool.Pools`` calls ``observe`` at every change
of a group's load and ``stayed`` at every EAGLE release, with its clock.
"""

from __future__ import annotations

import math

# The weight of one finished EAGLE request in the mean stay: about the last 20 requests.
STAY_WEIGHT = 0.05


class LoadTrend:
    __slots__ = ("_at", "_fast", "_load", "_slow", "stay")

    def __init__(self, now: float) -> None:
        self._at = now
        self._load = 0.0
        self._fast = 0.0
        self._slow = 0.0
        # The mean stay of the group's EAGLE requests, seconds; None until one has finished.
        self.stay: float | None = None

    def stayed(self, seconds: float) -> None:
        """One of the group's EAGLE requests finished after ``seconds`` from routing."""
        if seconds <= 0:
            return
        if self.stay is None:
            # No trend was measured before: start both averages flat where the load is.
            self._fast = self._slow = self._load
            self.stay = seconds
        else:
            self.stay += STAY_WEIGHT * (seconds - self.stay)

    def _averages(self, now: float) -> tuple[float, float]:
        """The two averages brought forward to ``now`` (the load held since the last change)."""
        stay, load = self.stay, self._load
        dt = now - self._at
        if stay is None:
            return load, load
        if dt <= 0:
            return self._fast, self._slow
        fast = load + (self._fast - load) * math.exp(-2.0 * dt / stay)
        slow = load + (self._slow - load) * math.exp(-dt / stay)
        return fast, slow

    def observe(self, now: float, load: int) -> None:
        """The group's load changed to ``load`` at ``now``."""
        self._fast, self._slow = self._averages(now)
        self._at = max(now, self._at)
        self._load = float(load)

    def ahead(self, now: float, lead: float) -> float:
        """What the load is predicted to gain over ``lead`` stays (0 when falling or unknown)."""
        fast, slow = self._averages(now)
        return max(0.0, 2.0 * lead * (fast - slow))


__all__ = ["STAY_WEIGHT", "LoadTrend"]
