"""Measured closed-loop levels into one mode of a speed profile (``common/profile.py``'s schema).

Two callers measure levels and need the same profile from them: ``dynspec-bench profile`` (a
sweep's records) and ``dynspec-launch --calibrate`` (its own short sweep of each server). Both
hand over ``[C, tok/s]`` points and what they know of acceptance and prefill; this module makes
the ``ModeProfile`` and says in its ``source`` what was measured and what was estimated.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dynspec.common.profile import ModeProfile

DEFAULT_PREFILL_OVERHEAD_S = 0.005
DEFAULT_PREFILL_TOKENS_PER_S = 20000.0


def fill_levels(points: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """``points`` plus the powers of two between measured levels, estimated.

    The simulator interpolates tok/s linearly between points, which bends the wrong way for a
    decode step whose time grows about linearly with the batch (memory-bound weights plus each
    request's KV cache): between C=16 and C=64, tok/s = C / TPOT is concave in C. So each added
    point takes TPOT (C / tok/s) linearly interpolated in C between its two measured neighbours.
    Nothing is added below the first or above the last measured level.
    """
    pts = sorted(points)
    out = dict(pts)
    for (c0, t0), (c1, t1) in itertools.pairwise(pts):
        tpot0, tpot1 = c0 / t0, c1 / t1
        c = 1
        while c < c1:
            if c > c0:
                tpot = tpot0 + (tpot1 - tpot0) * (c - c0) / (c1 - c0)
                out[c] = round(c / tpot, 1)
            c *= 2
    return tuple(sorted(out.items()))


def prefill_rate(ttft_s: float, tpot_s: float, prompt_tokens: float) -> float | None:
    """Prompt tokens per second of prefill, estimated from one request alone (C=1): what is left
    of its TTFT after the default overhead and one decode step; None where nothing is left."""
    left = ttft_s - DEFAULT_PREFILL_OVERHEAD_S - tpot_s
    if left <= 0 or prompt_tokens <= 0:
        return None
    return min(1e6, max(100.0, prompt_tokens / left))


def measured_mode(
    points: Sequence[tuple[int, float]],
    *,
    what: str,
    accept_length: float = 1.0,
    max_accept_length: int = 1,
    max_running: int | None = None,
    prefill_tokens_per_s: float | None = None,
    interpolate: bool = False,
) -> ModeProfile:
    """One mode from measured ``[C, tok/s]`` points (C=1 among them); ``what`` opens its source
    (e.g. ``target 'eagle'``). With ``interpolate`` the powers of two between measured levels
    are added (``fill_levels``) and named as estimates. A ValueError when C=1 is missing."""
    measured = tuple(sorted((int(c), round(float(t), 1)) for c, t in points))
    levels = [c for c, _ in measured]
    if not levels or levels[0] != 1:
        raise ValueError("a profile starts at batch 1: the levels need C=1")
    pts = fill_levels(measured) if interpolate else measured
    added = [c for c, _ in pts if c not in levels]
    source = f"{what}, measured C={','.join(map(str, levels))}"
    if added:
        source += (
            f"; estimated C={','.join(map(str, added))} (TPOT = C / tok/s linear in C between "
            "the measured neighbours)"
        )
    source += f"; flat beyond C={levels[-1]} (no data)"
    if max_running is not None:
        source += f"; max_running_requests {max_running} (as the measured server ran)"
    rate = DEFAULT_PREFILL_TOKENS_PER_S if prefill_tokens_per_s is None else prefill_tokens_per_s
    return ModeProfile(
        throughput=pts,
        accept_length=round(accept_length, 3),
        max_accept_length=max_accept_length,
        max_running_requests=max_running,
        prefill_tokens_per_s=round(rate, 1),
        prefill_overhead_s=DEFAULT_PREFILL_OVERHEAD_S,
        source=source,
    )
