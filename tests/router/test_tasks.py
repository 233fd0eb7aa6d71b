"""Stopping background tasks: a task that loses a cancellation still ends (router/tasks.py)."""

from __future__ import annotations

import asyncio

from dynspec.router.tasks import cancel_and_wait


async def _loses_one_cancellation(ran: list[int]) -> None:
    # What a poll loop does when asyncio.wait_for (Python < 3.12) returns its result as the
    # cancellation arrives: the cancellation is gone and the loop goes round again.
    lost = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if lost:
                raise
            lost = True
        ran.append(1)


async def test_a_task_that_loses_a_cancellation_is_cancelled_again() -> None:
    ran: list[int] = []
    plain = asyncio.create_task(asyncio.sleep(60))
    stubborn = asyncio.create_task(_loses_one_cancellation(ran))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(cancel_and_wait([plain, stubborn]), 5)
    assert plain.cancelled() and stubborn.cancelled()
    # With one cancellation only, the second task would still be running.
    assert ran


async def test_finished_and_failed_tasks_are_fine() -> None:
    async def fail() -> None:
        raise ValueError("boom")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fail())
    await asyncio.sleep(0.01)
    await cancel_and_wait([done, failed])
    await cancel_and_wait([])
    assert done.done() and isinstance(failed.exception(), ValueError)
