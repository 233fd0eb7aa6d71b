"""Router hot-path overhead: one streaming load direct, through dynspec-router and SGLang's router.

Every piece is its own process: two lean SGLang-like upstreams (``overhead_upstream``), the routers
under test, and one closed-loop load generator per run (``overhead_load``). For each configuration
(token interval, concurrency C, tokens per stream) the targets take turns, run after run, so slow
drifts of a shared machine spread over all of them. Per run it records the load generator's
requests/s, SSE events/s and TTFT percentiles, and each router's CPU seconds (utime + stime of the
process, all its threads and any child processes, from /proc) over exactly the measured window.

From runs of two stream lengths at one concurrency it solves ``cpu = chunks * a + requests * b``
(least squares over all runs) for each router's cost per relayed chunk ``a`` and per request ``b``.
A "chunk" is one SSE event the client received: role, each token, finish, usage and ``[DONE]``.

Results go to ``OUT.json`` and ``OUT.md``. Run ``python -m dynspec.bench.overhead --help``.

The parts: ``overhead_plan`` (settings, workloads, the processes of a phase), ``overhead_run``
(load runs, phases, soak), ``overhead_analysis`` (medians, cost model), ``overhead_report``
(Markdown), ``host`` (/proc accounting, machine facts); this module is the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dynspec.bench.overhead_plan import TARGETS, OverheadConfig, sglang_available
from dynspec.bench.overhead_report import markdown
from dynspec.bench.overhead_run import run_benchmark
from dynspec.common.cli import FlagParser, UsageError, add_log_level, configure_logging, run_main

log = logging.getLogger(__name__)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _requests(text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for part in text.split(","):
        if part.strip():
            c, _, n = part.partition(":")
            out[int(c)] = int(n)
    return out


DESCRIPTION = __doc__.split("\n")[0]


def build_parser(prog: str = "python -m dynspec.bench.overhead") -> FlagParser:
    p = FlagParser(prog=prog, description=DESCRIPTION)
    add_arguments(p)
    add_log_level(p)
    return p


def add_arguments(p: FlagParser) -> None:
    """The flags of ``dynspec-bench overhead`` (and ``python -m dynspec.bench.overhead``)."""
    p.add_argument(
        "--targets",
        default="direct,floor,floor-asgi,dynspec,sglang",
        help="comma list of direct, floor and floor-asgi (the cheapest Python relays, without and "
        "with an ASGI server: references, not routers), dynspec, sglang",
    )
    p.add_argument(
        "--intervals-ms", default="10,0", help="time between tokens of a stream, one phase each"
    )
    p.add_argument("--concurrency", default="1,64,256", help="closed-loop concurrency levels")
    p.add_argument("--tokens", type=int, default=16, help="tokens per stream in the main table")
    p.add_argument(
        "--cost-tokens",
        default="128,16",
        help="stream lengths for the CPU cost model ('' to skip it)",
    )
    p.add_argument(
        "--cost-concurrency", type=int, default=64, help="concurrency of the cost-model runs"
    )
    p.add_argument(
        "--cost-interval-ms", type=float, default=10.0, help="token interval of the cost-model runs"
    )
    p.add_argument("--runs", type=int, default=3, help="repeats of each configuration")
    p.add_argument(
        "--requests",
        default="1:30,64:1024,256:2048",
        help="requests per run for each concurrency, C:N,... (others: max(8C, 30); 0-ms phases "
        "at least 300); "
        "long streams get proportionally fewer",
    )
    p.add_argument(
        "--max-seconds", type=float, default=120.0, help="a run stops issuing requests after this"
    )
    p.add_argument("--threshold", type=int, default=8, help="dynspec-router --threshold")
    p.add_argument(
        "--stagger",
        default="auto",
        help="spread each run's first requests over this many ms; 'auto' is one stream's "
        "duration (steady state), 0 starts all C at once (lock-step bursts of C requests)",
    )
    p.add_argument(
        "--soak",
        type=int,
        default=0,
        help="after the last phase, serve this many requests (C=64) through each router, "
        "tracking its RSS (by hand, not in CI)",
    )
    p.add_argument("--out", default="bench/results/overhead", help="writes OUT.json and OUT.md")
    p.add_argument("--log-dir", default="", help="process logs (default: a temporary directory)")
    p.add_argument("--dynspec-args", default="", help="extra flags for dynspec-router, one string")
    p.add_argument("--sglang-args", default="", help="extra flags for SGLang's router, one string")


def settings_from(args: argparse.Namespace) -> tuple[OverheadConfig, list[str]]:
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        raise UsageError(
            f"--targets: unknown target {bad[0] if bad else '(none)'!r} "
            f"(choose from {', '.join(TARGETS)})"
        )
    skipped: list[str] = []
    why = sglang_available()
    if "sglang" in targets and why:
        targets.remove("sglang")
        skipped.append(f"sglang: {why}")
    if "direct" not in targets:
        targets.insert(0, "direct")  # every ratio is against direct
    try:
        s = OverheadConfig(
            targets=targets,
            intervals_ms=_floats(args.intervals_ms),
            concurrency=_ints(args.concurrency),
            tokens=args.tokens,
            cost_tokens=_ints(args.cost_tokens),
            cost_concurrency=args.cost_concurrency,
            cost_interval_ms=args.cost_interval_ms,
            runs=args.runs,
            requests=_requests(args.requests),
            max_seconds=args.max_seconds,
            threshold=args.threshold,
            soak=args.soak,
            out=Path(args.out),
            log_dir=Path(args.log_dir)
            if args.log_dir
            else Path(tempfile.mkdtemp(prefix="dynspec-overhead-")),
            dynspec_args=shlex.split(args.dynspec_args),
            sglang_args=shlex.split(args.sglang_args),
            stagger_ms=None if args.stagger == "auto" else float(args.stagger),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if (
        not s.intervals_ms
        or not s.concurrency
        or min(s.concurrency) < 1
        or s.runs < 1
        or s.tokens < 1
    ):
        raise UsageError(
            "need at least one interval, concurrencies >= 1, --runs >= 1 and --tokens >= 1"
        )
    return s, skipped


def run(args: argparse.Namespace) -> int:
    if not Path("/proc/self/stat").exists():
        raise RuntimeError("needs Linux /proc to measure router CPU")
    s, skipped = settings_from(args)
    for why in skipped:
        log.warning("skipping %s", why)
    log.info("process logs in %s", s.log_dir)
    result = run_benchmark(s)
    result["skipped"] = skipped
    result["command"] = args.command_line
    s.out.parent.mkdir(parents=True, exist_ok=True)
    s.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    s.out.with_suffix(".md").write_text(markdown(result))
    print(s.out.with_suffix(".md").read_text())
    if not args.log_dir:
        shutil.rmtree(s.log_dir, ignore_errors=True)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m dynspec.bench.overhead") -> None:
    args = build_parser(prog).parse_layered(argv)
    configure_logging(args.log_level)
    args.command_line = shlex.join(
        ["python", "-m", "dynspec.bench.overhead", *(argv or sys.argv[1:])]
    )
    run_main(prog, lambda: run(args), args.log_level)


if __name__ == "__main__":
    main()
