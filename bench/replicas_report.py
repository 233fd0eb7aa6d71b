"""The replicas experiment's goals (``GOALS``, issue 19 item 2: per layout, ``3-servers``
against ``1-router``, ``3-local`` beside them to show the problem) and report; pure but for
writing the files. ``switch_load`` is ``replicas.switch_load``'s; ``tput`` misses on a loss of
more than 5%, never on a gain. Each goal is PASS, MISS (with the figures), or not evaluated.
What they mean: docs/benchmarks.md, "Router replicas". Everything is SIMULATED.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynspec.bench import report, simreport
from dynspec.bench.report import Record
from dynspec.bench.simreport import cell
from dynspec.bench.ways import REPLICA_LAYOUTS, REPLICA_REFERENCE, REPLICA_VARIANTS
from dynspec.launcher.sim.profile import load_profile

LAYOUTS = tuple(REPLICA_LAYOUTS)
VARIANTS = tuple(REPLICA_VARIANTS)
REFERENCE = REPLICA_REFERENCE
SUBJECT = "3-servers"
PROBLEM = "3-local"

SWITCH_LOAD_WITHIN = 0.25
TPUT_WITHIN = 0.05
SWITCH_RATE_MAX = 1.5
MAJORITY = 0.5

GOALS = {
    "switch_load": f"the load at which new requests move to the baseline within "
    f"+-{100 * SWITCH_LOAD_WITHIN:g}% of {REFERENCE}'s",
    "tput": f"tok/s >= {1 - TPUT_WITHIN:g}x {REFERENCE}'s at every C",
    "switch_rate": f"switches per minute (busiest replica) <= {SWITCH_RATE_MAX:g}x {REFERENCE}'s",
}


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not b > 0:
        return math.nan
    return a / b


def _baseline(rec: Record) -> float:
    share = rec.get("backend_share")
    return float(share.get("baseline", 0.0)) if isinstance(share, dict) else 0.0


@dataclass(frozen=True)
class LevelRow:
    """One level C of one layout: each variant's tok/s, baseline share and switches."""

    c: int
    tput: Mapping[str, float]
    baseline: Mapping[str, float]
    switches: Mapping[str, int | None]  # all replicas together, while the level was measured

    def ratio(self, variant: str) -> float:
        return _ratio(self.tput.get(variant), self.tput.get(REFERENCE))


def level_rows(records: Sequence[Record], layout: str) -> list[LevelRow]:
    """Per level C of ``layout`` (model-time records): every variant that ran it."""
    by: dict[int, dict[str, Record]] = {}
    for r in records:
        if r.get("scope") == "level" and r.get("layout") == layout:
            by.setdefault(int(r["max_concurrency"]), {})[str(r["target"])] = r
    return [
        LevelRow(
            c,
            {v: float(r["output_throughput"]) for v, r in got.items()},
            {v: _baseline(r) for v, r in got.items()},
            {v: r.get("mode_switches") for v, r in got.items()},
        )
        for c, got in sorted(by.items())
    ]


@dataclass(frozen=True)
class RunRow:
    """One variant's whole run in one layout."""

    variant: str
    replicas: int
    switch_load: int | None  # None: no request went to the baseline on the way up
    switch_step_c: int | None
    majority_c: int | None  # the lowest level C with more than half answered by the baseline
    switches: tuple[int, ...]  # per replica, the whole run
    minutes: float  # the run's length, model minutes

    @property
    def per_minute(self) -> tuple[float, ...]:
        return tuple(s / self.minutes if self.minutes > 0 else math.nan for s in self.switches)

    @property
    def busiest(self) -> float:
        return max(self.per_minute, default=math.nan)


def run_rows(records: Sequence[Record], layout: str) -> dict[str, RunRow]:
    """Per variant of ``layout`` (model-time records) that finished its run."""
    levels = level_rows(records, layout)
    out: dict[str, RunRow] = {}
    for r in records:
        if r.get("scope") != "run" or r.get("layout") != layout:
            continue
        v = str(r["target"])
        majority = [w.c for w in levels if w.baseline.get(v, 0.0) > MAJORITY]
        load, step = r.get("switch_load"), r.get("switch_step_c")
        out[v] = RunRow(
            variant=v,
            replicas=int(r.get("replicas", 1)),
            switch_load=None if load is None else int(load),
            switch_step_c=None if step is None else int(step),
            majority_c=min(majority) if majority else None,
            switches=tuple(int(x) for x in r.get("replica_switches") or ()),
            minutes=float(r.get("run_seconds", 0.0)) / 60.0,
        )
    return out


@dataclass(frozen=True)
class Goal:
    key: str
    subject: str
    ok: bool | None  # None: not evaluated
    text: str

    @property
    def word(self) -> str:
        return {True: "PASS", False: "MISS", None: "not evaluated"}[self.ok]


def _load_goal(subject: str, runs: Mapping[str, RunRow]) -> Goal:
    ref, sub = runs[REFERENCE], runs[subject]
    if ref.switch_load is None:
        return Goal("switch_load", subject, None, f"{REFERENCE} never moved to the baseline")
    if sub.switch_load is None:
        text = f"{subject} never moved to the baseline on the way up ({REFERENCE}: load "
        return Goal("switch_load", subject, False, text + f"{ref.switch_load})")
    r = sub.switch_load / ref.switch_load
    ok = abs(r - 1.0) <= SWITCH_LOAD_WITHIN + 1e-9
    return Goal(
        "switch_load",
        subject,
        ok,
        f"{subject} moved new requests to the baseline at load {sub.switch_load} (ramp step "
        f"C={sub.switch_step_c}), {r:.2f}x {REFERENCE}'s {ref.switch_load} (step "
        f"C={ref.switch_step_c})",
    )


def _tput_goal(subject: str, levels: Sequence[LevelRow]) -> Goal:
    both = [w for w in levels if subject in w.tput and REFERENCE in w.tput]
    if not both:
        return Goal("tput", subject, None, f"no level with both {subject} and {REFERENCE}")
    ratios = [(w.c, w.ratio(subject)) for w in both]
    low = [(c, x) for c, x in ratios if not x >= 1.0 - TPUT_WITHIN - 1e-9]
    vals = [x for _, x in ratios if not math.isnan(x)]
    span = f"{min(vals):.3f}-{max(vals):.3f}x" if vals else "-"
    text = f"{subject} tok/s {span} {REFERENCE}'s over C = {','.join(str(c) for c, _ in ratios)}"
    if low:
        text += "; below at " + ", ".join(f"C={c} ({x:.3f}x)" for c, x in low)
    return Goal("tput", subject, not low, text)


def _rate_goal(subject: str, runs: Mapping[str, RunRow]) -> Goal:
    ref, sub = runs[REFERENCE], runs[subject]
    if math.isnan(ref.busiest) or math.isnan(sub.busiest):
        return Goal("switch_rate", subject, None, "no run length or no /metrics counts")
    ok = sub.busiest <= SWITCH_RATE_MAX * ref.busiest + 1e-9
    each = ", ".join(f"{x:.2f}" for x in sub.per_minute)
    r = _ratio(sub.busiest, ref.busiest)
    how = f"{r:.2f}x" if not math.isnan(r) else "vs none"
    return Goal(
        "switch_rate",
        subject,
        ok,
        f"the busiest {subject} replica {sub.busiest:.2f} switches per minute (each: {each}; "
        f"{sum(sub.switches)} switches in {sub.minutes:.1f} min), {how} {REFERENCE}'s "
        f"{ref.busiest:.2f} ({sum(ref.switches)} in {ref.minutes:.1f} min)",
    )


def goals(records: Sequence[Record], layout: str, subject: str = SUBJECT) -> list[Goal]:
    """The three goals for ``subject`` against the reference in ``layout`` (model-time
    records); not evaluated where either run is missing."""
    runs = run_rows(records, layout)
    levels = level_rows(records, layout)
    if REFERENCE not in runs or subject not in runs:
        missing = REFERENCE if REFERENCE not in runs else subject
        text = f"no finished {missing} run in {layout}"
        return [Goal(k, subject, None, text) for k in GOALS]
    return [_load_goal(subject, runs), _tput_goal(subject, levels), _rate_goal(subject, runs)]


def goal_lines(records: Sequence[Record], layout: str, subject: str) -> list[str]:
    return [f"- {g.word}: {GOALS[g.key]}: {g.text}." for g in goals(records, layout, subject)]


# ---- report ------------------------------------------------------------------------------------


def _ran(records: Sequence[Record], layout: str) -> list[str]:
    got = {str(r.get("target")) for r in records if r.get("layout") == layout}
    return [v for v in VARIANTS if v in got]


def level_table(rows: Sequence[LevelRow], ran: Sequence[str]) -> str:
    others = [v for v in ran if v != REFERENCE]
    head = [
        "C",
        *(f"{v} tok/s" for v in ran),
        *(f"{v} / {REFERENCE}" for v in others),
        *(f"{v} on baseline" for v in ran),
        *(f"{v} switches" for v in ran),
    ]
    body = []
    for w in rows:
        cells = [str(w.c), *(cell(w.tput.get(v), thousands=True) for v in ran)]
        cells += [cell(w.ratio(v), 3, thousands=True) for v in others]
        cells += ["-" if v not in w.baseline else f"{100 * w.baseline[v]:.0f}%" for v in ran]
        cells += ["-" if w.switches.get(v) is None else str(w.switches[v]) for v in ran]
        body.append(cells)
    return "\n".join(report.table(head, body)) + "\n"


def run_table(runs: Mapping[str, RunRow]) -> str:
    head = ["variant", "routers", "load at the move (ramp)", "its step C",
            "lowest level C > 50% baseline", "switches per replica", "model min",
            "switches/min per replica", "busiest"]  # fmt: skip
    body = [
        [v, str(r.replicas), "-" if r.switch_load is None else str(r.switch_load),
         "-" if r.switch_step_c is None else str(r.switch_step_c),
         "-" if r.majority_c is None else str(r.majority_c), ", ".join(map(str, r.switches)),
         f"{r.minutes:.1f}", ", ".join(cell(x, 2, True) for x in r.per_minute),
         cell(r.busiest, 2, True)]
        for v in VARIANTS if (r := runs.get(v)) is not None
    ]  # fmt: skip
    return "\n".join(report.table(head, body)) + "\n"


def ramp_table(records: Sequence[Record], layout: str, ran: Sequence[str]) -> str:
    by: dict[int, dict[str, Record]] = {}
    for r in records:
        if r.get("scope") == "step" and r.get("layout") == layout:
            by.setdefault(int(r["step"]), {})[str(r["target"])] = r
    head = ["step", "C", *(f"{v} tok/s" for v in ran), *(f"{v} on baseline" for v in ran)]
    body = []
    for k, got in sorted(by.items()):
        c = next(iter(got.values()))["max_concurrency"]
        cells = [str(k), str(c)]
        cells += [
            cell(float(got[v]["output_throughput"]), thousands=True) if v in got else "-"
            for v in ran
        ]
        cells += [f"{100 * _baseline(got[v]):.0f}%" if v in got else "-" for v in ran]
        body.append(cells)
    return "\n".join(report.table(head, body)) + "\n"


def _labels(records: Sequence[Record], layout: str) -> list[str]:
    out = []
    for r in records:
        if r.get("scope") == "run" and r.get("layout") == layout:
            each = [
                "; ".join(f"{k} {n}" for k, n in sorted(c.items())) or "none"
                for c in r.get("replica_switches_by_label") or []
            ]
            out.append(f"- {r['target']}: " + " | ".join(each))
    return out


def plot(records: Sequence[Record], path: Path, title: str) -> None:
    layouts = [lay for lay in LAYOUTS if any(r.get("layout") == lay for r in records)]
    n = max(1, len(layouts))
    with report.figure(path, title, 2, n, figsize=(5.5 * n, 6.5), squeeze=False) as (_, axes):
        for j, layout in enumerate(layouts):
            rows = level_rows(records, layout)
            for v in _ran(records, layout):
                pts = [(w.c, w.tput[v], w.baseline[v]) for w in rows if v in w.tput]
                cs = [p[0] for p in pts]
                axes[0][j].plot(cs, [p[1] for p in pts], marker="o", label=v)
                axes[1][j].plot(cs, [100 * p[2] for p in pts], marker="o", label=v)
            axes[0][j].set_title(f"{layout} (SIMULATED)")
            axes[0][j].set_ylabel("output tok/s (model time)")
            axes[0][j].set_ylim(bottom=0)
            axes[1][j].set_ylabel("% answered by a baseline server")
            axes[1][j].set_ylim(-5, 105)
            for ax in (axes[0][j], axes[1][j]):
                ax.set_xscale("log", base=2)
                ax.set_xlabel("concurrency (closed loop, all replicas together)")
                ax.grid(True, alpha=0.3)
                ax.legend()


def _header(records: Sequence[Record]) -> list[str]:
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    run_time = report.run_time_line(records)
    interval = float(meta.get("load_interval", 0.0))
    levels = sorted({int(r["max_concurrency"]) for r in records if r.get("scope") == "level"})
    how = (
        "set by hand"
        if meta.get("threshold_by_hand")
        else "picked by `suggest-threshold` from the profile's own curves"
    )
    return [
        f"Command: `{meta.get('command') or 'dynspec-bench replicas --simulate'}`",
        "",
        simreport.machine_line(records, "the load generator, every router and every simulator", ""),
        *([run_time] if run_time else []),
        *simreport.code_lines(records),
        f"- Routers: `--threshold {meta.get('threshold')} --hysteresis "
        f"{meta.get('hysteresis')}` ({how}; not `auto`, so the runs differ only in "
        f"the load signal and the number of routers); `--load-signal servers` replicas read "
        f"`/v1/loads` every {interval:g} s wall-clock ({interval * speed:g} s model time: the "
        "router's default 0.25 s of a real deployment, at the simulators' speed).",
        f"- Simulated time ran {speed:g}x wall-clock; tok/s and minutes are model time. "
        f"Closed-loop streaming clients, random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens. Levels C = "
        f"{','.join(map(str, levels))} ({meta.get('requests_per_c', '?')} x C measured requests, "
        f"at least {meta.get('min_requests', '?')}, after C warm-up ones; tok/s over the steady "
        "window, as the envelope measures it), then a ramp through C = 1, 2, 4 ... "
        f"{meta.get('peak', '?')} ... 2, 1, {float(meta.get('step_seconds', 0)):g} s wall-clock a "
        "step. Each variant on fresh servers and routers, one after the other.",
        "- Requests go round-robin over the replicas, one request at a time (`load.spread`): what "
        "a Kubernetes Service does with one connection per request (IPVS `rr`) or an L7 proxy; a "
        "Service balances connections, so clients with few long-lived connections spread less "
        "evenly.",
        "- **Load at which new requests move to the baseline**: on the ramp's first way up, the "
        "requests the load generator had in flight (all replicas together, counting the new "
        "one) when it sent the first request a baseline server answered (`x-dynspec-backend`). "
        "The load generator knows that total exactly whichever replica took each request, and "
        "the total is what one router's threshold compares: with one router it is threshold + 1 "
        "in `split`. In `paired` every pair has its own threshold and requests spread over the "
        "pairs, so it is the first pair's move, at about twice that in total; the header names "
        "the pool, not the server, so which pair moved is not seen (per pair: the `pair` "
        "labels of the switches below). The levels give a coarser figure beside it: the lowest "
        "C at which more than half the measured requests were answered by a baseline server.",
        "- **Switches per minute**: per replica, its `dynspec_mode_switches_total` (every `to` "
        "and `pair` label) at the end of the run (each router started fresh), over the run's "
        "length from the first level to the end of the ramp, in model minutes; the goal holds "
        "the busiest replica against one router.",
        "",
    ]


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """Markdown and PNG next to ``out``, from its records alone."""
    if not records:
        raise ValueError(f"{out}: no records")
    model = simreport.in_model_time(records)
    meta = records[0]
    profile = load_profile(str(meta.get("profile", "demo")))
    title = f"SIMULATED: 1 and 3 router replicas in front of the same servers, {profile.name}"
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    plot(model, png, f"{title} (speed {float(meta.get('speed', 1.0)):g})")
    lines = [
        f"# {title}",
        "",
        "**SIMULATED.** `dynspec-sim` servers (no GPU, no model) and real `dynspec-router` "
        "processes: `split` (an EAGLE and a baseline server, routers `--eagle-url/"
        "--baseline-url`) and `paired` (two `dynspec-sim --pair` processes, "
        f"`--sharing {meta.get('sharing', 'timeslice')}`, routers `--pair` x2); `1-router` (one "
        "router, `--load-signal local`: the reference), `3-local` (three replicas, "
        "`--load-signal local`) and `3-servers` (three replicas, `--load-signal servers`). "
        f"Profile {simreport.profile_text(profile)}.",
        "",
        f"Profile source: {profile.source}",
        "",
        *_header(records),
    ]
    for layout in LAYOUTS:
        ran = _ran(model, layout)
        if not ran:
            continue
        lines += [
            f"## SIMULATED: {layout}",
            "",
            f"Goals, `{SUBJECT}` against `{REFERENCE}`:",
            "",
            *goal_lines(model, layout, SUBJECT),
            "",
            f"The problem, the same figures for `{PROBLEM}` (each replica counts only its own "
            "requests):",
            "",
            *goal_lines(model, layout, PROBLEM),
            "",
            "Per level (model time; switches: all replicas together while the level was measured):",
            "",
            level_table(level_rows(model, layout), ran),
            "Per run:",
            "",
            run_table(run_rows(model, layout)),
            "Switches per replica by label at the end of the run (replicas separated by |):",
            "",
            *_labels(model, layout),
            "",
            "The ramp, per step (tok/s delivered inside the step; baseline share of the requests "
            "that ended in it):",
            "",
            ramp_table(model, layout, ran),
        ]
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md, png


def summary(records: Sequence[Record]) -> str:
    model = simreport.in_model_time(records)
    out = ["SIMULATED"]
    for layout in LAYOUTS:
        if not _ran(model, layout):
            continue
        out.append(f"{layout}:")
        for subject in (SUBJECT, PROBLEM):
            out += [f"  {line[2:]}" for line in goal_lines(model, layout, subject)]
    return "\n".join(out) + "\n"
