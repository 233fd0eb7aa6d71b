"""The eight-GPU comparison's goals and report (pure but for writing the files).

Goals (issue 16 item 6), per concurrency C, for ``paired-auto`` (two shared-GPU pairs, the router
learning each pair's threshold):

- ``best``: tok/s >= 0.95x the best homogeneous pair's (``2x-eagle``, ``2x-baseline``,
  ``2x-adaptive``: whichever served most at that C), at every C;
- ``tpot``: p50 TPOT <= 1.05x that best pair's, at every C below the crossover (where EAGLE stops
  paying: ``suggest-threshold``'s crossover, else the threshold);
- ``split``: tok/s >= 1.3x ``split-threshold``'s, at every C >= 2 x the threshold.

Each goal is PASS (met at every C where it applies), MISS (with the Cs and figures), or not
evaluated. Records of the older four-way run (``routed-threshold``, ``routed-balance``) read as
``split-threshold`` and ``split-balance``. Everything is SIMULATED.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dynspec.bench import report, threshold
from dynspec.bench.envelope import expected_tpot_ms
from dynspec.bench.report import Record, model_time
from dynspec.bench.ways import EIGHT_WAYS, HOMOGENEOUS, OLD_NAMES
from dynspec.launcher.sim.profile import Profile, load_profile

WAYS = EIGHT_WAYS
SINGLES = ("eagle", "baseline")

VS_BEST_TPUT = 0.95  # paired-auto tok/s >= 0.95x the best homogeneous pair's, every C
VS_BEST_TPOT = 1.05  # paired-auto p50 TPOT <= 1.05x the best's, C below the crossover
VS_SPLIT_GAIN = 1.3  # paired-auto tok/s >= 1.3x split-threshold's, C >= 2 x threshold
SUBJECT = "paired-auto"

WAY_TEXT = (
    "`split-threshold` / `split-balance` = one EAGLE + one baseline server on GPUs of their own "
    "(`split-balance` got the profile as `--speed-profile`, its tok/s x {speed:g}); "
    "`paired-threshold` / `paired-auto` = two shared-GPU pairs behind `--pair` (`--threshold N` / "
    "`--threshold auto`, no profile); `2x-*` = two servers of one kind in one pool."
)

GOALS = {
    "best": f"{SUBJECT} tok/s >= {VS_BEST_TPUT}x the best homogeneous pair's, every C",
    "tpot": f"{SUBJECT} p50 TPOT <= {VS_BEST_TPOT}x the best pair's, C below the crossover",
    "split": f"{SUBJECT} tok/s >= {VS_SPLIT_GAIN}x split-threshold's, C >= 2 x threshold",
}


def normalise(records: Sequence[Record]) -> list[Record]:
    """Records with the old four-way names read as the new ones (copies; pure)."""
    out = []
    for r in records:
        t = str(r.get("target"))
        out.append({**r, "target": OLD_NAMES[t]} if t in OLD_NAMES else dict(r))
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


@dataclass(frozen=True)
class GoalRow:
    """paired-auto against the best homogeneous pair and split-threshold at one C."""

    c: int
    tput: Mapping[str, float]  # way -> output tok/s
    tpot: Mapping[str, float]  # way -> p50 TPOT ms
    best_pair: str
    vs_best_tput: float
    vs_best_tpot: float
    vs_split_tput: float
    # Goal -> met (True/False), or None where the goal does not apply at this C.
    checks: Mapping[str, bool | None] = field(default_factory=dict)


def evaluate(records: Sequence[Record], thr: int, crossover: float | None = None) -> list[GoalRow]:
    """Per C where paired-auto and at least one homogeneous pair ran (records in model time;
    ratios do not depend on it). ``thr``: the threshold split-threshold ran with; ``crossover``:
    where EAGLE stops paying (None: ``thr``)."""
    by: dict[tuple[str, int], Record] = {
        (str(r["target"]), int(r["max_concurrency"])): r for r in normalise(records)
    }
    below = float(thr) if crossover is None else float(crossover)
    rows: list[GoalRow] = []
    for c in sorted({c for _, c in by}):
        homo = [w for w in HOMOGENEOUS if (w, c) in by]
        if (SUBJECT, c) not in by or not homo:
            continue
        ran = [w for w in WAYS if (w, c) in by]
        tput = {w: float(by[(w, c)]["output_throughput"]) for w in ran}
        tpot = {w: float(by[(w, c)]["median_tpot_ms"]) for w in ran}
        best = max(homo, key=lambda w: tput[w])
        auto = tput[SUBJECT]
        vs_split = _ratio(auto, tput["split-threshold"]) if "split-threshold" in tput else math.nan
        vs_tpot = _ratio(tpot[SUBJECT], tpot[best])
        checks: dict[str, bool | None] = {
            "best": _ratio(auto, tput[best]) >= VS_BEST_TPUT,
            "tpot": vs_tpot <= VS_BEST_TPOT if c < below else None,
            "split": (
                vs_split >= VS_SPLIT_GAIN
                if thr > 0 and c >= 2 * thr and not math.isnan(vs_split)
                else None
            ),
        }
        rows.append(
            GoalRow(
                c=c,
                tput=tput,
                tpot=tpot,
                best_pair=best,
                vs_best_tput=_ratio(auto, tput[best]),
                vs_best_tpot=vs_tpot,
                vs_split_tput=vs_split,
                checks=checks,
            )
        )
    return rows


def verdicts(rows: Sequence[GoalRow]) -> dict[str, tuple[bool | None, list[int]]]:
    """Per goal: met at every C where it applies (None: applies nowhere), and the Cs that miss."""
    out: dict[str, tuple[bool | None, list[int]]] = {}
    for goal in GOALS:
        applied = [(r.c, r.checks.get(goal)) for r in rows if r.checks.get(goal) is not None]
        missed = [c for c, ok in applied if not ok]
        out[goal] = (None if not applied else not missed, missed)
    return out


def _figure(goal: str, r: GoalRow) -> str:
    if goal == "best":
        return f"C={r.c} {r.vs_best_tput:.3f}x {r.best_pair}"
    if goal == "tpot":
        return f"C={r.c} {r.vs_best_tpot:.3f}x {r.best_pair}"
    return f"C={r.c} {r.vs_split_tput:.3f}x"


def verdict_lines(rows: Sequence[GoalRow]) -> list[str]:
    """One line per goal: PASS or MISS with the figures (the worst first for PASS)."""
    out = []
    for goal, (ok, missed) in verdicts(rows).items():
        applied = [r for r in rows if r.checks.get(goal) is not None]
        if ok is None:
            out.append(f"- not evaluated: {GOALS[goal]} (applies at no measured C).")
            continue
        if ok:
            key = {
                "best": lambda r: r.vs_best_tput,
                "tpot": lambda r: -r.vs_best_tpot,
                "split": lambda r: r.vs_split_tput,
            }[goal]
            worst = min(applied, key=key)
            out.append(f"- PASS: {GOALS[goal]} (worst: {_figure(goal, worst)}).")
        else:
            figs = "; ".join(_figure(goal, r) for r in applied if r.c in missed)
            out.append(f"- MISS: {GOALS[goal]}: {figs}.")
    return out


# ---- report ------------------------------------------------------------------------------------


def _f(v: float, digits: int = 1) -> str:
    return "-" if math.isnan(v) else f"{v:.{digits}f}"


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def goal_table(rows: Sequence[GoalRow]) -> str:
    head = (
        f"| C | {SUBJECT} tok/s | best pair | best pair tok/s | {SUBJECT} / best tok/s"
        f" | {SUBJECT} / best TPOT | split-threshold tok/s | {SUBJECT} / split"
        f" | >= {VS_BEST_TPUT}x best | TPOT <= {VS_BEST_TPOT}x | >= {VS_SPLIT_GAIN}x split |"
    )
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        split = r.tput.get("split-threshold", math.nan)
        lines.append(
            f"| {r.c} | {r.tput[SUBJECT]:.1f} | {r.best_pair} | {r.tput[r.best_pair]:.1f}"
            f" | {r.vs_best_tput:.3f} | {r.vs_best_tpot:.3f} | {_f(split)}"
            f" | {_f(r.vs_split_tput, 3)} | {_mark(r.checks['best'])}"
            f" | {_mark(r.checks['tpot'])} | {_mark(r.checks['split'])} |"
        )
    return "\n".join(lines) + "\n"


def way_table(records: Sequence[Record], ways: Sequence[str], key: str, unit: str) -> str:
    """One column per way: ``key`` of each way's record at each C."""
    by = {(str(r["target"]), int(r["max_concurrency"])): r for r in records}
    levels = sorted({c for _, c in by})
    digits = 2 if key.endswith("_ms") else 1
    lines = ["| C | " + " | ".join(f"{w} {unit}" for w in ways) + " |"]
    lines.append("|" + " --- |" * (len(ways) + 1))
    for c in levels:
        cells = [f"{float(by[(w, c)][key]):.{digits}f}" if (w, c) in by else "-" for w in ways]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def expected_tput(profile: Profile, mode: str, per_server: int, servers: int) -> float:
    """Output tok/s the profile predicts for ``servers`` servers with ``per_server`` clients each
    (decode only: prefill pauses make the measured value somewhat lower)."""
    m = profile.mode(mode)
    limit = m.max_running_requests or (48 if mode == "eagle" else 1024)
    return servers * m.throughput_at(min(per_server, limit))


def schedule_table(records: Sequence[Record], profile: Profile) -> str:
    """Measured p50 TPOT and tok/s of the single servers and the homogeneous EAGLE and baseline
    pairs against the profile's prediction."""
    lines = [
        "| target | C | per server | TPOT p50 ms | profile TPOT ms | measured / profile"
        " | tok/s | profile tok/s | measured / profile |",
        "|" + " --- |" * 9,
    ]
    for r in records:
        t, c = str(r["target"]), int(r["max_concurrency"])
        if t in SINGLES:
            mode, per, n = t, c, 1
        elif t in ("2x-eagle", "2x-baseline"):
            mode, per, n = t[3:], max(1, math.ceil(c / 2)), 2
        else:
            continue
        want = expected_tpot_ms(profile, mode, per)
        # Two servers with an odd C: one holds ceil(C/2), the other floor(C/2).
        tput = expected_tput(profile, mode, per, 1) + (
            expected_tput(profile, mode, c - per, 1) if n == 2 and c > per else 0.0
        )
        got = float(r["output_throughput"])
        lines.append(
            f"| {t} | {c} | {per} | {r['median_tpot_ms']:.2f} | {want:.2f}"
            f" | {r['median_tpot_ms'] / want:.3f} | {got:.1f} | {tput:.1f} | {got / tput:.3f} |"
        )
    return "\n".join(lines) + "\n"


def _lengths(meta: Record) -> str:
    if meta.get("dataset_name") == "sharegpt":
        return "ShareGPT prompts"
    text = (
        f"random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens"
    )
    ratio = meta.get("random_range_ratio")
    if ratio is not None and float(ratio) < 1.0:
        return text + f" (each uniform from {float(ratio):g}x that)"
    return text + " (fixed)"


def machine_line(records: Sequence[Record], who: str) -> str:
    m = records[0].get("machine") or {}
    loads = [float(r["loadavg_1m"]) for r in records if r.get("loadavg_1m") is not None]
    load = (
        f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f} at the levels' starts"
        if loads
        else ""
    )
    return (
        f"- Machine: {m.get('cpus', '?')} CPUs ({m.get('cpu') or 'unknown CPU'}), "
        f"{m.get('platform', '?')}, Python {m.get('python', '?')}; {who} share it, and other "
        f"work ran on it at the same time{load}."
    )


def _runs_line(records: Sequence[Record]) -> str:
    runs: dict[str, tuple[set[str], str]] = {}
    for r in records:
        ts, _ = runs.setdefault(str(r.get("run_started", "?")), (set(), str(r.get("command", ""))))
        ts.add(str(r["target"]))
    if len(runs) <= 1:
        return ""
    parts = [
        f"{start}: {', '.join(sorted(ts))} (`{cmd}`)" for start, (ts, cmd) in sorted(runs.items())
    ]
    return (
        "- NOTE: these records come from more than one run: "
        + "; ".join(parts)
        + ". Ways from different runs did not share each level's time slot, so a change in the "
        "machine's load between the runs shows up as a difference between those ways."
    )


def _threshold_line(thr_rec: Record | None, thr: int) -> str:
    if thr_rec is None:
        return "- split-threshold / paired-threshold: not run."
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
    return (
        f"- split-threshold / paired-threshold: `--threshold {thr} --hysteresis "
        f"{thr_rec.get('hysteresis')}`, {how}{at}."
    )


def _crossover(model: Sequence[Record]) -> tuple[Record | None, int, float | None]:
    routed = [r for r in model if r.get("target") in WAYS]
    thr_rec = next((r for r in routed if r.get("threshold") is not None), None)
    thr = int(thr_rec["threshold"]) if thr_rec is not None else 0
    cross = thr_rec.get("crossover") if thr_rec is not None else None
    return thr_rec, thr, (float(cross) if cross is not None else None)


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """``out``'s Markdown report and plot, from the level records alone (so a rerender works)."""
    if not records:
        raise ValueError(f"{out}: no levels")
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    profile = load_profile(str(meta.get("profile", "demo")))
    model = normalise([model_time(r, speed) for r in records])
    routed = [r for r in model if r.get("target") in WAYS]
    thr_rec, thr, cross = _crossover(model)
    rows = evaluate(model, thr, cross)
    ways = [w for w in WAYS if any(r["target"] == w for r in routed)]
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    sharing = meta.get("sharing", "timeslice")
    title = f"SIMULATED: eight GPUs, {len(ways)} ways, profile {profile.name}, pairs {sharing}"
    report.plot(routed, png, f"{title} (dynspec-sim, model time, speed {speed:g})")
    eagle = [r for r in model if r.get("target") == "eagle"]
    baseline = [r for r in model if r.get("target") == "baseline"]
    suggestion = threshold.suggest(eagle, baseline) if eagle and baseline else None
    levels = sorted({int(r["max_concurrency"]) for r in records})
    runs = _runs_line(records)
    run_time = "" if runs else report.run_time_line(records)
    not_run = [str(n) for n in meta.get("not_run") or []]
    commits = sorted({str(r["code_commit"]) for r in records if r.get("code_commit")})
    adaptive = meta.get("adaptive_profile")
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
        f"Command: `{meta.get('command') or 'dynspec-bench envelope --eight-gpus --simulate'}`",
        "",
        machine_line(records, "the client, the routers and the simulators"),
        *([f"- Code: commit {', '.join(commits)}."] if commits else []),
        f"- Simulated time ran {speed:g}x wall-clock (`--speed {speed:g}`); every figure is in "
        "model time (wall-clock durations x speed, rates / speed). The router's own cost is "
        "wall-clock, so it counts that many times over in model time.",
        f"- Closed-loop clients, {_lengths(meta)}; per level {meta.get('requests_per_c', '?')} x "
        f"C measured requests (at least {meta.get('min_requests', '?')}) after C warm-up "
        f"requests; throughputs over the steady window; levels {','.join(map(str, levels))}.",
        f"- Ways run: {', '.join(f'`{w}`' for w in ways)}. "
        + WAY_TEXT.format(speed=speed)
        + (f" `2x-adaptive` ran profile `{adaptive}`'s eagle mode." if adaptive else ""),
        _threshold_line(thr_rec, thr),
        *[f"- Not run: {n}." for n in not_run],
        *([runs] if runs else []),
        *([run_time] if run_time else []),
        "",
        f"## SIMULATED: the goals for `{SUBJECT}`",
        "",
        *(
            verdict_lines(rows)
            if rows
            else [f"- Not evaluated: the run lacks `{SUBJECT}` or every homogeneous pair."]
        ),
        "",
        *([goal_table(rows)] if rows else []),
        "## SIMULATED: output tok/s per way (model time)",
        "",
        way_table(routed, ways, "output_throughput", "tok/s"),
        "## SIMULATED: p50 TPOT per way (ms, model time)",
        "",
        way_table(routed, ways, "median_tpot_ms", "TPOT p50 ms"),
    ]
    if suggestion is not None:
        text += [
            "## SIMULATED: threshold suggestion from the single-server sweeps",
            "",
            threshold.render(suggestion),
            "",
        ]
    text += [
        "## SIMULATED: did the simulators keep their schedule?",
        "",
        "Measured p50 TPOT and tok/s of the single servers and of the homogeneous pairs (each "
        "server holding about C/2) against the profile's decode-only prediction. A baseline TPOT "
        "near 1.00x means the simulator kept its schedule and the client kept up; tok/s falls "
        "short of the profile by the time spent in prefill steps. A CPU that cannot keep up "
        "would show as the baseline's TPOT well above 1.00x.",
        "",
        schedule_table(model, profile),
        report.markdown_table(model, "SIMULATED: all levels (model time)"),
    ]
    md.write_text("\n".join(text), encoding="utf-8")
    return md, png


def summary(records: Sequence[Record]) -> str:
    """The goal table in model time and the PASS/MISS lines, for the terminal."""
    if not records:
        return "no levels\n"
    speed = float(records[0].get("speed", 1.0))
    model = normalise([model_time(r, speed) for r in records])
    _, thr, cross = _crossover(model)
    rows = evaluate(model, thr, cross)
    if not rows:
        return f"SIMULATED: {SUBJECT} or every homogeneous pair missing at every level: no goal\n"
    return "SIMULATED\n" + goal_table(rows) + "\n".join(verdict_lines(rows)) + "\n"


def is_four_way(records: Sequence[Record]) -> bool:
    names = {*WAYS, *OLD_NAMES}
    return any(r.get("experiment") == "four-way" or r.get("target") in names for r in records)
