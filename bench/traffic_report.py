"""The traffic experiment's report and pictures from ``slo.records``' records, each cell the
median of the repeats (min-max); the goals (issue 39): docs/benchmarks.md, "Open-loop traffic".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dynspec.bench import report
from dynspec.bench.report import Record

ROUTED = "routed"
SINGLES = ("eagle", "baseline")
ATTAINMENT_SLACK = 0.02
SWITCHES_PER_MIN = 6.0


def schedules(records: Sequence[Record]) -> list[str]:
    return list(dict.fromkeys(str(r.get("schedule")) for r in records))


def targets(records: Sequence[Record]) -> list[str]:
    present = {str(r.get("target")) for r in records}
    return [t for t in (ROUTED, *SINGLES) if t in present] + sorted(present - {ROUTED, *SINGLES})


def runs(records: Sequence[Record], schedule: str, target: str, scope: str = "run") -> list[Record]:
    """``target``'s records under ``schedule``: whole runs, or windows (``scope="window"``)."""
    want = (scope, schedule, target)
    return [r for r in records if (r.get("scope"), r.get("schedule"), r.get("target")) == want]


def windows(records: Sequence[Record], schedule: str, target: str) -> dict[int, list[Record]]:
    """The window records of ``target`` under ``schedule``, by window, one per repeat."""
    out: dict[int, list[Record]] = {}
    for r in runs(records, schedule, target, "window"):
        out.setdefault(int(r["window"]), []).append(r)
    return dict(sorted(out.items()))


def _mid(recs: Sequence[Record], key: str) -> float | None:
    m = report.spread_of(recs, key)
    return m.median if m else None


def is_sweep(name: str) -> bool:
    return name.startswith("rate-")


# ---- goals -------------------------------------------------------------------------------------


def _better(per: dict[str, float | None]) -> tuple[str, float] | None:
    known = [(t, v) for t, v in per.items() if t in SINGLES and v is not None]
    return max(known, key=lambda tv: tv[1]) if known else None


def window_goal(got: Sequence[Record], name: str, label: str) -> tuple[bool | None, list[str]]:
    """Every window: ``label``'s attainment >= the better single's (medians) minus the slack."""
    routed = windows(got, name, label)
    singles = {t: windows(got, name, t) for t in SINGLES}
    misses, judged = [], 0
    for k, recs in routed.items():
        mine = _mid(recs, "slo_attainment")
        best = _better({t: _mid(w.get(k, []), "slo_attainment") for t, w in singles.items()})
        if mine is None or best is None:
            continue
        judged += 1
        if mine < best[1] - ATTAINMENT_SLACK:
            t0 = recs[0].get("t0_s")
            misses.append(f"window {k} (t={t0}s) {mine:.3f} < {best[0]} {best[1]:.3f} - 0.02")
    return (not misses if judged else None), misses


def goals(records: Sequence[Record], routed: str = ROUTED) -> list[tuple[str, bool | None, str]]:
    """``(goal, passed, detail)`` of ``routed`` (or a variant) per goal judged (None: not)."""
    out: list[tuple[str, bool | None, str]] = []
    names = schedules(records)
    for name in [n for n in names if not is_sweep(n)]:
        ok, misses = window_goal(records, name, routed)
        detail = "; ".join(misses[:4]) + (f" (+{len(misses) - 4} more)" if len(misses) > 4 else "")
        if ok is None:
            detail = "not judged: no window had routed and a single server both"
        out.append((f"`{name}`: routed SLO attainment >= better single - 0.02, every window",
                    ok, detail or "every window"))  # fmt: skip
        mine = _mid(runs(records, name, routed), "goodput")
        best = _better({t: _mid(runs(records, name, t), "goodput") for t in SINGLES})
        if mine is not None and best is not None and best[1] > 0:
            ratio = mine / best[1]
            out.append((f"`{name}`: routed goodput >= 1.0x the better single's", ratio >= 1.0,
                        f"{ratio:.3f}x {best[0]} ({mine:.2f} vs {best[1]:.2f} req/s)"))  # fmt: skip
    if sweep := sorted((float(_rate_of(records, n) or 0.0), n) for n in names if is_sweep(n)):
        low, high = sweep[0][1], sweep[-1][1]
        mine = _mid(runs(records, low, routed), "median_tpot_ms")
        eagle = _mid(runs(records, low, "eagle"), "median_tpot_ms")
        if mine is not None and eagle:
            ratio = mine / eagle
            out.append((f"lowest rate ({low}): routed p50 TPOT within 5% of EAGLE alone",
                        ratio <= 1.05, f"{ratio:.3f}x ({mine:.2f} vs {eagle:.2f} ms)"))  # fmt: skip
        mine = _mid(runs(records, high, routed), "output_throughput")
        base = _mid(runs(records, high, "baseline"), "output_throughput")
        if mine is not None and base:
            ratio = mine / base
            out.append((f"highest rate ({high}): routed tok/s >= 0.95x baseline alone",
                        ratio >= 0.95, f"{ratio:.3f}x ({mine:,.0f} vs {base:,.0f})"))  # fmt: skip
    flaps = [(name, _mid(runs(records, name, routed), "switches_per_min")) for name in names]
    flaps = [(n, v) for n, v in flaps if v is not None]
    if flaps:
        worst = max(flaps, key=lambda nv: nv[1] or 0.0)
        out.append((f"routed: at most {SWITCHES_PER_MIN:g} mode switches a minute, every schedule",
                    (worst[1] or 0.0) <= SWITCHES_PER_MIN,
                    f"worst {worst[0]}: {worst[1]:.1f} a minute"))  # fmt: skip
    return out


def _rate_of(records: Sequence[Record], name: str) -> float | None:
    recs = [r for r in records if r.get("scope") == "run" and r.get("schedule") == name]
    return float(recs[0]["scheduled_rate"]) if recs else None


# ---- tables ------------------------------------------------------------------------------------

# The run table's columns: (the record's key, the header, digits).
RUN_COLUMNS: Sequence[tuple[str, str, int]] = (
    ("goodput", "goodput req/s", 2), ("slo_attainment", "SLO attained", 3),
    ("output_throughput", "tok/s", 0), ("median_tpot_ms", "TPOT p50 ms", 1),
    ("p99_tpot_ms", "TPOT p99 ms", 1), ("median_ttft_ms", "TTFT p50 ms", 0),
    ("p99_ttft_ms", "TTFT p99 ms", 0), ("eagle_share", "on EAGLE", 2),
    ("switches_per_min", "switches/min", 1), ("shed", "shed", 0), ("failed", "failed", 0),
    ("cut", "cut", 0),
)  # fmt: skip


def run_table(records: Sequence[Record], name: str) -> list[str]:
    body = []
    for t in targets(records):
        if recs := runs(records, name, t):
            spreads = [(report.spread_of(recs, k), d) for k, _, d in RUN_COLUMNS]
            cells = [m.cell(d, same_once=True) if m else "-" for m, d in spreads]
            body.append([t, str(len(recs)), *cells])
    return report.table(["target", "repeats", *(c[1] for c in RUN_COLUMNS)], body)


def window_table(records: Sequence[Record], name: str) -> list[str]:
    ts = targets(records)
    by = {t: windows(records, name, t) for t in ts}
    cols = ["window (s)", "rate sched / offered", "routed on EAGLE", "switches"]
    # A learned threshold moves: its range over the window in every repeat (sampled runs only).
    learned = any("threshold_min" in r for w in by.get(ROUTED, {}).values() for r in w)
    cols += ["threshold (all repeats)"] if learned else []
    cols += [f"{t} attained" for t in ts] + [f"{t} TPOT p50/p99" for t in ts]
    body = []
    first = by[ts[0]] if ts else {}
    for k, recs in first.items():
        r0 = recs[0]
        routed = by.get(ROUTED, {}).get(k, [])
        row = [
            f"{r0['t0_s']:g}-{r0['t1_s']:g}",
            f"{_med(recs, 'scheduled_rate', 2)} / {_med(recs, 'offered_rate', 2)}",
            _med(routed, "eagle_share", 2),
            _med(routed, "mode_switches", 0),
            *([_range(routed)] if learned else []),
        ]
        per = [by[t].get(k, []) for t in ts]
        row += [_med(w, "slo_attainment", 3) for w in per]
        row += [f"{_med(w, 'median_tpot_ms', 1)} / {_med(w, 'p99_tpot_ms', 1)}" for w in per]
        body.append(row)
    return report.table(cols, body)


def _range(recs: Sequence[Record]) -> str:
    """The threshold's lowest and highest reading in these windows, ``-`` where none."""
    lo = [r["threshold_min"] for r in recs if "threshold_min" in r]
    hi = [r["threshold_max"] for r in recs if "threshold_max" in r]
    if not lo or not hi:
        return "-"
    a, b = min(lo), max(hi)
    return f"{a:g}" if a == b else f"{a:g}-{b:g}"


def _med(recs: Sequence[Record], key: str, digits: int) -> str:
    """The median of the repeats, a number only (the tables of windows are wide already)."""
    return report.cell(_mid(recs, key), digits, thousands=True)


def overload_lines(records: Sequence[Record]) -> list[str]:
    """Per run with shed requests: what every request got, whether any was lost, the memory."""
    lines = []
    for r in records:
        if r.get("scope") != "run" or not (r.get("shed") or r.get("cut")):
            continue
        rss = r.get("router_rss_mib") or {}
        mem = "no RSS"
        if rss:
            steps = " -> ".join(map(str, [rss["first"], *rss.get("quarters", []), rss["last"]]))
            mem = f"router RSS {steps} MiB (max {rss['max']})"
        lines.append(
            f"- {r['schedule']} #{r['repeat']} {r['target']}: {r['requests']} requests, statuses "
            f"{r.get('statuses')}, {r.get('shed_without_retry_after')} shed without Retry-After, "
            f"{r.get('cut')} cut, errors {r.get('errors')}; served TTFT p99 "
            f"{report.cell(r.get('p99_ttft_ms'), 0, thousands=True)} ms, max "
            f"{report.cell(r.get('max_ttft_ms'), 0, thousands=True)} ms; {mem}."
        )
    return lines


# ---- the report --------------------------------------------------------------------------------


def _label(records: Sequence[Record]) -> str:
    return "SIMULATED" if records and records[0].get("simulated") else "MEASURED"


def header(records: Sequence[Record]) -> list[str]:
    r0 = records[0]
    label = _label(records)
    repeats = max(int(r.get("repeat", 1)) for r in records)
    where = (
        f"profile `{r0.get('profile')}`, layout `{r0.get('layout')}`, routed: "
        f"`{router_of(records, ROUTED)}`"
        if r0.get("simulated")
        else f"targets {', '.join(targets(records))}"
    )
    lines = [
        f"# {label}: open-loop traffic, {where}",
        "",
        f"**{label}.** Open-loop arrivals (burstiness {r0.get('burstiness')}: gamma shape, 1 = "
        f"Poisson), SLOs TTFT <= {r0.get('slo_ttft_ms')} ms and TPOT <= {r0.get('slo_tpot_ms')} "
        f"ms, windows of {r0.get('window_s')} s, {repeats} repeats (targets interleaved, the "
        "order rotated each repeat; every target of a repeat got the same arrivals). Cells: the "
        "median of the repeats (min-max).",
        "",
        f"Command: `{r0.get('command', '')}`",
        "",
    ]
    if r0.get("simulated"):
        lines.append(
            f"- Time: model time; the simulators ran {r0.get('speed')}x wall-clock. Every run "
            "had simulators (and, routed, a router) started fresh for it alone."
        )
        lines.append(report.machine_line(records, "the client, routers and simulators"))
    else:
        lines.append(measured_line(records))
    lines += report.code_lines(records)
    lines += report.run_time_lines(records)
    return [*lines, ""]


def measured_line(records: Sequence[Record]) -> str:
    """What a real run ran on: the GPU plan's fields where it wrote them."""
    r0 = records[0]
    facts = [f"GPU {r0['gpu']}" if r0.get("gpu") else "GPU not recorded"]
    for key, text in (("plan", "`dynspec-bench gpu run --plan {}`"), ("draft", "EAGLE draft `{}`")):
        if r0.get(key):
            facts.append(text.format(r0[key]))
    if r0.get("mps") is not None:
        facts.append("under MPS" if r0["mps"] else "without MPS")
    if r0.get("peak_rps"):
        facts.append(f"the day's peak {float(r0['peak_rps']):.1f} req/s")
    if commits := sorted({str(r["commit"]) for r in records if r.get("commit")}):
        facts.append(f"code {', '.join(commits)}")
    if launches := sorted({int(r["launch"]) for r in records if r.get("launch")}):
        facts.append(f"{len(launches)} launch{'es' if len(launches) > 1 else ''}")
    return "- Ran on: " + ", ".join(facts) + "."


def render(records: Sequence[Record]) -> str:
    lines = header(records)
    lines += ["## Goals", "", *verdicts(records, ROUTED, "- "), ""]
    for name in variants(records):
        flags = router_of(records, name)
        lines += [f"## Goals: `{name}` (router `{flags}`)", "", *verdicts(records, name, "- "), ""]
    for name in schedules(records):
        text = next((r.get("schedule_text") for r in records if r.get("schedule") == name), "")
        lines += [f"## `{name}` ({text})", "", *run_table(records, name), ""]
        if not is_sweep(name):
            lines += [*window_table(records, name), ""]
    if over := overload_lines(records):
        lines += ["## Shed and cut requests", "", *over, ""]
    return "\n".join(lines)


def verdicts(records: Sequence[Record], routed: str = ROUTED, lead: str = "") -> list[str]:
    """``PASS|MISS|-: goal: detail`` for every goal (``-``: not judged), each after ``lead``."""
    return [f"{lead}{report.MARK[ok]}: {g}: {d}" for g, ok, d in goals(records, routed)]


def router_of(records: Sequence[Record], label: str) -> str:
    """The router flags a simulated routed target (``label``) ran with, ``?`` where none."""
    return next((str(r.get("router", "?")) for r in records if r.get("target") == label), "?")


def variants(records: Sequence[Record]) -> list[str]:
    return [t for t in targets(records) if t not in (ROUTED, *SINGLES)]  # traffic --variant


def summary(records: Sequence[Record]) -> str:
    more = [v for t in variants(records) for v in verdicts(records, t, f"{t}: ")]
    return "".join(f"{v}\n" for v in [*verdicts(records), *more])


COLORS = {"routed": "tab:green", "eagle": "tab:blue", "baseline": "tab:orange"}
MORE_COLORS = ("tab:purple", "tab:red", "tab:brown", "tab:pink", "tab:olive")  # variants, labels


def _color(records: Sequence[Record], t: str) -> str:
    """Every target but routed and the singles is a variant (``targets``, ``variants``)."""
    return COLORS.get(t) or MORE_COLORS[variants(records).index(t) % len(MORE_COLORS)]


def _series(
    records: Sequence[Record], name: str, target: str, key: str
) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for recs in windows(records, name, target).values():
        v = _mid(recs, key)
        if v is not None:
            xs.append((float(recs[0]["t0_s"]) + float(recs[0]["t1_s"])) / 2)
            ys.append(v)
    return xs, ys


def plot_series(records: Sequence[Record], name: str, path: Path) -> None:
    """Rate and the routed pool share on top; TPOT p50 and p99 of every target below, then
    every target's SLO attainment."""
    title = f"{_label(records)}: open-loop `{name}`, medians of repeats"
    with report.figure(path, title, 3, 1, figsize=(10, 9), sharex=True) as (_, axes):
        top, bottom, slo = axes
        rate = _series(records, name, targets(records)[0], "scheduled_rate")
        top.plot(*rate, color="gray", label="scheduled rate")
        offered = _series(records, name, ROUTED, "offered_rate")
        top.plot(*offered, color="black", linestyle=":", label="offered rate")
        top.set_ylabel("requests / s")
        share = top.twinx()
        on_eagle = _series(records, name, ROUTED, "eagle_share")
        share.plot(*on_eagle, color=COLORS["routed"], label="routed: share on EAGLE")
        share.set_ylim(-0.05, 1.05)
        share.set_ylabel("routed share on EAGLE")
        top.legend(loc="upper left")
        share.legend(loc="upper right")
        for t in targets(records):
            for key, style, q in (("median_tpot_ms", "-", "p50"), ("p99_tpot_ms", "--", "p99")):
                tpot = _series(records, name, t, key)
                bottom.plot(*tpot, color=_color(records, t), linestyle=style, label=f"{t} {q}")
        bottom.set_ylabel("TPOT ms")
        bottom.set_yscale("log")
        bottom.legend(ncol=3, fontsize="small")
        for t in targets(records):
            attained = _series(records, name, t, "slo_attainment")
            slo.plot(*attained, color=_color(records, t), marker="o", markersize=3, label=t)
        slo.set_ylim(-0.05, 1.05)
        slo.set_ylabel("SLO attainment")
        slo.set_xlabel("time (s)")
        slo.legend(ncol=3, fontsize="small")


def plot_sweep(records: Sequence[Record], path: Path) -> None:
    """Goodput and p99 TPOT against the request rate, one line per target with min-max bars."""
    names = [n for n in schedules(records) if is_sweep(n)]
    title = f"{_label(records)}: open-loop rate sweep, medians of repeats (min-max)"
    with report.figure(path, title, 1, 2, figsize=(11, 4.5)) as (_, (left, right)):
        for t in targets(records):
            for ax, key in ((left, "goodput"), (right, "p99_tpot_ms")):
                pts = []
                for n in names:
                    m = report.spread_of(runs(records, n, t), key)
                    rate = _rate_of(records, n)
                    if m is not None and rate is not None:
                        pts.append((rate, m))
                if pts:
                    pts.sort(key=lambda p: (p[0], p[1].median))
                    xs, spreads = [x for x, _ in pts], [m for _, m in pts]
                    report.errorbars(ax, xs, spreads, color=_color(records, t), label=t)
        left.set_xlabel("request rate (req/s)")
        left.set_ylabel("goodput (req/s meeting both SLOs)")
        right.set_xlabel("request rate (req/s)")
        right.set_ylabel("p99 TPOT ms")
        right.set_yscale("log")
        left.legend()


def pictures(records: Sequence[Record], out: Path) -> list[Path]:
    made = []
    for name in schedules(records):
        if not is_sweep(name):
            path = out.with_name(f"{out.stem}-{name}.png")
            plot_series(records, name, path)
            made.append(path)
    if any(is_sweep(n) for n in schedules(records)):
        path = out.with_name(f"{out.stem}-sweep.png")
        plot_sweep(records, path)
        made.append(path)
    return made


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """OUT.md and the pictures (OUT-NAME.png per time series, OUT-sweep.png); returns the
    Markdown and the first picture."""
    md = out.with_suffix(".md")
    made = pictures(records, out)
    text = render(records)
    if made:
        text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made) + "\n"
    md.write_text(text, encoding="utf-8")
    return md, (made[0] if made else md)
