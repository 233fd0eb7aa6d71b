"""What several ``dynspec-bench`` commands share: flags, reading JSONL, the simulator profile,
the results path, ``--from-jsonl`` and the run-then-report tail. Imports nothing heavy: every
parser is built from it before the bench extra is needed.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from dynspec.common import cli
from dynspec.common.profile import SHARING_WAYS
from dynspec.launcher import flags as launch_flags

if TYPE_CHECKING:
    from dynspec.bench.load import Target
    from dynspec.bench.report import Record
    from dynspec.bench.sweep import SweepConfig
    from dynspec.launcher.sim.profile import Profile

PROG = "dynspec-bench"
Number = TypeVar("Number", int, float)
DEFAULT_LEVELS = "1,2,4,8,16,32,64,128,256"


def numbers(text: str, kind: Callable[[str], Number], what: str) -> list[Number]:
    """A comma-separated list of ``what``, each above 0: sorted, each once."""
    try:
        out = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}: {text!r}") from None
    if not out or any(x <= 0 for x in out):
        raise argparse.ArgumentTypeError(f"{what} must be above 0: {text!r}")
    return sorted(set(out))


def levels(text: str) -> list[int]:
    return numbers(text, int, "concurrency levels (whole numbers)")


def ratio(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def threshold_value(text: str) -> str:
    """A router's ``--threshold`` as ``dynspec-launch`` reads it (N >= 1 or auto), as text."""
    return str(launch_flags.threshold_value(text))


def add_load_flags(p: cli.FlagParser | argparse.ArgumentParser) -> None:
    """The closed-loop levels and their prompts (the longer texts: docs/benchmarks.md)."""
    text = "concurrency levels (requests in flight, closed loop), comma-separated"
    p.add_argument("--concurrency", type=levels, default=levels(DEFAULT_LEVELS), help=text)
    for flag, kind, default, text in (
        ("--requests", cli.positive_int, None, "measured requests per level"),
        ("--requests-per-c", cli.positive_int, 4, "default requests per level / C"),
        ("--min-requests", cli.positive_int, 16, "fewest requests in a level"),
        ("--warmup", cli.non_negative_int, None, "warm-up requests per level (default: C)"),
        ("--seed", int, 0, "seed for prompt sampling"),
        ("--pause", float, 1.0, "seconds between levels (lets in-flight drain)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    add_length_flags(p)
    add_request_timeout(p)
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")


def add_request_timeout(p: cli.FlagParser | argparse.ArgumentParser) -> None:
    text = "seconds a stream may stay silent before the request counts as failed"
    p.add_argument("--request-timeout", type=cli.positive_float, default=600.0, help=text)


def add_length_flags(
    p: cli.FlagParser | argparse.ArgumentParser,
    *,
    pool: bool = True,
    ratio_flags: Sequence[str] = ("--range-ratio",),
) -> None:
    """The prompts' lengths; ``traffic`` spells the ratio as bench_serving does too and has no
    prompt pool (each arrival gets its own prompt)."""
    p.add_argument("--input-len", type=cli.positive_int, default=256, help="random prompt tokens")
    p.add_argument("--output-len", type=cli.positive_int, default=128, help="output tokens")
    text = "random lengths uniform in [ratio x len, len]; 1 = fixed lengths"
    p.add_argument(*ratio_flags, dest="range_ratio", type=ratio, default=1.0, help=text)
    if pool:
        add_prompt_pool_flag(p)


def add_prompt_pool_flag(p: cli.FlagParser | argparse.ArgumentParser) -> None:
    text = "random prompts: 0, a new one for every request; N, N reused in turn"
    p.add_argument("--prompt-pool", type=cli.non_negative_int, default=0, help=text)


def add_sharing_flag(p: cli.FlagParser | argparse.ArgumentParser, where: str) -> None:
    text = f"{where}how the two servers of a shared GPU share it (dynspec-sim --sharing)"
    p.add_argument("--sharing", choices=SHARING_WAYS, default="timeslice", help=text)


def add_router_log_level(p: cli.FlagParser | argparse.ArgumentParser, default: str) -> None:
    text = "the --log-level of the routers it starts (their logs: router-*.log in the run's folder)"
    p.add_argument("--router-log-level", default=default, choices=cli.LOG_LEVELS, help=text)


def add_simulate_flags(p: cli.FlagParser | argparse.ArgumentParser) -> None:
    """--simulate, --profile, --speed, --startup-timeout, --out, --from-jsonl."""
    p.add_argument("--simulate", action="store_true", help="simulated servers (required)")
    p.add_argument("--profile", default="demo", help="dynspec-sim profile: NAME or FILE.json")
    for flag, kind, default, text in (
        ("--speed", cli.positive_float, 1.0, "simulated time runs this many times faster"),
        ("--startup-timeout", cli.positive_float, 60.0, "seconds to wait per process"),
        ("--out", Path, None, "results path without suffix (default: command and profile)"),
        ("--from-jsonl", Path, None, "run nothing: rewrite an earlier run's report and plot"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)


def sweep_config(args: argparse.Namespace, **extra: object) -> SweepConfig:
    from dynspec.bench.sweep import SweepConfig

    same = "requests requests_per_c min_requests warmup input_len output_len range_ratio"
    same += " seed prompt_pool request_timeout pause"
    return SweepConfig(
        concurrencies=args.concurrency,
        api_key=getattr(args, "api_key", None),
        **{k: getattr(args, k) for k in same.split()},
        **extra,  # type: ignore[arg-type]
    )


def targets(raw: object, endpoint: str = "chat") -> list[Target]:
    """``--url`` as targets, URL or LABEL=URL each (``$DYNSPEC_URL``: space-separated), each
    label once."""
    from dynspec.bench import load

    given = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []  # str: the env
    items = [item for x in given for item in str(x).split()]
    if not items:
        raise cli.UsageError("give at least one --url")
    out: list[Target] = []
    for item in items:
        try:
            out.append(load.parse_target(item, endpoint))
        except ValueError as exc:
            raise cli.UsageError(f"--url: {exc}") from None
    labels = [t.label for t in out]
    if len(set(labels)) != len(labels):
        raise cli.UsageError("--url: two targets with the same label; use LABEL=URL")
    return out


def read(path: Path) -> list[Record]:
    from dynspec.bench import report

    if not path.is_file():
        raise cli.UsageError(f"no such file: {path}")
    return report.load_jsonl(path)


def sim_profile(args: argparse.Namespace) -> Profile:
    """``--profile`` for a simulated run (``--simulate`` required): both modes, else UsageError."""
    if not args.simulate:
        raise cli.UsageError(
            "only --simulate is supported; on real servers run 'sweep' against each server "
            "and the router"
        )
    from dynspec.launcher.sim.profile import ProfileError, load_profile

    try:
        prof = load_profile(args.profile)
    except ProfileError as exc:
        raise cli.UsageError(f"--profile: {exc}") from None
    if not {"eagle", "baseline"} <= set(prof.modes):
        raise cli.UsageError(f"--profile {args.profile}: needs both an eagle and a baseline mode")
    return prof


def out_path(args: argparse.Namespace, default: str) -> Path:
    """``--out`` (or ``default``) as a ``.jsonl`` path, its folder made."""
    stem = args.out if args.out is not None else Path(default)
    out = stem.with_name(stem.name + ".jsonl") if stem.suffix != ".jsonl" else stem
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


class Report(Protocol):
    def write_report(self, out: Path, records: Sequence[Record], /) -> tuple[Path, Path]: ...
    def summary(self, records: Sequence[Record], /) -> str: ...


def _report(kind: Report, out: Path, records: Sequence[Record], *written: Path) -> int:
    paths = [*written, *kind.write_report(out, records)]
    print(kind.summary(records), end="")
    print(f"results: {', '.join(map(str, paths))}", file=sys.stderr)
    return 0


def rerender(path: Path, pick: Callable[[Sequence[Record]], Report]) -> int:
    """``--from-jsonl``: the report and plot again from ``path``'s records (``pick`` gives the
    report module for them), nothing run."""
    records = read(path)
    return _report(pick(records), path, records)


class Terminated(KeyboardInterrupt):
    """SIGTERM, taking Ctrl-C's path so that children are stopped and finished levels kept."""


def on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def run_then_report(run: Callable[[], object], out: Path, finished: str, kind: Report) -> int:
    """Run an experiment that writes ``out``, then report all ``out`` holds; Ctrl-C or SIGTERM
    stops it (exit 130 or 143), keeping and reporting what finished."""
    signal.signal(signal.SIGTERM, on_sigterm)
    code = 0
    try:
        run()
    except KeyboardInterrupt as exc:
        print(f"\n{PROG}: interrupted; keeping the finished {finished}", file=sys.stderr)
        code = 143 if isinstance(exc, Terminated) else 130
    if out.exists() and out.stat().st_size > 0:
        _report(kind, out, read(out), out)
    return code
