"""The steady-state plans' report: each point's median and min-max over its repeats, the routed
pair over the better server alone and the router over a direct connection, judged on medians
with the spread beside them. Joins the JSONL of any number of device commands (a record without
``repeat`` is one run: the plans before the steady instrument)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynspec.bench import report
from dynspec.bench.report import MARK, Record, Spread, by_point, load_jsonl, spread, stats, table

PAIR_GOAL = 0.95  # routed >= 0.95 x the better server alone, at every C
COST_GOAL = 0.97  # routed >= 0.97 x direct at every C ...
COST_TTFT_MS = 5.0  # ... and TTFT p50 within +5 ms
ALONE = ("eagle", "baseline")
COST = ("routed_eagle", "eagle")


def read(paths: Iterable[Path]) -> list[Record]:
    return [r for path in paths for r in load_jsonl(path)]


def pair_ratios(rows: Sequence[Record]) -> dict[int, dict[str, Any]]:
    """Per C: routed's median tok/s over the better of ``ALONE`` (by median), and the spread of
    the same ratio taken repeat by repeat (each repeat's targets ran back to back)."""
    tok = by_point(rows, "output_throughput")
    out: dict[int, dict[str, Any]] = {}
    for c, routed in sorted(tok.get("routed", {}).items()):
        alone = [a for a in ALONE if c in tok.get(a, {})]
        if not alone:
            continue
        best = max(alone, key=lambda a: statistics.median(tok[a][c].values()))
        per_rep = [v / tok[best][c][r] for r, v in routed.items() if r in tok[best][c]]
        ratio = statistics.median(routed.values()) / statistics.median(tok[best][c].values())
        out[c] = {
            "ratio": ratio,
            "better": best,
            "per_repeat": spread(per_rep) if per_rep else None,
        }
    return out


def unjudged(
    tok: Mapping[str, Mapping[int, Spread]], ratios: Mapping[int, Mapping[str, Any]], repeats: int
) -> str:
    """What keeps the pair's goal at every C from being judged, from the tok/s ``stats`` and the
    ``pair_ratios``: the levels routed ran where no server alone did, and those where it or the
    better server alone has fewer than ``repeats`` runs (a run cut short by the device's time).
    Empty: none."""
    alone_missing = [c for c in sorted(tok.get("routed", {})) if c not in ratios]
    short = [
        c for c, r in ratios.items() if min(tok["routed"][c].n, tok[r["better"]][c].n) < repeats
    ]
    parts = []
    if alone_missing:
        parts.append("not judged (no server alone): " + ", ".join(f"C={c}" for c in alone_missing))
    if short:
        parts.append(f"fewer than {repeats} runs: " + ", ".join(f"C={c}" for c in short))
    return "; ".join(parts)


def cost_rows(rows: Sequence[Record]) -> dict[int, dict[str, Any]]:
    """Per C: the router's median tok/s over the EAGLE server's own port, and the TTFT p50 it
    adds (median of the repeat-by-repeat differences), with their spreads."""
    tok = by_point(rows, "output_throughput")
    ttft = by_point(rows, "median_ttft_ms")
    cpu = by_point(rows, "router_cpu_s")
    client = by_point(rows, "client_cpu_s")
    dur = by_point(rows, "duration")
    own = [{**r, "own_ms": router_delay_ms(r)} for r in rows]
    delay = by_point(own, "own_ms")
    routed, direct = COST
    out: dict[int, dict[str, Any]] = {}
    for c, mine in sorted(tok.get(routed, {}).items()):
        theirs = tok.get(direct, {}).get(c)
        if not theirs:
            continue
        reps = [r for r in mine if r in theirs]
        added = [ttft[routed][c][r] - ttft[direct][c][r] for r in reps if r in ttft[routed][c]]
        row: dict[str, Any] = {
            "ratio": statistics.median(mine.values()) / statistics.median(theirs.values()),
            "per_repeat": spread([mine[r] / theirs[r] for r in reps]) if reps else None,
            "ttft_added_ms": spread(added) if added else None,
        }
        mean_delay = list(delay.get(routed, {}).get(c, {}).values())
        row["router_delay_ms"] = spread(mean_delay) if mean_delay else None
        for name, seconds, label in (("router_cpu", cpu, routed), ("client_cpu", client, routed),
                                     ("client_cpu_direct", client, direct)):  # fmt: skip
            share = [
                seconds[label][c][r] / dur[label][c][r]
                for r in seconds.get(label, {}).get(c, {})
                if dur.get(label, {}).get(c, {}).get(r)
            ]
            row[name] = spread(share) if share else None  # CPU seconds per second of the level
        out[c] = row
    return out


def router_delay_ms(record: Mapping[str, Any]) -> float | None:
    """A record's mean of the router's own share of TTFT in ms (``steady.RouterDelay``)."""
    seen = record.get("first_token")
    got = seen.get("router_delay") if isinstance(seen, Mapping) else None
    return float(got["ms"]) if isinstance(got, Mapping) else None


def markdown(rows: Sequence[Record]) -> str:
    """The tables: tok/s and TPOT p50 per target and C (median, min-max), then the goals: routed
    over the better server alone, and the router-cost pair, where each ran."""
    tok, tpot = stats(rows, "output_throughput"), stats(rows, "median_tpot_ms")
    targets = list(tok)
    levels = sorted({c for t in tok.values() for c in t})
    reps = max((s.n for t in tok.values() for s in t.values()), default=0)
    lines = [f"Output tok/s, median (min-max) of up to {reps} repeats:", ""]
    lines += report.level_table(tok, targets, 0)
    lines += ["", "p50 TPOT ms, median (min-max):", ""]
    lines += report.level_table(tpot, targets, 2, levels=levels)
    ratios = pair_ratios(rows)
    if ratios:
        worst = min(r["ratio"] for r in ratios.values())
        said = f"{MARK[worst >= PAIR_GOAL]} (worst {worst:.2f})"
        gaps = unjudged(tok, ratios, reps)
        if gaps:
            said = f"INCOMPLETE: {said} at the C judged; {gaps}"
        lines += [
            "",
            f"routed over the better of {', '.join(ALONE)} (goal >= {PAIR_GOAL} at every C, on "
            f"medians; the spread is the ratio repeat by repeat): {said}",
            "",
        ]
        share = share_cells(rows, "routed")
        body = [
            [str(c), f"{r['ratio']:.2f}", r["per_repeat"].cell(2), r["better"], share.get(c, "-")]
            for c, r in ratios.items()
        ]
        lines += table(["C", "ratio", "per repeat", "better", "on EAGLE / switches"], body)
    costs = cost_rows(rows)
    if costs:
        ok = all(r["ratio"] >= COST_GOAL and added_ms(r) <= COST_TTFT_MS for r in costs.values())
        lines += [
            "",
            f"The router over the EAGLE server's own port (goal >= {COST_GOAL} tok/s and TTFT "
            f"p50 within +{COST_TTFT_MS:g} ms at every C, on medians; CPU in cores, CPU seconds "
            f"per second of the level): {MARK[ok]}",
            "",
        ]
        head = ["C", "routed / direct", "per repeat", "TTFT p50 added ms", "router CPU"]
        head += ["client CPU routed", "client CPU direct", "router's own ms"]
        lines += table(head, [cost_cells(c, r) for c, r in costs.items()])
        own = [r["router_delay_ms"] for r in costs.values() if r["router_delay_ms"] is not None]
        if own:
            worst = max(s.median for s in own)
            missing = len(own) < len(costs)
            said = "INCOMPLETE: some C have none" if missing else MARK[worst <= COST_TTFT_MS]
            lines += [
                "",
                f"The router's own share of TTFT (`router_delay`: from a request's arrival to its "
                f"sending to the server, its mean over each level, median over the repeats), "
                f"within +{COST_TTFT_MS:g} ms at every C: {said} (worst {worst:.2f} ms)",
            ]
    return "\n".join(lines) + "\n"


def added_ms(row: Mapping[str, Any]) -> float:
    added = row["ttft_added_ms"]
    return float(added.median) if added is not None else 0.0


def cost_cells(c: int, row: Mapping[str, Any]) -> list[str]:
    keys = (("per_repeat", 3), ("ttft_added_ms", 1), ("router_cpu", 2), ("client_cpu", 2),
            ("client_cpu_direct", 2), ("router_delay_ms", 2))  # fmt: skip
    cells = [row[k].cell(d) if row[k] is not None else "-" for k, d in keys]
    return [str(c), f"{row['ratio']:.3f}", *cells]


def share_cells(rows: Sequence[Record], label: str) -> dict[int, str]:
    """Per C: a routed target's share of requests on EAGLE and its mode switches, per repeat."""
    found: dict[int, list[str]] = {}
    for r in sorted(rows, key=lambda r: int(r.get("repeat") or 1)):
        if r.get("target") != label:
            continue
        share = (r.get("backend_share") or {}).get("eagle", 0.0)
        found.setdefault(int(r["max_concurrency"]), []).append(
            f"{100 * float(share):.0f}%/{r.get('mode_switches', '-')}"
        )
    return {c: " ".join(v) for c, v in found.items()}


def summary(rows: Sequence[Record]) -> dict[str, Any]:
    """The report as JSON (``PLAN-summary.json``)."""

    def plain(x: Any) -> Any:
        if isinstance(x, Spread):
            return vars(x)
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        return x

    return {
        "tok_s": plain(stats(rows, "output_throughput")),
        "ttft_p50_ms": plain(stats(rows, "median_ttft_ms")),
        "pair": plain(pair_ratios(rows)),
        "router_cost": plain(cost_rows(rows)),
    }


def write_rows(jsonl: Path, rows: Sequence[Record], title: str = "") -> None:
    """``STEM.md`` (the tables), ``STEM.png`` (tok/s and TPOT, medians with min-max) and
    ``STEM-summary.json`` beside ``jsonl``, from ``rows`` (``gpu report --write``: the records
    of every file given)."""
    import json

    if not rows:
        return
    jsonl.with_suffix(".md").write_text(markdown(rows))
    report.plot(rows, jsonl.with_suffix(".png"), title or jsonl.stem)
    summary_path = jsonl.with_name(jsonl.stem + "-summary.json")
    summary_path.write_text(json.dumps(summary(rows), indent=1))
