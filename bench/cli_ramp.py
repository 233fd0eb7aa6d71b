"""``dynspec-bench ramp``: a simulated load ramp, learning routers against seeded ones."""

from __future__ import annotations

import argparse

from dynspec.bench import ways
from dynspec.bench.cli_common import (
    add_length_flags,
    add_ramp_flags,
    add_sharing_flag,
    add_simulate_flags,
    out_path,
    rerender,
    run_then_report,
    sim_profile,
)
from dynspec.common.cli import FlagParser, positive_float

DESCRIPTION = (
    "Start simulated servers; on them, one after the other, run routers that learn from "
    "nothing and their twins seeded with --speed-profile: balance-learning / balance-profile "
    "(--policy balance over an EAGLE and a baseline server) and paired-auto / "
    "paired-auto-seeded (--pair --threshold auto over one shared-GPU pair), under a "
    "closed-loop load whose concurrency steps 1, 2, 4 ... --peak ... 2, 1, --cycles times, "
    "--step-seconds each. Reports tok/s and p50 TPOT per step and whether learning alone is "
    "within 10%% (balance) / 5%% (paired-auto) of the seeded router after the first cycle. "
    "Takes about variants x steps x --step-seconds (steps: 2 x log2(peak) + 1, then 2 x "
    "log2(peak) per further cycle). Writes OUT.jsonl, OUT.md, OUT.png."
)


def add_arguments(p: FlagParser) -> None:
    add_simulate_flags(p)
    add_ramp_flags(p, peak=256, cycles=2, step_seconds=10.0)
    p.add_argument(
        "--variants",
        type=ways.parse_variants,
        default=list(ways.RAMP_VARIANTS),
        help="which routers to run, comma-separated, in this order",
    )
    add_sharing_flag(p, "paired-auto variants: ")
    add_length_flags(p)
    p.add_argument("--seed", type=int, default=0, help="seed for prompts and simulators")
    p.add_argument(
        "--metrics-interval",
        type=positive_float,
        default=None,
        help="the routers' --metrics-interval (default: the router's)",
    )


def run(args: argparse.Namespace) -> int:
    from dynspec.bench import ramp, ramp_report

    if args.from_jsonl is not None:
        return rerender(args.from_jsonl, lambda _: ramp_report)
    prof = sim_profile(args)
    out = out_path(args, f"ramp-{prof.name}")
    same = "profile speed peak cycles step_seconds input_len output_len range_ratio prompt_pool"
    same += " seed variants metrics_interval sharing startup_timeout"
    cfg = ramp.RampConfig(
        **{name: getattr(args, name) for name in same.split()}, out=out, command=args.command_line
    )

    def go() -> None:  # the report is then made from OUT.jsonl, as --from-jsonl makes it
        ramp.run(cfg)

    return run_then_report(go, out, "variants", ramp_report)
