"""What the overhead runs say: medians per configuration with ranges and ratios to the direct
target, and each router's CPU cost per relayed chunk and per request (a least-squares fit)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from dynspec.bench.overhead_plan import OverheadConfig


def _med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _rng(values: Sequence[float | None]) -> list[float] | None:
    vals = [v for v in values if v is not None]
    return [min(vals), max(vals)] if vals else None


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (interval, C, tokens, target): medians over runs, ranges, ratios to direct."""
    keys: list[tuple[float, int, int, str]] = []
    for r in runs:
        k = (r["interval_ms"], r["concurrency"], r["tokens"], r["target"])
        if k not in keys:
            keys.append(k)
    rows: list[dict[str, Any]] = []
    for interval, c, tokens, target in keys:
        group = [
            r
            for r in runs
            if (r["interval_ms"], r["concurrency"], r["tokens"], r["target"])
            == (interval, c, tokens, target)
        ]
        direct = [
            r
            for r in runs
            if (r["interval_ms"], r["concurrency"], r["tokens"], r["target"])
            == (interval, c, tokens, "direct")
        ]
        rps = _med([r["requests_per_s"] for r in group])
        cps = _med([r["chunks_per_s"] for r in group])
        p50 = _med([r["ttft_ms"]["p50"] for r in group])
        p99 = _med([r["ttft_ms"]["p99"] for r in group])
        d_rps = _med([r["requests_per_s"] for r in direct])
        d_p50 = _med([r["ttft_ms"]["p50"] for r in direct])
        d_p99 = _med([r["ttft_ms"]["p99"] for r in direct])
        cpu_per_k = _med(
            [
                r["router_cpu_s"] / r["events"] * 1000
                if r.get("router_cpu_s") is not None and r["events"]
                else None
                for r in group
            ]
        )
        rows.append(
            {
                "interval_ms": interval,
                "concurrency": c,
                "tokens": tokens,
                "target": target,
                "runs": len(group),
                "requests_per_s": rps,
                "requests_per_s_range": _rng([r["requests_per_s"] for r in group]),
                "x_direct": round(rps / d_rps, 3) if rps is not None and d_rps else None,
                "chunks_per_s": cps,
                "ttft_p50_ms": p50,
                "ttft_p50_range": _rng([r["ttft_ms"]["p50"] for r in group]),
                "ttft_p99_ms": p99,
                "added_ttft_p50_ms": round(p50 - d_p50, 3)
                if p50 is not None and d_p50 is not None
                else None,
                "added_ttft_p99_ms": round(p99 - d_p99, 3)
                if p99 is not None and d_p99 is not None
                else None,
                "router_cpu_s_per_1k_chunks": round(cpu_per_k, 4)
                if cpu_per_k is not None
                else None,
                "bad_streams": sum(r["bad_streams"] for r in group),
                "failed": sum(r["requests_failed"] + r["requests_unfinished"] for r in group),
            }
        )
    return rows


def solve_cost(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Least squares of ``cpu = chunks * a + requests * b`` over (chunks, requests, cpu) samples."""
    sxx = sum(x * x for x, _, _ in samples)
    syy = sum(y * y for _, y, _ in samples)
    sxy = sum(x * y for x, y, _ in samples)
    sxc = sum(x * c for x, _, c in samples)
    syc = sum(y * c for _, y, c in samples)
    det = sxx * syy - sxy * sxy
    # Two stream lengths make the system well posed; one length alone leaves it singular.
    if not samples or abs(det) <= 1e-9 * max(sxx * syy, 1e-300):
        return None
    a = (sxc * syy - syc * sxy) / det
    b = (syc * sxx - sxc * sxy) / det
    return a, b


def cost_model(runs: Sequence[dict[str, Any]], s: OverheadConfig) -> dict[str, Any]:
    """Per router: ``a`` (per chunk) and ``b`` (per request) from the cost-model runs.

    On a shared machine a single run can be far off, so the estimate uses, for each stream
    length, the median over runs of CPU per request and chunks per request, and solves the
    resulting equations (least squares when more than two lengths). ``*_range`` solves each set of
    same-numbered runs on its own, to show the noise.
    """
    out: dict[str, Any] = {}
    if len(set(s.cost_tokens)) < 2:
        return out  # one stream length cannot separate the two costs
    for target in s.targets:
        if target == "direct":
            continue
        picked = [
            r
            for r in runs
            if r["target"] == target
            and r["concurrency"] == s.cost_concurrency
            and r["interval_ms"] == s.cost_interval_ms
            and r["tokens"] in s.cost_tokens
            and r.get("router_cpu_s") is not None
            and r["requests_ok"] > 0
        ]
        by_len: dict[int, list[dict[str, Any]]] = {}
        for r in picked:
            by_len.setdefault(r["tokens"], []).append(r)

        def point(group: Sequence[dict[str, Any]]) -> tuple[float, float, float]:
            chunks = statistics.median(r["events"] / r["requests_ok"] for r in group)
            cpu = statistics.median(r["router_cpu_s"] / r["requests_ok"] for r in group)
            return (chunks, 1.0, cpu)

        solved = solve_cost([point(g) for g in by_len.values()]) if len(by_len) > 1 else None
        per_run: list[tuple[float, float]] = []
        for i in range(min((len(g) for g in by_len.values()), default=0)):
            one = solve_cost([point([g[i]]) for g in by_len.values()]) if len(by_len) > 1 else None
            if one is not None:
                per_run.append(one)
        out[target] = {
            "runs": len(picked),
            "chunk_us": round(solved[0] * 1e6, 2) if solved else None,
            "request_ms": round(solved[1] * 1e3, 4) if solved else None,
            "chunk_us_range": [
                round(min(a for a, _ in per_run) * 1e6, 2),
                round(max(a for a, _ in per_run) * 1e6, 2),
            ]
            if per_run
            else None,
            "request_ms_range": [
                round(min(b for _, b in per_run) * 1e3, 4),
                round(max(b for _, b in per_run) * 1e3, 4),
            ]
            if per_run
            else None,
            "samples": [
                {
                    "tokens": r["tokens"],
                    "chunks": r["events"],
                    "requests": r["requests_ok"],
                    "cpu_s": r["router_cpu_s"],
                }
                for r in picked
            ],
        }
    return out
