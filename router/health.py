"""Health of each server: a few failed checks in a row mark it down, one success marks it up.

A refused connection marks a server down at once (nothing listens: no point waiting for more
proof); timeouts and error statuses need ``FAILURES_TO_DOWN`` in a row, so one slow answer under
load does not empty a pool. Each server is polled by its own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging

from dynspec.router.pool import Pools
from dynspec.router.upstream import Client, ConnectError, UpstreamError

logger = logging.getLogger(__name__)

FAILURES_TO_DOWN = 3


class Probe(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    REFUSED = "refused"


class HealthTracker:
    """Turns probe results into up/down decisions; pure, so the rule is tested on its own."""

    def __init__(self, failures_to_down: int = FAILURES_TO_DOWN) -> None:
        self.failures_to_down = failures_to_down
        self._failures: dict[str, int] = {}

    def verdict(self, url: str, probe: Probe) -> bool | None:
        """True: mark up; False: mark down; None: no change yet."""
        if probe is Probe.OK:
            self._failures[url] = 0
            return True
        if probe is Probe.REFUSED:
            self._failures[url] = self.failures_to_down
            return False
        n = self._failures.get(url, 0) + 1
        self._failures[url] = n
        return False if n >= self.failures_to_down else None


class HealthChecker:
    def __init__(
        self,
        pools: Pools,
        client: Client,
        interval: float,
        headers: bytes = b"",
    ) -> None:
        self.pools = pools
        self.client = client
        self.interval = interval
        self.timeout = min(max(interval, 1.0), 5.0)
        self.headers = headers
        self.tracker = HealthTracker()
        # Why each server's last check failed, for the log line that marks it down.
        self.reasons: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def probe(self, url: str) -> Probe:
        try:
            status, _ = await asyncio.wait_for(
                self.client.get(url, "/health", self.headers), self.timeout
            )
        except ConnectError as exc:
            self.reasons[url] = str(exc)
            return Probe.REFUSED if exc.refused else Probe.FAILED
        except UpstreamError as exc:
            self.reasons[url] = str(exc)
            return Probe.FAILED
        except asyncio.TimeoutError:
            self.reasons[url] = f"no answer within {self.timeout:g}s"
            return Probe.FAILED
        if status != 200:
            self.reasons[url] = f"/health answered {status}"
            return Probe.FAILED
        return Probe.OK

    def apply(self, url: str, probe: Probe) -> None:
        verdict = self.tracker.verdict(url, probe)
        if verdict is None:
            return
        if self.pools.set_healthy(url, verdict):
            server = self.pools.server(url)
            if verdict:
                logger.info("server %s (%s) is up", url, server.pool)
            else:
                reason = self.reasons.get(url, probe.value)
                logger.warning("server %s (%s) is down: %s", url, server.pool, reason)

    def refused(self, url: str) -> None:
        """A request found nothing listening at ``url``: down at once, no need to wait for a
        probe."""
        self.apply(url, Probe.REFUSED)

    async def check_once(self, url: str) -> None:
        self.apply(url, await self.probe(url))

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check_once(s.url) for s in self.pools.servers))
        for server in self.pools.servers:
            if not server.healthy:
                reason = self.reasons.get(server.url, "no answer yet")
                logger.warning("server %s (%s) is not up: %s", server.url, server.pool, reason)

    async def _loop(self, url: str) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_once(url)
            except Exception:
                logger.exception("health check of %s failed unexpectedly", url)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(s.url)) for s in self.pools.servers]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
