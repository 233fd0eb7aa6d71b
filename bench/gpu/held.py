"""What the servers themselves held over each level of a steady sweep: SGLang's own running and
queued counts (its decode-log lines, read by ``dynspec.common.sglanglog``) inside the level's
window, the mean of the lines there. A record gets ``server_held``: ``{"running": R, "queued": Q,
"lines": N}`` (the sum over the target's servers: both of a pair for a router), or nothing where
no line fell in its window. The window is the record's end (``timestamp``) less its
``duration``, whole seconds only (a line in the second a level began may be the level before's).
Why it matters: docs/benchmarks.md, "What the servers held".
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynspec.common.sglanglog import SERVERS, Decode, decodes, read_logs, seconds

# Which servers' lines a target's level is read from.
TARGET_SERVERS: dict[str, tuple[str, ...]] = {
    "eagle": ("eagle",),
    "baseline": ("baseline",),
    "routed": ("eagle", "baseline"),
    "routed_eagle": ("eagle", "baseline"),
}

Samples = Mapping[str, Sequence[Decode]]  # server -> its decode lines, in time order


def samples(logs: Iterable[Path]) -> dict[str, list[Decode]]:
    """Each server's decode lines from one or more logs folders or tarballs (one per launch)."""
    out: dict[str, list[Decode]] = {s: [] for s in SERVERS}
    for path in logs:
        found = read_logs(path, list(SERVERS.values()))
        for server, name in SERVERS.items():
            out[server] += decodes(found.get(name, ()))
    for lines in out.values():
        lines.sort(key=_second)
    return out


def _second(d: Decode) -> int:
    return d.second


def held(rec: Mapping[str, Any], found: Samples) -> dict[str, float] | None:
    """Mean running and queued over the record's window, summed over its target's servers
    (second by second: a server with no line in a second held nothing then); None without a
    line in the window or a window to take."""
    servers = TARGET_SERVERS.get(str(rec.get("target")))
    stamp, duration = rec.get("timestamp"), rec.get("duration")
    if servers is None or not isinstance(stamp, str) or not isinstance(duration, (int, float)):
        return None
    # The level ran from T - duration to T, T somewhere in the stamp's second [end, end + 1).
    end = seconds(stamp[:19])
    start, last = math.ceil(end + 1 - duration), end - 1
    per_second: dict[int, list[float]] = {}  # second -> [running, queued]
    lines = 0
    for server in servers:
        ds_all = found.get(server, ())
        # The lines are in time order: only the window's are looked at.
        lo = bisect.bisect_left(ds_all, start, key=_second)
        hi = bisect.bisect_right(ds_all, last, key=_second)
        by_second: dict[int, list[Decode]] = {}
        for d in ds_all[lo:hi]:
            by_second.setdefault(d.second, []).append(d)
        for second, ds in by_second.items():
            cell = per_second.setdefault(second, [0.0, 0.0])
            cell[0] += sum(d.running for d in ds) / len(ds)
            cell[1] += sum(d.queued for d in ds) / len(ds)
            lines += len(ds)
    if not per_second:
        return None
    n = len(per_second)
    return {
        "running": round(sum(c[0] for c in per_second.values()) / n, 1),
        "queued": round(sum(c[1] for c in per_second.values()) / n, 1),
        "lines": lines,
    }


def annotate(rows: Iterable[dict[str, Any]], found: Samples, *, again: bool = False) -> None:
    """``server_held`` on every record whose window has lines; one it already has is kept unless
    ``again`` (the whole logs are read anew: the rule of today holds for every record)."""
    for rec in rows:
        if "server_held" in rec and not again:
            continue
        got = held(rec, found)
        if got is not None:
            rec["server_held"] = got


def cells(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, str]]:
    """target -> C -> ``running+queued`` of each repeat, in repeat order."""
    out: dict[str, dict[int, list[str]]] = {}
    for r in sorted(rows, key=lambda r: int(r.get("repeat") or 1)):
        h = r.get("server_held")
        if not isinstance(h, Mapping):
            continue
        by_c = out.setdefault(str(r["target"]), {})
        by_c.setdefault(int(r["max_concurrency"]), []).append(
            f"{h['running']:.0f}+{h['queued']:.0f}"
        )
    return {t: {c: ", ".join(v) for c, v in by_c.items()} for t, by_c in out.items()}


class LogTail:
    """A live run's server logs, read on from where the last call stopped (a plan annotates each
    record as its level ends, without reading the whole log again)."""

    def __init__(self, folder: Path) -> None:
        self.paths = {server: folder / name for server, name in SERVERS.items()}
        self.offsets = dict.fromkeys(SERVERS, 0)
        self.partial = dict.fromkeys(SERVERS, b"")
        self.found: dict[str, list[Decode]] = {s: [] for s in SERVERS}

    def read(self) -> Samples:
        for server, path in self.paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[server])
                    data = f.read()
            except OSError:
                continue
            self.offsets[server] += len(data)
            # Whole lines only: a line being written waits for the next read.
            *done, self.partial[server] = (self.partial[server] + data).split(b"\n")
            lines = [ln.decode("utf-8", "replace").rstrip("\r") for ln in done]
            self.found[server] += decodes(lines)
        return self.found
