"""``dynspec-bench gpu``: build the SGLang bundle, build the test models, run one GPU attempt."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from dynspec.common.cli import FlagParser, UsageError, add_log_level, configure_logging, run_main

PROG = "dynspec-bench gpu"
COMMANDS = {
    "bundle": "build sgl-site.tar.xz: SGLang 0.5.17 for a GPU machine without a package index",
    "models": "build the random 8B-shaped target and the EAGLE-3 drafts (needs torch)",
    "run": "one bounded attempt on one GPU: launcher, router checks, sweeps (see --help)",
    "report": "the README tables of the pair (or --eight) plans from their sweep JSONL files",
}


def cmd_bundle(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import bundle

    p = FlagParser(prog=f"{PROG} bundle", description=bundle.__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(".gpu"), help="folder for sgl-site.tar.xz")
    p.add_argument("--python", default="python3.12", help="a Python 3.12 with pip (downloads)")
    p.add_argument("--wheels", type=Path, default=None, help="wheel cache (default: OUT/wheels)")
    add_log_level(p)
    args = p.parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        archive = bundle.build_bundle(args.out, args.python, args.wheels or args.out / "wheels")
        print(f"{archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
        return 0

    run_main(PROG, body, args.log_level)


def cmd_models(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import models

    p = FlagParser(prog=f"{PROG} models", description=models.__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for llama8b/ and eagle3-*/")
    p.add_argument(
        "--drafts",
        default=",".join(models.draft_specs()),
        help="comma-separated drafts to build: " + ", ".join(models.draft_specs()),
    )
    add_log_level(p)
    args = p.parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        names = [d for d in args.drafts.split(",") if d]
        unknown = [d for d in names if d not in models.draft_specs()]
        if unknown:
            raise UsageError(f"--drafts: unknown draft {unknown[0]!r}")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError("building the models needs torch and safetensors") from None
        for name, path in models.build_models(args.out, names).items():
            print(f"{name}: {path}")
        return 0

    run_main(PROG, body, args.log_level)


def cmd_run(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import run

    run.main(argv)


def cmd_report(argv: Sequence[str]) -> NoReturn:
    from dynspec.bench.gpu import eight, pair

    p = FlagParser(prog=f"{PROG} report", description=COMMANDS["report"])
    p.add_argument("sweeps", type=Path, nargs="+", help="sweep-pair-a.jsonl, sweep-pair-b.jsonl")
    p.add_argument("--eight", action="store_true", help="the eight plan's sweep-eight.jsonl")
    add_log_level(p)
    args = p.parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        missing = [s for s in args.sweeps if not s.is_file()]
        if missing:
            raise UsageError(f"{missing[0]}: no such file")
        text = (
            eight.eight_markdown(args.sweeps)
            if args.eight
            else pair.markdown(pair.read_rows(args.sweeps))
        )
        print(text, end="")
        return 0

    run_main(PROG, body, args.log_level)


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
