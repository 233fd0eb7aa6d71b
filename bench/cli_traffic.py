"""``dynspec-bench traffic``: open-loop traffic against the routed pair and each server alone
(bench/traffic.py, bench/slo.py, bench/traffic_report.py). The flags: docs/benchmarks.md."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from dynspec.bench import arrivals, cli_common
from dynspec.bench.arrivals import Schedule
from dynspec.common import cli

if TYPE_CHECKING:
    from dynspec.bench.traffic import TrafficConfig

DESCRIPTION = (
    "Open-loop load (each request sent at its arrival time, whatever is in flight, as "
    "sglang.bench_serving --request-rate sends) against the routed pair and each server alone, "
    "every target on the same arrivals, interleaved and repeated: --request-rate for "
    "--duration, --schedule (steps, ramps, the compressed 'day'), a --rates sweep or a --trace. "
    "--simulate starts fresh dynspec-sim servers (and a router) for every run; --url loads "
    "targets that are up. Reports per window SLO attainment, goodput, TTFT and TPOT p50/p99, "
    "tok/s, pool share and mode switches; writes OUT.jsonl, OUT.md and pictures."
)


def _rates(text: str) -> list[float]:
    return cli_common.numbers(text, float, "rates (requests a second)")


def add_arguments(p: cli.FlagParser) -> None:
    cli_common.add_simulate_flags(p)
    p.add_argument(
        "--url", action="append", default=[], help="a target that is up already, LABEL=URL "
        "(repeat the flag; routed, eagle, baseline are the report's labels); not with --simulate",
    )  # fmt: skip
    p.add_argument(
        "--watch", action="append", default=[], help="--url: the label of a dynspec router "
        "sampled during its runs (default: routed, if there is one)",
    )  # fmt: skip
    p.add_argument("--targets", default="routed,eagle,baseline", help="--simulate: which to run")
    p.add_argument("--variant", action="append", default=[], help="--simulate: NAME=FLAGS, "
                   "repeatable: one more routed target, its router given the routed one's flags "
                   "and FLAGS (as given: seconds are wall-clock)")  # fmt: skip
    p.add_argument(
        "--layout", choices=("split", "paired"), default="split", help="--simulate: the routed "
        "pair's servers of their own, or on one shared simulated GPU (dynspec-sim --pair)",
    )  # fmt: skip
    cli_common.add_sharing_flag(p, "--layout paired: ")
    cli_common.add_router_log_level(p, "info")
    p.add_argument(
        "--calibrated", action="store_true", help="give the routed router the profile as "
        "--speed-profile (what a launch's --calibrate gives it)",
    )  # fmt: skip
    p.add_argument(
        "--schedule", action="append", default=[], help="[NAME=]TEXT, repeatable: segments "
        "'R@S' (R req/s for S s) or 'R1-R2@S' (a ramp), comma-separated, or 'day[:S]' (a "
        "compressed day of S s, its peak at --request-rate)",
    )  # fmt: skip
    cli_common.add_length_flags(
        p, pool=False, ratio_flags=("--random-range-ratio", "--range-ratio")
    )
    for flag, kind, default, text in (
        ("--threshold", cli_common.threshold_value, "auto", "the routed router's --threshold: N "
         "or auto"),
        ("--hysteresis", cli.positive_int, None, "its --hysteresis"),
        ("--return-delay", cli.non_negative_float, None, "its --return-delay, model seconds"),
        ("--switch-margin", cli.fraction, None, "its --switch-margin"),
        ("--switch-lead", cli.non_negative_float, None, "its --switch-lead"),
        ("--max-concurrency", cli.positive_int, None, "its --max-concurrency (past it: 503)"),
        ("--request-rate", cli.positive_float, None, "requests a second for --duration, or the "
         "peak of --schedule day"),
        ("--duration", cli.positive_float, 60.0, "seconds of a constant --request-rate"),
        ("--rates", _rates, None, "a rate sweep: a constant-rate schedule 'rate-R' for each"),
        ("--rate-seconds", cli.positive_float, 30.0, "each --rates schedule's seconds"),
        ("--burstiness", cli.positive_float, 1.0, "gamma shape of the gaps between arrivals "
         "(sglang.bench_serving's): 1 is Poisson, lower is burstier"),
        ("--trace", Path, None, "replay a CSV or JSONL trace: Azure's, BurstGPT's or "
         "timestamp,input_tokens,output_tokens"),
        ("--trace-speedup", cli.positive_float, 1.0, "--trace: its times divided by this"),
        ("--slo-ttft-ms", cli.positive_float, 1000.0, "TTFT SLO"),
        ("--slo-tpot-ms", cli.positive_float, 50.0, "TPOT SLO"),
        ("--window", cli.positive_float, 10.0, "report window, seconds"),
        ("--repeats", cli.positive_int, 3, "runs of every target"),
        ("--seed", int, 0, "arrivals of repeat r: seed + r"),
        ("--drain", cli.non_negative_float, 30.0, "wall seconds the open requests get after the "
         "last arrival; then they are cut"),
    ):  # fmt: skip
        p.add_argument(flag, type=kind, default=default, help=text)
    cli_common.add_request_timeout(p)


def _schedules(args: argparse.Namespace) -> list[tuple[str, Schedule]]:
    out: list[tuple[str, Schedule]] = []
    try:
        for text in args.schedule:
            name, sep, body = text.partition("=")
            if not sep:
                name, body = text.split(":", 1)[0].split("@", 1)[0], text
                name = name if name == "day" else f"schedule{len(out) + 1}"
            out.append((name, arrivals.parse_schedule(body, rate=args.request_rate)))
        for rate in args.rates or []:
            out.append((f"rate-{rate:g}", arrivals.constant(rate, args.rate_seconds)))
    except ValueError as exc:
        raise cli.UsageError(f"--schedule: {exc}") from None
    if not out and args.request_rate is not None:
        rate = args.request_rate
        out.append((f"rate-{rate:g}", arrivals.constant(rate, args.duration)))
    if len({n for n, _ in out}) < len(out):
        raise cli.UsageError("--schedule: two schedules share a name; name them NAME=TEXT")
    return out


Variant = tuple[str, tuple[str, ...]]  # a variant's name and router flags


def target_names(text: str, flag: str = "--targets") -> tuple[str, ...]:
    """``--targets LIST``: some of ``traffic.TARGETS``, each once, in the order given."""
    from dynspec.bench.traffic import TARGETS

    names = [n for n in text.replace(" ", "").split(",") if n]
    if not names or set(names) - set(TARGETS) or len(set(names)) < len(names):
        raise cli.UsageError(f"{flag}: some of {','.join(TARGETS)}, each once")
    return tuple(names)


def variant_of(text: str, taken: Collection[str], flag: str = "--variant") -> Variant:
    """``NAME=FLAGS``: a new label (none of ``taken``) and its router flags, split as a shell
    would."""
    name, sep, flags = text.partition("=")
    if not (sep and re.fullmatch(r"[a-z0-9][a-z0-9-]*", name)) or name in taken:
        raise cli.UsageError(f"{flag} {name}: NAME=FLAGS, NAME a new label of a-z 0-9 -")
    try:
        return name, tuple(shlex.split(flags))
    except ValueError as exc:
        raise cli.UsageError(f"{flag} {name}: {exc}") from None


def check_router(
    who: str, flags: Sequence[str], *, python: str = sys.executable,
    env: Mapping[str, str] | None = None, error: type[Exception] = cli.UsageError,
) -> None:  # fmt: skip
    """``flags`` as the router reads them (``--check``, a process: the bench imports nothing of
    the router), by default without this shell's DYNSPEC_*; ``error`` says why, after ``who``."""
    from dynspec.bench.procs import captured, environment_without, last_line

    env = environment_without(("DYNSPEC_",)) if env is None else env
    argv = [python, "-m", "dynspec.router", "--check", "--pair", "http://h:1,http://h:2", *flags]
    if (r := captured(argv, env=env, timeout=60)).returncode:
        raise error(f"{who}: {last_line(r.stderr).split(': error: ')[-1]}")


def _variants(texts: list[str], settings: list[str]) -> tuple[Variant, ...]:
    """``--variant NAME=FLAGS``: each a new label, its flags checked by the router."""
    from dynspec.bench.traffic import TARGETS

    out: dict[str, tuple[str, ...]] = {}
    for text in texts:
        name, flags = variant_of(text, {*TARGETS, *out})
        check_router(f"--variant {name}", [*settings, *flags])
        out[name] = flags
    return tuple(out.items())


def _config(args: argparse.Namespace) -> TrafficConfig:
    from dynspec.bench import traffic

    trace = None
    if args.trace is not None:
        try:
            trace = arrivals.read_trace(args.trace, speedup=args.trace_speedup)
        except (OSError, ValueError) as exc:
            raise cli.UsageError(f"--trace: {exc}") from None
    schedules = _schedules(args)
    if trace is not None and schedules:
        raise cli.UsageError(
            "--trace: the trace is the load; not with --request-rate, --schedule or --rates"
        )
    if trace is not None:
        span = max(a.at for a in trace.arrivals) + 1e-3
        schedules = [("trace", arrivals.constant(len(trace.arrivals) / span, span))]
    if not schedules:
        raise cli.UsageError("no load: give --request-rate, --schedule, --rates or --trace")
    return traffic.TrafficConfig(
        schedules=tuple(schedules), burstiness=args.burstiness, input_len=args.input_len,
        output_len=args.output_len, range_ratio=args.range_ratio, trace=trace,
        slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, window_s=args.window,
        repeats=args.repeats, seed=args.seed, speed=args.speed if args.simulate else 1.0,
        drain_s=args.drain, request_timeout=args.request_timeout, command=args.command_line,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from dynspec.bench import traffic, traffic_report

    if args.from_jsonl is not None:
        return cli_common.rerender(args.from_jsonl, lambda _: traffic_report)
    cfg = _config(args)
    if args.url:
        if args.simulate or args.variant:  # with --url, another router is another --url
            raise cli.UsageError("--url: not with --simulate or --variant")
        chosen = cli_common.targets(args.url)
        labels = {t.label for t in chosen}
        watch = args.watch or (["routed"] if "routed" in labels else [])
        if set(watch) - labels:
            raise cli.UsageError(f"--watch: no --url labelled {sorted(set(watch) - labels)[0]!r}")
        out = cli_common.out_path(args, "traffic")
        out.write_text("", encoding="utf-8")  # a rerun starts afresh, as envelope's does
        by = {t.label: t.base_url for t in chosen}
        live = partial(traffic.run_live, chosen, cfg, out, watch={w: by[w] for w in watch})
        return cli_common.run_then_report(live, out, "runs", traffic_report)
    prof = cli_common.sim_profile(args)
    names = target_names(args.targets)
    settings = ["--threshold", args.threshold]
    # The router's clock is the wall clock: a model-time delay runs --speed times faster.
    delay = None if args.return_delay is None else args.return_delay / args.speed
    for flag, value, text in (
        ("--hysteresis", args.hysteresis, str), ("--return-delay", delay, repr),
        ("--switch-margin", args.switch_margin, "{:g}".format),
        ("--switch-lead", args.switch_lead, "{:g}".format),
        ("--max-concurrency", args.max_concurrency, str),
    ):  # fmt: skip
        settings += [flag, text(value)] if value is not None else []
    variants = _variants(args.variant, settings)
    sim = traffic.SimTraffic(
        profile=args.profile, layout=args.layout, targets=(*names, *(n for n, _ in variants)),
        router_settings=tuple(settings), variants=variants, calibrated=args.calibrated,
        sharing=args.sharing,
        startup_timeout=args.startup_timeout, router_log_level=args.router_log_level,
        speed=args.speed, seed=args.seed,
    )  # fmt: skip
    out = cli_common.out_path(args, f"traffic-{prof.name}")
    out.write_text("", encoding="utf-8")
    return cli_common.run_then_report(
        partial(traffic.run_simulated, cfg, sim, out), out, "runs", traffic_report
    )
