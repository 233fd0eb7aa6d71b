"""``dynspec-bench sweep``: closed-loop concurrency sweep of one or more targets."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.bench.cli_common import PROG, add_load_flags, on_sigterm, stopped_code, sweep_config
from dynspec.common.cli import (
    FlagParser,
    UsageError,
    non_negative_float,
    positive_float,
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
        ("--time-limit", positive_float, None, "seconds: start no level that would end later"),
        ("--out", Path, Path("sweep.jsonl"), "JSONL results file"),
        ("--title", str, "dynspec-bench sweep", "plot and table title"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    for flag, text in (
        ("--warm-pass", "first run every target at every level once, not recorded"),
        ("--append", "append to an existing --out file"),
        ("--resume", "append to --out, skipping the points already in it"),
    ):
        p.add_argument(flag, action="store_true", help=text)


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
    from dynspec.bench.sweep import ProgressLine, pending, sweep

    chosen = targets(args.url, args.endpoint)
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    cfg = sweep_config(
        args, repeats=args.repeats, min_seconds=args.min_seconds, resume=args.resume,
        deadline=deadline, warm_pass=args.warm_pass,
    )  # fmt: skip
    out: Path = args.out
    if out.exists() and out.stat().st_size > 0 and not (args.append or args.resume):
        raise UsageError(f"--out {out} exists; use --append, --resume or another --out")
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
    left = pending(chosen, cfg, out)
    if left:
        print(f"{PROG}: {len(left)} points left for --resume (--time-limit)", file=sys.stderr)
    return 0
