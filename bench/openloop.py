"""Open-loop load: each request sent at its arrival time whatever is in flight, as
``bench_serving --request-rate`` sends (a closed loop would send a slow server less).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from dynspec.bench import load
from dynspec.bench.arrivals import Arrival
from dynspec.bench.load import Prompt, Target
from dynspec.bench.metrics import RequestTrace

logger = logging.getLogger(__name__)

# A sample of what a run watches: its wall-clock time (perf_counter) and named readings.
Sample = tuple[float, dict[str, float]]
Probe = Callable[[aiohttp.ClientSession], Awaitable[dict[str, float]]]


@dataclass
class OpenLoopRun:
    """What one open-loop run sent and saw; ``traces[i]`` is ``arrivals[i]``'s request."""

    arrivals: Sequence[Arrival]
    traces: list[RequestTrace]
    start: float  # perf_counter of arrival time 0
    end: float  # when the last request ended or was cut
    speed: float = 1.0
    cut: int = 0  # still open at the drain deadline, cancelled
    samples: list[Sample] = field(default_factory=list)

    def lag(self) -> list[float]:
        """Each sent request's delay past its arrival time (wall seconds): the client's own
        health; a late client would under-load the target and flatter it."""
        return [
            t.send - (self.start + a.at / self.speed)
            for a, t in zip(self.arrivals, self.traces, strict=True)
            if t.send > 0
        ]


def prompt_of(arrival: Arrival, key: str) -> Prompt:
    """``input_tokens`` random words drawn from ``key``, ``output_tokens`` to generate. Live
    traffic gives each target a key of its own, so a prefix cache shared behind them serves none
    from another's; simulated traffic gives them one (``traffic._each``)."""
    words = load.words(random.Random(key), arrival.input_tokens)
    return Prompt(words, arrival.input_tokens, arrival.output_tokens)


async def _sample(probe: Probe | None, session: aiohttp.ClientSession, into: list[Sample]) -> None:
    while probe is not None:
        try:
            into.append((time.perf_counter(), await probe(session)))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            logger.debug("sample failed: %s", exc)
        await asyncio.sleep(1.0)  # a sample a second


async def replay(
    session: aiohttp.ClientSession,
    target: Target,
    model: str,
    arrivals: Sequence[Arrival],
    *,
    key: str,
    drain_s: float,
    speed: float = 1.0,
    probe: Probe | None = None,
) -> OpenLoopRun:
    """Send every arrival at wall second ``at / speed``; ``drain_s`` after the last, cut the
    requests still open. A failed request's trace says what happened; nothing raises."""
    hdrs = {"Content-Type": "application/json"}
    traces = [RequestTrace(send=0.0) for _ in arrivals]
    inflight: dict[asyncio.Task[RequestTrace], int] = {}
    samples: list[Sample] = []
    start = time.perf_counter()
    sampler = asyncio.create_task(_sample(probe, session, samples))
    try:
        for i, a in enumerate(arrivals):
            delay = start + a.at / speed - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            prompt = prompt_of(a, f"{key}:{i}")
            body = load.request_body(target, model, prompt)
            task = asyncio.create_task(
                load.send_request(session, target, body, prompt, hdrs, trace=traces[i])
            )
            inflight[task] = i
            task.add_done_callback(inflight.pop)
        pending: set[asyncio.Task[RequestTrace]] = set()
        if inflight:
            _, pending = await asyncio.wait(set(inflight), timeout=drain_s)
        cut = [inflight[task] for task in pending]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        end = time.perf_counter()
        for i in cut:
            traces[i].end = end
            traces[i].success = False
            traces[i].error = "cut: still open when the run's drain time ended"
    finally:
        for task in list(inflight):
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    return OpenLoopRun(arrivals, traces, start, end, speed, len(cut), samples)
