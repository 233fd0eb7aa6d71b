"""``dynspec-bench traffic``: open-loop traffic against the routed pair and each server alone
(bench/traffic.py, bench/slo.py, bench/traffic_report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynspec.bench.cli_common import (
    add_request_timeout,
    add_router_log_level,
    add_sharing_flag,
    add_simulate_flags,
    out_path,
    ratio,
    rerender,
    run_then_report,
    sim_profile,
)
from dynspec.common.cli import (
    FlagParser,
    UsageError,
    non_negative_float,
    positive_float,
    positive_int,
)

DESCRIPTION = (
    "Open-loop load (each request sent at its arrival time, whatever is in flight, as "
    "sglang.bench_serving --request-rate sends) against the routed pair and each server alone, "
    "every target on the same arrivals, interleaved and repeated. The load: --request-rate for "
    "--duration, a --schedule (steps, ramps, or the named compressed 'day'), a --rates sweep, "
    "or a --trace replayed. With --simulate every run gets fresh dynspec-sim servers (and a "
    "router); with --url the targets are up already. Reports per window offered rate, tok/s, "
    "in-flight, pool share, mode switches, TTFT and TPOT p50/p99, SLO attainment and goodput "
    "(requests a second meeting both SLOs); writes OUT.jsonl, OUT.md and pictures."
)

if TYPE_CHECKING:
    from dynspec.bench.traffic import TrafficConfig


def _rates(text: str) -> list[float]:
    try:
        out = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates: {text!r}") from None
    if not out or any(r <= 0 for r in out):
        raise argparse.ArgumentTypeError("rates must be > 0 requests a second")
    return sorted(set(out))


def _threshold(text: str) -> str:
    if text == "auto" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'auto', got {text!r}")


def add_arguments(p: FlagParser) -> None:
    add_simulate_flags(p)
    p.add_argument(
        "--url",
        action="append",
        default=[],
        help="a target that is up already, LABEL=URL (repeat the flag; 'routed', 'eagle' and "
        "'baseline' are the report's labels); instead of --simulate",
    )
    p.add_argument(
        "--watch",
        action="append",
        default=[],
        help="--url: the label of a dynspec router whose /metrics and /status are sampled "
        "during its runs (default: 'routed' when there is one)",
    )
    p.add_argument(
        "--targets",
        default="routed,eagle,baseline",
        help="--simulate: which of routed, eagle, baseline to run, comma-separated",
    )
    p.add_argument(
        "--layout",
        choices=("split", "paired"),
        default="split",
        help="--simulate: split (an EAGLE and a baseline server of their own) or paired (both on "
        "one shared simulated GPU, dynspec-sim --pair)",
    )
    add_sharing_flag(p, "--layout paired: ")
    add_router_log_level(p, "info")
    p.add_argument(
        "--threshold", type=_threshold, default="auto", help="the routed router's --threshold"
    )
    p.add_argument("--hysteresis", type=positive_int, default=None, help="its --hysteresis")
    p.add_argument(
        "--calibrated",
        action="store_true",
        help="give the routed router the profile as --speed-profile (the start a launch's "
        "--calibrate gives it: a measurement of each server alone)",
    )
    p.add_argument(
        "--return-delay",
        type=non_negative_float,
        default=None,
        help="the routed router's --return-delay, in model seconds (given to the router / "
        "--speed; default: the router's)",
    )
    p.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="the routed router's --max-concurrency (beyond it: 503 with Retry-After)",
    )
    p.add_argument(
        "--request-rate", type=positive_float, default=None, help="requests a second (a constant "
        "rate for --duration; with --schedule day, the day's peak)",
    )  # fmt: skip
    p.add_argument(
        "--duration", type=positive_float, default=60.0, help="seconds of a constant rate"
    )
    p.add_argument(
        "--schedule",
        action="append",
        default=[],
        help="[NAME=]TEXT: segments 'R@S' (R req/s for S s) or 'R1-R2@S' (a ramp), comma-"
        "separated, or 'day[:S]' (a compressed day of S s: a quiet night, a morning ramp, a peak "
        "at --request-rate, bursts); repeat the flag for several",
    )
    p.add_argument(
        "--rates",
        type=_rates,
        default=None,
        help="a rate sweep: a constant-rate schedule 'rate-R' for each, --rate-seconds each",
    )
    p.add_argument("--rate-seconds", type=positive_float, default=30.0, help="--rates: seconds")
    p.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of the inter-arrival times (sglang.bench_serving's): 1 is Poisson, "
        "lower is burstier",
    )
    p.add_argument("--input-len", type=positive_int, default=256, help="random prompt tokens")
    p.add_argument("--output-len", type=positive_int, default=128, help="output tokens")
    p.add_argument(
        "--random-range-ratio",
        "--range-ratio",
        dest="range_ratio",
        type=ratio,
        default=1.0,
        help="lengths uniform in [ratio x len, len] (sglang.bench_serving's); 1 = fixed",
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="replay arrivals and lengths from a CSV or JSONL trace (the Azure LLM-inference "
        "columns TIMESTAMP,ContextTokens,GeneratedTokens; BurstGPT's Timestamp,Request tokens,"
        "Response tokens; or timestamp,input_tokens,output_tokens)",
    )
    p.add_argument(
        "--trace-speedup", type=positive_float, default=1.0, help="--trace: times / this"
    )
    p.add_argument("--slo-ttft-ms", type=positive_float, default=1000.0, help="TTFT SLO")
    p.add_argument("--slo-tpot-ms", type=positive_float, default=50.0, help="TPOT SLO")
    p.add_argument("--window", type=positive_float, default=10.0, help="report window, seconds")
    p.add_argument("--repeats", type=positive_int, default=3, help="runs of every target")
    p.add_argument("--seed", type=int, default=0, help="arrivals of repeat r: seed + r")
    p.add_argument(
        "--drain",
        type=non_negative_float,
        default=30.0,
        help="wall seconds the open requests get after the last arrival; then they are cut",
    )
    add_request_timeout(p)


def _schedules(args: argparse.Namespace) -> list[tuple[str, object]]:
    from dynspec.bench import arrivals

    out: list[tuple[str, object]] = []
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
        raise UsageError(f"--schedule: {exc}") from None
    if not out and args.request_rate is not None:
        rate = args.request_rate
        out.append((f"rate-{rate:g}", arrivals.constant(rate, args.duration)))
    if len({n for n, _ in out}) < len(out):
        raise UsageError("--schedule: two schedules share a name; name them NAME=TEXT")
    return out


def run(args: argparse.Namespace) -> int:
    from dynspec.bench import arrivals, traffic, traffic_report
    from dynspec.bench.load import parse_target

    if args.from_jsonl is not None:
        return rerender(args.from_jsonl, lambda _: traffic_report)
    trace = None
    if args.trace is not None:
        try:
            trace = arrivals.read_trace(args.trace, speedup=args.trace_speedup)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--trace: {exc}") from None
    schedules = _schedules(args)
    if trace is not None and schedules:
        raise UsageError(
            "--trace: the trace is the load; not with --request-rate, --schedule or --rates"
        )
    if trace is not None:
        span = max(a.at for a in trace.arrivals) + 1e-3
        schedules = [("trace", arrivals.constant(len(trace.arrivals) / span, span))]
    if not schedules:
        raise UsageError("no load: give --request-rate, --schedule, --rates or --trace")
    cfg = traffic.TrafficConfig(
        schedules=tuple(schedules),  # type: ignore[arg-type]
        burstiness=args.burstiness,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        trace=trace,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        window_s=args.window,
        repeats=args.repeats,
        seed=args.seed,
        speed=args.speed if args.simulate else 1.0,
        drain_s=args.drain,
        request_timeout=args.request_timeout,
        command=args.command_line,
    )
    if args.url:
        if args.simulate:
            raise UsageError("--url and --simulate: choose one")
        try:
            targets = [parse_target(u) for u in args.url]
        except ValueError as exc:
            raise UsageError(f"--url: {exc}") from None
        labels = {t.label for t in targets}
        watch = args.watch or (["routed"] if "routed" in labels else [])
        if set(watch) - labels:
            raise UsageError(f"--watch: no --url labelled {sorted(set(watch) - labels)[0]!r}")
        out = out_path(args, "traffic")
        refuse_other_plan(out, cfg)
        by = {t.label: t.base_url for t in targets}

        def live() -> None:
            traffic.run_live(targets, cfg, out, watch={w: by[w] for w in watch})

        return run_then_report(live, out, "runs", traffic_report)
    prof = sim_profile(args)
    names = [n for n in args.targets.replace(" ", "").split(",") if n]
    if not names or set(names) - set(traffic.TARGETS) or len(set(names)) < len(names):
        raise UsageError(f"--targets: some of {','.join(traffic.TARGETS)}, each once")
    settings = ["--threshold", args.threshold]
    if args.hysteresis is not None:
        settings += ["--hysteresis", str(args.hysteresis)]
    if args.return_delay is not None:
        # The router's clock is the wall clock: a model-time delay runs --speed times faster.
        settings += ["--return-delay", repr(args.return_delay / args.speed)]
    if args.max_concurrency is not None:
        settings += ["--max-concurrency", str(args.max_concurrency)]
    sim = traffic.SimTraffic(
        profile=args.profile,
        layout=args.layout,
        targets=tuple(names),
        router_settings=tuple(settings),
        calibrated=args.calibrated,
        sharing=args.sharing,
        startup_timeout=args.startup_timeout,
        router_log_level=args.router_log_level,
        speed=args.speed,
        seed=args.seed,
    )
    out = out_path(args, f"traffic-{prof.name}")
    refuse_other_plan(out, cfg, {"profile": args.profile, "layout": args.layout})

    def simulated() -> None:
        traffic.run_simulated(cfg, sim, out)

    return run_then_report(simulated, out, "runs", traffic_report)


def refuse_other_plan(out: Path, cfg: TrafficConfig, more: dict[str, Any] | None = None) -> None:
    """A usage error when ``out`` holds runs of another plan: a rerun resumes, keeping them."""
    from dynspec.bench import traffic

    why = traffic.other_plan(out, cfg, more)
    if why is not None:
        raise UsageError(
            f"{out} holds runs of another plan ({why}); a rerun goes on from the runs there: "
            "give another --out, or remove it to start afresh"
        )
