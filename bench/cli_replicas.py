"""``dynspec-bench replicas``: 1 and 3 router replicas in front of the same simulated servers,
with each replica's own count and with the servers' shared load signal (bench/replicas.py,
bench/replicas_report.py)."""

from __future__ import annotations

import argparse

from dynspec.bench import ways
from dynspec.bench.cli_common import (
    add_load_flags,
    add_sharing_flag,
    add_simulate_flags,
    levels,
    out_path,
    rerender,
    run_then_report,
    sim_profile,
    sweep_config,
)
from dynspec.common.cli import (
    FlagParser,
    UsageError,
    non_negative_int,
    positive_float,
    positive_int,
)

DESCRIPTION = (
    "Start simulated servers and, on fresh ones each time, one router (--load-signal local, the "
    "reference), three replicas counting their own requests (3-local) and three replicas on "
    "the servers' shared load signal (3-servers), in the split layout (an EAGLE and a baseline "
    "server) and the paired one (two shared-GPU pairs); load them with closed-loop levels "
    "(--concurrency) and a ramp 1 -> --peak -> 1, every request sent to the next replica in "
    "turn as a Kubernetes Service would. Reports, for 3-servers and 3-local against one "
    "router, the load at which new requests move to the baseline (goal: within +-25%%), tok/s "
    "at every C (>= 0.95x) and mode switches per minute (<= 1.5x). Takes about layouts x "
    "variants x (the levels + ramp steps x --step-seconds). Writes OUT.jsonl, OUT.md, OUT.png."
)
DEFAULT_LEVELS = "1,2,4,8,16,32,64,128"


def add_arguments(p: FlagParser) -> None:
    add_simulate_flags(p)
    add_load_flags(p)
    p.set_defaults(concurrency=levels(DEFAULT_LEVELS), requests_per_c=2, speed=4.0)
    for flag, parse, names, text in (
        ("--layouts", ways.parse_layouts, ways.REPLICA_LAYOUTS, "split (an EAGLE and a "
         "baseline server) and/or paired (two dynspec-sim --pair)"),
        ("--variants", ways.parse_replica_variants, ways.REPLICA_VARIANTS, "which of 1-router, "
         "3-local, 3-servers to run (the goals need 1-router)"),
    ):  # fmt: skip
        p.add_argument(flag, type=parse, default=list(names), help=text + ", comma-separated")
    p.add_argument(
        "--threshold",
        type=positive_int,
        default=None,
        help="every router's --threshold (default: suggest-threshold on the profile's curves)",
    )
    p.add_argument(
        "--hysteresis",
        type=non_negative_int,
        default=None,
        help="every router's --hysteresis (default: suggest-threshold's rule, a quarter of the "
        "threshold)",
    )
    p.add_argument(
        "--load-interval",
        type=positive_float,
        default=None,
        help="the 3-servers replicas' --load-interval, wall-clock seconds (default: 0.25 / "
        "--speed, the router's default in model time)",
    )
    # The ramp 1, 2, 4 ... peak ... 2, 1 (replicas.schedule).
    p.add_argument("--peak", type=positive_int, default=128, help="the ramp's highest C")
    p.add_argument("--cycles", type=positive_int, default=1, help="ramps up and down")
    p.add_argument(
        "--step-seconds",
        type=positive_float,
        default=5.0,
        help="wall-clock seconds per concurrency step",
    )
    add_sharing_flag(p, "paired: ")


def run(args: argparse.Namespace) -> int:
    from dynspec.bench import replicas, replicas_report, threshold
    from dynspec.bench.sweep import ProgressLine

    if args.from_jsonl is not None:
        return rerender(args.from_jsonl, lambda _: replicas_report)
    prof = sim_profile(args)
    s = replicas.profile_suggestion(prof)
    if args.threshold is None and s.verdict in ("never", "tie"):
        raise UsageError(
            f"--profile {prof.name}: by its curves EAGLE never pays (suggest-threshold: "
            f"{s.verdict}), so no router would switch; give --threshold"
        )
    thr = s.threshold if args.threshold is None else args.threshold
    hyst = threshold.hysteresis_for(thr) if args.hysteresis is None else args.hysteresis
    if hyst >= thr:
        raise UsageError(f"--hysteresis {hyst} must be smaller than the threshold, {thr}")
    out = out_path(args, f"replicas-{prof.name}")
    same = "profile speed layouts variants threshold load_interval peak cycles step_seconds"
    same += " sharing seed startup_timeout"
    cfg = replicas.ReplicasConfig(
        **{name: getattr(args, name) for name in same.split()},
        sweep=sweep_config(args),
        out=out,
        hysteresis=hyst,
        command=args.command_line,
    )
    progress = ProgressLine(enabled=not args.no_progress)
    return run_then_report(lambda: replicas.run(cfg, progress), out, "runs", replicas_report)
