"""The shared load signal (``--load-signal servers``): each server's own running + queued count.

Several routers in front of the same servers each see only their own requests; a threshold on
that count switches at N times the threshold with N routers. SGLang knows the true count. Every
``--load-interval`` seconds one task per server reads ``GET /v1/loads?include=core`` (the freshest
count SGLang serves in 0.5.17 and 0.5.23; docs/operations.md, "Several routers in front of the
same servers", says why and how stale it can be), and the load of a server is

    its last reading + this router's admissions to it since - this router's finishes since

(never below 0), so replicas agree to within one reading. "Since" is measured from the moment
the poll was sent, not when its answer came back. A server that cannot be read (refused,
timeout, non-200, a body that does not parse, a reading older than ``max_age``) is counted on
this router's own in-flight requests alone until it is read again: warned about once, counted
through ``on_error`` (``dynspec_load_signal_errors_total{server}``).

``LoadSignal`` is synchronous and owns no task or clock of its own (a clock is injected);
``LoadPoller`` is the async part. Neither imports the pool: the pool calls ``admitted`` and
``finished`` where it changes in-flight counts, and the policy reads ``load``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from dynspec.router.tasks import cancel_and_wait
from dynspec.router.upstream import Client, UpstreamError

logger = logging.getLogger(__name__)

LOADS_PATH = "/v1/loads?include=core"
SIGNALS = ("local", "servers")
# A count above this is not a request count (SGLang's own running limit is in the thousands).
MAX_COUNT = 1_000_000
MAX_RANKS = 1024
# Admissions/finishes kept between two readings; more means the readings stopped being useful.
MAX_EVENTS = 65_536


class LoadParseError(ValueError):
    """A ``/v1/loads`` body that is not SGLang's load answer."""


@dataclass(frozen=True, slots=True)
class LoadReading:
    """A server's counts, summed over its data-parallel ranks."""

    running: int
    queued: int

    @property
    def total(self) -> int:
        return self.running + self.queued


def _count(rank: dict[str, Any], key: str) -> int:
    value = rank.get(key)
    # bool is an int in Python; a JSON true is not a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise LoadParseError(f"{key} is not an integer: {str(value)[:40]!r}")
    if not 0 <= value <= MAX_COUNT:
        raise LoadParseError(f"{key} out of range: {value}")
    return value


def parse_loads(body: bytes) -> LoadReading:
    """SGLang's ``/v1/loads`` JSON -> the running and waiting counts over all DP ranks.

    Raises ``LoadParseError`` on anything else: not JSON, no ``loads`` list, an empty or huge one,
    a rank without both counts, a count that is not a non-negative integer up to ``MAX_COUNT``.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise LoadParseError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise LoadParseError("not a JSON object")
    loads = doc.get("loads")
    if not isinstance(loads, list) or not loads:
        raise LoadParseError("no 'loads' list")
    if len(loads) > MAX_RANKS:
        raise LoadParseError(f"{len(loads)} ranks")
    running = queued = 0
    for rank in loads:
        if not isinstance(rank, dict):
            raise LoadParseError("a rank that is not an object")
        running += _count(rank, "num_running_reqs")
        queued += _count(rank, "num_waiting_reqs")
    if running + queued > MAX_COUNT:
        raise LoadParseError(f"total out of range: {running + queued}")
    return LoadReading(running, queued)


@dataclass(slots=True)
class _Server:
    in_flight: int = 0  # this router's own, always kept: the fallback
    reading: int | None = None  # None: no usable reading (never read, or the last read failed)
    reading_at: float = 0.0
    # Times of this router's admissions and finishes after ``reading_at``.
    admits: deque[float] = field(default_factory=deque)
    finishes: deque[float] = field(default_factory=deque)
    warned: bool = False


def _drop_until(events: deque[float], at: float) -> None:
    while events and events[0] <= at:
        events.popleft()


class LoadSignal:
    """Per server: the last reading, corrected by this router's admissions and finishes since."""

    def __init__(
        self,
        servers: Iterable[str],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._servers = {url: _Server() for url in servers}
        self.max_age = max_age
        self.clock = clock
        self.on_error = on_error

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(self._servers)

    def admitted(self, url: str) -> None:
        s = self._servers[url]
        s.in_flight += 1
        self._record(s, s.admits)

    def finished(self, url: str) -> None:
        s = self._servers[url]
        s.in_flight = max(0, s.in_flight - 1)
        self._record(s, s.finishes)

    def _record(self, s: _Server, events: deque[float]) -> None:
        # Kept without a reading too: a poll in flight needs the events after it was sent.
        events.append(self.clock())
        if len(events) > MAX_EVENTS:
            events.popleft()
            s.reading = None  # the correction would be short: wait for the next reading

    def reading(self, url: str, running: int, queued: int, at: float) -> None:
        """A reading taken at ``at`` (the clock when its poll was sent)."""
        s = self._servers[url]
        if s.reading is not None and at < s.reading_at:
            return  # an answer that overtook a later one: keep the later
        if s.reading is None and s.warned:
            logger.info("server %s: load readable again", url)
            s.warned = False
        s.reading, s.reading_at = running + queued, at
        _drop_until(s.admits, at)
        _drop_until(s.finishes, at)

    def failed(self, url: str, why: str) -> None:
        """The server could not be read: count it, warn once, use local counts until it can."""
        s = self._servers[url]
        if self.on_error is not None:
            self.on_error(url)
        if not s.warned:
            s.warned = True
            logger.warning(
                "server %s: load not readable (%s); counting this router's own", url, why
            )
        s.reading = None

    def from_server(self, url: str) -> bool:
        """Whether ``load(url)`` comes from a reading (else from local counts)."""
        s = self._servers[url]
        return s.reading is not None and self.clock() - s.reading_at <= self.max_age

    def load(self, url: str) -> int:
        s = self._servers[url]
        if not self.from_server(url):
            return s.in_flight
        assert s.reading is not None
        return max(0, s.reading + len(s.admits) - len(s.finishes))

    def total(self, urls: Iterable[str]) -> int:
        return sum(self.load(u) for u in urls)


class LoadPoller:
    """One task per server: reads ``/v1/loads`` every ``interval`` seconds into the signal."""

    def __init__(
        self,
        signal: LoadSignal,
        client: Client,
        *,
        interval: float,
        headers: bytes = b"",
        servers: Sequence[str] | None = None,
    ) -> None:
        self.signal = signal
        self.client = client
        self.interval = interval
        # Long enough for a busy server's event loop, short enough that a hung one falls back soon.
        self.timeout = min(max(4 * interval, 1.0), 5.0)
        self.headers = headers
        self.servers = tuple(servers) if servers is not None else signal.servers
        self._tasks: list[asyncio.Task[None]] = []

    async def poll_once(self, url: str) -> None:
        at = self.signal.clock()
        try:
            code, body = await asyncio.wait_for(
                self.client.get(url, LOADS_PATH, self.headers), self.timeout
            )
        except UpstreamError as exc:
            self.signal.failed(url, str(exc) or type(exc).__name__)
            return
        except asyncio.TimeoutError:
            self.signal.failed(url, f"no answer in {self.timeout:g}s")
            return
        if code != 200:
            self.signal.failed(url, f"{LOADS_PATH} answered {code}")
            return
        try:
            r = parse_loads(body)
        except LoadParseError as exc:
            self.signal.failed(url, f"{LOADS_PATH}: {exc}")
            return
        self.signal.reading(url, r.running, r.queued, at)

    async def _loop(self, url: str) -> None:
        while True:
            try:
                await self.poll_once(url)
            except Exception:
                logger.exception("load poll of %s failed unexpectedly", url)
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(u)) for u in self.servers]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
