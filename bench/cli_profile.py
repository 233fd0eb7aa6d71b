"""``dynspec-bench profile``: measured sweeps -> a dynspec-sim profile."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dynspec.bench import profile_export
from dynspec.bench.cli_common import read
from dynspec.common.cli import FlagParser, UsageError, positive_int

DESCRIPTION = (
    "Turn measured sweeps (an EAGLE target and/or a baseline target, levels from C=1) "
    "into a dynspec-sim profile JSON (dynspec-sim --profile FILE.json)."
)


def _mode_limit(text: str) -> tuple[str, int]:
    mode, sep, value = text.partition("=")
    if not sep or mode not in ("eagle", "baseline"):
        raise argparse.ArgumentTypeError(f"expected eagle=N or baseline=N, got {text!r}")
    return mode, positive_int(value)


def add_arguments(p: FlagParser) -> None:
    """Each flag at length: docs/benchmarks.md, "Flags of dynspec-bench profile"."""
    p.add_argument("sweeps", type=Path, nargs="+", help="sweep JSONL file(s)")
    p.add_argument("--name", default=None, help="profile name (default: the first file's stem)")
    p.add_argument("--eagle-target", default=None, help="the EAGLE target's label")
    p.add_argument("--baseline-target", default=None, help="the baseline target's label")
    p.add_argument("--model", default=None, help="model name for the profile")
    text = "add points at the powers of two between measured levels (TPOT linear in C)"
    p.add_argument("--interpolate", action="store_true", help=text)
    text = "MODE=N: the mode's max_running_requests, as the measured server ran (repeatable)"
    p.add_argument("--max-running", action="append", type=_mode_limit, default=None, help=text)
    p.add_argument("--note", default="", help="text added to the profile's source")
    p.add_argument("--out", "-o", type=Path, default=None, help="profile file (default: stdout)")


def run(args: argparse.Namespace) -> int:
    records = [r for path in args.sweeps for r in read(path)]
    names = ("eagle_target", "baseline_target", "model", "interpolate", "note")
    same = {k: getattr(args, k) for k in names}
    try:
        prof = profile_export.build_profile(
            records, args.sweeps, name=args.name or args.sweeps[0].stem,
            max_running=dict(args.max_running or []), **same,
        )  # fmt: skip
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.out is None:
        sys.stdout.write(prof.dumps())
    else:
        args.out.write_text(prof.dumps(), encoding="utf-8")
        print(f"profile written to {args.out}", file=sys.stderr)
    return 0
