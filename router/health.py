"""Health of each server: a few failed checks in a row mark it down, one success marks it up.

A refused connection marks a server down at once (nothing listens: no point waiting for more
proof); timeouts and error statuses need ``FAILURES_TO_DOWN`` in a row, so one slow answer under
load does not empty a pool. Each server is polled by its own task.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from dynspec.router.pool import Pools
from dynspec.router.server import Server
from dynspec.router.tasks import cancel_and_wait
from dynspec.router.upstream import Client, ConnectError, UpstreamError

logger = logging.getLogger(__name__)

FAILURES_TO_DOWN = 3


class Probe(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    REFUSED = "refused"


class HealthTracker:
    """Turns probe results into up/down decisions, counting failures on the server's record."""

    def __init__(self, failures_to_down: int = FAILURES_TO_DOWN) -> None:
        self.failures_to_down = failures_to_down

    def verdict(self, server: Server, probe: Probe) -> bool | None:
        """True: mark up; False: mark down; None: no change yet."""
        if probe is Probe.OK:
            server.failures = 0
            return True
        if probe is Probe.REFUSED:
            server.failures = self.failures_to_down
            return False
        server.failures += 1
        return False if server.failures >= self.failures_to_down else None


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
        self._tasks: list[asyncio.Task[None]] = []

    async def probe(self, server: Server) -> Probe:
        url = server.url
        try:
            status, _ = await asyncio.wait_for(
                self.client.get(url, "/health", self.headers), self.timeout
            )
        except ConnectError as exc:
            server.down_reason = str(exc)
            return Probe.REFUSED if exc.refused else Probe.FAILED
        except UpstreamError as exc:
            server.down_reason = str(exc)
            return Probe.FAILED
        except asyncio.TimeoutError:
            server.down_reason = f"no answer within {self.timeout:g}s"
            return Probe.FAILED
        if status != 200:
            server.down_reason = f"/health answered {status}"
            return Probe.FAILED
        return Probe.OK

    def apply(self, server: Server, probe: Probe) -> None:
        verdict = self.tracker.verdict(server, probe)
        if verdict is None:
            return
        if server.mark(verdict):
            if verdict:
                logger.info("server %s (%s) is up", server.url, server.pool)
            else:
                reason = server.down_reason or probe.value
                logger.warning("server %s (%s) is down: %s", server.url, server.pool, reason)

    def refused(self, server: Server) -> None:
        """A request found nothing listening at ``server``: down at once, no need to wait for a
        probe."""
        self.apply(server, Probe.REFUSED)

    async def check_once(self, server: Server) -> None:
        self.apply(server, await self.probe(server))

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check_once(s) for s in self.pools.servers))
        for server in self.pools.servers:
            if not server.healthy:
                reason = server.down_reason or "no answer yet"
                logger.warning("server %s (%s) is not up: %s", server.url, server.pool, reason)

    async def _loop(self, server: Server) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_once(server)
            except Exception:
                logger.exception("health check of %s failed unexpectedly", server.url)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(s)) for s in self.pools.servers]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
