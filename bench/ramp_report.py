"""The ramp's evaluation and report (pure but for writing the files).

Each learning router is held against its profile-seeded twin (``ways.RAMP_PAIRS``):
``balance-learning`` against ``balance-profile`` (within 10%), ``paired-auto`` against
``paired-auto-seeded`` (within 5%, issue 16 item 6): after the first cycle, every later cycle's
tok/s >= (1 - within) x and p50 TPOT <= (1 + within) x the seeded one's. Everything is SIMULATED.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynspec.bench import simreport
from dynspec.bench.report import Record, table
from dynspec.bench.simreport import cell
from dynspec.bench.ways import RAMP_PAIRS, RAMP_VARIANTS
from dynspec.launcher.sim.profile import load_profile

VARIANTS = RAMP_VARIANTS
PAIRS = RAMP_PAIRS


@dataclass(frozen=True)
class StepRow:
    step: int
    cycle: int
    c: int
    start_s: float
    tput: dict[str, float]
    tpot: dict[str, float | None]
    learning: str = VARIANTS[0]
    seeded: str = VARIANTS[1]
    tolerance: float = PAIRS[0][2]

    def ratio(self, which: str) -> float:
        """learning / seeded, of tok/s (``tput``) or p50 TPOT (``tpot``)."""
        vals = self.tput if which == "tput" else self.tpot
        a, b = vals.get(self.learning), vals.get(self.seeded)
        if a is None or b is None or not b > 0:
            return math.nan
        return a / b


def compare(
    records: Sequence[Record], scope: str = "step", pair: tuple[str, str, float] = PAIRS[0]
) -> list[StepRow]:
    """Per step (or per cycle) where both variants of ``pair`` ran: their tok/s and p50 TPOT."""
    learning, seeded, tol = pair
    both = (learning, seeded)
    key = "step" if scope == "step" else "cycle"
    by: dict[int, dict[str, Record]] = {}
    for r in records:
        if r.get("scope") == scope and r.get("target") in both:
            by.setdefault(int(r[key]), {})[str(r["target"])] = r
    rows = []
    for k in sorted(by):
        got = by[k]
        if set(got) != set(both):
            continue
        any_rec = got[learning]
        rows.append(
            StepRow(
                step=k if scope == "step" else -1,
                cycle=int(any_rec["cycle"]),
                c=int(any_rec["max_concurrency"]),
                start_s=float(any_rec.get("step_start_s", 0.0)),
                tput={v: float(got[v]["output_throughput"]) for v in both},
                tpot={
                    v: None
                    if got[v].get("median_tpot_ms") is None
                    else float(got[v]["median_tpot_ms"])
                    for v in both
                },
                learning=learning,
                seeded=seeded,
                tolerance=tol,
            )
        )
    return rows


def within(row: StepRow) -> bool:
    """Learning's tok/s >= (1 - tol) x and p50 TPOT <= (1 + tol) x the seeded router's."""
    tp, tpot = row.ratio("tput"), row.ratio("tpot")
    return tp >= 1 - row.tolerance and (math.isnan(tpot) or tpot <= 1 + row.tolerance)


def pairs_run(records: Sequence[Record]) -> list[tuple[str, str, float]]:
    ran = {str(r.get("target")) for r in records}
    return [p for p in PAIRS if p[0] in ran and p[1] in ran]


def verdict(
    records: Sequence[Record], pair: tuple[str, str, float] = PAIRS[0]
) -> tuple[bool | None, str]:
    """After the first cycle: every later cycle's tok/s and p50 TPOT within the pair's tolerance
    of the seeded router's; PASS/MISS with the ratios."""
    later = [r for r in compare(records, "cycle", pair) if r.cycle >= 2]
    if not later:
        return None, f"not evaluated: no second cycle with both {pair[0]} and {pair[1]}"
    ok = all(within(r) for r in later)
    parts = [
        f"cycle {r.cycle}: tok/s {r.ratio('tput'):.3f}x, p50 TPOT {r.ratio('tpot'):.3f}x"
        for r in later
    ]
    word = "PASS" if ok else "MISS"
    return ok, (
        f"{word}: {pair[0]} within {100 * pair[2]:g}% of {pair[1]} after the first cycle "
        f"({'; '.join(parts)})"
    )


# ---- report ------------------------------------------------------------------------------------


def step_table(rows: Sequence[StepRow]) -> str:
    if not rows:
        return "(no steps with both variants)\n"
    a, b, tol = rows[0].learning, rows[0].seeded, rows[0].tolerance
    head = ["step", "cycle", "C", "start s", f"{a} tok/s", f"{b} tok/s", "tok/s ratio",
            f"{a} TPOT p50 ms", f"{b} TPOT p50 ms", "TPOT ratio",
            f"within {100 * tol:g}%"]  # fmt: skip
    body = [
        [str(r.step) if r.step >= 0 else "all", str(r.cycle), str(r.c), f"{r.start_s:.0f}",
         cell(r.tput[a]), cell(r.tput[b]), cell(r.ratio("tput"), 3), cell(r.tpot[a], 2),
         cell(r.tpot[b], 2), cell(r.ratio("tpot"), 3), "yes" if within(r) else "NO"]
        for r in rows
    ]  # fmt: skip
    return "\n".join(table(head, body)) + "\n"


def plot(records: Sequence[Record], path: Path, title: str) -> None:
    steps = [r for r in records if r.get("scope") == "step"]
    ran = [v for v in VARIANTS if any(r.get("target") == v for r in steps)]

    def rows(variant: str) -> list[Record]:
        return sorted(
            (r for r in steps if r.get("target") == variant), key=lambda r: int(r["step"])
        )

    with simreport.figure(path, title, 2, 1, figsize=(11, 6.5), sharex=True) as (_, axes):
        ax_tp, ax_tpot = axes
        for variant in ran:
            xs = [float(r["step_start_s"]) for r in rows(variant)]
            tput = [float(r["output_throughput"]) for r in rows(variant)]
            ax_tp.step(xs, tput, where="post", label=variant)
            pts = [(x, r["median_tpot_ms"]) for x, r in zip(xs, rows(variant), strict=True)]
            pts = [(x, float(y)) for x, y in pts if y]
            ax_tpot.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=variant)
        if ran:
            first = rows(ran[0])
            ax_c = ax_tp.twinx()
            ax_c.step(
                [float(r["step_start_s"]) for r in first],
                [int(r["max_concurrency"]) for r in first],
                where="post",
                color="grey",
                alpha=0.4,
                label="concurrency",
            )
            ax_c.set_yscale("log", base=2)
            ax_c.set_ylabel("concurrency (grey)")
        ax_tp.set_ylabel("output tokens/s")
        ax_tp.set_ylim(bottom=0)
        ax_tpot.set_ylabel("p50 TPOT (ms)")
        ax_tpot.set_yscale("log")
        ax_tpot.set_xlabel("time since the ramp started (s, model time)")
        for ax in (ax_tp, ax_tpot):
            ax.grid(True, alpha=0.3)
            ax.legend(loc="upper left")


def write_report(out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
    """Markdown and PNG next to ``out``, from its records alone."""
    if not records:
        raise ValueError(f"{out}: no steps")
    meta = records[0]
    speed = float(meta.get("speed", 1.0))
    profile = load_profile(str(meta.get("profile", "demo")))
    model = simreport.in_model_time(records)
    md, png = out.with_suffix(".md"), out.with_suffix(".png")
    title = f"SIMULATED: load ramp, learning only vs profile-seeded, profile {profile.name}"
    plot(model, png, f"{title} (speed {speed:g})")
    step_s = float(meta.get("step_seconds", 0.0))
    ran = [v for v in VARIANTS if any(r.get("target") == v for r in records)]
    lines = [
        f"# {title}",
        "",
        "**SIMULATED.** `dynspec-sim` servers (no GPU, no model) and, one after the other, "
        "routers that learn their speed curves from nothing and their twins seeded with "
        "`--speed-profile`: `balance-learning` / `balance-profile` (`--policy balance` over an "
        "EAGLE and a baseline server on GPUs of their own) and `paired-auto` / "
        "`paired-auto-seeded` (`--pair ... --threshold auto` over one shared GPU, "
        f"`dynspec-sim --pair --sharing {meta.get('sharing', 'timeslice')}`). Profile "
        f"{simreport.profile_text(profile)}.",
        "",
        f"Command: `{meta.get('command') or 'dynspec-bench ramp --simulate'}`",
        "",
        simreport.machine_line(
            records, "client, router and simulators", " at the variants' starts"
        ),
        *simreport.code_lines(records),
        f"- Closed-loop clients, random prompts, {meta.get('random_input_len')} input / "
        f"{meta.get('random_output_len')} output tokens; concurrency stepped every "
        f"{step_s:g} s wall-clock ({step_s * speed:g} s model time) through 1, 2, 4 ... "
        f"{max(int(r['max_concurrency']) for r in records)} ... 2, 1, "
        f"{max(int(r['cycle']) for r in records)} cycles. Going down, clients leave as their "
        "request ends; after the last step the requests still in flight are cancelled.",
        f"- Simulated time ran {speed:g}x wall-clock; figures in model time. The seeded routers "
        f"got the profile with its tok/s x {speed:g} (the simulators' wall-clock speed).",
        f"- Variants run: {', '.join(ran)} (in the command's order; each learning router starts "
        "from nothing).",
        "- Per step: output tok/s = tokens delivered inside the step's window / its length; "
        "p50 TPOT and TTFT of the requests that finished inside it (requests that span steps "
        "count in the step where they end).",
        "",
    ]
    pairs = pairs_run(records)
    if not pairs:
        lines += ["No learning router ran beside its seeded twin: no goal evaluated.", ""]
    for pair in pairs:
        steps = compare(model, "step", pair)
        _, text = verdict(model, pair)
        lines += [
            f"## SIMULATED: {pair[0]} within {100 * pair[2]:g}% of {pair[1]} after the first "
            "cycle?",
            "",
            f"{text}.",
            "",
            "Per cycle (all steps of the cycle together):",
            "",
            step_table(compare(model, "cycle", pair)),
            "Per step:",
            "",
            step_table(steps),
        ]
        out_of = [r for r in steps if r.cycle >= 2 and not within(r)]
        if out_of:
            lines.append(
                f"Steps after the first cycle outside {100 * pair[2]:g}%: "
                + ", ".join(f"{r.step} (C={r.c})" for r in out_of)
                + "."
            )
            lines.append("")
    share = []
    for r in model:
        if r.get("scope") == "cycle" and isinstance(r.get("backend_share"), dict):
            share.append(
                f"- {r['target']}, cycle {r['cycle']}: "
                f"{100 * float(r['backend_share'].get('eagle', 0.0)):.0f}% of finished requests "
                "on EAGLE."
            )
    if share:
        lines += ["Where the requests went:", "", *share, ""]
    lines.append(f"Profile source: {profile.source}")
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return md, png


def summary(records: Sequence[Record]) -> str:
    model = simreport.in_model_time(records)
    out = ["SIMULATED"]
    for pair in pairs_run(records) or [PAIRS[0]]:
        out += [step_table(compare(model, "cycle", pair)).rstrip("\n"), verdict(model, pair)[1]]
    return "\n".join(out) + "\n"
