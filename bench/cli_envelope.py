"""``dynspec-bench envelope --eight-gpus``: the same eight simulated GPUs used seven ways
(``envelope8.py``, ``envelope8_report.py``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from dynspec.bench import cli_common, ways
from dynspec.common import cli

if TYPE_CHECKING:
    from dynspec.bench.report import Record

DESCRIPTION = (
    "With --eight-gpus: start simulated servers and dynspec-routers on free loopback ports and "
    "compare the same eight GPUs used seven ways (split, paired, homogeneous pairs). Writes "
    "OUT.jsonl, OUT.md, OUT.png. (Without --eight-gpus, one pair: retired, in git history at "
    "b22afdf.)"
)
RETIRED = (
    "the single-pair envelope (without --eight-gpus) is retired: its code and results are in git "
    "history at b22afdf; run --eight-gpus"
)


def add_arguments(p: cli.FlagParser) -> None:
    """Each flag at length: docs/benchmarks.md, "Flags of dynspec-bench envelope"."""
    cli_common.add_simulate_flags(p)
    p.add_argument("--threshold", type=cli.non_negative_int, help="override the suggested one")
    p.add_argument("--hysteresis", type=cli.non_negative_int, help="override the suggested one")
    cli_common.add_load_flags(p)
    p.set_defaults(requests_per_c=2)
    text = "eight GPUs (each simulated server four of them) used the --ways ways"
    p.add_argument("--eight-gpus", action="store_true", help=text)
    ways_text = "--eight-gpus: which ways to run, comma-separated"
    p.add_argument("--ways", type=ways.parse_ways, default=list(ways.EIGHT_WAYS), help=ways_text)
    cli_common.add_sharing_flag(p, "--eight-gpus: ")
    text = "--eight-gpus: give paired-auto the profile as --speed-profile (default: none)"
    p.add_argument("--calibrated", action="store_true", help=text)
    text = "--eight-gpus: runs of the whole comparison, each started afresh"
    p.add_argument("--repeats", type=cli.positive_int, default=1, help=text)
    cli_common.add_router_log_level(p, "warning")


def _report_of(records: Sequence[Record]) -> Any:
    from dynspec.bench import envelope8_report

    if not envelope8_report.is_eight_gpus(records):
        raise cli.UsageError(RETIRED)
    return envelope8_report


def run(args: argparse.Namespace) -> int:
    from dynspec.bench import envelope8, envelope8_report
    from dynspec.bench.sweep import to_stderr

    if args.from_jsonl is not None:
        return cli_common.rerender(args.from_jsonl, _report_of)
    prof = cli_common.sim_profile(args)
    if not args.eight_gpus:
        raise cli.UsageError(RETIRED)
    suffix = ("-mps" if args.sharing == "mps" else "") + ("-calibrated" if args.calibrated else "")
    out = cli_common.out_path(args, f"envelope8-{prof.name}{suffix}")
    names = "profile speed threshold hysteresis seed startup_timeout router_log_level ways"
    names += " sharing repeats calibrated"
    same, sweep = {k: getattr(args, k) for k in names.split()}, cli_common.sweep_config(args)
    cfg = envelope8.EightGpusConfig(**same, sweep=sweep, out=out, command=args.command_line)
    run = partial(envelope8.run, cfg, None if args.no_progress else to_stderr)
    return cli_common.run_then_report(run, out, "levels", envelope8_report)
