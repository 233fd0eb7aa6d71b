"""Where EAGLE stops paying: the threshold and hysteresis to give the router, from two sweeps.

The decision variable is each request's decode speed, 1 / p50 TPOT (tokens/s one user sees). At
fixed closed-loop concurrency it also orders aggregate throughput (tokens/s ~ C / TPOT), so one
crossover serves both. Between two measured levels the crossover is interpolated linearly in
log2(C) on log2(EAGLE speed / baseline speed): speeds change by ratios and levels are powers of two,
so both axes are logarithmic.

The router sends a request to EAGLE while the load (requests in flight, counting the new one) is
at most ``threshold``; above it, to the baseline, until the load is back at or below ``threshold -
hysteresis``. So ``threshold = floor(crossover)``: every load at or below the crossover goes to
EAGLE. ``hysteresis`` is a quarter of the threshold (at least 1, and at most ``threshold - 1`` so
that the router can switch back at all): wide enough that a load jittering around the threshold does
not flip the mode on every request, narrow enough that the loads served by the "wrong" pool after a
spike are close to the crossover, where the two pools differ least.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dynspec.bench.report import Record, targets

Verdict = Literal["crossover", "never", "always"]


@dataclass(frozen=True)
class Level:
    concurrency: int
    eagle_tpot_ms: float
    baseline_tpot_ms: float
    eagle_output_throughput: float
    baseline_output_throughput: float

    @property
    def eagle_speed(self) -> float:
        return 1000.0 / self.eagle_tpot_ms

    @property
    def baseline_speed(self) -> float:
        return 1000.0 / self.baseline_tpot_ms

    @property
    def ratio(self) -> float:
        return self.eagle_speed / self.baseline_speed


@dataclass(frozen=True)
class Suggestion:
    verdict: Verdict
    threshold: int
    hysteresis: int
    crossover: float | None
    levels: tuple[Level, ...]
    message: str
    # Measured levels above the crossover where EAGLE is faster again (noise or a real second win).
    rewins: tuple[int, ...] = ()


def select(records: Sequence[Record], target: str | None, what: str) -> list[Record]:
    """The records of one target; with several targets in the file, ``target`` must name one."""
    names = targets(records)
    if target is None:
        if len(names) != 1:
            raise ValueError(
                f"{what}: the file holds {len(names)} targets ({', '.join(names)}); name one"
            )
        target = names[0]
    elif target not in names:
        raise ValueError(f"{what}: no target {target!r} (found: {', '.join(names)})")
    return [r for r in records if str(r.get("target")) == target]


def _by_level(records: Sequence[Record]) -> dict[int, tuple[float, float]]:
    """Per concurrency: mean of p50 TPOT and of output tok/s over repeated runs."""
    acc: dict[int, list[tuple[float, float]]] = {}
    for r in records:
        tpot = r.get("median_tpot_ms")
        if not r.get("completed") or not isinstance(tpot, (int, float)) or tpot <= 0:
            continue
        acc.setdefault(int(r["max_concurrency"]), []).append(
            (float(tpot), float(r.get("output_throughput", 0.0)))
        )
    return {
        c: (sum(v[0] for v in vs) / len(vs), sum(v[1] for v in vs) / len(vs))
        for c, vs in acc.items()
    }


def hysteresis_for(threshold: int) -> int:
    return max(0, min(max(1, round(threshold / 4)), threshold - 1))


def suggest(eagle: Sequence[Record], baseline: Sequence[Record]) -> Suggestion:
    e, b = _by_level(eagle), _by_level(baseline)
    common = sorted(set(e) & set(b))
    if not common:
        raise ValueError("the two sweeps share no concurrency level with completed requests")
    levels = tuple(Level(c, e[c][0], b[c][0], e[c][1], b[c][1]) for c in common)
    logr = [math.log2(lv.ratio) for lv in levels]
    lo, hi = common[0], common[-1]
    if logr[0] < 0:
        wins = [lv.concurrency for lv, r in zip(levels, logr, strict=True) if r >= 0]
        note = f" (it is faster again at C={', '.join(map(str, wins))})" if wins else ""
        return Suggestion(
            "never",
            0,
            0,
            None,
            levels,
            f"EAGLE never wins at low load: its per-request decode speed is already below the "
            f"baseline's at C={lo}{note}. Send everything to the baseline (--threshold 0 "
            f"--hysteresis 0), or do not run the EAGLE server on this setup.",
            tuple(wins),
        )
    for i in range(len(levels) - 1):
        if logr[i] >= 0 > logr[i + 1]:
            x0, x1 = math.log2(common[i]), math.log2(common[i + 1])
            x = x0 + (x1 - x0) * logr[i] / (logr[i] - logr[i + 1])
            crossover = 2.0**x
            threshold = max(1, math.floor(crossover))
            rewins = tuple(
                lv.concurrency
                for lv, r in zip(levels[i + 1 :], logr[i + 1 :], strict=True)
                if r >= 0
            )
            note = (
                f" Note: EAGLE is faster again at C={', '.join(map(str, rewins))}; the first "
                f"crossing is used (rerun those levels if that looks like noise)."
                if rewins
                else ""
            )
            return Suggestion(
                "crossover",
                threshold,
                hysteresis_for(threshold),
                crossover,
                levels,
                f"EAGLE's per-request decode speed (1/p50 TPOT) falls below the baseline's between "
                f"C={common[i]} and C={common[i + 1]}, at C ~ {crossover:.1f} (linear "
                f"interpolation of log2(speed ratio) in log2(C)).{note}",
                rewins,
            )
    hyst = hysteresis_for(hi)
    return Suggestion(
        "always",
        hi,
        hyst,
        None,
        levels,
        f"EAGLE always wins: its per-request decode speed is above the baseline's at every "
        f"measured concurrency up to C={hi}, so the crossover is above C={hi}. Use at least "
        f"--threshold {hi}, and sweep higher concurrencies to find the crossover.",
    )


def evidence_table(levels: Sequence[Level]) -> str:
    head = (
        "| C | EAGLE TPOT p50 ms | baseline TPOT p50 ms | EAGLE tok/s per request"
        " | baseline tok/s per request | EAGLE / baseline | faster | EAGLE out tok/s"
        " | baseline out tok/s |"
    )
    lines = [head, "|" + " --- |" * 9]
    for lv in levels:
        lines.append(
            f"| {lv.concurrency} | {lv.eagle_tpot_ms:.2f} | {lv.baseline_tpot_ms:.2f}"
            f" | {lv.eagle_speed:.1f} | {lv.baseline_speed:.1f} | {lv.ratio:.2f}"
            f" | {'EAGLE' if lv.ratio >= 1 else 'baseline'}"
            f" | {lv.eagle_output_throughput:.0f} | {lv.baseline_output_throughput:.0f} |"
        )
    return "\n".join(lines) + "\n"


def render(s: Suggestion) -> str:
    return (
        f"{evidence_table(s.levels)}\n{s.message}\n\n"
        f"Recommended: --threshold {s.threshold} --hysteresis {s.hysteresis}\n"
    )
