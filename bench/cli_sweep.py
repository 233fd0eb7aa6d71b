"""``dynspec-bench sweep``: closed-loop concurrency sweep of one or more targets."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.bench.cli_common import PROG, add_load_flags, on_sigterm, stopped_code, sweep_config
from dynspec.common.cli import (
    FlagParser,
    UsageError,
    non_negative_float,
    positive_int,
)

if TYPE_CHECKING:
    from dynspec.bench.load import Target

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


def targets(raw: object, endpoint: str) -> list[Target]:
    from dynspec.bench import load

    items: list[str] = []
    if isinstance(raw, str):  # from DYNSPEC_URL
        items = raw.split()
    elif isinstance(raw, list):
        for x in raw:
            items += str(x).split()
    if not items:
        raise UsageError("give at least one --url")
    out: list[Target] = []
    for item in items:
        try:
            out.append(load.parse_target(item, endpoint))
        except ValueError as exc:
            raise UsageError(f"--url: {exc}") from None
    labels = [t.label for t in out]
    if len(set(labels)) != len(labels):
        raise UsageError("--url: two targets with the same label; use LABEL=URL")
    return out


def _finish(out: Path, title: str) -> None:
    from dynspec.bench import report

    if not out.exists() or out.stat().st_size == 0:
        return
    records = report.load_jsonl(out)
    md, png = report.write_outputs(out, records, title)
    print(report.markdown_table(records), end="")
    print(f"results: {out}, {md}, {png}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from dynspec.bench.sweep import ProgressLine, sweep

    chosen = targets(args.url, args.endpoint)
    cfg = sweep_config(
        args, repeats=args.repeats, min_seconds=args.min_seconds, warm_pass=args.warm_pass
    )
    out: Path = args.out
    if out.exists() and out.stat().st_size > 0:
        raise UsageError(f"--out {out} exists; give another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    progress = ProgressLine(enabled=not args.no_progress)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        asyncio.run(sweep(chosen, cfg, out, progress))
    except KeyboardInterrupt as exc:
        print(f"\n{PROG}: interrupted; keeping the finished levels", file=sys.stderr)
        _finish(out, args.title)
        return stopped_code(exc)
    _finish(out, args.title)
    return 0
