"""Where a level's time to first token went: its mean as the load generator, the router (and its
own share before the server) and each SGLang server saw it, each from a histogram's ``_sum`` over
its ``_count`` between the level's start and its record (every series of the name added up; a
source that did not answer, or counted nothing, is left out). What the clocks split and why:
docs/benchmarks.md, "Where the first token waited".
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dynspec.bench import report
from dynspec.bench.metrics import samples

ROUTER_TTFT = "dynspec_time_to_first_token_seconds"
ROUTER_DELAY = "dynspec_router_delay_seconds"
SERVER_TTFT = "sglang:time_to_first_token_seconds"
SERVERS = ("eagle", "baseline")

Totals = tuple[float, float]  # (sum of seconds, count)
Fetch = Callable[[str], str]  # a URL -> its text (raises OSError or ValueError when it cannot)


def totals(text: str, name: str) -> Totals | None:
    """The ``_sum`` and ``_count`` of histogram ``name`` in a Prometheus text page, each added up
    over the histogram's series; None where the page has no ``_count`` of it."""
    count = samples(text, f"{name}_count")
    if not count:
        return None
    return sum((v for _, v in samples(text, f"{name}_sum")), 0.0), sum(v for _, v in count)


class FirstTokens:
    """``start()`` as a level begins, ``read()`` as it is recorded: each source's mean TTFT over
    the level, from its ``/metrics``. ``sources``: name -> (base URL, histogram name)."""

    def __init__(self, sources: Mapping[str, tuple[str, str]], fetch: Fetch) -> None:
        self.sources = dict(sources)
        self.fetch = fetch
        self.before: dict[str, Totals] = {}

    def _read(self) -> dict[str, Totals]:
        out: dict[str, Totals] = {}
        for name, (url, histogram) in self.sources.items():
            with contextlib.suppress(OSError, ValueError):
                got = totals(self.fetch(f"{url}/metrics"), histogram)
                if got is not None:
                    out[name] = got
        return out

    def start(self) -> None:
        self.before = self._read()

    def read(self) -> dict[str, dict[str, float]]:
        """name -> ``{"ms": mean TTFT, "n": requests counted}`` over the level, where any were."""
        out: dict[str, dict[str, float]] = {}
        for name, (total, count) in self._read().items():
            was_total, was_count = self.before.get(name, (0.0, 0.0))
            n = count - was_count
            if n > 0:
                out[name] = {"ms": round(1000 * (total - was_total) / n, 3), "n": n}
        return out


def mean_ms(record: Mapping[str, Any], name: str) -> float | None:
    """A record's mean TTFT in ms by source ``name``; None where it has none."""
    seen = record.get("first_token")
    got = seen.get(name) if isinstance(seen, Mapping) else None
    return float(got["ms"]) if isinstance(got, Mapping) else None


def sources(router: str | None, servers: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """What a level reads: its router, if it went through one, and every server of the pair."""
    out = {}
    if router is not None:
        out = {"router": (router, ROUTER_TTFT), "router_delay": (router, ROUTER_DELAY)}
    out.update({s: (servers[s], SERVER_TTFT) for s in SERVERS if s in servers})
    return out


COLUMNS = ("client", "router", "router_delay", *SERVERS)


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown lines: per C and target, each clock's mean TTFT, the median over the repeats and
    its min-max; nothing where no record has ``first_token``."""
    cells: dict[tuple[int, str], dict[str, list[float]]] = {}
    for r in rows:
        seen = r.get("first_token")
        if not isinstance(seen, Mapping):
            continue
        point = cells.setdefault((int(r["max_concurrency"]), str(r["target"])), {})
        if isinstance(r.get("mean_ttft_ms"), (int, float)):
            point.setdefault("client", []).append(float(r["mean_ttft_ms"]))
        for name, got in seen.items():
            point.setdefault(name, []).append(float(got["ms"]))
    if not cells:
        return []
    body = [
        [str(c), target, *(_cell(point.get(k, [])) for k in COLUMNS)]
        for (c, target), point in sorted(cells.items())
    ]
    return [
        "",
        "Mean TTFT ms where it was seen, median (min-max) over the repeats (client: the load "
        "generator's measured requests; router and servers: their own histograms over the level, "
        "warm-up requests included; router_delay: the router's own share, from a request's "
        "arrival to its sending to the server; `firsttoken.py`):",
        "",
        *report.table(["C", "target", *COLUMNS], body),
    ]


def _cell(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    digits = 1 if mid >= 10 else 2 if mid >= 1 else 3
    if len(values) == 1:
        return f"{mid:.{digits}f}"
    return f"{mid:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
