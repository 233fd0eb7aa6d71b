"""``dynspec-bench``: concurrency sweeps, threshold suggestion, profile export, the envelope run.

Each subcommand has its own ``FlagParser``, so its flags also read ``DYNSPEC_<FLAG>``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from dynspec.bench import profile_export, report, threshold
from dynspec.common.cli import (
    FlagParser,
    UsageError,
    add_log_level,
    configure_logging,
    non_negative_int,
    positive_float,
    positive_int,
    run_main,
    write_stdout,
)

if TYPE_CHECKING:
    from dynspec.bench.load import Target
    from dynspec.bench.sweep import SweepConfig

PROG = "dynspec-bench"
COMMANDS = {
    "sweep": "closed-loop concurrency sweep of one or more servers or routers",
    "suggest-threshold": "the router threshold/hysteresis where EAGLE stops paying, from 2 sweeps",
    "profile": "turn a measured sweep into a dynspec-sim profile",
    "envelope": "simulated servers + router: does routing follow the better server?",
    "ramp": "simulated load ramp: balance learning from nothing vs seeded with the profile",
    "overhead": "router hot-path cost: direct vs dynspec-router vs SGLang's router",
    "gpu": "real SGLang on one GPU: bundle, test models, launcher + router checks + sweeps",
}
# Commands that load servers or draw plots need the bench extra (aiohttp, matplotlib); the others
# read files and run on the base install. Their modules are imported only once this is checked.
NEEDS_EXTRA = {"sweep", "envelope", "ramp", "overhead"}
EXTRA_MODULES = ("aiohttp", "matplotlib")
DEFAULT_LEVELS = "1,2,4,8,16,32,64,128,256"
logger = logging.getLogger(__name__)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of integers: {text!r}"
        ) from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return sorted(set(levels))


def _ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def _add_load_flags(p: FlagParser) -> None:
    p.add_argument(
        "--concurrency",
        type=_levels,
        default=_levels(DEFAULT_LEVELS),
        help="concurrency levels (requests in flight, closed loop), comma-separated",
    )
    p.add_argument(
        "--requests",
        type=positive_int,
        default=None,
        help="measured requests per level (default: max(--min-requests, --requests-per-c x C))",
    )
    p.add_argument(
        "--requests-per-c", type=positive_int, default=4, help="default requests per level / C"
    )
    p.add_argument(
        "--min-requests", type=positive_int, default=16, help="fewest requests in a level"
    )
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        help="warm-up requests per level, not measured (default: C, one round of the loop)",
    )
    p.add_argument("--input-len", type=positive_int, default=256, help="random prompt tokens")
    p.add_argument("--output-len", type=positive_int, default=128, help="output tokens")
    p.add_argument(
        "--range-ratio",
        type=_ratio,
        default=1.0,
        help="random lengths uniform in [ratio x len, len] (sglang.bench_serving's "
        "--random-range-ratio); 1 = fixed lengths",
    )
    p.add_argument(
        "--dataset",
        type=Path,
        default=None,
        help="a ShareGPT-format JSON file to take prompts from (instead of random prompts)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for prompt sampling")
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a stream may stay silent before the request counts as failed",
    )
    p.add_argument(
        "--pause", type=float, default=1.0, help="seconds between levels (lets in-flight drain)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")


def _sweep_config(args: argparse.Namespace, **extra: object) -> SweepConfig:
    from dynspec.bench.sweep import SweepConfig

    if args.dataset is not None and not args.dataset.is_file():
        raise UsageError(f"--dataset: no such file: {args.dataset}")
    return SweepConfig(
        concurrencies=args.concurrency,
        requests=args.requests,
        requests_per_c=args.requests_per_c,
        min_requests=args.min_requests,
        warmup=args.warmup,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        dataset=args.dataset,
        seed=args.seed,
        api_key=getattr(args, "api_key", None),
        request_timeout=args.request_timeout,
        pause=args.pause,
        **extra,  # type: ignore[arg-type]
    )


def sweep_parser() -> FlagParser:
    from dynspec.bench import load

    p = FlagParser(
        prog=f"{PROG} sweep",
        description=(
            "Closed-loop concurrency sweep (like sglang.bench_serving --max-concurrency) of one or "
            "more OpenAI-compatible targets. Writes JSONL (one line per target and level, as each "
            "level ends), a Markdown table and a PNG plot next to it."
        ),
    )
    p.add_argument(
        "--url",
        action="append",
        default=None,
        help="a target, URL or LABEL=URL (repeat for several); the environment variable takes "
        "space-separated targets",
    )
    p.add_argument(
        "--endpoint",
        choices=sorted(load.ENDPOINTS),
        default="chat",
        help="API to load (a URL ending in the endpoint's path overrides this)",
    )
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    _add_load_flags(p)
    p.add_argument("--out", type=Path, default=Path("sweep.jsonl"), help="JSONL results file")
    p.add_argument("--append", action="store_true", help="append to an existing --out file")
    p.add_argument("--title", default="dynspec-bench sweep", help="plot and table title")
    add_log_level(p)
    return p


def _targets(raw: object, endpoint: str) -> list[Target]:
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


class _Terminated(KeyboardInterrupt):
    """SIGTERM, taking Ctrl-C's path so that children are stopped and finished levels kept."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated


def _stopped_code(exc: KeyboardInterrupt) -> int:
    return 143 if isinstance(exc, _Terminated) else 130


class _Report(Protocol):
    def write_report(self, out: Path, records: Sequence[report.Record], /) -> tuple[Path, Path]: ...
    def summary(self, records: Sequence[report.Record], /) -> str: ...


def _run_then_report(
    run: Callable[[], Sequence[report.Record] | None], out: Path, finished: str, kind: _Report
) -> int:
    """Run an experiment that writes OUT.jsonl, then its report; Ctrl-C or SIGTERM keeps what
    finished. ``run`` returns the records to report, or None to read them back from ``out``."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        records = run()
    except KeyboardInterrupt as exc:
        print(f"\n{PROG}: interrupted; the finished {finished} are in {out}", file=sys.stderr)
        return _stopped_code(exc)
    if records is None:
        records = _read(out)
    md, png = kind.write_report(out, records)
    print(kind.summary(records), end="")
    print(f"results: {out}, {md}, {png}", file=sys.stderr)
    return 0


def _finish(out: Path, title: str) -> None:
    if not out.exists() or out.stat().st_size == 0:
        return
    records = report.load_jsonl(out)
    md, png = report.write_outputs(out, records, title)
    print(report.markdown_table(records), end="")
    print(f"results: {out}, {md}, {png}", file=sys.stderr)


def cmd_sweep(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.sweep import ProgressLine, sweep

    args = sweep_parser().parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        targets = _targets(args.url, args.endpoint)
        cfg = _sweep_config(args)
        out: Path = args.out
        if out.exists() and out.stat().st_size > 0 and not args.append:
            raise UsageError(f"--out {out} exists; use --append or another --out")
        out.parent.mkdir(parents=True, exist_ok=True)
        progress = ProgressLine(enabled=not args.no_progress)
        signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            asyncio.run(sweep(targets, cfg, out, progress))
        except KeyboardInterrupt as exc:
            print(f"\n{PROG}: interrupted; keeping the finished levels", file=sys.stderr)
            _finish(out, args.title)
            return _stopped_code(exc)
        _finish(out, args.title)
        return 0

    run_main(PROG, body, args.log_level)


def threshold_parser() -> FlagParser:
    p = FlagParser(
        prog=f"{PROG} suggest-threshold",
        description=(
            "Find the concurrency where EAGLE's per-request decode speed (1 / p50 TPOT) falls "
            "below the baseline's (interpolated linearly in log2 C on log2 of the speed ratio) "
            "and print the router's --threshold and --hysteresis with the evidence."
        ),
    )
    p.add_argument("eagle", type=Path, help="sweep JSONL of the EAGLE server")
    p.add_argument("baseline", type=Path, help="sweep JSONL of the baseline server")
    p.add_argument("--eagle-target", default=None, help="target label in a multi-target file")
    p.add_argument("--baseline-target", default=None, help="target label in a multi-target file")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_log_level(p)
    return p


def _read(path: Path) -> list[report.Record]:
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    return report.load_jsonl(path)


def cmd_threshold(argv: Sequence[str]) -> NoReturn:
    args = threshold_parser().parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        e_all, b_all = _read(args.eagle), _read(args.baseline)
        try:
            e = threshold.select(e_all, args.eagle_target, str(args.eagle))
            b = threshold.select(b_all, args.baseline_target, str(args.baseline))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        s = threshold.suggest(e, b)
        if args.json:
            print(
                json.dumps(
                    {
                        "verdict": s.verdict,
                        "threshold": s.threshold,
                        "hysteresis": s.hysteresis,
                        "crossover": s.crossover,
                        "message": s.message,
                        "levels": [
                            {
                                "max_concurrency": lv.concurrency,
                                "eagle_median_tpot_ms": lv.eagle_tpot_ms,
                                "baseline_median_tpot_ms": lv.baseline_tpot_ms,
                                "speed_ratio": lv.ratio,
                            }
                            for lv in s.levels
                        ],
                    }
                )
            )
        else:
            print(threshold.render(s), end="")
        return 0

    run_main(PROG, body, args.log_level)


def profile_parser() -> FlagParser:
    p = FlagParser(
        prog=f"{PROG} profile",
        description=(
            "Turn measured sweeps (an EAGLE target and/or a baseline target, levels from C=1) "
            "into a dynspec-sim profile JSON (dynspec-sim --profile FILE.json)."
        ),
    )
    p.add_argument("sweeps", type=Path, nargs="+", help="sweep JSONL file(s)")
    p.add_argument("--name", default=None, help="profile name (default: the first file's stem)")
    p.add_argument("--eagle-target", default=None, help="the EAGLE target's label")
    p.add_argument("--baseline-target", default=None, help="the baseline target's label")
    p.add_argument("--model", default=None, help="model name for the profile")
    p.add_argument(
        "--interpolate",
        action="store_true",
        help="add points at the powers of two between measured levels, with TPOT (C / tok/s) "
        "linear in C between the measured neighbours (the simulator would otherwise "
        "interpolate tok/s linearly); the profile's source lists which points are estimated",
    )
    p.add_argument(
        "--max-running",
        action="append",
        type=_mode_limit,
        default=None,
        help="MODE=N: the mode's max_running_requests, as the measured server ran "
        "(e.g. eagle=64 for an EAGLE server started with --max-running-requests 64); repeat "
        "for both modes",
    )
    p.add_argument(
        "--note", default="", help="text added to the profile's source (what was measured)"
    )
    p.add_argument("--out", "-o", type=Path, default=None, help="profile file (default: stdout)")
    add_log_level(p)
    return p


def _mode_limit(text: str) -> tuple[str, int]:
    mode, sep, value = text.partition("=")
    if not sep or mode not in ("eagle", "baseline"):
        raise argparse.ArgumentTypeError(f"expected eagle=N or baseline=N, got {text!r}")
    return mode, positive_int(value)


def cmd_profile(argv: Sequence[str]) -> NoReturn:
    args = profile_parser().parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        records = [r for path in args.sweeps for r in _read(path)]
        try:
            prof = profile_export.build_profile(
                records,
                args.sweeps,
                name=args.name or args.sweeps[0].stem,
                eagle_target=args.eagle_target,
                baseline_target=args.baseline_target,
                model=args.model,
                interpolate=args.interpolate,
                max_running=dict(args.max_running or []),
                note=args.note,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.out is None:
            sys.stdout.write(prof.dumps())
        else:
            args.out.write_text(prof.dumps(), encoding="utf-8")
            print(f"profile written to {args.out}", file=sys.stderr)
        return 0

    run_main(PROG, body, args.log_level)


def envelope_parser() -> FlagParser:
    p = FlagParser(
        prog=f"{PROG} envelope",
        description=(
            "Start an EAGLE and a baseline dynspec-sim and a dynspec-router on free loopback "
            "ports; sweep each server alone, pick the threshold with suggest-threshold, sweep "
            "the router, and report routed vs the better server at each concurrency "
            "(goal: tok/s >= 0.95x, p50 TPOT <= 1.05x). Writes OUT.jsonl, OUT.md, OUT.png."
        ),
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="run against simulated servers (required: the only mode so far)",
    )
    p.add_argument("--profile", default="demo", help="dynspec-sim profile: NAME or FILE.json")
    p.add_argument(
        "--speed",
        type=positive_float,
        default=1.0,
        help="simulated time runs this many times faster than real time (figures are reported "
        "in model time); keep it low enough that the CPU keeps up",
    )
    p.add_argument(
        "--threshold", type=non_negative_int, default=None, help="override the suggested one"
    )
    p.add_argument(
        "--hysteresis", type=non_negative_int, default=None, help="override the suggested one"
    )
    _add_load_flags(p)
    p.set_defaults(requests_per_c=2)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results path without suffix (default: envelope-PROFILE in the current directory)",
    )
    p.add_argument(
        "--startup-timeout", type=positive_float, default=60.0, help="seconds to wait per process"
    )
    p.add_argument(
        "--from-jsonl",
        type=Path,
        default=None,
        help="run nothing: rewrite the report and plot of an earlier envelope JSONL",
    )
    p.add_argument(
        "--four-way",
        action="store_true",
        help="eight GPUs four ways: two EAGLE and two baseline sims, and a router for each of "
        "routed-threshold (one EAGLE + one baseline, the suggested threshold), routed-balance "
        "(the same two, --policy balance --speed-profile PROFILE), 2x-eagle and 2x-baseline "
        "(one pool of two servers, least in flight); reports balance against its goals "
        "(default --out: envelope8-PROFILE). With --threshold and --hysteresis both given, the "
        "single-server sweeps that suggest them are skipped",
    )
    p.add_argument(
        "--ways",
        type=_ways,
        default=list(FOUR_WAYS),
        help="--four-way: which ways to run, comma-separated",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="--four-way: add to an existing --out JSONL instead of replacing it (the report "
        "then says which ways came from which run)",
    )
    p.add_argument(
        "--metrics-interval",
        type=positive_float,
        default=None,
        help="--four-way: the balance router's --metrics-interval (default: the router's)",
    )
    add_log_level(p)
    return p


# dynspec.bench.fourway.WAYS, without importing the load modules to parse flags.
FOUR_WAYS = ("routed-threshold", "routed-balance", "2x-eagle", "2x-baseline")


def _ways(text: str) -> list[str]:
    ways = [w for w in text.replace(" ", "").split(",") if w]
    if not ways or any(w not in FOUR_WAYS for w in ways):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(FOUR_WAYS)}, got {text!r}")
    return [w for w in FOUR_WAYS if w in ways]


def cmd_envelope(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench import envelope, fourway
    from dynspec.bench.sweep import ProgressLine

    args = envelope_parser().parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        if args.from_jsonl is not None:
            records = _read(args.from_jsonl)
            if fourway.is_four_way(records):
                md, png = fourway.write_report(args.from_jsonl, records)
                print(fourway.summary(records), end="")
            else:
                md, png = envelope.write_report(args.from_jsonl, records)
                print(envelope.summary(records), end="")
            print(f"results: {md}, {png}", file=sys.stderr)
            return 0
        if not args.simulate:
            raise UsageError(
                "only --simulate is supported; on real servers run 'sweep' against each server "
                "and the router"
            )
        from dynspec.launcher.sim.profile import ProfileError, load_profile

        try:
            prof = load_profile(args.profile)
        except ProfileError as exc:
            raise UsageError(f"--profile: {exc}") from None
        if not {"eagle", "baseline"} <= set(prof.modes):
            raise UsageError(f"--profile {args.profile}: needs both an eagle and a baseline mode")
        default = f"envelope8-{prof.name}" if args.four_way else f"envelope-{prof.name}"
        stem = args.out if args.out is not None else Path(default)
        out = stem.with_name(stem.name + ".jsonl") if stem.suffix != ".jsonl" else stem
        out.parent.mkdir(parents=True, exist_ok=True)
        if args.four_way:
            return _four_way(args, argv, out)
        cfg = envelope.EnvelopeConfig(
            profile=args.profile,
            speed=args.speed,
            sweep=_sweep_config(args),
            out=out,
            threshold=args.threshold,
            hysteresis=args.hysteresis,
            seed=args.seed,
            startup_timeout=args.startup_timeout,
            command="dynspec-bench envelope " + shlex.join(argv),
        )
        progress = ProgressLine(enabled=not args.no_progress)
        return _run_then_report(
            lambda: envelope.run(cfg, progress).records, out, "levels", envelope
        )

    run_main(PROG, body, args.log_level)


def _four_way(args: argparse.Namespace, argv: Sequence[str], out: Path) -> int:
    from dynspec.bench import fourway
    from dynspec.bench.sweep import ProgressLine

    if args.append and not (out.exists() and out.stat().st_size > 0):
        raise UsageError(f"--append: {out} does not exist or is empty")
    cfg = fourway.FourWayConfig(
        profile=args.profile,
        speed=args.speed,
        sweep=_sweep_config(args),
        out=out,
        ways=args.ways,
        threshold=args.threshold,
        hysteresis=args.hysteresis,
        metrics_interval=args.metrics_interval,
        seed=args.seed,
        startup_timeout=args.startup_timeout,
        append=args.append,
        command="dynspec-bench envelope " + shlex.join(argv),
    )
    progress = ProgressLine(enabled=not args.no_progress)

    def run() -> None:
        fourway.run(cfg, progress)

    return _run_then_report(run, out, "levels", fourway)


def ramp_parser() -> FlagParser:
    p = FlagParser(
        prog=f"{PROG} ramp",
        description=(
            "Start an EAGLE and a baseline dynspec-sim; on those two servers, one after the "
            "other, run dynspec-router --policy balance without a profile (balance-learning) and "
            "with --speed-profile (balance-profile) under a closed-loop load whose concurrency "
            "steps 1, 2, 4 ... --peak ... 2, 1, --cycles times, --step-seconds each. Reports "
            "tok/s and p50 TPOT per step and whether learning alone is within 10%% of the seeded "
            "router after the first cycle. Takes about 2 x steps x --step-seconds "
            "(steps: 2 x log2(peak) + 1 per cycle). Writes OUT.jsonl, OUT.md, OUT.png."
        ),
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="run against simulated servers (required: the only mode so far)",
    )
    p.add_argument("--profile", default="demo", help="dynspec-sim profile: NAME or FILE.json")
    p.add_argument(
        "--speed",
        type=positive_float,
        default=1.0,
        help="simulated time runs this many times faster than real time (figures are reported "
        "in model time)",
    )
    p.add_argument("--peak", type=positive_int, default=128, help="highest concurrency")
    p.add_argument("--cycles", type=positive_int, default=2, help="ramps up and down")
    p.add_argument(
        "--step-seconds",
        type=positive_float,
        default=10.0,
        help="wall-clock seconds per concurrency step",
    )
    p.add_argument(
        "--variants",
        type=_variants,
        default=list(RAMP_VARIANTS),
        help="which routers to run, comma-separated, in this order",
    )
    p.add_argument("--input-len", type=positive_int, default=256, help="random prompt tokens")
    p.add_argument("--output-len", type=positive_int, default=128, help="output tokens")
    p.add_argument(
        "--range-ratio",
        type=_ratio,
        default=1.0,
        help="random lengths uniform in [ratio x len, len]; 1 = fixed lengths",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for prompts and simulators")
    p.add_argument(
        "--metrics-interval",
        type=positive_float,
        default=None,
        help="the balance routers' --metrics-interval (default: the router's)",
    )
    p.add_argument(
        "--startup-timeout", type=positive_float, default=60.0, help="seconds to wait per process"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results path without suffix (default: ramp-PROFILE in the current directory)",
    )
    p.add_argument(
        "--from-jsonl",
        type=Path,
        default=None,
        help="run nothing: rewrite the report and plot of an earlier ramp JSONL",
    )
    add_log_level(p)
    return p


# dynspec.bench.ramp.VARIANTS, without importing the load modules to parse flags.
RAMP_VARIANTS = ("balance-learning", "balance-profile")


def _variants(text: str) -> list[str]:
    names = [v for v in text.replace(" ", "").split(",") if v]
    if not names or any(v not in RAMP_VARIANTS for v in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected some of {','.join(RAMP_VARIANTS)}, each once, got {text!r}"
        )
    return names


def cmd_ramp(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench import ramp

    args = ramp_parser().parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        if args.from_jsonl is not None:
            records = _read(args.from_jsonl)
            md, png = ramp.write_report(args.from_jsonl, records)
            print(ramp.summary(records), end="")
            print(f"results: {md}, {png}", file=sys.stderr)
            return 0
        if not args.simulate:
            raise UsageError("only --simulate is supported")
        from dynspec.launcher.sim.profile import ProfileError, load_profile

        try:
            prof = load_profile(args.profile)
        except ProfileError as exc:
            raise UsageError(f"--profile: {exc}") from None
        if not {"eagle", "baseline"} <= set(prof.modes):
            raise UsageError(f"--profile {args.profile}: needs both an eagle and a baseline mode")
        stem = args.out if args.out is not None else Path(f"ramp-{prof.name}")
        out = stem.with_name(stem.name + ".jsonl") if stem.suffix != ".jsonl" else stem
        out.parent.mkdir(parents=True, exist_ok=True)
        cfg = ramp.RampConfig(
            profile=args.profile,
            speed=args.speed,
            out=out,
            peak=args.peak,
            cycles=args.cycles,
            step_seconds=args.step_seconds,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            seed=args.seed,
            variants=args.variants,
            metrics_interval=args.metrics_interval,
            startup_timeout=args.startup_timeout,
            command="dynspec-bench ramp " + shlex.join(argv),
        )

        def run() -> None:
            ramp.run(cfg)

        return _run_then_report(run, out, "variants", ramp)

    run_main(PROG, body, args.log_level)


def cmd_overhead(argv: Sequence[str]) -> None:
    from dynspec.bench.overhead import main as overhead_main

    overhead_main(argv, prog=f"{PROG} overhead")


def cmd_gpu(argv: Sequence[str]) -> None:
    from dynspec.bench.gpu.cli import main as gpu_main

    gpu_main(argv)


HANDLERS = {
    "gpu": cmd_gpu,
    "sweep": cmd_sweep,
    "suggest-threshold": cmd_threshold,
    "profile": cmd_profile,
    "envelope": cmd_envelope,
    "ramp": cmd_ramp,
    "overhead": cmd_overhead,
}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _usage() -> str:
    lines = [f"usage: {PROG} {{{','.join(COMMANDS)}}} [flags]  ({PROG} COMMAND --help)", ""]
    lines += [f"  {name:<18} {text}" for name, text in COMMANDS.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    for noisy in ("matplotlib", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args:
        sys.stderr.write(f"{PROG}: error: missing command (choose from {', '.join(COMMANDS)})\n")
        sys.exit(2)
    if args[0] in ("-h", "--help"):
        write_stdout(_usage())
        sys.exit(0)
    handler = HANDLERS.get(args[0])
    if handler is None:
        sys.stderr.write(
            f"{PROG}: error: unknown command {args[0]!r} (choose from {', '.join(COMMANDS)})\n"
        )
        sys.exit(2)
    if args[0] in NEEDS_EXTRA:
        missing = [m for m in EXTRA_MODULES if not _importable(m)]
        if missing:
            sys.stderr.write(
                f"{PROG}: error: {PROG} {args[0]} needs the bench extra ({', '.join(missing)} "
                "not installed): pip install 'dynspec[bench]'\n"
            )
            sys.exit(1)
    handler(args[1:])


if __name__ == "__main__":
    main()
