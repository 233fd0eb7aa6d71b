"""``dynspec-bench suggest-threshold``: where EAGLE stops paying, from two sweeps."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynspec.bench import threshold
from dynspec.bench.cli_common import read
from dynspec.common.cli import FlagParser, UsageError

DESCRIPTION = (
    "Find the concurrency where EAGLE's per-request decode speed (1 / p50 TPOT) falls "
    "below the baseline's (interpolated linearly in log2 C on log2 of the speed ratio) "
    "and print the router's --threshold and --hysteresis with the evidence."
)


def add_arguments(p: FlagParser) -> None:
    p.add_argument("eagle", type=Path, help="sweep JSONL of the EAGLE server")
    p.add_argument("baseline", type=Path, help="sweep JSONL of the baseline server")
    p.add_argument("--eagle-target", default=None, help="target label in a multi-target file")
    p.add_argument("--baseline-target", default=None, help="target label in a multi-target file")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    e_all, b_all = read(args.eagle), read(args.baseline)
    try:
        e = threshold.select(e_all, args.eagle_target, str(args.eagle))
        b = threshold.select(b_all, args.baseline_target, str(args.baseline))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    s = threshold.suggest(e, b)
    if not args.json:
        print(threshold.render(s), end="")
        return 0
    doc = {k: getattr(s, k) for k in ("verdict", "threshold", "hysteresis", "crossover", "message")}
    doc["levels"] = [
        {"max_concurrency": lv.concurrency, "eagle_median_tpot_ms": lv.eagle_tpot_ms,
         "baseline_median_tpot_ms": lv.baseline_tpot_ms, "speed_ratio": lv.ratio}
        for lv in s.levels
    ]  # fmt: skip
    print(json.dumps(doc))
    return 0
