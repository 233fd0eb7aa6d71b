"""One open-loop run's figures, per window and for the whole run, judged on SLOs; in model time
(what a window counts: docs/benchmarks.md, "Open-loop traffic"). Pure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from dynspec.bench import metrics
from dynspec.bench.arrivals import Schedule
from dynspec.bench.metrics import RequestTrace
from dynspec.bench.openloop import OpenLoopRun, Sample
from dynspec.bench.report import Record

SHED = (429, 503)


def _pct(values: Sequence[float], p: float) -> float | None:
    return round(metrics.percentile(values, p), 2) if values else None


def _reading(samples: Sequence[Sample], name: str, at: float) -> float | None:
    """The last ``name`` reading taken by wall time ``at`` (the first one when none was yet)."""
    got = None
    for t, values in samples:
        if name not in values:
            continue
        if t > at and got is not None:
            break
        got = values[name]
    return got


def _readings(samples: Sequence[Sample], name: str, a: float, b: float) -> list[float]:
    return [v[name] for t, v in samples if a <= t < b and name in v]


class _Request:
    """One request's figures in model time."""

    __slots__ = ("at", "met", "shed", "tpot_ms", "trace", "ttft_ms")

    def __init__(self, at: float, trace: RequestTrace, speed: float, ttft: float, tpot: float):
        self.at = at
        self.trace = trace
        self.ttft_ms = trace.ttft * speed * 1000.0 if trace.success else None
        self.tpot_ms = None
        if trace.success and trace.output_tokens > 1:
            self.tpot_ms = (trace.latency - trace.ttft) / (trace.output_tokens - 1)
            self.tpot_ms *= speed * 1000.0
        self.shed = trace.status in SHED
        self.met = (
            self.ttft_ms is not None
            and self.ttft_ms <= ttft
            and (self.tpot_ms is None or self.tpot_ms <= tpot)
        )


def _figures(
    run: OpenLoopRun,
    reqs: Sequence[_Request],
    t0: float,
    t1: float,
    *,
    schedule: Schedule,
    per_chunk: float,
) -> Record:
    """The figures of model times ``[t0, t1)``: ``reqs`` are the requests that arrived in it."""
    speed = run.speed
    w0, w1 = run.start + t0 / speed, run.start + t1 / speed
    length = max(t1 - t0, 1e-9)
    win = metrics.window(run.traces, w0, w1, tokens_per_chunk=per_chunk)
    ok = [r for r in reqs if r.trace.success]
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    tpots = [r.tpot_ms for r in ok if r.tpot_ms is not None]
    met = sum(1 for r in reqs if r.met)
    rec: Record = {
        "t0_s": round(t0, 3),
        "t1_s": round(t1, 3),
        "scheduled_rate": round((schedule.expected(t1) - schedule.expected(t0)) / length, 4),
        "offered_rate": round(len(reqs) / length, 4),
        "arrived": len(reqs),
        "completed": len(ok),
        "shed": sum(1 for r in reqs if r.shed),
        "failed": sum(1 for r in reqs if not r.trace.success and not r.shed),
        "output_throughput": round(win.output_tokens / length, 2),
        "in_flight": round(win.busy / (w1 - w0), 2) if w1 > w0 else 0.0,
        "median_ttft_ms": _pct(ttfts, 50),
        "p99_ttft_ms": _pct(ttfts, 99),
        "median_tpot_ms": _pct(tpots, 50),
        "p99_tpot_ms": _pct(tpots, 99),
        "slo_met": met,
        "slo_attainment": round(met / len(reqs), 4) if reqs else None,
        "goodput": round(met / length, 4),
    }
    if pools := Counter(r.trace.backend for r in reqs if r.trace.backend):
        rec["eagle_share"] = round(pools.get("eagle", 0) / sum(pools.values()), 4)
    first, last = _reading(run.samples, "switches", w0), _reading(run.samples, "switches", w1)
    if first is not None and last is not None:
        rec["mode_switches"] = round(last - first)
    if held := _readings(run.samples, "in_flight", w0, w1):
        rec["router_in_flight"] = round(sum(held) / len(held), 2)
    # The router's threshold as sampled (a learned one moves): its range over the window.
    if thresholds := _readings(run.samples, "threshold", w0, w1):
        rec["threshold_min"], rec["threshold_max"] = min(thresholds), max(thresholds)
    return rec


def records(
    run: OpenLoopRun,
    schedule: Schedule,
    *,
    window_s: float,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
    head: Record,
) -> list[Record]:
    """One record per window of ``window_s`` model seconds over the schedule (``"scope":
    "window"``) and one for the whole run (``"scope": "run"``), each starting with ``head``."""
    speed = run.speed
    reqs = [
        _Request(a.at, t, speed, slo_ttft_ms, slo_tpot_ms)
        for a, t in zip(run.arrivals, run.traces, strict=True)
    ]
    per_chunk = metrics.tokens_per_chunk(run.traces)
    duration = schedule.duration
    out: list[Record] = []
    n = max(1, math.ceil(duration / window_s - 1e-9))
    for k in range(n):
        t0, t1 = k * window_s, min(duration, (k + 1) * window_s)
        inside = [r for r in reqs if t0 <= r.at < t1]
        rec = {**head, "scope": "window", "window": k}
        rec.update(_figures(run, inside, t0, t1, schedule=schedule, per_chunk=per_chunk))
        out.append(rec)
    whole = {**head, "scope": "run"}
    whole.update(_figures(run, reqs, 0.0, duration, schedule=schedule, per_chunk=per_chunk))
    whole.update(_run_only(run, reqs, duration))
    out.append(whole)
    return out


def _run_only(run: OpenLoopRun, reqs: Sequence[_Request], duration: float) -> Record:
    """What only the whole run says: statuses, cuts, the client's lag, switches a minute, the
    router's memory, the worst TTFT of the requests that were served."""
    statuses = Counter(str(t.status) if t.status is not None else "none" for t in run.traces)
    shed = [r.trace for r in reqs if r.shed]
    lag = [x * 1000.0 for x in run.lag()]
    ttfts = [r.ttft_ms for r in reqs if r.ttft_ms is not None]
    rec: Record = {
        "requests": len(reqs),
        "cut": run.cut,
        "statuses": dict(sorted(statuses.items())),
        "shed_without_retry_after": sum(1 for t in shed if not t.retry_after),
        "errors": dict(Counter(_error_kind(r.trace) for r in reqs if not r.trace.success)),
        "max_ttft_ms": round(max(ttfts), 2) if ttfts else None,
        "client_lag_p99_ms": _pct(lag, 99),
        "client_lag_max_ms": round(max(lag), 2) if lag else None,
        "run_wall_s": round(run.end - run.start, 2),
    }
    first = _reading(run.samples, "switches", -math.inf)
    last = _reading(run.samples, "switches", math.inf)
    if first is not None and last is not None and duration > 0:
        rec["mode_switches"] = round(last - first)
        rec["switches_per_min"] = round((last - first) / (duration / 60.0), 2)
    if rss := [v["rss_mib"] for _, v in run.samples if "rss_mib" in v]:
        # Where it stood at each quarter of the run too: memory that keeps growing shows there.
        quarters = [rss[min(len(rss) - 1, (len(rss) * k) // 4)] for k in (1, 2, 3)]
        rec["router_rss_mib"] = {
            "first": round(rss[0], 1),
            "quarters": [round(x, 1) for x in quarters],
            "last": round(rss[-1], 1),
            "max": round(max(rss), 1),
        }
    return rec


def _error_kind(trace: RequestTrace) -> str:
    if trace.status is not None and trace.status != 200:
        return f"HTTP {trace.status}"
    if trace.error.startswith("cut"):
        return "cut"
    return trace.error.split(":", 1)[0] or "unknown"
