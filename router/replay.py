"""``python -m dynspec.router.replay LOGS [--profile P] [--since T]``: a GPU run's logged SGLang
gauges, fed again to the router's speed learner, and the threshold it derives from them, second
by second. A diagnostic of the learner, not part of serving: it lives beside the learner because
it drives its internals (the bench only speaks to a router over HTTP).

The router learns from each server's ``/metrics`` (``sglang:num_running_reqs``,
``sglang:gen_throughput``, ``sglang:num_queue_reqs``), and SGLang sets those gauges when it
writes a decode-log line ("Decode batch, #running-req: N, ..., gen throughput (token/s): X,
#queue-req: Q"). So a run's ``eagle.log`` and ``baseline.log`` hold what each poll saw: here the
poll at the end of each second sees the last line written up to then (the router polls once a
second). A poll is not learned while the pair-mate wrote a line in the last second (it was
busy: what ``Server.alone_since`` says in the router). Left out: the router's own finished requests
(its second source), and the bound, hysteresis and hold rules around the derivation
(``autothreshold.relearn``): this replays the curves and ``derive_threshold`` on them, to test a
change of the poll rule against a real run, not to reproduce its router exactly.

With ``--observations`` the replay is exact instead: a router run at ``--log-level debug`` logs
every observation its learner took (``learning.py``: the server, the source, the time a token and
the load) and, at each derivation, the group's load (``pool.py``); fed again in order, they rebuild
the same curves, and the threshold is derived from them at each logged derivation. Single-pair
logs only (the pair-0 lines); the bound, hysteresis and hold rules are still left out.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar, cast

from dynspec.common import sglanglog
from dynspec.common.cli import (
    FlagParser,
    UsageError,
    add_log_level,
    configure_logging,
    fraction,
    run_main,
)
from dynspec.common.sglanglog import SERVERS, decodes, seconds
from dynspec.router.autothreshold import derive_threshold
from dynspec.router.learning import SpeedLearner
from dynspec.router.speed import profile_from_json

if TYPE_CHECKING:
    from dynspec.router.server import Server

STARTED = re.compile(r"^==> dynspec-launch (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d):")
# What a router at --log-level debug logs: each observation learned, each derivation's load.
_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) DEBUG dynspec\.router\."
OBSERVED = re.compile(
    _STAMP + r"learning: (\S+) \((eagle|baseline)\): (request|poll), ([\d.]+) ms a token at "
    r"load ([\d.]+)$"
)
DERIVED = re.compile(_STAMP + r"pool: (?:pair 0|pools): at load (\d+) ")

Gauges = tuple[float, float, float]  # running, gen_throughput, queued


@dataclass(frozen=True)
class Derived:
    second: int  # POSIX seconds, UTC
    threshold: int
    eagle: Gauges | None
    baseline: Gauges | None

    def line(self) -> str:
        at = dt.datetime.fromtimestamp(self.second, dt.timezone.utc).strftime("%H:%M:%S")
        return (
            f"{at}  threshold {self.threshold:>3}  eagle {_g(self.eagle)}  "
            f"baseline {_g(self.baseline)}"
        )


def _g(g: Gauges | None) -> str:
    return "-" if g is None else f"{g[0]:.0f} running at {g[1]:,.0f} tok/s, {g[2]:.0f} queued"


def gauges(lines: Iterable[str]) -> dict[int, Gauges]:
    """The last decode-log line's gauges in each second that has one."""
    return {d.second: (float(d.running), d.gen_throughput, float(d.queued)) for d in decodes(lines)}


def router_started(lines: Iterable[str]) -> int | None:
    """When the launcher started the router (its log's last ``==> dynspec-launch`` header)."""
    found = None
    for ln in lines:
        m = STARTED.match(ln)
        if m:
            found = seconds(m[1])
    return found


def read_logs(path: Path) -> dict[str, list[str]]:
    """``eagle.log``, ``baseline.log`` and ``router.log`` from a folder or a tarball of one."""
    return sglanglog.read_logs(path, [*SERVERS.values(), "router.log"])


def replay(logs: dict[str, list[str]], profile: object, margin: float = 0.0) -> Iterator[Derived]:
    """Every second from the router's start: each server's poll, then the derived threshold
    (with ``margin``: the pair's ``--switch-margin``)."""
    series = {mode: gauges(logs.get(name, ())) for mode, name in SERVERS.items()}
    if not series["eagle"] or not series["baseline"]:
        raise ValueError("no decode-log lines in eagle.log and baseline.log")
    first = min(min(s) for s in series.values())
    start = router_started(logs.get("router.log", ())) or first
    clock = [float(first)]
    learner = SpeedLearner(
        [("eagle", "eagle"), ("baseline", "baseline")],
        profile_from_json(profile) if profile is not None else None,
        clock=lambda: clock[0],
    )
    busy = {"eagle": False, "baseline": False}
    for mode, speed in learner.servers.items():
        # What the router asks a server's record before learning a poll (``Server.alone_since``).
        speed.server = cast("Server", _Alone(busy, mode))
    last: dict[str, Gauges | None] = {"eagle": None, "baseline": None}
    seen = {"eagle": -(10**12), "baseline": -(10**12)}
    end = max(max(s) for s in series.values())
    for t in range(first, end + 1):
        clock[0] = float(t)
        for mode, s in series.items():
            if t in s:
                last[mode], seen[mode] = s[t], t
        if t < start:
            continue
        for mode, mate in (("eagle", "baseline"), ("baseline", "eagle")):
            g = last[mode]
            if g is not None:
                busy[mode] = t - seen[mate] <= 1
                learner.polled(mode, running=g[0], gen_throughput=g[1], queued=g[2])
        learner.rebuild(float(t))
        e, b = learner.servers["eagle"].curve, learner.servers["baseline"].curve
        yield Derived(t, derive_threshold(e, b, margin=margin), last["eagle"], last["baseline"])


@dataclass(frozen=True)
class _Alone:
    busy: dict[str, bool]
    mode: str

    @property
    def mate(self) -> _Alone:
        return self  # a pair: a poll is learned only when its mate was idle

    def mate_area(self, now: float) -> float:
        return 0.0

    def alone_since(self, mate_area: float, now: float) -> bool:
        return not self.busy[self.mode]


@dataclass(frozen=True)
class Logged:
    """A derivation replayed from a router's debug log: when (seconds, UTC), the group's load,
    the threshold the curves give and each pool's curve at a few loads (ms a token)."""

    at: float
    load: int
    threshold: int
    curves: dict[str, dict[int, float]]

    @property
    def second(self) -> int:
        return int(self.at)

    def line(self) -> str:
        when = dt.datetime.fromtimestamp(self.at, dt.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        pools = "  ".join(
            f"{pool} " + " ".join(f"{b}:{v:.1f}" for b, v in c.items())
            for pool, c in self.curves.items()
        )
        return f"{when}  threshold {self.threshold:>3}  at load {self.load:>3}  {pools}"


CURVE_AT = (1, 8, 16, 32, 64, 128)


def replay_observations(
    lines: Sequence[str], profile: object, margin: float = 0.0
) -> Iterator[Logged]:
    """Each derivation of a debug-level ``router.log``, from the observations logged before it
    (with ``margin``: the pair's ``--switch-margin``)."""
    urls: dict[str, str] = {}  # pool -> its server's URL, as the log names it
    for ln in lines:
        m = OBSERVED.match(ln)
        if m:
            urls.setdefault(m[4], m[3])
    if len(urls) < 2:
        raise ValueError("router.log holds no learner observations of both servers (a router "
                         "at --log-level debug logs them)")  # fmt: skip
    clock = [0.0]
    learner = SpeedLearner(
        [(urls["eagle"], "eagle"), (urls["baseline"], "baseline")],
        profile_from_json(profile) if profile is not None else None,
        clock=lambda: clock[0],
    )
    for ln in lines:
        m = OBSERVED.match(ln)
        if m and m[3] in learner.servers:
            clock[0] = seconds(m[1]) + int(m[2]) / 1e3
            speed = learner.servers[m[3]]
            source = speed.direct if m[5] == "request" else speed.polled
            learner.learn(speed, source, float(m[7]), float(m[6]) / 1e3)
            continue
        d = DERIVED.match(ln)
        if d is None:
            continue
        clock[0] = seconds(d[1]) + int(d[2]) / 1e3
        learner.rebuild(clock[0])
        e, b = (learner.servers[urls[p]].curve for p in ("eagle", "baseline"))
        curves = {
            p: {x: c.at(x) * 1e3 for x in CURVE_AT} for p, c in (("eagle", e), ("baseline", b))
        }
        yield Logged(clock[0], int(d[3]), derive_threshold(e, b, margin=margin), curves)


def router_log(folder: Path) -> list[str]:
    """The one ``router-*.log`` of a folder (a bench run's: ``router-routed.log``), else none."""
    found = sorted(folder.glob("router-*.log")) if folder.is_dir() else []
    return found[0].read_text(errors="replace").splitlines() if len(found) == 1 else []


Step = TypeVar("Step", Derived, Logged)


def changes(derived: Iterable[Step], since: int | None = None) -> list[Step]:
    """The seconds at which the derived threshold changed (from ``since`` on)."""
    out: list[Step] = []
    for d in derived:
        if (since is None or d.second >= since) and (not out or d.threshold != out[-1].threshold):
            out.append(d)
    return out


def load_profile_json(path: Path | None) -> object:
    return None if path is None else json.loads(path.read_text())


PROG = "python -m dynspec.router.replay"


def main(argv: list[str] | None = None) -> NoReturn:
    p = FlagParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("logs", type=Path, help="a run's logs folder or logs.tar.xz (eagle.log, ...)")
    p.add_argument("--profile", type=Path, help="the speed profile the router started from")
    p.add_argument("--since", help="print the changes from this UTC time on (YYYY-MM-DD HH:MM:SS)")
    p.add_argument(
        "--observations",
        action="store_true",
        help="replay the observations a router at --log-level debug logged (router.log), "
        "exactly, instead of the servers' decode-log gauges",
    )
    p.add_argument(
        "--switch-margin",
        type=fraction,
        default=0.0,
        help="derive as a router with this --switch-margin would (the pair's: EAGLE keeps a "
        "load only where it is predicted at least this share faster)",
    )
    add_log_level(p)
    args = p.parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> int:
        for path in (args.logs, args.profile):
            if path is not None and not path.exists():
                raise UsageError(f"{path}: no such file")
        try:
            since = seconds(args.since) if args.since else None
        except ValueError:
            raise UsageError(f"--since: not a time: {args.since!r}") from None
        try:
            logs, profile = read_logs(args.logs), load_profile_json(args.profile)
            if args.observations:
                lines = logs.get("router.log") or router_log(args.logs)
                steps = list(replay_observations(lines, profile, args.switch_margin))
                lines = [d.line() for d in changes(steps, since)]
            else:
                derived = replay(logs, profile, args.switch_margin)
                lines = [d.line() for d in changes(derived, since)]
        except (OSError, ValueError) as e:
            raise UsageError(f"{args.logs}: {e}") from None
        print("\n".join(lines))
        return 0

    run_main(PROG, body, args.log_level)


if __name__ == "__main__":
    main()
