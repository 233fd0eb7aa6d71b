"""Where EAGLE stops paying: the threshold and hysteresis to give the router, from two sweeps of
per-request decode speed, 1 / p50 TPOT (the rules and why: docs/benchmarks.md, "suggest-threshold").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dynspec.bench.report import Record, table, targets

Verdict = Literal["crossover", "never", "always", "tie"]
# Two figures within 2% of each other are the same: closer than repeated sweeps of one server.
TIE_TOLERANCE = 0.02


def _same(log2_ratio: float) -> bool:
    return abs(log2_ratio) <= math.log2(1.0 + TIE_TOLERANCE)


@dataclass(frozen=True)
class LevelComparison:
    """Both pools measured at one concurrency."""

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
    threshold: int  # 0 with verdict "never": no EAGLE pool at all
    hysteresis: int
    crossover: float | None
    levels: tuple[LevelComparison, ...]
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


def _first_crossing(cs: Sequence[int], logr: Sequence[float]) -> tuple[int, float] | None:
    """The first i with logr[i] >= 0 > logr[i + 1], and C there (linear in log2 C)."""
    for i in range(len(cs) - 1):
        if logr[i] >= 0 > logr[i + 1]:
            x0, x1 = math.log2(cs[i]), math.log2(cs[i + 1])
            return i, 2.0 ** (x0 + (x1 - x0) * logr[i] / (logr[i] - logr[i + 1]))
    return None


def _log_ratio(a: float, b: float) -> float:
    return math.log2(a / b) if a > 0 and b > 0 else 0.0


def suggest(eagle: Sequence[Record], baseline: Sequence[Record]) -> Suggestion:
    """The suggestion from two sweeps. One guard on decode speed: if EAGLE's tok/s falls below
    the baseline's at a lower C, that crossing is used: EAGLE's requests then queue (SGLang caps
    an EAGLE server at 48 running), so its TPOT looks good while the queued ones wait."""
    e, b = _by_level(eagle), _by_level(baseline)
    common = sorted(set(e) & set(b))
    if not common:
        raise ValueError("the two sweeps share no concurrency level with completed requests")
    levels = tuple(LevelComparison(c, e[c][0], b[c][0], e[c][1], b[c][1]) for c in common)
    logr = [math.log2(lv.ratio) for lv in levels]
    tp_logr = [
        _log_ratio(lv.eagle_output_throughput, lv.baseline_output_throughput) for lv in levels
    ]
    lo, hi = common[0], common[-1]
    if all(_same(r) and _same(t) for r, t in zip(logr, tp_logr, strict=True)):
        where = f"C={lo}" if lo == hi else f"every measured concurrency, C={lo} to C={hi}"
        msg = (
            f"No difference: EAGLE's per-request decode speed and output tok/s are within "
            f"{TIE_TOLERANCE:.0%} of the baseline's at {where}, so neither pool wins and there "
            f"is no threshold to choose. Speculation buys nothing measurable here: the baseline "
            f"pool alone serves as well (check that the two sweeps are of two different servers)."
        )
        return Suggestion("tie", 0, 0, None, levels, msg)
    if logr[0] < 0:
        wins = tuple(lv.concurrency for lv, r in zip(levels, logr, strict=True) if r >= 0)
        note = f" (it is faster again at C={', '.join(map(str, wins))})" if wins else ""
        msg = (
            f"EAGLE never wins at low load: its per-request decode speed is already below the "
            f"baseline's at C={lo}{note}. Do not route to EAGLE on this setup: run the router "
            f"with --baseline-url only (or POST /admin/drain/eagle). The threshold policy cannot "
            f"express it: --threshold must be at least 1, and 1 still sends a lone request to "
            f"EAGLE."
        )
        return Suggestion("never", 0, 0, None, levels, msg, wins)
    by_speed = _first_crossing(common, logr)
    by_tput = (0, float(lo)) if tp_logr[0] < 0 else _first_crossing(common, tp_logr)
    if by_speed is None and by_tput is None:
        msg = (
            f"EAGLE always wins: its per-request decode speed and its output tok/s are above "
            f"the baseline's at every measured concurrency up to C={hi}, so the crossover is "
            f"above C={hi}. Use at least --threshold {hi}, and sweep higher concurrencies to "
            f"find the crossover."
        )
        return Suggestion("always", hi, hysteresis_for(hi), None, levels, msg)
    if by_speed is not None and (by_tput is None or by_speed[1] <= by_tput[1]):
        i, crossover = by_speed
        text = (
            f"EAGLE's per-request decode speed (1/p50 TPOT) falls below the baseline's between "
            f"C={common[i]} and C={common[i + 1]}, at C ~ {crossover:.1f} (linear interpolation "
            f"of log2(speed ratio) in log2(C))."
        )
    else:
        assert by_tput is not None
        i, crossover = by_tput
        where = (
            f"already at C={lo}"
            if tp_logr[0] < 0
            else f"between C={common[i]} and C={common[i + 1]}, at C ~ {crossover:.1f}"
        )
        speed_at = "" if by_speed is None else f" (C ~ {by_speed[1]:.1f})"
        text = (
            f"EAGLE's output tok/s falls below the baseline's {where}, before its per-request "
            f"decode speed does{speed_at}: its requests wait (see TTFT; SGLang caps an EAGLE "
            f"server at 48 running requests), so the throughput crossing is used."
        )
    threshold = max(1, math.floor(crossover))
    after = list(zip(levels[i + 1 :], logr[i + 1 :], tp_logr[i + 1 :], strict=True))
    rewins = tuple(lv.concurrency for lv, r, t in after if r >= 0 and t >= 0)
    slow_tpot = tuple(lv.concurrency for lv, r, t in after if r >= 0 > t)
    if rewins:
        text += (
            f" Note: EAGLE is faster again at C={', '.join(map(str, rewins))}; the first "
            f"crossing is used (rerun those levels if that looks like noise)."
        )
    if slow_tpot:
        text += (
            f" At C={', '.join(map(str, slow_tpot))} EAGLE's TPOT is lower but its output "
            f"tok/s is not: requests queue there."
        )
    return Suggestion(
        "crossover", threshold, hysteresis_for(threshold), crossover, levels, text, rewins
    )


def _faster(lv: LevelComparison) -> str:
    if _same(math.log2(lv.ratio)):
        return "same"
    return "EAGLE" if lv.ratio > 1 else "baseline"


def evidence_table(levels: Sequence[LevelComparison]) -> str:
    head = ["C", "EAGLE TPOT p50 ms", "baseline TPOT p50 ms", "EAGLE tok/s per request",
            "baseline tok/s per request", "EAGLE / baseline", "faster", "EAGLE out tok/s",
            "baseline out tok/s"]  # fmt: skip
    body = [
        [str(lv.concurrency), f"{lv.eagle_tpot_ms:.2f}", f"{lv.baseline_tpot_ms:.2f}",
         f"{lv.eagle_speed:.1f}", f"{lv.baseline_speed:.1f}", f"{lv.ratio:.2f}", _faster(lv),
         f"{lv.eagle_output_throughput:.0f}", f"{lv.baseline_output_throughput:.0f}"]
        for lv in levels
    ]  # fmt: skip
    return "\n".join(table(head, body)) + "\n"


def render(s: Suggestion) -> str:
    if s.verdict == "never":
        advice = "Recommended: no EAGLE pool (dynspec-router --baseline-url ... only)"
    elif s.verdict == "tie":
        advice = "Recommended: no threshold to choose; the baseline pool alone serves as well"
    else:
        advice = f"Recommended: --threshold {s.threshold} --hysteresis {s.hysteresis}"
    return f"{evidence_table(s.levels)}\n{s.message}\n\n{advice}\n"
