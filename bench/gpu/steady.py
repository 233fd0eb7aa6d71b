"""The steady-state plans on one GPU, ``pair-a`` / ``pair-b`` (the routed pair against each of its
servers alone, without and with ``--mps``) and ``router-cost`` (the router against the EAGLE
server's own port): docs/benchmarks.md, "The plans".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from dynspec.bench.cli_common import levels as parse_levels
from dynspec.bench.gpu import toolkit
from dynspec.bench.gpu.attempt import Body
from dynspec.bench.gpu.launch import finish, launch_argv, router_argv, start_launch, start_router
from dynspec.bench.metrics import samples
from dynspec.bench.procs import cmdline, cpu_seconds, descendants, fetch, free_port

TITLE = "One H200 = one pair, SGLang 0.5.17, random 8B (tp 1)"
COST_LEVELS = (16, 64, 128, 256)  # router-cost's levels; with --router-cost: the plan's >= 16
COST_FROM = 16
ABOVE_ANY_LOAD = 1_000_000  # a threshold no closed loop here reaches: every request on EAGLE


@dataclass(frozen=True)
class Target:
    label: str
    what: str  # routed (the launcher's router), cost (the second router), eagle, baseline
    levels: tuple[int, ...] | None = None  # None: every level of the plan


@dataclass(frozen=True)
class Study:
    name: str
    threshold: str
    mps: bool
    targets: tuple[Target, ...]
    baseline_limit: int | None = None  # --baseline-limit (None: SGLang's own)
    baseline_args: str = ""  # --baseline-args: after the launcher's


ROUTED = Target("routed", "routed")
EAGLE = Target("eagle", "eagle")
BASELINE = Target("baseline", "baseline")
ROUTED_EAGLE = Target("routed_eagle", "routed")
STUDIES = {
    "pair-a": Study("pair-a", "auto", False, (ROUTED, EAGLE, BASELINE)),
    "pair-b": Study("pair-b", "auto", True, (ROUTED, EAGLE, BASELINE)),
    # The launcher's own router with a threshold above any load against EAGLE's own port.
    "router-cost": Study("router-cost", str(ABOVE_ANY_LOAD), False, (ROUTED_EAGLE, EAGLE)),
}


def check_flags(args: argparse.Namespace) -> str | None:
    """A usage error of the pair plans' flags, or None."""
    baseline = ("baseline_from", "baseline_limit", "baseline_args")
    given = [f"--{n.replace('_', '-')}" for n in baseline if getattr(args, n) is not None]
    if given and args.plan not in ("pair-a", "pair-b", "traffic"):
        return f"{', '.join(given)}: only the pair-a, pair-b and traffic plans"
    if args.router_cost and args.plan == "router-cost":
        return "--router-cost: the router-cost plan measures nothing else"
    return None


def study_of(args: argparse.Namespace) -> tuple[Study, list[int]]:
    """The plan's study and levels from its flags (``trafficplan.plan_of``'s counterpart)."""
    study = STUDIES[args.plan]
    if args.threshold is not None and args.plan != "router-cost":
        study = replace(study, threshold=args.threshold)
    if args.levels:
        levels = list(args.levels)
    elif args.plan == "router-cost":
        levels = list(COST_LEVELS)
    else:
        levels = parse_levels(toolkit.PAIR_LEVELS)
    if args.router_cost:
        study = with_router_cost(study, levels)
    if args.baseline_from is not None:
        study = baseline_from(study, levels, args.baseline_from)
    given = {k: getattr(args, k) for k in ("baseline_limit", "baseline_args")}
    return replace(study, **{k: v for k, v in given.items() if v is not None}), levels


def body_of(args: argparse.Namespace) -> Body:
    """The plan's part of the attempt, from its flags."""
    study, levels = study_of(args)
    return partial(
        plan_steady, study=study, levels=levels, keep=args.keep, sweep_seconds=args.sweep_seconds
    )


def with_router_cost(study: Study, levels: Sequence[int]) -> Study:
    """``study`` with the second router (threshold above any load) as a target, right before
    EAGLE alone, at the study's ``levels`` from ``COST_FROM`` up (where a router's cost could
    show: below, a few requests in flight)."""
    cost = Target("routed_eagle", "cost", tuple(c for c in levels if c >= COST_FROM))
    targets = list(study.targets)
    targets.insert(targets.index(EAGLE), cost)
    return replace(study, targets=tuple(targets))


def baseline_from(study: Study, levels: Sequence[int], c: int) -> Study:
    """``study`` with the baseline alone measured only at ``levels`` from ``c`` up: below, where
    EAGLE alone is the better server by far (C=1: 2.4x on the H200), the time goes to repeats."""
    baseline = Target(BASELINE.label, BASELINE.what, tuple(x for x in levels if x >= c))
    targets = tuple(baseline if t == BASELINE else t for t in study.targets)
    return replace(study, targets=targets)


def cost_router_argv(commands: Sequence[str], port: int) -> list[str]:
    """The launcher's router command line (from its ``--dry-run``) on ``port`` with a threshold
    above any load and no speed profile: the same router, every request on EAGLE."""
    more = ("--threshold", str(ABOVE_ANY_LOAD))
    return router_argv(commands, port, drop=("--threshold", "--speed-profile"), more=more)


def router_pid(launcher_pid: int, port: int) -> int | None:
    """The launcher's router: its child whose command line is ``-m dynspec.router ... --port``."""
    for pid in descendants(launcher_pid):
        argv = cmdline(pid)
        if "dynspec.router" in argv and str(port) in argv:
            return pid
    return None


def learned(status: Mapping[str, Any]) -> dict[str, Any]:
    """The threshold fields of the router's ``/status``, whichever of them it has, and each
    server's learned speed curve (so a threshold can be traced to what was learned)."""
    keys = ("policy", "threshold", "threshold_auto", "hysteresis", "mode")
    found = {k: status[k] for k in keys if k in status}
    # Each pair's state, and what each server's learner believes at the level's end: the curves
    # the threshold is derived from.
    for name, fields in (("pairs", _PAIRED), ("servers", _LEARNED)):
        items = status.get(name)
        if isinstance(items, list):
            found[name] = [
                {k: x[k] for k in fields if k in x} for x in items if isinstance(x, Mapping)
            ]
    return found


_PAIRED = ("threshold", "mode", "load", "learned_floor")
_LEARNED = ("pool", "curve", "running_limit", "learned_floor", "learned_reach",
            "spec_accept_length")  # fmt: skip


ROUTER_DELAY = "dynspec_router_delay_seconds"


def delay_totals(text: str) -> tuple[float, float] | None:
    """The ``_sum`` and ``_count`` of the router's ``dynspec_router_delay_seconds`` on a Prometheus
    page, each added up over its series; None where the page has no ``_count`` of it."""
    count = samples(text, f"{ROUTER_DELAY}_count")
    if not count:
        return None
    return sum((v for _, v in samples(text, f"{ROUTER_DELAY}_sum")), 0.0), sum(v for _, v in count)


class RouterDelay:
    """The router's own share of a level's TTFT (from a request's arrival to its last byte sent to
    the server): the change of its histogram's sum over its count from ``start()`` to ``read()``,
    the record's ``first_token`` (why: docs/benchmarks.md, "Where the first token waited"). A
    router that does not answer, or counted nothing, gives nothing."""

    def __init__(self, url: str | None, get: Callable[[str], str] = fetch) -> None:
        self.url, self.get = url, get
        self.before = (0.0, 0.0)

    def _totals(self) -> tuple[float, float] | None:
        if self.url is not None:
            with contextlib.suppress(OSError, ValueError):
                return delay_totals(self.get(f"{self.url}/metrics"))
        return None

    def start(self) -> None:
        self.before = self._totals() or (0.0, 0.0)

    def read(self) -> dict[str, dict[str, float]]:
        """``{"router_delay": {"ms": mean, "n": requests}}`` over the level, or ``{}``."""
        total, count = self._totals() or self.before
        was_total, was_count = self.before
        n = count - was_count
        if n <= 0:
            return {}
        return {"router_delay": {"ms": round(1000 * (total - was_total) / n, 3), "n": n}}


class Levels:
    """``on_record``: what the router and the servers say about each level."""

    def __init__(
        self, targets: Sequence[Target], urls: Mapping[str, str], routers: Mapping[str, int]
    ) -> None:
        self.what = {t.label: t.what for t in targets}
        self.urls, self.routers = urls, routers  # routers: what -> pid
        self.cpu = {what: cpu_seconds(pid) for what, pid in routers.items()}
        self.delay = RouterDelay(None)

    def start(self, label: str) -> None:
        what = self.what[label]
        if what in self.routers:
            self.cpu[what] = cpu_seconds(self.routers[what])
        self.delay = RouterDelay(self.urls[what] if what in ("routed", "cost") else None)
        self.delay.start()

    def __call__(self, rec: dict[str, Any]) -> None:
        what = self.what[rec["target"]]
        seen = self.delay.read()
        if seen:
            rec["first_token"] = seen
        if what in self.routers:
            rec["router_cpu_s"] = round(cpu_seconds(self.routers[what]) - self.cpu[what], 3)
        with contextlib.suppress(OSError, ValueError):
            if what in self.routers:
                rec["router"] = learned(json.loads(fetch(f"{self.urls[what]}/status")))
            elif what == "eagle":
                text = fetch(f"{self.urls['eagle']}/metrics")
                rec["spec_accept_length"] = toolkit.gauge(text, "sglang:spec_accept_length")


def plan_steady(
    run: toolkit.Run,
    models: Path,
    session: dict[str, Any] | None,
    *,
    study: Study,
    levels: Sequence[int],
    keep: bool,
    sweep_seconds: float | None = None,
) -> int:
    from dynspec.bench import load

    toolkit.check_models(models, "hi")
    cost_port = int(session["cost_port"]) if session and "cost_port" in session else free_port()
    urls = {**toolkit.pair_urls(run.ports), "cost": f"http://127.0.0.1:{cost_port}"}
    wanted = sorted(set(levels) | {c for t in study.targets for c in t.levels or ()})
    targets = [
        load.Target(t.label, urls[t.what], levels=frozenset(t.levels) if t.levels else None)
        for t in study.targets
    ]
    jsonl = run.results / f"sweep-{study.name}.jsonl"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    if session is None:
        launch = launch_argv(run, models, threshold=study.threshold, mps=study.mps,
                             baseline_limit=study.baseline_limit,
                             baseline_args=study.baseline_args)  # fmt: skip
        procs["launcher"] = start_launch(run, launch)
        if any(t.what == "cost" for t in study.targets):
            argv = cost_router_argv(run.meta["commands"], cost_port)
            run.meta["cost_router_argv"] = argv
            procs["cost_router"] = start_router(run, "cost-router", argv, cost_port)
        servers = {t.what: urls[t.what] for t in study.targets if t.what in ("eagle", "baseline")}
        toolkit.warm(run, servers, wanted)
        pids = {name: proc.pid for name, proc in procs.items()}
    else:
        pids = {name: int(pid) for name, (pid, _start) in session["procs"].items()}
    routers = {"routed": router_pid(pids["launcher"], run.ports[0])}
    if "cost_router" in pids:
        routers["cost"] = pids["cost_router"]
    live = {w: p for w, p in routers.items() if p is not None}
    hook = Levels(study.targets, urls, live)
    run.say(f"sweep {', '.join(t.label for t in study.targets)} at C={wanted}")
    title = f"MEASURED: {TITLE}, code at {run.meta.get('commit', '?')}, medians (min-max)"
    done = toolkit.sweep(run, targets, jsonl, levels=wanted, limit=sweep_seconds, on_record=hook,
                 on_start=hook.start, title=title)  # fmt: skip
    return finish(run, procs, session, keep=keep and not done, cost_port=cost_port)
