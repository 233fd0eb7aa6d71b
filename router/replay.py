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
busy: what ``Server.alone`` says in the router). Left out: the router's own finished requests
(its second source), and the bound, hysteresis and hold rules around the derivation
(``autothreshold.relearn``): this replays the curves and ``derive_threshold`` on them, to test a
change of the poll rule against a real run, not to reproduce its router exactly.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from dynspec.common import sglanglog
from dynspec.common.cli import FlagParser, UsageError, add_log_level, configure_logging, run_main
from dynspec.common.sglanglog import SERVERS, decodes, seconds
from dynspec.router.autothreshold import derive_threshold
from dynspec.router.learning import SpeedLearner
from dynspec.router.speed import profile_from_json

if TYPE_CHECKING:
    from dynspec.router.server import Server

STARTED = re.compile(r"^==> dynspec-launch (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d):")

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


def replay(logs: dict[str, list[str]], profile: object) -> Iterator[Derived]:
    """Every second from the router's start: each server's poll, then the derived threshold."""
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
        # What the router asks a server's record before learning a poll (``Server.alone``).
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
        yield Derived(t, derive_threshold(e, b), last["eagle"], last["baseline"])


@dataclass(frozen=True)
class _Alone:
    busy: dict[str, bool]
    mode: str

    def alone(self) -> bool:
        return not self.busy[self.mode]


def changes(derived: Iterable[Derived], since: int | None = None) -> list[Derived]:
    """The seconds at which the derived threshold changed (from ``since`` on)."""
    out: list[Derived] = []
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
            derived = list(replay(read_logs(args.logs), load_profile_json(args.profile)))
        except (OSError, ValueError) as e:
            raise UsageError(f"{args.logs}: {e}") from None
        for d in changes(derived, since):
            print(d.line())
        return 0

    run_main(PROG, body, args.log_level)


if __name__ == "__main__":
    main()
