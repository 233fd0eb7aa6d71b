"""The relay's read timeout (``--request-timeout``: to the first byte, then between chunks).

One task looks at every request in flight a few times per timeout, rather than a timer per read:
aiohttp's ``sock_read`` cancelled and re-armed one on every chunk received, measured at ~6 us a
chunk under uvloop, a fifth of the relay's whole budget. A chunk here costs one integer increment
(``Watched.progress``). A request that made no progress for the timeout is marked ``timed_out``
and its task cancelled; what the client then gets is the proxy's to say.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dynspec.router.tasks import cancel_and_wait


class Watched:
    """What the watchdog reads and writes on one request (the proxy's request state extends it)."""

    __slots__ = ("finished", "progress", "seen", "seen_at", "task", "timed_out")

    def __init__(self) -> None:
        # Set once the response is complete (or the request is over): no timeout from then on.
        self.finished = False
        # Grows with every chunk; the watchdog compares it with what it saw last (``seen``) and
        # since when (``seen_at``, monotonic seconds).
        self.progress = 0
        self.seen = 0
        self.seen_at = time.monotonic()
        self.timed_out = False
        # The task that serves the request, cancelled on a timeout.
        self.task: asyncio.Task[Any] | None = None


class Watchdog:
    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # The requests in flight: the proxy adds each one when it relays it, and discards it after.
        self.active: set[Watched] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _watch(self) -> None:
        timeout = self.timeout
        tick = min(1.0, timeout / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for req in list(self.active):
                if req.progress != req.seen:
                    req.seen = req.progress
                    req.seen_at = now
                elif now - req.seen_at >= timeout and not (req.finished or req.timed_out):
                    req.timed_out = True
                    if req.task is not None:
                        req.task.cancel()
