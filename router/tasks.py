"""Stopping the router's background tasks (health checks, metrics and load polls, the watchdog).

One cancellation is not always enough: before Python 3.12, ``asyncio.wait_for`` returns its inner
result when the cancellation arrives just as that result does, and the cancellation is lost
(CPython gh-86296). A poll loop that loses it goes round again and never ends, and the router's
shutdown waited on it for good (seen in CI: "Waiting for application shutdown." and nothing more,
with the health checks polling every 0.2 s). So a task still running after a cancellation is
cancelled again until it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

# How long one cancellation is given before the next is sent.
RECANCEL_S = 0.5


async def cancel_and_wait(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Cancel every task and wait until all have ended, cancelling again those that go on."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for t in tasks:
        # Retrieve each outcome, so none is logged as "never retrieved".
        if not t.cancelled():
            t.exception()


__all__ = ["RECANCEL_S", "cancel_and_wait"]
