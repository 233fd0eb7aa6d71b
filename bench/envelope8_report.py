"""The eight-GPU comparison's goals for ``paired-auto`` (judged on the repeats' medians at every C
where each applies) and its report, from the level records alone so that ``--from-jsonl`` works:
with what the profile predicts, the table that holds the simulators to it, and the threshold
suggestion from the run's single-server sweeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dynspec.bench import report, threshold
from dynspec.bench.envelope8 import EXPERIMENT, adaptive_counterpart
from dynspec.bench.report import MARK, Record, Spread, cell, level_table, model_time, stats, table
from dynspec.bench.ways import EIGHT_WAYS, HOMOGENEOUS, SHARED
from dynspec.launcher.sim.profile import DEFAULT_RUNNING_LIMIT, Profile, load_profile

VS_BEST_TPUT = 0.95  # paired-auto tok/s >= 0.95x the best homogeneous pair's, every C
VS_BEST_TPOT = 1.05  # paired-auto p50 TPOT <= 1.05x the best's, C below the crossover
VS_SPLIT_GAIN = 1.3  # paired-auto tok/s >= 1.3x split-threshold's, C >= 2 x threshold
SUBJECT = "paired-auto"

WAY_TEXT = (
    "`split-threshold` / `split-balance` = one EAGLE + one baseline server on GPUs of their own "
    "(`split-balance` got the profile as `--speed-profile`, its tok/s x {speed:g}); "
    "`paired-threshold` / `paired-auto` = two shared GPUs behind `--pair` (`--threshold N` / "
    "`--threshold auto`, {auto_start}); `2x-*` = two servers of one kind in one pool."
)
AUTO_START = {
    False: "no profile",
    True: "from a calibrated start: the profile as `--speed-profile`, as a launch's "
    "`--calibrate` gives it",
}

GOALS = {
    "best": f"{SUBJECT} tok/s >= {VS_BEST_TPUT}x the best homogeneous pair's, every C",
    "tpot": f"{SUBJECT} p50 TPOT <= {VS_BEST_TPOT}x the best pair's, C below the crossover",
    "split": f"{SUBJECT} tok/s >= {VS_SPLIT_GAIN}x split-threshold's, C >= 2 x threshold",
}


def comparable(records: Sequence[Record], profile: Profile) -> tuple[list[Record], list[str]]:
    """The records the goals may judge, and one note per way absent: each way the run left out,
    and a ``2x-adaptive`` that ran an adaptive curve not measured at ``profile``'s acceptance
    (no ceiling for it)."""
    notes = [f"Not run: {n}" for n in records[0].get("not_run") or []] if records else []
    ran = next((r for r in records if r.get("target") == "2x-adaptive"), None)
    if ran is None:
        return list(records), notes
    want, why = adaptive_counterpart(profile)
    if ran.get("adaptive_profile") == want:
        return list(records), notes
    notes.append(
        f"Left out: 2x-adaptive: it ran profile {ran.get('adaptive_profile')}'s adaptive curve, "
        f"and {why or f'{want} is the one measured for this profile'}; no ceiling for "
        f"{profile.name}"
    )
    return [r for r in records if r.get("target") != "2x-adaptive"], notes


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


@dataclass(frozen=True)
class GoalRow:
    """paired-auto against the best homogeneous pair and split-threshold at one C (medians)."""

    c: int
    tput: Mapping[str, float]  # way -> output tok/s (median)
    tpot: Mapping[str, float]  # way -> p50 TPOT ms (median)
    best_pair: str
    vs_best_tput: float
    vs_best_tpot: float
    vs_split_tput: float
    # Goal -> met (True/False), or None where the goal does not apply at this C.
    checks: Mapping[str, bool | None] = field(default_factory=dict)
    spread: Mapping[str, Spread] = field(default_factory=dict)  # way -> tok/s over the repeats

    def figure(self, goal: str) -> str:
        """The ratio a goal judges at this C, and against which pair."""
        ratio = {"best": self.vs_best_tput, "tpot": self.vs_best_tpot}.get(goal, self.vs_split_tput)
        return f"C={self.c} {ratio:.3f}x" + ("" if goal == "split" else f" {self.best_pair}")


def evaluate(records: Sequence[Record], thr: int, crossover: float | None = None) -> list[GoalRow]:
    """Per C where paired-auto and a homogeneous pair ran. ``thr``: the threshold split-threshold
    ran with; ``crossover``: where EAGLE stops paying (None: ``thr``)."""
    tok, tpot_of = stats(records, "output_throughput"), stats(records, "median_tpot_ms")
    below = float(thr) if crossover is None else float(crossover)
    rows: list[GoalRow] = []
    for c in sorted({c for w in EIGHT_WAYS for c in tok.get(w, {})}):
        ran = [w for w in EIGHT_WAYS if c in tok.get(w, {})]
        homo = [w for w in HOMOGENEOUS if w in ran]
        if SUBJECT not in ran or not homo:
            continue
        spread = {w: tok[w][c] for w in ran}
        tput = {w: s.median for w, s in spread.items()}
        tpot = {w: tpot_of[w][c].median for w in ran}
        best = max(homo, key=lambda w: tput[w])
        auto = tput[SUBJECT]
        vs_split = _ratio(auto, tput["split-threshold"]) if "split-threshold" in tput else math.nan
        vs_tpot = _ratio(tpot[SUBJECT], tpot[best])
        split_applies = thr > 0 and c >= 2 * thr and not math.isnan(vs_split)
        vs_best = _ratio(auto, tput[best])
        checks: dict[str, bool | None] = {
            "best": vs_best >= VS_BEST_TPUT,
            "tpot": vs_tpot <= VS_BEST_TPOT if c < below else None,
            "split": vs_split >= VS_SPLIT_GAIN if split_applies else None,
        }
        rows.append(GoalRow(c, tput, tpot, best, vs_best, vs_tpot, vs_split, checks, spread))
    return rows


def verdicts(rows: Sequence[GoalRow]) -> dict[str, tuple[bool | None, list[int]]]:
    """Per goal: met at every C where it applies (None: applies nowhere), and the Cs that miss."""
    out: dict[str, tuple[bool | None, list[int]]] = {}
    for goal in GOALS:
        applied = [(r.c, r.checks.get(goal)) for r in rows if r.checks.get(goal) is not None]
        missed = [c for c, ok in applied if not ok]
        out[goal] = (None if not applied else not missed, missed)
    return out


# How bad a row is for each goal, the worst first (for PASS lines).
_WORST = {
    "best": lambda r: r.vs_best_tput,
    "tpot": lambda r: -r.vs_best_tpot,
    "split": lambda r: r.vs_split_tput,
}


def verdict_lines(rows: Sequence[GoalRow]) -> list[str]:
    """One line per goal: PASS or MISS with the figures (the worst first for PASS)."""
    out = []
    for goal, (ok, missed) in verdicts(rows).items():
        applied = [r for r in rows if r.checks.get(goal) is not None]
        if ok is None:
            out.append(f"- not evaluated: {GOALS[goal]} (applies at no measured C).")
        elif ok:
            worst = min(applied, key=_WORST[goal])
            out.append(f"- PASS: {GOALS[goal]} (worst: {worst.figure(goal)}).")
        else:
            figs = "; ".join(r.figure(goal) for r in applied if r.c in missed)
            out.append(f"- MISS: {GOALS[goal]}: {figs}.")
    return out


# ---- the simulators against their profile --------------------------------------------------------


def _batch(profile: Profile, mode: str, c: int) -> int:
    m = profile.mode(mode)
    return min(c, m.max_running_requests or DEFAULT_RUNNING_LIMIT[mode])


def expected_tput(profile: Profile, mode: str, c: int) -> float:
    """Output tok/s the profile predicts for one server with ``c`` clients (decode only)."""
    return profile.mode(mode).throughput_at(_batch(profile, mode, c))


SCHEDULE_TEXT = (
    "Measured p50 TPOT and tok/s of the single servers (and of the homogeneous pairs, each server "
    "holding about C/2) against the profile's decode-only prediction (batch = min(C, running-"
    "request limit), TPOT = batch / throughput(batch)). A baseline TPOT near 1.00x means the "
    "simulator kept its schedule and the client kept up; prefill steps that pause decoding make "
    "the measured TPOT somewhat higher and tok/s somewhat lower. A CPU that cannot keep up would "
    "show as the baseline's TPOT well above 1.00x."
)


def schedule_table(records: Sequence[Record], profile: Profile) -> str:
    """SCHEDULE_TEXT's table, from model-time records."""
    head = ["target", "C", "per server", "TPOT p50 ms", "profile TPOT ms", "measured / profile",
            "tok/s", "profile tok/s", "measured / profile", "achieved C"]  # fmt: skip
    body = []
    for r in records:
        t, c = str(r["target"]), int(r["max_concurrency"])
        if t in ("eagle", "baseline"):
            mode, per = t, c
        elif t in ("2x-eagle", "2x-baseline"):
            mode, per = t[3:], max(1, math.ceil(c / 2))
        else:
            continue
        # The p50 TPOT the profile predicts for one server holding ``per``.
        want = 1000.0 * _batch(profile, mode, per) / expected_tput(profile, mode, per)
        # Two servers with an odd C: one holds ceil(C/2), the other floor(C/2).
        tput = expected_tput(profile, mode, per) + (
            expected_tput(profile, mode, c - per) if c > per else 0.0
        )
        got = float(r["output_throughput"])
        tpot = r["median_tpot_ms"]
        body.append([t, str(c), str(per), f"{tpot:.2f}", f"{want:.2f}", f"{tpot / want:.3f}",
                     f"{got:.1f}", f"{tput:.1f}", f"{got / tput:.3f}",
                     cell(r.get("concurrency"))])  # fmt: skip
    return "\n".join(table(head, body)) + "\n"


def prompts_text(meta: Record) -> str:
    text = (
        f"random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens"
    )
    ratio = meta.get("random_range_ratio")
    if ratio is not None and float(ratio) < 1.0:
        return text + f" (each uniform from {float(ratio):g}x that)"
    return text + " (fixed)"


def suggestion_section(model: Sequence[Record]) -> list[str]:
    """``suggest-threshold`` on the run's single-server sweeps, if it has both."""
    eagle = [r for r in model if r.get("target") == "eagle"]
    baseline = [r for r in model if r.get("target") == "baseline"]
    if not (eagle and baseline):
        return []
    title = "## SIMULATED: threshold suggestion from the single-server sweeps"
    return [title, "", threshold.render(threshold.suggest(eagle, baseline)), ""]


# ---- report ------------------------------------------------------------------------------------


def _tok(r: GoalRow, way: str) -> str:
    """A way's tok/s: the median, and the min-max over the repeats where there are several."""
    return r.spread[way].cell(1) if way in r.spread else f"{r.tput[way]:.1f}"


def goal_table(rows: Sequence[GoalRow]) -> str:
    head = ["C", f"{SUBJECT} tok/s", "best pair", "best pair tok/s", f"{SUBJECT} / best tok/s",
            f"{SUBJECT} / best TPOT", "split-threshold tok/s", f"{SUBJECT} / split",
            f">= {VS_BEST_TPUT}x best", f"TPOT <= {VS_BEST_TPOT}x",
            f">= {VS_SPLIT_GAIN}x split"]  # fmt: skip
    body = [
        [str(r.c), _tok(r, SUBJECT), r.best_pair, _tok(r, r.best_pair), f"{r.vs_best_tput:.3f}",
         f"{r.vs_best_tpot:.3f}", cell(r.tput.get("split-threshold", math.nan)),
         cell(r.vs_split_tput, 3), *(MARK[r.checks[goal]] for goal in GOALS)]
        for r in rows
    ]  # fmt: skip
    return "\n".join(table(head, body)) + "\n"


def way_table(records: Sequence[Record], ways: Sequence[str], key: str, unit: str) -> str:
    """``key`` per C (rows) and way (columns): the median over the repeats, with their min-max
    where there are several ("-" where the way has none)."""
    digits = 2 if key.endswith("_ms") else 1
    head = [f"{w} {unit}" for w in ways]
    return "\n".join(level_table(stats(records, key), ways, digits, head)) + "\n"


def _repeats(records: Sequence[Record]) -> int:
    return max((int(r.get("repeat") or 1) for r in records), default=1)


def _repeats_lines(records: Sequence[Record]) -> list[str]:
    n = _repeats(records)
    if n == 1:
        return []
    return [
        f"- {n} repeats, each on simulators and routers started afresh (repeat r seeded the "
        "simulators and the prompts with `--seed` + r - 1), each level's ways in turn within a "
        "repeat. Cells are the median over the repeats (min-max); the goals judge the medians."
    ]


def _threshold_record(records: Sequence[Record]) -> Record | None:
    return next((r for r in records if r.get("threshold") is not None), None)


def _threshold_line(records: Sequence[Record]) -> str:
    thr_rec = _threshold_record(records)
    if thr_rec is None:
        return "- split-threshold / paired-threshold: not run."
    thr = int(thr_rec["threshold"])
    if thr <= 0:
        return (
            "- split-threshold / paired-threshold: baseline servers only: `suggest-threshold` "
            "found that EAGLE never wins, and the threshold policy cannot send every request "
            "to the baseline."
        )
    how = (
        "set by hand (`--threshold`/`--hysteresis`)"
        if thr_rec.get("threshold_by_hand")
        else "picked by `suggest-threshold` from the single-server sweeps below"
    )
    cross = thr_rec.get("crossover")
    at = f"; crossover C={float(cross):.1f}" if cross is not None else ""
    # Each repeat suggests its own: said where they differ (the goals use the first's).
    each = {
        int(r.get("repeat") or 1): (r.get("threshold"), r.get("hysteresis"), r.get("crossover"))
        for r in records
        if r.get("threshold") is not None
    }
    differ = len(set(each.values())) > 1
    per = "; per repeat (threshold, hysteresis, crossover): " + ", ".join(
        f"#{k} {t}/{h}/{cell(x)}" for k, (t, h, x) in sorted(each.items())
    )
    return (
        f"- split-threshold / paired-threshold: `--threshold {thr} --hysteresis "
        f"{thr_rec.get('hysteresis')}`, {how}{at}{per if differ else ''}."
    )


def _judged(records: Sequence[Record]) -> tuple[list[Record], list[str], list[GoalRow], Profile]:
    """The model-time records judged, the notes on ways absent, the goal rows, the profile."""
    profile = load_profile(str(records[0].get("profile", "demo")))
    model, notes = comparable([model_time(r) for r in records], profile)
    thr_rec = _threshold_record(model)
    thr = int(thr_rec["threshold"]) if thr_rec is not None else 0
    cross = thr_rec.get("crossover") if thr_rec is not None else None
    return model, notes, evaluate(model, thr, cross), profile


def _servers_lines(records: Sequence[Record], ran: Sequence[str]) -> list[str]:
    """Which ways ran on simulators of their own (``way_servers``; older records have none)."""
    used = next((r["way_servers"] for r in records if r.get("way_servers")), None)
    if not used:
        return []
    own = [w for w in ran if used.get(w, {}).get("set", SHARED) != SHARED]
    if not own:
        return ["- Every way ran on the same simulators, one after the other."]
    return [
        f"- Simulators of their own (no other way's load on what their routers learn from): "
        f"{', '.join(f'`{w}`' for w in own)}; the other ways shared theirs, one after the other."
    ]


def _header(records: Sequence[Record], ran: Sequence[str], notes: Sequence[str]) -> list[str]:
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    levels = sorted({int(r["max_concurrency"]) for r in records})
    adaptive = meta.get("adaptive_profile") if "2x-adaptive" in ran else None
    return [
        f"Command: `{meta.get('command') or 'dynspec-bench envelope --eight-gpus --simulate'}`",
        "",
        report.machine_line(
            records, "the client, the routers and the simulators", " at the levels' starts"
        ),
        *report.code_lines(records),
        f"- Simulated time ran {speed:g}x wall-clock (`--speed {speed:g}`); every figure is in "
        "model time (wall-clock durations x speed, rates / speed). The router's own cost is "
        "wall-clock, so it counts that many times over in model time.",
        f"- Closed-loop clients, {prompts_text(meta)}; per level "
        f"{meta.get('requests_per_c', '?')} x C measured requests (at least "
        f"{meta.get('min_requests', '?')}) after C warm-up requests; throughputs over the steady "
        f"window; levels {','.join(map(str, levels))}.",
        f"- Ways run: {', '.join(f'`{w}`' for w in ran)}. "
        + WAY_TEXT.format(speed=speed, auto_start=AUTO_START[bool(meta.get("calibrated"))])
        + (f" `2x-adaptive` ran profile `{adaptive}`'s eagle mode." if adaptive else ""),
        *_servers_lines(records, ran),
        *_repeats_lines(records),
        _threshold_line(records),
        *[f"- {n}." for n in notes],
        *report.run_time_lines(records),
        "",
    ]


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """``out``'s Markdown report and plot, from the level records alone (so a rerender works)."""
    if not records:
        raise ValueError(f"{out}: no levels")
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    model, notes, rows, profile = _judged(records)
    routed = [r for r in model if r.get("target") in EIGHT_WAYS]
    ran = [w for w in EIGHT_WAYS if any(r["target"] == w for r in routed)]
    # The ways absent get their column too, and the line that says why under the table.
    absent = [w for w in EIGHT_WAYS if any(n.split(": ")[1] == w for n in notes)]
    columns = [w for w in EIGHT_WAYS if w in ran or w in absent]
    why = [f"- {n}." for n in notes]
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    sharing = meta.get("sharing", "timeslice")
    title = f"SIMULATED: eight GPUs, {len(ran)} ways, profile {profile.name}, pairs {sharing}"
    title += ", paired-auto calibrated" if meta.get("calibrated") else ""
    n = _repeats(records)
    each = f", medians of {n} repeats (min-max)" if n > 1 else ""
    report.plot(routed, png, f"{title} (dynspec-sim, model time, speed {speed:g}{each})")
    goals = (
        verdict_lines(rows)
        if rows
        else [f"- Not evaluated: the run lacks `{SUBJECT}` or every homogeneous pair."]
    )
    text = [
        f"# {title}",
        "",
        "**SIMULATED.** `dynspec-sim` servers (no GPU, no model; each stands for four GPUs, a "
        "`--pair` simulator for four GPUs holding an EAGLE and a baseline server that share them "
        f"by `{sharing}`) and real `dynspec-router` processes, on a CPU-only machine. Profile "
        f"`{profile.name}`{' (ILLUSTRATIVE, not measured)' if profile.illustrative else ''}.",
        "",
        f"Profile source: {profile.source}",
        "",
        *_header(records, ran, notes),
        f"## SIMULATED: the goals for `{SUBJECT}`",
        "",
        *goals,
        "",
        *([goal_table(rows)] if rows else []),
        "## SIMULATED: output tok/s per way (model time)",
        "",
        way_table(routed, columns, "output_throughput", "tok/s"),
        *([*why, ""] if absent else []),
        "## SIMULATED: p50 TPOT per way (ms, model time)",
        "",
        way_table(routed, columns, "median_tpot_ms", "TPOT p50 ms"),
        *suggestion_section(model),
        "## SIMULATED: did the simulators keep their schedule?",
        "",
        SCHEDULE_TEXT,
        "",
        schedule_table(model, profile),
        report.markdown_table(
            [model_time(r) for r in records],
            "SIMULATED: all levels (model time"
            + ("; every repeat, in the order run)" if n > 1 else ")"),
        ),
    ]
    md.write_text("\n".join(text), encoding="utf-8")
    return md, png


def summary(records: Sequence[Record]) -> str:
    """The goal table in model time and the PASS/MISS lines, for the terminal."""
    if not records:
        return "no levels\n"
    _, notes, rows, _ = _judged(records)
    if not rows:
        return f"SIMULATED: {SUBJECT} or every homogeneous pair missing at every level: no goal\n"
    lines = [*verdict_lines(rows), *[f"- {n}." for n in notes]]
    return "SIMULATED\n" + goal_table(rows) + "\n".join(lines) + "\n"


def is_eight_gpus(records: Sequence[Record]) -> bool:
    return any(r.get("experiment") == EXPERIMENT or r.get("target") in EIGHT_WAYS for r in records)
