"""Polls each server's ``/metrics`` for the speed learner, one task per server.

Every ``interval`` seconds: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:gen_throughput`` and (EAGLE) ``sglang:spec_accept_length`` go to the learner. Once per
server, ``/get_server_info`` gives the running limit (``max_running_requests``). A server that
exports none of these keeps being learned from the router's own observations: it is warned about
once, not per poll. A body that does not parse is skipped and counted, and the poller goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from dynspec.router.learning import SpeedLearner
from dynspec.router.server import Server
from dynspec.router.tasks import cancel_and_wait
from dynspec.router.upstream import Client, UpstreamError

logger = logging.getLogger(__name__)

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
GEN_THROUGHPUT = "sglang:gen_throughput"
ACCEPT_LENGTH = "sglang:spec_accept_length"
_WANTED = (RUNNING, QUEUED, GEN_THROUGHPUT, ACCEPT_LENGTH)


class MetricsParseError(ValueError):
    """A ``/metrics`` body that is not Prometheus text."""


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """The few SGLang gauges the learner uses; None where the server exports no such series."""

    running: float | None = None
    queued: float | None = None
    gen_throughput: float | None = None
    accept_length: float | None = None

    @property
    def has_speed(self) -> bool:
        return self.running is not None and self.gen_throughput is not None


def _sample(line: str) -> tuple[str, float]:
    """``name{labels} value [timestamp]`` -> (name, value)."""
    brace = line.find("{")
    if brace != -1:
        end = line.rfind("}")
        if end < brace:
            raise MetricsParseError(f"unclosed label set: {line[:80]!r}")
        name, rest = line[:brace], line[end + 1 :]
    else:
        name, _, rest = line.partition(" ")
        rest = " " + rest
    fields = rest.split()
    if not name or not fields or len(fields) > 2 or " " in name:
        raise MetricsParseError(f"not a sample line: {line[:80]!r}")
    try:
        return name, float(fields[0])
    except ValueError:
        raise MetricsParseError(f"not a number: {line[:80]!r}") from None


def parse_metrics(text: str) -> ServerMetrics:
    """The SGLang gauges of a Prometheus text body (summed over label sets, such as DP ranks).

    Raises ``MetricsParseError`` when a line is neither a comment nor a sample.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, value = _sample(line)
        if name in _WANTED and math.isfinite(value):
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    accept = sums.get(ACCEPT_LENGTH)
    return ServerMetrics(
        running=sums.get(RUNNING),
        queued=sums.get(QUEUED),
        gen_throughput=sums.get(GEN_THROUGHPUT),
        # A mean per request, not a sum: averaged over the label sets.
        accept_length=accept / counts[ACCEPT_LENGTH] if accept is not None else None,
    )


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1:
        return None
    return int(value)


def parse_running_limit(body: bytes) -> int | None:
    """The running limit in a ``/get_server_info`` answer, or None when it does not say."""
    try:
        info = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        limit = _positive_int(states[0].get("effective_max_running_requests_per_dp"))
        if limit is not None:
            return limit
    return _positive_int(info.get("max_running_requests"))


class MetricsPoller:
    """Polls each server record's ``/metrics``; what it learns of a server is kept on the record."""

    def __init__(
        self,
        learner: SpeedLearner,
        servers: Sequence[Server],
        client: Client,
        *,
        interval: float,
        headers: bytes = b"",
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.learner = learner
        self.servers = tuple(servers)
        self.client = client
        self.interval = interval
        self.timeout = min(max(interval, 1.0), 5.0)
        self.headers = headers
        self.on_error = on_error
        self._tasks: list[asyncio.Task[None]] = []

    async def poll_once(self, server: Server) -> None:
        url = server.url
        if not server.limit_asked:
            await self._read_limit(server)
        try:
            code, body = await asyncio.wait_for(
                self.client.get(url, "/metrics", self.headers), self.timeout
            )
        except (UpstreamError, asyncio.TimeoutError):
            return  # down or slow: the health checker says so
        if code != 200:
            self._warn_once(server, f"/metrics answered {code}")
            return
        try:
            sample = parse_metrics(body.decode("utf-8", "replace"))
        except MetricsParseError as exc:
            if self.on_error is not None:
                self.on_error(url)
            logger.debug("%s/metrics skipped: %s", url, exc)
            return
        if not sample.has_speed:
            self._warn_once(server, "/metrics has no sglang:num_running_reqs/gen_throughput")
        self.learner.polled(
            url,
            running=sample.running,
            queued=sample.queued,
            gen_throughput=sample.gen_throughput,
            accept_length=sample.accept_length,
        )

    async def _read_limit(self, server: Server) -> None:
        url = server.url
        try:
            code, body = await asyncio.wait_for(
                self.client.get(url, "/get_server_info", self.headers), self.timeout
            )
        except (UpstreamError, asyncio.TimeoutError):
            return
        # Asked once per server whatever the answer: a server that does not say will not later.
        server.limit_asked = True
        limit = parse_running_limit(body) if code == 200 else None
        if limit is not None:
            self.learner.set_limit(url, limit)
            logger.info("server %s runs at most %d requests at once", url, limit)

    def _warn_once(self, server: Server, why: str) -> None:
        if server.poll_warned:
            return
        server.poll_warned = True
        logger.warning(
            "server %s: %s; its speed is learned from finished requests only", server.url, why
        )

    async def _loop(self, server: Server) -> None:
        while True:
            try:
                await self.poll_once(server)
                self.learner.refresh()
            except Exception:
                logger.exception("metrics poll of %s failed unexpectedly", server.url)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self.interval > 0:
            self._tasks = [asyncio.create_task(self._loop(s)) for s in self.servers]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
