"""The ``traffic`` plan: open-loop traffic on one GPU, the routed pair against each of its
servers alone (``dynspec.bench.traffic.run_live``), on ``pair-b``'s launch after a short warm
pass; the day's peak from the launch's calibration, chosen once (``settle_peak``). What it runs
and its flags: docs/benchmarks.md, "The plans" and "The traffic plan's day peak".
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynspec.bench import arrivals
from dynspec.bench.cli_traffic import check_router, target_names, variant_of
from dynspec.bench.gpu import toolkit
from dynspec.bench.gpu.launch import finish, launch_argv, router_argv, start_launch, start_router
from dynspec.bench.procs import free_port
from dynspec.common.cli import UsageError, fraction, non_negative_float, positive_float
from dynspec.launcher.config import load_config
from dynspec.launcher.sim.profile import Profile, ProfileError, load_profile
from dynspec.launcher.spec import build_router_spec

if TYPE_CHECKING:
    from dynspec.bench.gpu.attempt import Body
    from dynspec.bench.load import Target

RESULTS = "traffic.jsonl"
VARIANT = "--traffic-variant"
TARGETS = ("routed", "eagle", "baseline")
WARM_LEVELS = (1, 16, 64, 128, 256)
BASELINE_LIMIT = 128  # both servers capped at 128 running, as in every pair run since pair-a-capped
# The day's peak (``capacity``), and the times of the commands it takes (``commands_needed``), from
# the H200's runs: docs/benchmarks.md, "The traffic plan's day peak".
EAGLE_SCALE = 0.75
BASELINE_SCALE = 0.935
EAGLE_OVERLOAD = 1.10
SETUP_S = 55.0
# An MPS launch with a one-pass calibration took 250 s on the H200; with three passes and the
# warm-up levels (--calibrate-passes 3) two H100 launches took 336 and 351 s (1d5e6b7).
LAUNCH_MPS_S = 350.0
WARM_S = 26.0
STOP_S = 25.0
# The open-loop runner starts a run only if this much (beyond its schedule and drain) is left
# (dynspec.bench.traffic._each); drains of a loaded server's queue.
RUN_MARGIN_S = 15.0
DRAIN_S = 30.0
TYPICAL_DRAIN_S = 5.0
SLO_TTFT_MS = 1000.0  # an interactive chat's: the first token within a second,
SLO_TPOT_MS = 20.0  # then at least 50 tokens a second
EXAMPLE_CALIBRATION = "results/h200/pair-b-interval4"  # under bench/: the plan's launch, MPS


@dataclass(frozen=True)
class TrafficPlan:
    """The plan's flags (``--traffic-*``, ``--draft`` and the baseline's): what must be the same
    in every command of one run."""

    day_seconds: float = 120.0
    peak: float | None = None  # req/s at the day's peak; None: from the launch's calibration
    rates: tuple[float, ...] = ()  # constant-rate schedules, req/s each
    rate_seconds: float = 30.0
    draft: str = "hi"
    threshold: str = "auto"
    baseline_limit: int | None = BASELINE_LIMIT
    baseline_args: str = ""
    drain_s: float = DRAIN_S
    # The router's --return-delay (0: off, the router's default) and the launch's --log-level
    # (debug: the router logs every observation its learner takes and each derivation's curves,
    # so a run's learned threshold can be replayed from its log).
    return_delay: float = 0.0
    switch_margin: float = 0.0  # the router's --switch-margin (0: its default)
    switch_lead: float = 0.0  # the router's --switch-lead (0: its default, off)
    log_level: str = "info"
    mps: bool = True  # pair-b's launch; False: pair-a's, the two servers time-slicing the GPU
    targets: tuple[str, ...] = TARGETS
    # --traffic-variant NAME=FLAGS: one more target, a second router with FLAGS after the plan's.
    variant: str = ""
    variant_flags: tuple[str, ...] = ()

    def labels(self) -> tuple[str, ...]:
        """The targets ``run_live`` runs, in order: ``targets``, then the variant."""
        return (*self.targets, *([self.variant] if self.variant else []))

    def router_flags(self) -> list[str]:
        """The router's flags that the plan sets, which the launch passes on (its threshold goes
        to ``launch_argv`` apart)."""
        given = (("--return-delay", self.return_delay), ("--switch-margin", self.switch_margin),
                 ("--switch-lead", self.switch_lead))  # fmt: skip
        return [x for f, v in given if v for x in (f, f"{v:g}")]

    def variant_router_flags(self) -> list[str]:
        """The variant's router flags as its records name them: the plan's, then FLAGS."""
        return ["--threshold", self.threshold, *self.router_flags(), *self.variant_flags]

    def schedule_seconds(self) -> list[tuple[str, float]]:
        """Each schedule's name and length, in the order ``run_live`` runs them."""
        rates = [(rate_name(r), self.rate_seconds) for r in self.rates]
        return [("day", self.day_seconds), *rates]

    def settings(self) -> dict[str, Any]:
        """What ``meta.json`` keeps (``peak`` as chosen is kept beside it, as ``peak_rps``)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def rate_name(rate: float) -> str:
    return f"rate-{rate:g}"


@dataclass(frozen=True)
class Capacity:
    """What the calibration says each server serves a second, and the peak chosen from it."""

    eagle_rps: float
    baseline_rps: float
    peak_rps: float

    @property
    def separated(self) -> bool:
        """Whether the peak lies between the two capacities as calibrated."""
        return self.eagle_rps < self.peak_rps < self.baseline_rps

    def line(self) -> str:
        told = ("" if self.separated else f" ({EAGLE_OVERLOAD:g}x EAGLE's: the calibration puts "
                "the baseline no higher, so the day may overload it too)")  # fmt: skip
        return (f"EAGLE serves ~{self.eagle_rps:.1f} req/s, the baseline ~{self.baseline_rps:.1f}: "
                f"peak {self.peak_rps:.1f} req/s{told}")  # fmt: skip


def capacity(profile: Profile, output_len: int) -> Capacity:
    """Each server's capacity in requests a second (top calibrated tok/s x its scale / output
    tokens a request; EAGLE's curve is flat past its running limit: the calibration measures up
    to it, not beyond), and the peak: their geometric mean, at least ``EAGLE_OVERLOAD`` x EAGLE's,
    rounded to 0.1 req/s."""
    try:
        top = {m: max(t for _, t in profile.mode(m).throughput) for m in ("eagle", "baseline")}
    except ProfileError as exc:
        raise toolkit.RunFailed(f"the calibration: {exc}") from None
    eagle = top["eagle"] * EAGLE_SCALE / output_len
    baseline = top["baseline"] * BASELINE_SCALE / output_len
    peak = max(math.sqrt(eagle * baseline), eagle * EAGLE_OVERLOAD)
    return Capacity(round(eagle, 1), round(baseline, 1), round(peak, 1))


def calibration_file(folder: Path, pattern: str = "*.json") -> Path | None:
    """The calibration profile in ``folder``: the last ``pattern`` file (None: none there)."""
    found = sorted(folder.glob(pattern)) if folder.is_dir() else []
    return found[-1] if found else None


def read_profile(folder: Path, pattern: str = "*.json") -> Profile:
    """``calibration_file``, read by the launcher's reader."""
    found = calibration_file(folder, pattern)
    if found is None:
        raise toolkit.RunFailed(f"no calibration profile in {folder}: give --traffic-peak")
    try:
        return load_profile(str(found))
    except ProfileError as exc:
        raise toolkit.RunFailed(f"calibration {found}: {exc}") from None


def build_targets(urls: Mapping[str, str], labels: Sequence[str]) -> list[Target]:
    """``load.Target`` of each of ``labels`` at its URL in ``urls``, in ``labels``' order."""
    from dynspec.bench import load

    return [load.Target(label, urls[label]) for label in labels]


# ``dynspec.bench.traffic.run_live``'s signature (a test's stand-in has it too).
RunLive = Callable[..., Sequence[Mapping[str, Any]]]


def schedules(plan: TrafficPlan, peak: float) -> tuple[tuple[str, arrivals.Schedule], ...]:
    day = arrivals.parse_schedule(f"day:{plan.day_seconds:g}", rate=peak)
    rates = [(rate_name(r), arrivals.constant(r, plan.rate_seconds)) for r in plan.rates]
    return (("day", day), *rates)


def settle_peak(run: toolkit.Run, plan: TrafficPlan) -> float:
    """The peak of this run: the one an earlier command of it chose (``meta.json``), else the
    flag's, else the calibration's (``capacity``); refused when the earlier command's plan was
    another (its arrivals would not be this one's)."""
    earlier = run.meta.get("traffic")
    mine = plan.settings()
    if earlier:
        theirs, chosen = earlier.get("settings", {}), float(earlier["peak_rps"])
        differ = [f"{k} {theirs.get(k)} there, {mine[k]} here" for k in sorted(mine)
                  if k != "peak" and theirs.get(k) != mine[k]]  # fmt: skip
        # A later command may leave the peak to the first's choice; one that names it must agree.
        if plan.peak is not None and plan.peak != chosen:
            differ.append(f"peak {chosen:g} there, {plan.peak:g} here")
        if differ:
            raise toolkit.RunFailed(
                f"the earlier command ran another traffic plan ({'; '.join(differ)})"
            )
        return chosen
    record: dict[str, Any] = {"settings": mine}
    if plan.peak is not None:
        record["peak_rps"] = plan.peak
    else:
        cap = capacity(read_profile(run.logs / "calibration"), run.steady.output_len)
        record.update(peak_rps=cap.peak_rps, capacity=asdict(cap))
        run.say(f"the day's peak from the calibration: {cap.line()}")
    run.meta["traffic"] = record
    return float(record["peak_rps"])


def plan_launch(run: toolkit.Run, models: Path, plan: TrafficPlan) -> list[str]:
    """The plan's ``dynspec-launch`` command line (``launch_argv`` with the plan's settings)."""
    return launch_argv(run, models, threshold=plan.threshold, mps=plan.mps, draft=plan.draft,
                       baseline_limit=plan.baseline_limit, baseline_args=plan.baseline_args,
                       more=[*plan.router_flags(), "--log-level", plan.log_level])  # fmt: skip


def check_variant(plan: TrafficPlan, **how: Any) -> None:
    """The variant's flags after the plan's as the router reads them (``check_router``)."""
    check_router(f"{VARIANT} {plan.variant}", plan.variant_router_flags(), **how)


def start_variant(run: toolkit.Run, plan: TrafficPlan, port: int) -> subprocess.Popen[bytes]:
    """The variant's router on ``port``: the launch's router, the launch's calibration its
    ``--speed-profile`` (as the launcher gives its own; the one the day's peak was read from),
    then the variant's flags."""
    found = calibration_file(run.logs / "calibration")
    more = [*(["--speed-profile", str(found)] if found else []), *plan.variant_flags]
    argv = router_argv(run.meta["commands"], port, drop=["--speed-profile"], more=more)
    run.meta["variant_router_argv"] = argv
    return start_router(run, f"router-{plan.variant}", argv, port)


def plan_traffic(
    run: toolkit.Run,
    models: Path,
    session: dict[str, Any] | None,
    *,
    plan: TrafficPlan,
    keep: bool,
    seconds: float | None = None,
    command: str = "",
    run_live: RunLive | None = None,
) -> int:
    """The plan's body (``attempt.Body``): launch (or the kept launch), warm, ``run_live`` until
    every run is in ``traffic.jsonl`` or the budget (``seconds`` at most) is spent; then keep the
    launch for the next command (``keep``) or stop it."""
    from dynspec.bench import traffic  # aiohttp and the runner: only when a run needs them

    toolkit.check_models(models, plan.draft)
    out = run.results / RESULTS
    served = toolkit.pair_urls(run.ports)
    routers = {"routed": served["routed"]}  # sampled in their runs
    port = int((session or {}).get("variant_port") or free_port())
    if plan.variant:
        routers[plan.variant] = served[plan.variant] = f"http://127.0.0.1:{port}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        if session is None:
            if plan.variant:  # before the launch: flags the router refuses cost no launch
                check_variant(plan, python=run.python, env=run.env, error=toolkit.RunFailed)
            procs["launcher"] = start_launch(run, plan_launch(run, models, plan))
            peak = settle_peak(run, plan)
            if plan.variant:  # up before the warm pass: both routers' learners see its polls
                procs["variant_router"] = start_variant(run, plan, port)
            warm = {"eagle": served["eagle"], "baseline": served["baseline"]}
            toolkit.warm(run, warm, WARM_LEVELS)
        else:
            # A refused plan leaves the kept launch up for a corrected command (one session lost
            # it: the next command launched again, about 4 device minutes).
            run.keep = keep
            peak = settle_peak(run, plan)
        cfg = traffic.TrafficConfig(
            schedules=schedules(plan, peak), input_len=run.steady.input_len,
            output_len=run.steady.output_len, repeats=run.steady.repeats, drain_s=plan.drain_s,
            slo_ttft_ms=SLO_TTFT_MS, slo_tpot_ms=SLO_TPOT_MS, command=command,
        )  # fmt: skip
        extra = {"plan": "traffic", "commit": run.meta.get("commit"), "draft": plan.draft,
                 "peak_rps": peak, "mps": plan.mps,
                 "gpu": run.meta.get("versions", {}).get("gpu")}  # fmt: skip
        names = [name for name, _ in plan.schedule_seconds()]
        run.say(f"traffic: {', '.join(names)} (day peak {peak:g} req/s) x {run.steady.repeats} "
                f"repeats over {', '.join(plan.labels())}")  # fmt: skip
        live = run_live or traffic.run_live
        # The variant's records name its router flags, as the simulated variant's do.
        fields = {plan.variant: {"router": shlex.join(plan.variant_router_flags())}}
        live(build_targets(served, plan.labels()), cfg, out, watch=routers, extra=extra,
             deadline=run.sweep_deadline(seconds), fields=fields)  # fmt: skip
        left = len(traffic.runs_left(cfg, plan.labels(), out))
        run.meta["traffic_runs_left"] = left
        if left:
            run.say(f"{left} runs left (the budget): the next command with --keep resumes")
        return finish(run, procs, session, keep=keep and left > 0, variant_port=port)
    except BaseException:  # no router of this command's outlives it (the launch: attempt's end)
        if "variant_router" in procs:
            run.stop(procs["variant_router"])
        raise


# -- the operator's view: the estimate and the dry run ----------------------------------------


def commands_needed(
    plan: TrafficPlan, repeats: int, budget: float, *, drain: float
) -> list[tuple[int, float]]:
    """Runs and seconds of each device command of ``--keep`` commands of ``budget`` seconds, each
    run lasting its schedule plus ``drain`` (the runner starts a run only if its schedule, the
    whole drain and ``RUN_MARGIN_S`` fit before the deadline): the first command also sets up,
    launches and warms, the last stops the launch."""
    room = budget - toolkit.KEEP_RESERVE_S
    lengths = [s for _, s in plan.schedule_seconds()] * repeats * len(plan.labels())
    if any(s + plan.drain_s + RUN_MARGIN_S > room for s in lengths):
        raise toolkit.RunFailed("a run is longer than one command's budget")
    out: list[tuple[int, float]] = []
    t = SETUP_S + LAUNCH_MPS_S + WARM_S
    runs = 0
    for s in lengths:
        if t + s + plan.drain_s + RUN_MARGIN_S > room:  # the next command runs it
            out.append((runs, t))
            t, runs = 0.0, 0
        t += s + drain
        runs += 1
    out.append((runs, t + STOP_S))
    return out


def estimate_lines(plan: TrafficPlan, repeats: int, budget: float) -> list[str]:
    total = len(plan.schedule_seconds()) * repeats * len(plan.labels())
    lines = [
        f"# {total} runs; device commands of --budget {budget:g} with --keep (the first sets up "
        f"{SETUP_S:.0f} s, launches {LAUNCH_MPS_S:.0f} s, warms {WARM_S:.0f} s):"
    ]
    for what, drain in (("typical", TYPICAL_DRAIN_S), ("every run draining", plan.drain_s)):
        cmds = commands_needed(plan, repeats, budget, drain=drain)
        per = ", ".join(f"{n} ({s:.0f} s)" for n, s in cmds)
        lines.append(f"#   {what} {drain:g} s: {len(cmds)} commands, runs (seconds) {per}; "
                     f"{sum(s for _, s in cmds) / 60:.1f} device minutes")  # fmt: skip
    return lines


def example_capacity(output_len: int) -> Capacity | None:
    """``capacity`` of the H200's last MPS calibration committed (the dry run's example)."""
    folder = Path(__file__).resolve().parents[1] / EXAMPLE_CALIBRATION
    try:
        return capacity(read_profile(folder, "calibration-*.json"), output_len)
    except toolkit.RunFailed:
        return None


def dry_run(args: argparse.Namespace) -> str:
    """The launch's command line, the schedules, the peak's rule and the commands it takes."""
    budget = min(args.budget, 600.0)
    run = toolkit.Run(out=args.out, work=args.work, deadline=time.monotonic() + args.budget, env={})
    run.ports, run.python = args.ports, "python3"
    st = run.steady = toolkit.Steady(repeats=args.repeats, output_len=args.output_len)
    plan = plan_of(args)
    launch = plan_launch(run, args.models or args.work / "models", plan)
    ex = example_capacity(st.output_len)
    if plan.peak is not None:
        peak = f"{plan.peak:g} req/s (--traffic-peak)"
    else:
        peak = ("auto: chosen at launch from its calibration, the geometric mean of EAGLE's "
                f"(top tok/s x {EAGLE_SCALE}) and the baseline's (x {BASELINE_SCALE}) capacity at "
                f"{st.output_len} output tokens, at least {EAGLE_OVERLOAD:g}x EAGLE's")  # fmt: skip
        peak += f"; with {EXAMPLE_CALIBRATION}'s (draft hi): {ex.line()}" if ex else ""
    lines = [
        f"# traffic plan: one launch ({'MPS' if plan.mps else 'no MPS'}, draft {plan.draft}, "
        f"threshold {plan.threshold}, return delay {plan.return_delay:g} s, "
        + (f"switch margin {plan.switch_margin:g}, " if plan.switch_margin else "")
        + (f"switch lead {plan.switch_lead:g}, " if plan.switch_lead else "")
        + "log level "
        f"{plan.log_level}), a warm pass at C={','.join(map(str, WARM_LEVELS))}, then "
        f"{st.repeats} repeats x each schedule x {', '.join(plan.labels())} (order rotated each "
        f"repeat, the same arrivals within a repeat), {st.input_len} tokens in, "
        f"{st.output_len} out, drain {plan.drain_s:g} s",
        f"# day: the compressed day over {plan.day_seconds:g} s (day:{plan.day_seconds:g}), "
        f"peak {peak}",
        *(f"# {rate_name(r)}: {r:g} req/s for {plan.rate_seconds:g} s" for r in plan.rates),
        *estimate_lines(plan, st.repeats, budget),
        shlex.join(launch),
    ]
    if plan.variant:  # the launcher's router command as its --dry-run builds it, then FLAGS
        spec = build_router_spec(load_config(launch[3:], environ={})).argv
        argv = router_argv([shlex.join([run.python, *spec[1:]])], "PORT", more=plan.variant_flags)
        lines += [f"# {plan.variant}: a second router on a free PORT, the launch's calibration its "
                  f"--speed-profile, its log {run.logs}/router-{plan.variant}.log",
                  shlex.join(argv)]  # fmt: skip
    return "\n".join(lines) + "\n"


# -- flags ---------------------------------------------------------------------------------------


def _peak(text: str) -> float | None:
    if text == "auto":
        return None
    try:
        return positive_float(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"want req/s > 0 or auto: {text!r}") from None


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(positive_float(x) for x in text.split(",") if x.strip())
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        rates = ()
    if not rates or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"want different req/s > 0, comma-separated: {text!r}")
    return rates


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traffic-day-seconds", type=positive_float, help="the day's (default 120)")
    p.add_argument("--traffic-peak", type=_peak, help="the day's req/s, or auto (the default)")
    p.add_argument("--traffic-rates", type=_rates, help="constant req/s after the day: R,R,...")
    p.add_argument("--traffic-rate-seconds", type=positive_float, help="each (default 30)")
    p.add_argument(
        "--traffic-return-delay", type=non_negative_float, help="the router's (default 0: off)"
    )
    p.add_argument("--traffic-switch-margin", type=fraction, help="the router's (default 0)")
    p.add_argument(
        "--traffic-switch-lead", type=non_negative_float, help="the router's (default 0: off)"
    )
    p.add_argument("--traffic-log-level", choices=("info", "debug"), help="the launch's (info)")
    p.add_argument("--traffic-mps", choices=("on", "off"), help="the launch's --mps (on)")
    p.add_argument("--traffic-targets", help="some of routed,eagle,baseline (default: all)")
    p.add_argument(VARIANT, help="NAME=FLAGS: one more target, a second router (the launch's, "
                   "then FLAGS) in front of the same servers")  # fmt: skip


def check_flags(args: argparse.Namespace) -> str | None:
    """A usage error of the traffic flags, or None."""
    traffic = {n: v for n, v in vars(args).items() if n.startswith("traffic_")}  # add_flags'
    given = [f"--{n.replace('_', '-')}" for n, v in traffic.items() if v is not None]
    if given and args.plan != "traffic":
        return f"{', '.join(given)}: only the traffic plan"
    if args.plan != "traffic":
        return None
    if args.traffic_rate_seconds is not None and not args.traffic_rates:
        return "--traffic-rate-seconds: only with --traffic-rates"
    steady = (("--levels", args.levels), ("--baseline-from", args.baseline_from),
              ("--router-cost", args.router_cost or None))  # fmt: skip
    wrong = [flag for flag, value in steady if value is not None]
    if wrong:
        return f"{', '.join(wrong)}: not for the traffic plan (it runs schedules, not levels)"
    budget = min(args.budget, 600.0)
    try:
        plan = plan_of(args)
        # The GPU machine's own Python has the router's packages only from the bundle: there the
        # plan checks the flags before its launch (check_variant).
        if plan.variant and importlib.util.find_spec("uvicorn"):
            check_variant(plan)
    except UsageError as exc:
        return str(exc)
    longest = max(s for _, s in plan.schedule_seconds()) + plan.drain_s + RUN_MARGIN_S
    if longest > budget - toolkit.KEEP_RESERVE_S:
        return f"a run takes up to {longest:g} s, more than --budget {args.budget:g} holds"
    return None


def plan_of(args: argparse.Namespace) -> TrafficPlan:
    # Each --traffic-NAME where given (and not 0), else the plan's default.
    names = ("day_seconds", "rate_seconds", "return_delay", "switch_margin", "switch_lead",
             "log_level")  # fmt: skip
    given = {k: v for k in names if (v := getattr(args, f"traffic_{k}"))}
    limit = BASELINE_LIMIT if args.baseline_limit is None else args.baseline_limit
    if args.traffic_targets is not None:
        given["targets"] = target_names(args.traffic_targets, "--traffic-targets")
    if args.traffic_variant is not None:
        given["variant"], given["variant_flags"] = variant_of(
            args.traffic_variant, TARGETS, VARIANT
        )
    return TrafficPlan(
        **given, peak=args.traffic_peak, rates=args.traffic_rates or (), draft=args.draft,
        threshold=args.threshold or "auto", baseline_limit=limit,
        baseline_args=args.baseline_args or "", mps=args.traffic_mps != "off",
    )  # fmt: skip


def body_of(args: argparse.Namespace) -> Body:
    """The plan's part of the attempt, from its flags."""
    return partial(plan_traffic, plan=plan_of(args), keep=args.keep, seconds=args.sweep_seconds,
                   command=command_line())  # fmt: skip


def command_line() -> str:
    """This command as typed (``python -m dynspec.bench gpu run ...``: argv from ``gpu``)."""
    return shlex.join(["dynspec-bench", *sys.argv[1:]])
