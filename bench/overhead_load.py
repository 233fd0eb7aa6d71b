"""Closed-loop streaming load for the overhead benchmark, run as its own process.

``C`` workers each send one streaming chat request at a time until a fixed number of requests has
been sent or a deadline passes, and the run prints one JSON object: requests/s, SSE events/s, TTFT
and latency percentiles, and how many streams did not carry exactly what the upstream sent.

The client is kept cheap, because on a small machine it competes with what it measures: responses
are read in whatever pieces arrive and counted with ``bytes.count`` (no line splitting, no JSON
parsing); only the first content chunk of each stream is found with a regular expression.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from dynspec.common.cli import FlagParser, run_main

_EVENT = b"data:"
_CONTENT = b'"content":"'
_EMPTY = b'"content":""'
_FIRST = re.compile(rb'"content":"[^"]')
_CARRY = len(_EMPTY) + 4
# Role chunk, finish chunk and [DONE] on top of one chunk per token, plus the usage chunk.
FIXED_EVENTS = 4


def expected_events(tokens: int, usage: bool = True) -> int:
    return tokens + FIXED_EVENTS - (0 if usage else 1)


@dataclass
class Totals:
    ok: int = 0
    failed: int = 0
    events: int = 0
    content: int = 0
    bad_streams: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.failed += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99/mean/max in milliseconds, nearest rank; None when there is nothing."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    s = sorted(values)
    n = len(s)

    def rank(q: float) -> float:
        return s[min(n - 1, max(0, int(q * n + 0.999999) - 1))] * 1e3

    return {
        "p50": round(rank(0.50), 3),
        "p90": round(rank(0.90), 3),
        "p99": round(rank(0.99), 3),
        "mean": round(sum(s) / n * 1e3, 3),
        "max": round(s[-1] * 1e3, 3),
    }


async def _one(  # noqa: PLR0917
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    tokens: int,
    t: Totals,
    record: bool,
) -> None:
    start = time.perf_counter()
    first = 0.0
    events = content = 0
    prev = b""
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                if record:
                    t.error(f"status {resp.status}")
                return
            async for piece in resp.content.iter_any():
                buf = prev + piece
                if not first and _FIRST.search(buf):
                    first = time.perf_counter()
                # Markers split across two reads are found in prev + piece; those wholly in prev
                # were counted last time.
                events += buf.count(_EVENT) - prev.count(_EVENT)
                content += (buf.count(_CONTENT) - prev.count(_CONTENT)) - (
                    buf.count(_EMPTY) - prev.count(_EMPTY)
                )
                prev = buf[-_CARRY:]
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if record:
            t.error(type(exc).__name__)
        return
    end = time.perf_counter()
    if not record:
        return
    t.ok += 1
    t.events += events
    t.content += content
    if content != tokens or events != expected_events(tokens):
        t.bad_streams += 1
    if first:
        t.ttft.append(first - start)
    t.latency.append(end - start)


async def run_load(  # noqa: PLR0917
    urls: Sequence[str],
    concurrency: int,
    requests: int,
    tokens: int,
    max_seconds: float,
    warmup: int = 0,
    api_key: str | None = None,
    read_timeout: float = 60.0,
    handshake: bool = False,
    stagger: float = 0.0,
) -> dict[str, Any]:
    payload = {
        "model": "bench-model",
        "messages": [{"role": "user", "content": "Say something."}],
        "stream": True,
        "max_tokens": tokens,
        "stream_options": {"include_usage": True},
    }
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    totals = Totals()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        # Warm-up opens the connections and fills caches on both sides; it is not recorded.
        if warmup:
            await asyncio.gather(
                *(
                    _one(session, urls[i % len(urls)], body, headers, tokens, totals, False)
                    for i in range(min(warmup, max(concurrency, 1) * 2))
                )
            )
        if handshake:
            # Tell the caller the warm-up is over and wait for its go: what it measures around the
            # run (router CPU) then covers only the recorded requests.
            sys.stdout.write("warm\n")
            sys.stdout.flush()
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        issued = 0
        deadline = time.perf_counter() + max_seconds

        async def worker(i: int) -> None:
            nonlocal issued
            if stagger and i:
                await asyncio.sleep(stagger * i / concurrency)
            while issued < requests and time.perf_counter() < deadline:
                url = urls[issued % len(urls)]
                issued += 1
                await _one(session, url, body, headers, tokens, totals, True)

        start = time.perf_counter()
        tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        # Bounded: the workers stop issuing at the deadline; whatever is still running after a
        # grace period is cancelled and counted as unfinished.
        _, pending = await asyncio.wait(tasks, timeout=max_seconds + read_timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        elapsed = time.perf_counter() - start
    done = totals.ok + totals.failed
    return {
        "concurrency": concurrency,
        "tokens": tokens,
        "requests_planned": requests,
        "requests_ok": totals.ok,
        "requests_failed": totals.failed,
        "requests_unfinished": issued - done,
        "errors": totals.errors,
        "elapsed_s": round(elapsed, 4),
        "events": totals.events,
        "content_chunks": totals.content,
        "expected_events_per_request": expected_events(tokens),
        "bad_streams": totals.bad_streams,
        "requests_per_s": round(totals.ok / elapsed, 3) if elapsed > 0 else 0.0,
        "chunks_per_s": round(totals.events / elapsed, 1) if elapsed > 0 else 0.0,
        "ttft_ms": percentiles(totals.ttft),
        "latency_ms": percentiles(totals.latency),
    }


def _parser() -> FlagParser:
    p = FlagParser(prog="python -m dynspec.bench.overhead_load", description=__doc__.split("\n")[0])
    p.add_argument(
        "--url", action="append", required=True, help="chat completions URL (repeat to round-robin)"
    )
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop workers")
    p.add_argument("--requests", type=int, default=100, help="requests to send (after warm-up)")
    p.add_argument("--tokens", type=int, default=16, help="max_tokens of each request")
    p.add_argument("--max-seconds", type=float, default=60.0, help="stop issuing after this")
    p.add_argument("--warmup", type=int, default=0, help="unrecorded requests sent first")
    p.add_argument("--api-key", default=None, help="bearer key to send")
    p.add_argument(
        "--stagger-ms",
        type=float,
        default=0.0,
        help="spread the workers' first requests over this long (about one stream's duration), "
        "so the loop runs in steady state rather than in lock-step bursts of C requests",
    )
    p.add_argument(
        "--handshake",
        action="store_true",
        help="print 'warm' after the warm-up and wait for a line on stdin",
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_layered(argv)

    def body() -> None:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:  # pragma: no cover
            pass
        result = asyncio.run(
            run_load(
                args.url,
                args.concurrency,
                args.requests,
                args.tokens,
                args.max_seconds,
                args.warmup,
                args.api_key,
                handshake=args.handshake,
                stagger=args.stagger_ms / 1e3,
            )
        )
        sys.stdout.write(json.dumps(result) + "\n")

    run_main("overhead_load", body)


if __name__ == "__main__":
    main()
