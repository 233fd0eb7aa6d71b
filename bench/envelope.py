"""The envelope experiment: does the routed pair follow the better of its two servers?

One command: start an EAGLE and a baseline ``dynspec-sim`` on free loopback ports, sweep each alone,
let ``suggest-threshold`` pick the router's threshold and hysteresis from those two sweeps, start a
``dynspec-router`` with them, sweep it, and compare at every concurrency the routed output tok/s
with the better server's (goal >= 0.95x) and the routed p50 TPOT with the better server's (goal
<= 1.05x).

Simulated time runs ``speed`` times faster than wall-clock time, so the reported figures are
converted back to model time (durations x speed, rates / speed); ratios do not depend on it. The
router's own cost is wall-clock and does not scale: a high speed inflates it in model time, and the
machine's CPU (client, router and both simulators share it) bounds the chunk rate that can be
measured. ``schedule`` in the table is the measured p50 TPOT over what the profile predicts for a
single server; near 1.00 means the simulator kept to its schedule and the client kept up.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.bench import harness, report, simreport, threshold, ways
from dynspec.bench.load import Target
from dynspec.bench.report import Record
from dynspec.bench.sweep import ProgressLine, SweepConfig, sweep
from dynspec.launcher.sim.profile import load_profile

logger = logging.getLogger(__name__)

THROUGHPUT_GOAL = 0.95
TPOT_GOAL = 1.05


@dataclass(frozen=True)
class EnvelopeConfig:
    profile: str
    speed: float
    sweep: SweepConfig
    out: Path
    threshold: int | None = None
    hysteresis: int | None = None
    seed: int = 0
    startup_timeout: float = 60.0
    router_log_level: str = "warning"  # the routers' --log-level
    command: str = ""
    sharing: str = "timeslice"  # no shared GPU here; harness.SimSettings asks for it


def compare(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per concurrency: the routed target against the better single server.

    The better server is the one with the higher output tok/s at that concurrency; both ratios
    compare with it. (Comparing TPOT with the lower TPOT of the two would be wrong where EAGLE
    queues: beyond its running-request limit its TPOT stays low while its tok/s is far lower.)
    """
    by: dict[tuple[str, int], Record] = {
        (str(r["target"]), int(r["max_concurrency"])): r for r in records
    }
    rows: list[dict[str, Any]] = []
    for c in sorted({c for t, c in by if t == "routed"}):
        e, b, r = by.get(("eagle", c)), by.get(("baseline", c)), by[("routed", c)]
        if e is None or b is None:
            continue
        best = e if e["output_throughput"] >= b["output_throughput"] else b
        best_tp, best_tpot = best["output_throughput"], best["median_tpot_ms"]
        tp_ratio = r["output_throughput"] / best_tp if best_tp > 0 else math.nan
        tpot_ratio = r["median_tpot_ms"] / best_tpot if best_tpot > 0 else math.nan
        share = r.get("backend_share") or {}
        rows.append(
            {
                "max_concurrency": c,
                "better": best["target"],
                "eagle_output_throughput": e["output_throughput"],
                "baseline_output_throughput": b["output_throughput"],
                "routed_output_throughput": r["output_throughput"],
                "throughput_ratio": tp_ratio,
                "eagle_median_tpot_ms": e["median_tpot_ms"],
                "baseline_median_tpot_ms": b["median_tpot_ms"],
                "routed_median_tpot_ms": r["median_tpot_ms"],
                "tpot_ratio": tpot_ratio,
                "eagle_share": float(share.get("eagle", 0.0)),
                "mode_switches": r.get("mode_switches"),
                "routed_concurrency": r["concurrency"],
                "throughput_ok": tp_ratio >= THROUGHPUT_GOAL,
                "tpot_ok": tpot_ratio <= TPOT_GOAL,
            }
        )
    return rows


def envelope_table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["C", "better server", "EAGLE tok/s", "baseline tok/s", "routed tok/s",
            "routed / better tok/s", "EAGLE TPOT p50 ms", "baseline TPOT p50 ms",
            "routed TPOT p50 ms", "routed / better TPOT", "routed to EAGLE", "switches",
            "in envelope"]  # fmt: skip
    body = [
        [str(w["max_concurrency"]), str(w["better"]), f"{w['eagle_output_throughput']:.1f}",
         f"{w['baseline_output_throughput']:.1f}", f"{w['routed_output_throughput']:.1f}",
         f"{w['throughput_ratio']:.3f}", f"{w['eagle_median_tpot_ms']:.2f}",
         f"{w['baseline_median_tpot_ms']:.2f}", f"{w['routed_median_tpot_ms']:.2f}",
         f"{w['tpot_ratio']:.3f}", f"{100 * w['eagle_share']:.0f}%",
         "-" if w["mode_switches"] is None else str(w["mode_switches"]),
         "yes" if w["throughput_ok"] and w["tpot_ok"] else "NO"]
        for w in rows
    ]  # fmt: skip
    return "\n".join(report.table(head, body)) + "\n"


def misses(rows: Sequence[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for w in rows:
        bits = []
        if not w["throughput_ok"]:
            bits.append(f"routed tok/s {w['throughput_ratio']:.3f}x the better server's")
        if not w["tpot_ok"]:
            bits.append(f"routed p50 TPOT {w['tpot_ratio']:.3f}x the better server's")
        if bits:
            bits.append(f"{100 * w['eagle_share']:.0f}% of requests went to EAGLE")
            out.append(f"C={w['max_concurrency']}: " + "; ".join(bits))
    return out


def run(cfg: EnvelopeConfig, progress: ProgressLine | None = None) -> list[Record]:
    """Run the experiment; level records are appended to ``cfg.out`` as they finish."""
    import asyncio

    extra = {
        **harness.run_metadata(None, cfg.profile, cfg.speed, cfg.command),
        "requests_per_c": cfg.sweep.requests_per_c,
        "min_requests": cfg.sweep.min_requests,
    }
    scfg = dataclasses.replace(cfg.sweep, extra={**cfg.sweep.extra, **extra})
    cfg.out.write_text("", encoding="utf-8")
    with harness.processes() as procs:
        servers = harness.start_servers(procs, {"eagle": 1, "baseline": 1}, cfg)
        singles = [Target("eagle", servers.eagle[0]), Target("baseline", servers.baseline[0])]
        records = asyncio.run(sweep(singles, scfg, cfg.out, progress))
        suggestion = threshold.suggest(
            [r for r in records if r["target"] == "eagle"],
            [r for r in records if r["target"] == "baseline"],
        )
        thr = suggestion.threshold if cfg.threshold is None else cfg.threshold
        hyst = suggestion.hysteresis if cfg.hysteresis is None else cfg.hysteresis
        router = ways.way_router("split-threshold", servers, threshold=thr, hysteresis=hyst)
        router = dataclasses.replace(router, log_level=cfg.router_log_level)
        url, _ = harness.start_router(procs, "router", router, cfg.startup_timeout)
        rcfg = dataclasses.replace(scfg, extra={**scfg.extra, "threshold": thr, "hysteresis": hyst})
        records += asyncio.run(sweep([Target("routed", url)], rcfg, cfg.out, progress))
    return records


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """``out``'s Markdown report and plot, from the level records alone (so a rerender works)."""
    if not records:
        raise ValueError(f"{out}: no levels")
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    profile = load_profile(str(meta.get("profile", "demo")))
    model = simreport.in_model_time(records)
    rows = compare(model)
    routed = [r for r in records if r.get("target") == "routed"]
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    title = f"SIMULATED envelope, profile {profile.name}"
    report.plot(model, png, f"{title} (dynspec-sim, model time, speed {speed:g})")
    levels = sorted({int(r["max_concurrency"]) for r in records})
    suggestion = simreport.suggestion(model)
    run_time = report.run_time_line(records)
    miss = misses(rows)
    text = [
        f"# {title}",
        "",
        "SIMULATED: two `dynspec-sim` servers (no GPU, no model) and a `dynspec-router`, profile "
        f"{simreport.profile_text(profile)}.",
        "",
        f"Profile source: {profile.source}",
        "",
        f"Reproduce: `{meta.get('command') or 'dynspec-bench envelope --simulate'}`",
        "",
        f"- Simulated time ran {speed:g}x wall-clock (`--speed {speed:g}`); every figure below is "
        "in model time (wall-clock durations x speed, rates / speed).",
        f"- Closed-loop clients, {simreport.prompts_text(meta)}; per level "
        f"{meta.get('requests_per_c', '?')} x C measured requests (at least "
        f"{meta.get('min_requests', '?')}) after C warm-up requests; throughputs over the steady "
        f"window (see `dynspec.bench.load.run_level`); levels {','.join(map(str, levels))}.",
        _router_line(routed, suggestion),
        *([run_time] if run_time else []),
        "",
        f"## SIMULATED: routed vs the better single server (goal: tok/s >= {THROUGHPUT_GOAL}x, "
        f"p50 TPOT <= {TPOT_GOAL}x)",
        "",
        "The better server at a concurrency is the one with the higher output tok/s there.",
        "",
        envelope_table(rows),
        "Outside the envelope: " + ("none." if rows and not miss else ""),
        *[f"- {m}" for m in miss],
        "",
        *simreport.suggestion_section(suggestion),
        "## SIMULATED: did the simulators keep their schedule?",
        "",
        simreport.SCHEDULE_TEXT,
        "",
        simreport.schedule_table(model, profile),
        report.markdown_table(model, "SIMULATED: all levels (model time)"),
    ]
    md.write_text("\n".join(text), encoding="utf-8")
    return md, png


def _router_line(routed: Sequence[Record], suggestion: threshold.Suggestion | None) -> str:
    if not routed:
        return "- Router: not reached (the run stopped before the routed sweep)."
    thr, hyst = routed[0].get("threshold"), routed[0].get("hysteresis")
    if thr == 0:
        found = (
            "no difference between the two servers"
            if suggestion is not None and suggestion.verdict == "tie"
            else "that EAGLE never wins"
        )
        return (
            f"- Router: baseline pool only (no `--eagle-url`): `suggest-threshold` found "
            f"{found}, and the threshold policy cannot send every request to the "
            "baseline (`--threshold` >= 1)."
        )
    picked = suggestion is not None and (thr, hyst) == (suggestion.threshold, suggestion.hysteresis)
    how = (
        "picked by `suggest-threshold` from the two single-server sweeps"
        if picked
        else "set by hand"
    )
    return f"- Router: `--threshold {thr} --hysteresis {hyst}` ({how})."


def summary(records: Sequence[Record]) -> str:
    """The envelope table in model time, and the levels outside it."""
    rows = compare(simreport.in_model_time(records))
    lines = [envelope_table(rows)]
    miss = misses(rows)
    lines.append("All levels inside the envelope." if not miss else "Outside the envelope:")
    lines += [f"  {m}" for m in miss]
    return "\n".join(lines) + "\n"
