"""``dynspec-bench sweep``: closed-loop concurrency sweep of one or more targets."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.bench.cli_common import add_load_flags, run_then_report, sweep_config, targets
from dynspec.common.cli import FlagParser, UsageError, non_negative_float, positive_int

if TYPE_CHECKING:
    from dynspec.bench.report import Record

DESCRIPTION = (
    "Closed-loop concurrency sweep (like sglang.bench_serving --max-concurrency) of one or "
    "more OpenAI-compatible targets. Writes JSONL (one line per target and level, as each "
    "level ends), a Markdown table and a PNG plot next to it."
)


def add_arguments(p: FlagParser) -> None:
    """Each flag at length: docs/benchmarks.md, "Flags of dynspec-bench sweep"."""
    from dynspec.bench import load

    text = "a target, URL or LABEL=URL (repeat for several; $DYNSPEC_URL: space-separated)"
    p.add_argument("--url", action="append", default=None, help=text)
    text = "API to load (a URL ending in the endpoint's path overrides this)"
    p.add_argument("--endpoint", choices=sorted(load.ENDPOINTS), default="chat", help=text)
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    add_load_flags(p)
    for flag, kind, default, text in (
        ("--repeats", positive_int, 1, "runs of each target at each level, taking turns"),
        ("--min-seconds", non_negative_float, 0.0, "a level lasts at least this long"),
        ("--out", Path, Path("sweep.jsonl"), "JSONL results file"),
        ("--title", str, "dynspec-bench sweep", "plot and table title"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    text = "first run every target at every level once, not recorded"
    p.add_argument("--warm-pass", action="store_true", help=text)


@dataclass(frozen=True)
class Table:
    """The sweep's report (``cli_common.Report``): the Markdown table and the plot, titled."""

    title: str

    def write_report(self, out: Path, records: Sequence[Record]) -> tuple[Path, Path]:
        """OUT.md and OUT.png beside the JSONL."""
        from dynspec.bench import report

        md, png = out.with_suffix(".md"), out.with_suffix(".png")
        md.write_text(report.markdown_table(records, self.title), encoding="utf-8")
        report.plot(records, png, self.title)
        return md, png

    def summary(self, records: Sequence[Record]) -> str:
        from dynspec.bench import report

        return report.markdown_table(records)


def run(args: argparse.Namespace) -> int:
    from dynspec.bench.sweep import sweep, to_stderr

    chosen = targets(args.url, args.endpoint)
    cfg = sweep_config(
        args, repeats=args.repeats, min_seconds=args.min_seconds, warm_pass=args.warm_pass
    )
    out: Path = args.out
    if out.exists() and out.stat().st_size > 0:
        raise UsageError(f"--out {out} exists; give another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    say = None if args.no_progress else to_stderr
    job = partial(asyncio.run, sweep(chosen, cfg, out, say))
    return run_then_report(job, out, "levels", Table(args.title))
