"""The ``kill`` plan's load: closed-loop streamed chat requests through the router until SIGTERM.

``python -m dynspec.bench.gpu.killload --url ROUTER --out FILE ...``: ``--concurrency`` clients
each send their next request when the last one ends (``dynspec.bench.load``'s request and
prompts: 256 random words in, 128 tokens out, ``ignore_eos``). SIGTERM or SIGINT (or
``--max-seconds``) stops new requests; those in flight finish, for up to ``--drain`` seconds,
then the rest are cancelled (and marked so). Every request is appended to ``FILE`` as one JSON
line (``request_record``), its times in seconds after ``--t0`` (a ``time.monotonic()`` reading
of the plan, so that they line up with its kill times).

A separate process because the plan runs on the GPU machine's bare Python, and aiohttp comes
with the SGLang bundle that only the children see.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynspec.bench import load
from dynspec.bench.metrics import RequestTrace


def request_record(trace: RequestTrace, *, kill: int, offset: float) -> dict[str, Any]:
    """One request as the plan reads it; ``offset`` turns ``perf_counter`` into plan seconds."""

    def at(t: float | None) -> float | None:
        return None if t is None or t <= 0 else round(t + offset, 4)

    return {
        "kill": kill,
        "start": at(trace.send),
        "first_byte": at(trace.first_byte),
        "first_token": at(trace.chunk_times[0]) if trace.chunk_times else None,
        "end": at(trace.end),
        "status": trace.status,
        "backend": trace.backend,
        "done": trace.done,
        "ok": trace.success,
        "output_tokens": trace.output_tokens,
        "stopped": trace.error == load.STOPPED,
        "error": trace.error or None,
    }


def plan_offset(
    t0: float,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    perf_counter: Callable[[], float] = time.perf_counter,
    tries: int = 5,
) -> float:
    """What turns a ``perf_counter`` reading into plan seconds (``t0``: the plan's
    ``monotonic`` origin). The two are the same clock on Linux; measured, not assumed: a
    ``perf_counter`` reading between two ``monotonic`` ones, the tightest of ``tries``. One
    reading of each is off by any pause between them, and on a busy machine that pause
    (milliseconds) moved every record of the load earlier by as much, before the kill that cut
    it."""
    best = (float("inf"), 0.0)
    for _ in range(tries):
        before = monotonic()
        at = perf_counter()
        after = monotonic()
        best = min(best, (after - before, (before + after) / 2 - at))
    return best[1] - t0


async def drive(
    target: load.Target,
    model: str,
    prompts: load.Prompts,
    *,
    concurrency: int,
    stop: asyncio.Event,
    drain: float,
    request_timeout: float,
) -> list[RequestTrace]:
    async with load.make_session(request_timeout) as session:
        clients = load.ClosedLoop(session, target, model, prompts)
        clients.set(concurrency)
        await stop.wait()
        await clients.stop(drain)
    return clients.traces


async def main_async(args: argparse.Namespace) -> list[RequestTrace]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.call_later(args.max_seconds, stop.set)
    prompts = load.Prompts(input_len=args.input_len, output_len=args.output_len, seed=args.kill)
    target = load.parse_target(args.url)
    return await drive(
        target,
        args.model,
        prompts,
        concurrency=args.concurrency,
        stop=stop,
        drain=args.drain,
        request_timeout=args.request_timeout,
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dynspec.bench.gpu.killload")
    p.add_argument("--url", required=True, help="the router (or a server): http://HOST:PORT")
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True, help="JSONL file the requests are added to")
    p.add_argument("--kill", type=int, default=0, help="which kill these requests belong to")
    p.add_argument("--t0", type=float, default=0.0, help="the plan's time.monotonic() origin")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--drain", type=float, default=30.0)
    p.add_argument("--max-seconds", type=float, default=600.0)
    p.add_argument("--request-timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    offset = plan_offset(args.t0)
    traces: list[RequestTrace] = []
    with contextlib.suppress(KeyboardInterrupt):
        traces = asyncio.run(main_async(args))
    with open(args.out, "a", encoding="utf-8") as f:
        for t in traces:
            f.write(json.dumps(request_record(t, kill=args.kill, offset=offset)) + "\n")


if __name__ == "__main__":
    main()
