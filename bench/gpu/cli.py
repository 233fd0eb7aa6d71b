"""``dynspec-bench gpu``: build the SGLang bundle, build the test models, run one GPU attempt."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from dynspec.bench.cli_common import add_prompt_pool_flag, threshold_value
from dynspec.bench.cli_common import levels as parse_levels
from dynspec.common import cli

PROG = "dynspec-bench gpu"
COMMANDS = {
    "bundle": "build sgl-site.tar.xz: SGLang 0.5.17 for a GPU machine without a package index",
    "models": "build the random 8B-shaped target and the EAGLE-3 drafts (needs torch)",
    "run": "one bounded attempt of one plan on a GPU machine (see --help)",
    "report": "the README tables of the pair plans from their sweep JSONL files",
}


def cmd_bundle(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import bundle

    p = cli.FlagParser(prog=f"{PROG} bundle", description=bundle.__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(".gpu"), help="folder for sgl-site.tar.xz")
    p.add_argument("--python", default="python3.12", help="a Python 3.12 with pip (downloads)")
    p.add_argument("--wheels", type=Path, default=None, help="wheel cache (default: OUT/wheels)")
    cli.add_log_level(p)
    args = p.parse_layered(argv)
    cli.configure_logging(args.log_level)

    def body() -> int:
        archive = bundle.build_bundle(args.out, args.python, args.wheels or args.out / "wheels")
        print(f"{archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
        return 0

    cli.run_main(PROG, body, args.log_level)


def cmd_models(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import models

    p = cli.FlagParser(prog=f"{PROG} models", description=models.__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for llama8b/ and eagle3-*/")
    drafts = list(models.draft_specs())
    text = "comma-separated drafts to build: " + ", ".join(drafts)
    p.add_argument("--drafts", default=",".join(drafts), help=text)
    cli.add_log_level(p)
    args = p.parse_layered(argv)
    cli.configure_logging(args.log_level)

    def body() -> int:
        names = [d for d in args.drafts.split(",") if d]
        unknown = [d for d in names if d not in drafts]
        if unknown:
            raise cli.UsageError(f"--drafts: unknown draft {unknown[0]!r}")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise cli.UsageError("building the models needs torch and safetensors") from None
        for name, path in models.build_models(args.out, names).items():
            print(f"{name}: {path}")
        return 0

    cli.run_main(PROG, body, args.log_level)


def cmd_run(argv: Sequence[str]) -> NoReturn:
    """``dynspec-bench gpu run``: one bounded attempt of one plan (``attempt.attempt``)."""
    from dynspec.bench.gpu import attempt, steady, toolkit, trafficplan
    from dynspec.bench.harness import code_commit

    p = run_parser()
    args = p.parse_layered(argv)
    if args.dry_run and args.plan != "traffic":
        p.error("--dry-run: only the traffic plan has one")
    wrong = steady.check_flags(args) or trafficplan.check_flags(args)
    if wrong:
        p.error(wrong)
    if args.dry_run:
        print(trafficplan.dry_run(args), end="")
        sys.exit(0)
    a = attempt.Attempt(
        plan=args.plan, out=args.out, work=args.work, budget=args.budget, ports=args.ports,
        bundle=args.bundle, models=args.models, drafts=drafts(args),
        commit=args.commit or code_commit(),
        steady=toolkit.Steady(repeats=args.repeats, min_seconds=args.min_seconds,
                              per_c=args.requests_per_c, output_len=args.output_len,
                              prompt_pool=args.prompt_pool),
        keep=args.keep,
    )  # fmt: skip
    plan = trafficplan if args.plan == "traffic" else steady
    attempt.attempt(a, plan.body_of(args))


# Retired, with their results, to git history: main (the router checks and sweeps through
# dynspec-launch --gpus 0) and levels (EAGLE-3 variants alone), last at b22afdf; kill (a server
# SIGKILLed under load) and eight (eight GPUs, a 70B-shaped model), last at b2570b5.
PLANS = ("pair-a", "pair-b", "router-cost", "traffic")
RUN_HELP = """One bounded attempt on a GPU machine, at most --budget seconds. Plans: pair-a /
pair-b (one GPU = one pair behind --threshold auto; pair-b with --mps), router-cost (the router
against the EAGLE server's own port), traffic (open-loop arrivals against pair-b's launch, or
pair-a's with --traffic-mps off). The plans and every flag: docs/benchmarks.md, "Real GPUs"."""


def drafts(args: argparse.Namespace) -> tuple[str, ...]:
    """The EAGLE drafts the plan's servers load (built unless --models is given)."""
    return (args.draft,) if args.plan == "traffic" else ("hi",)


def _baseline_args(text: str) -> str:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a shell word list: {exc}") from None
    if not words or not words[0].startswith("--"):
        raise argparse.ArgumentTypeError(f"{text!r}: SGLang flags, starting with --")
    return shlex.join(words)


def _ports(text: str) -> tuple[int, int, int]:
    values = tuple(cli.port(x) for x in text.split(","))
    if len(values) != 3 or len(set(values)) != 3:
        raise ValueError("want three different ports: router,EAGLE,baseline")
    return values


def run_parser() -> cli.FlagParser:
    from dynspec.bench.gpu.toolkit import PAIR_LEVELS, Steady
    from dynspec.bench.gpu.toolkit import PROG as RUN_PROG
    from dynspec.bench.gpu.trafficplan import add_flags

    st = Steady()  # the plans' defaults are the flags' defaults: one record of them

    p = cli.FlagParser(prog=RUN_PROG, description=RUN_HELP)
    p.add_argument("--plan", choices=PLANS, required=True, help="what to run")
    p.add_argument("--out", type=Path, required=True, help="results folder")
    for flag, kind, default, text in (
        ("--bundle", Path, None, "sgl-site.tar.xz (default: the installed SGLang)"),
        ("--work", Path, Path("/tmp/dynspec-gpu"), "models, site"),
        ("--budget", cli.positive_float, 540.0, "seconds for it all"),
        ("--levels", parse_levels, None, f"default {PAIR_LEVELS}"),
        ("--threshold", threshold_value, None, "the router's: N or auto (the default)"),
        ("--repeats", cli.positive_int, st.repeats, "runs of each point"),
        ("--min-seconds", cli.non_negative_float, st.min_seconds, "a level, at least"),
        ("--requests-per-c", cli.positive_int, st.per_c, "a level, at least x C"),
        ("--output-len", cli.positive_int, st.output_len, "tokens out"),
        ("--sweep-seconds", cli.non_negative_float, None, "start no level (run) after this"),
        ("--baseline-limit", cli.positive_int, None, "baseline --max-running-requests"),
        ("--baseline-args", _baseline_args, None, "more baseline SGLang flags"),
        ("--baseline-from", cli.positive_int, None, "pair-*: baseline alone from C"),
        ("--commit", str, None, "the code's commit, for meta.json (the device has no .git)"),
        ("--models", Path, None, "prebuilt models (default: build into --work)"),
        ("--ports", _ports, "8000,30001,30002", "router, EAGLE, baseline"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    add_prompt_pool_flag(p)
    for flag, text in (
        ("--keep", "leave the launch for the next command"),
        ("--router-cost", "pair-*: a router-cost target too"),
        ("--dry-run", "traffic: print the plan, start nothing"),
    ):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--draft", choices=("hi", "p54"), default="hi", help="traffic: EAGLE draft")
    add_flags(p)
    return p


def cmd_report(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import steadyreport

    p = cli.FlagParser(prog=f"{PROG} report", description=COMMANDS["report"])
    p.add_argument("sweeps", type=Path, nargs="+", help="sweep-pair-a.jsonl, sweep-pair-b.jsonl")
    p.add_argument("--write", action="store_true", help="also write STEM.md, .png, -summary.json")
    p.add_argument("--title", default="", help="--write: the plot's title")
    cli.add_log_level(p)
    args = p.parse_layered(argv)
    cli.configure_logging(args.log_level)

    def body() -> int:
        missing = [s for s in args.sweeps if not s.exists()]
        if missing:
            raise cli.UsageError(f"{missing[0]}: no such file")
        rows = steadyreport.read(args.sweeps)
        if args.write:
            steadyreport.write_rows(args.sweeps[0], rows, args.title)
        print(steadyreport.markdown(rows), end="")
        return 0

    cli.run_main(PROG, body, args.log_level)


HANDLERS = {"bundle": cmd_bundle, "models": cmd_models, "run": cmd_run, "report": cmd_report}


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        lines = [f"usage: {PROG} {{{','.join(COMMANDS)}}} [flags]", ""]
        lines += [f"  {name:<8} {text}" for name, text in COMMANDS.items()]
        (sys.stdout if args else sys.stderr).write("\n".join(lines) + "\n")
        sys.exit(0 if args else 2)
    handler = HANDLERS.get(args[0])
    if handler is None:
        sys.stderr.write(
            f"{PROG}: error: unknown command {args[0]!r} (choose from {', '.join(COMMANDS)})\n"
        )
        sys.exit(2)
    handler(args[1:])
