"""What every report writes with: JSONL (a line per target and level, with ``bench_serving``'s
key names where they exist), Markdown tables, medians over repeats, figures, the lines that say
where and on which code a run ran; the sweep's own table and plot.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Record = dict[str, Any]
MARK = {True: "PASS", False: "MISS", None: "-"}  # a goal met, missed, not judged


def append_jsonl(path: Path, record: Record) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=False) + "\n")
        f.flush()


def load_jsonl(path: Path) -> list[Record]:
    records: list[Record] = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            text = raw.strip()
            if not text:
                continue
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            records.append(rec)
    return records


# Wall-clock durations (ms or s) and per-second rates in a record, converted to model time.
_TIME_KEYS = ("duration",)
_RATE_KEYS = ("request_throughput", "input_throughput", "output_throughput", "total_throughput")


def model_time(rec: Record) -> Record:
    """A copy of a level record in a simulator's model time: durations x speed, rates / speed
    (the record's ``speed``, else 1)."""
    speed = float(rec.get("speed") or 1.0)
    if speed == 1.0:
        return dict(rec)
    out = dict(rec)
    for k, v in rec.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        if k.endswith("_ms") or k in _TIME_KEYS:
            out[k] = v * speed
        elif k in _RATE_KEYS:
            out[k] = v / speed
    return out


def run_time_lines(records: Sequence[Record]) -> list[str]:
    """``- Run time N min wall-clock.``: from the first record's ``run_started`` to the last
    ``timestamp``; none without them."""
    stamps = [str(r["timestamp"]) for r in records if r.get("timestamp")]
    started = records[0].get("run_started") if records else None
    if not started or not stamps:
        return []
    secs = (
        dt.datetime.fromisoformat(max(stamps)) - dt.datetime.fromisoformat(str(started))
    ).total_seconds()
    return [f"- Run time {secs / 60:.1f} min wall-clock."]


def machine_line(records: Sequence[Record], who: str, when: str = "") -> str:
    """The machine, who shares it, and the 1-minute load averages the records saw (``when``)."""
    m = records[0].get("machine") or {}
    loads = [float(r["loadavg_1m"]) for r in records if r.get("loadavg_1m") is not None]
    load = f" (1-minute load average {min(loads):.1f}-{max(loads):.1f}{when})" if loads else ""
    return (
        f"- Machine: {m.get('cpus', '?')} CPUs ({m.get('cpu') or 'unknown CPU'}), "
        f"{m.get('platform', '?')}, Python {m.get('python', '?')}; {who} share it, and other "
        f"work ran on it at the same time{load}."
    )


def code_lines(records: Sequence[Record]) -> list[str]:
    commits = sorted({str(r["code_commit"]) for r in records if r.get("code_commit")})
    return [f"- Code: commit {', '.join(commits)}."] if commits else []


def targets(records: Iterable[Record]) -> list[str]:
    return list(dict.fromkeys(str(r.get("target", "?")) for r in records))


def cell(value: object, digits: int = 1, *, thousands: bool = False) -> str:
    """A table cell: '-' for none or NaN, a float to ``digits`` (``thousands``: separated)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if thousands:
        return f"{value:,.{digits}f}"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _share(rec: Record) -> str:
    share = rec.get("backend_share")
    if not isinstance(share, dict) or not share:
        return "-"
    return " / ".join(f"{k} {100 * float(v):.0f}%" for k, v in sorted(share.items()))


# The sweep table's columns: (the record's key, the header, digits).
COLUMNS: Sequence[tuple[str, str, int]] = (
    ("max_concurrency", "C", 0), ("completed", "done", 0), ("failed", "fail", 0),
    ("concurrency", "achieved C", 1), ("request_throughput", "req/s", 2),
    ("output_throughput", "out tok/s", 1), ("median_ttft_ms", "TTFT p50 ms", 1),
    ("p99_ttft_ms", "TTFT p99 ms", 1), ("median_tpot_ms", "TPOT p50 ms", 2),
    ("p90_tpot_ms", "TPOT p90 ms", 2), ("p99_tpot_ms", "TPOT p99 ms", 2),
    ("median_itl_ms", "ITL p50 ms", 2), ("median_e2e_latency_ms", "E2E p50 ms", 0),
)  # fmt: skip


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    def cell(self, digits: int = 0, *, same_once: bool = False) -> str:
        """The median and the min-max of several values (``same_once``: only where they differ)."""
        if self.n == 1 or (same_once and self.lo == self.hi):
            return f"{self.median:,.{digits}f}"
        return f"{self.median:,.{digits}f} ({self.lo:,.{digits}f}-{self.hi:,.{digits}f})"


def spread(values: Sequence[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values), len(values))


def spread_of(records: Iterable[Record], key: str) -> Spread | None:
    """``key``'s spread over the records that have it; None where none has."""
    values = [float(r[key]) for r in records if r.get(key) is not None]
    return spread(values) if values else None


def by_point(rows: Iterable[Record], key: str) -> dict[str, dict[int, dict[int, float]]]:
    """target -> C -> repeat -> value (the last record of a point wins)."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for r in rows:
        if r.get(key) is None:
            continue
        c, rep = int(r["max_concurrency"]), int(r.get("repeat") or 1)
        out.setdefault(str(r["target"]), {}).setdefault(c, {})[rep] = float(r[key])
    return out


def stats(rows: Iterable[Record], key: str) -> dict[str, dict[int, Spread]]:
    return {
        t: {c: spread(list(reps.values())) for c, reps in sorted(per_c.items())}
        for t, per_c in by_point(rows, key).items()
    }


def table(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: every report's tables are written by this one function."""
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + [
        "| " + " | ".join(row) + " |" for row in body
    ]


def level_table(
    by: Mapping[str, Mapping[int, Spread]],
    columns: Sequence[str],
    digits: int,
    head: Sequence[str] = (),
    levels: Iterable[int] = (),
) -> list[str]:
    """Each C (rows: ``levels``, else every C of ``by``) and column's median (min-max) over the
    repeats, from ``stats``; "-" where a column has none at that C."""
    rows = sorted(levels or {c for per_c in by.values() for c in per_c})
    body = [
        [str(c), *(by[w][c].cell(digits) if c in by.get(w, {}) else "-" for w in columns)]
        for c in rows
    ]
    return table(["C", *(head or columns)], body)


def markdown_table(records: Sequence[Record], title: str | None = None) -> str:
    routed = any("backend_share" in r for r in records)
    head = ["target", *(c[1] for c in COLUMNS)]
    if routed:
        head += ["pools", "switches"]
    body = []
    for r in records:
        cells = [str(r.get("target", "?"))]
        cells += [cell(r.get(key), digits) for key, _, digits in COLUMNS]
        if routed:
            cells += [_share(r), cell(r.get("mode_switches"))]
        body.append(cells)
    return "\n".join([*([f"### {title}", ""] if title else []), *table(head, body)]) + "\n"


def plot(records: Sequence[Record], path: Path, title: str) -> None:
    """Output tok/s and p50 TPOT against C, one line per target through the medians of the
    repeats, a bar spanning their min-max."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    with figure(path, title, 1, 2, figsize=(11, 4.2)) as (_, (ax_tp, ax_tpot)):
        levels: set[int] = set()
        for name in targets(records):
            by_c: dict[int, list[Record]] = {}
            for r in records:
                if str(r.get("target")) == name and r.get("completed"):
                    by_c.setdefault(int(r["max_concurrency"]), []).append(r)
            if not by_c:
                continue
            cs = sorted(by_c)
            levels.update(cs)
            for ax, key in ((ax_tp, "output_throughput"), (ax_tpot, "median_tpot_ms")):
                spreads = [spread([float(r[key]) for r in by_c[c]]) for c in cs]
                errorbars(ax, cs, spreads, label=name)
        for ax, ylabel in ((ax_tp, "output tokens/s (all requests)"), (ax_tpot, "p50 TPOT (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(levels))
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("concurrency (requests in flight, closed loop)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        ax_tpot.set_yscale("log")
        ax_tpot.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax_tpot.yaxis.set_major_formatter(plain)
        ax_tpot.yaxis.set_minor_formatter(NullFormatter())
        ax_tp.set_ylim(bottom=0)


def errorbars(ax: Any, xs: Sequence[float], spreads: Sequence[Spread], **kw: Any) -> None:
    """A line through the medians, a bar over each min-max."""
    below = [s.median - s.lo for s in spreads]
    above = [s.hi - s.median for s in spreads]
    ax.errorbar(xs, [s.median for s in spreads], yerr=[below, above], marker="o", capsize=3, **kw)


@contextlib.contextmanager
def figure(
    path: Path, title: str, rows: int, cols: int = 1, **kw: Any
) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure and its axes, saved to ``path`` under ``title`` when the block ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, **kw)
    try:
        yield fig, axes
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
