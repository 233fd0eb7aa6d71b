"""The calibration's load generator: closed-loop levels against one server, and its gauges.

Small on purpose (the bench's aiohttp generator is a bench extra the launcher does not import):
one shared ``httpx.AsyncClient``, ``C`` workers that each send their next request as soon as the
last one ends. Requests go to the OpenAI text route, ``POST /v1/completions``, streamed, with
``ignore_eos`` and a fixed ``max_tokens``, asking for ``stream_options.continuous_usage_stats``:
every event then carries the cumulative ``usage.completion_tokens`` (SGLang and dynspec-sim
alike), so the tokens that arrive in a window and the tokens per decode step are counted exactly,
without a tokenizer. It streams deltas, as the routes the router serves do. (SGLang's native
``/generate``, which this used before, sends the whole output so far in every event, text and
token ids: work per event that grows with the output, in the server's front end and here, and
the baseline sends about four times EAGLE's events. On one H200 its levels read the baseline
at 0.54-0.99x of the steady bench's speed at C=128, ``bench/results/h200/README.md``.)

A level's tok/s is measured over a steady window: it opens once every one of the ``C`` workers
has its first token (all ``C`` in flight, prefills done), and closes after ``rounds x C``
requests finished in it or ``window_s`` seconds, whichever comes first. Then the workers are
cancelled (their streams close, and the server aborts those requests, as it does for a client
that leaves), and the next level waits until the server reports nothing running or queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx
import orjson

from dynspec.common.words import WORDS

ROUNDS = 3  # a level ends after this many rounds of C requests in its window ...
WINDOW_S = 4.0  # ... or this many seconds, whichever comes first
OUTPUT_TOKENS = 256  # each request asks for between half this and this (not in lockstep)
PROMPT_WORDS = 200
OPEN_TIMEOUT_S = 60.0  # every worker's first token, else the level fails
READ_TIMEOUT_S = 60.0  # a stream silent this long fails the level
QUIET_TIMEOUT_S = 30.0  # a server still running requests this long after a level fails it


class CalibrationError(Exception):
    """A measurement that cannot be trusted or finished: one line saying why."""


@dataclass(frozen=True)
class Level:
    c: int
    tok_s: float  # aggregate output tokens per second in the steady window
    ttft_s: float | None  # median time to the first token of the level's requests
    tokens_per_chunk: float | None  # mean tokens per stream event after the first one
    max_tokens_per_chunk: int
    prompt_tokens: float | None  # mean, as the server counted them


@dataclass
class _Window:
    c: int
    rounds: int
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    started: set[int] = field(default_factory=set)
    start: float = 0.0
    end: float = 0.0
    tokens: int = 0
    finished: int = 0
    ttfts: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)

    def first_token(self, worker: int, now: float) -> None:
        if self.opened.is_set():
            return
        self.started.add(worker)
        if len(self.started) == self.c:
            self.start = now
            self.opened.set()

    def add(self, tokens: int) -> None:
        if self.opened.is_set() and not self.closed.is_set():
            self.tokens += tokens

    def finish(self, now: float) -> None:
        if self.opened.is_set() and not self.closed.is_set():
            self.finished += 1
            if self.finished >= self.rounds * self.c:
                self.close(now)

    def close(self, now: float) -> None:
        if not self.closed.is_set():
            self.end = now
            self.closed.set()


ROUTE = "/v1/completions"
_USAGE = {"include_usage": True, "continuous_usage_stats": True}
# How a level is loaded, in the calibration cache's key: a profile measured another way (the
# native /generate before) is measured again, not reused.
METHOD = (
    f"POST {ROUTE} streamed, continuous usage stats, {PROMPT_WORDS} words in, "
    f"{OUTPUT_TOKENS // 2}-{OUTPUT_TOKENS} tokens out, ignore_eos"
)


def request_body(rng: random.Random, output_tokens: int, model: str) -> bytes:
    words = " ".join(rng.choices(WORDS, k=PROMPT_WORDS))
    tokens = rng.randint(max(1, output_tokens // 2), output_tokens)
    return orjson.dumps(
        {
            "model": model,
            "prompt": words,
            "max_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": _USAGE,
        }
    )


def _describe(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {READ_TIMEOUT_S:g}s"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return "the server closed the connection mid-answer"
    return f"{type(exc).__name__} ({exc})" if str(exc) else type(exc).__name__


async def _one_request(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    *,
    headers: Mapping[str, str],
    worker: int,
    window: _Window,
) -> None:
    sent = time.perf_counter()
    seen = 0
    done = False
    try:
        # SGLang's FastAPI (0.5.17's bundles FastAPI 0.165, strict about it) reads a body as
        # JSON only when it is labelled so: unlabelled, its routes answer 400.
        labelled = {"content-type": "application/json", **headers}
        async with client.stream("POST", url, content=body, headers=labelled) as r:
            if r.status_code != 200:
                detail = (await r.aread())[:200].decode("utf-8", "replace").strip()
                raise CalibrationError(
                    f"HTTP {r.status_code} from {ROUTE}" + (f": {detail}" if detail else "")
                )
            pending = b""
            async for data in r.aiter_raw():
                pending += data
                *events, pending = pending.split(b"\n\n")
                now = time.perf_counter()
                for event in events:
                    payload = event.strip().removeprefix(b"data:").strip()
                    if payload == b"[DONE]":
                        done = True
                        continue
                    if not payload:
                        continue
                    count, prompt = event_counts(payload)
                    if count <= seen:
                        continue
                    if seen == 0:
                        window.ttfts.append(now - sent)
                        window.first_token(worker, now)
                        if prompt is not None:
                            window.prompts.append(prompt)
                    else:
                        window.chunks.append(count - seen)
                    window.add(count - seen)
                    seen = count
    except httpx.HTTPError as exc:
        raise CalibrationError(_describe(exc)) from None
    if seen == 0:
        raise CalibrationError("a request got no tokens")
    if not done:
        raise CalibrationError("a stream ended before [DONE]")
    window.finish(time.perf_counter())


def event_counts(payload: bytes) -> tuple[int, int | None]:
    """(completion tokens so far, prompt tokens) of one stream event; an error event fails, and
    so does an event without usage (a server that ignores ``continuous_usage_stats``)."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise CalibrationError("a stream event is not JSON") from None
    usage = data.get("usage") if isinstance(data, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        prompt = usage.get("prompt_tokens")
        return usage["completion_tokens"], prompt if isinstance(prompt, int) else None
    if isinstance(data, dict) and "choices" in data:
        raise CalibrationError(
            "the stream's events carry no usage (the server ignores "
            "stream_options.continuous_usage_stats)"
        )
    error = data.get("error") or data.get("message") if isinstance(data, dict) else None
    raise CalibrationError(f"the server sent an error: {str(error)[:120]}")


async def _worker(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: Mapping[str, str],
    worker: int,
    window: _Window,
    output_tokens: int,
    model: str,
) -> None:
    rng = random.Random(worker)
    while True:
        body = request_body(rng, output_tokens, model)
        await _one_request(client, url, body, headers=headers, worker=worker, window=window)


async def _until(event: asyncio.Event, tasks: Sequence[asyncio.Task[None]], timeout: float) -> bool:
    """True when ``event`` is set within ``timeout``; a worker that ended raises its error."""
    waiter = asyncio.create_task(event.wait())
    try:
        done, _ = await asyncio.wait(
            [waiter, *tasks], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
    for task in done:
        if task is not waiter:
            task.result()  # workers loop until cancelled: one that ended failed
    return waiter in done


async def measure_level(
    client: httpx.AsyncClient,
    base_url: str,
    c: int,
    *,
    model: str,
    headers: Mapping[str, str] | None = None,
    rounds: int = ROUNDS,
    window_s: float = WINDOW_S,
    output_tokens: int = OUTPUT_TOKENS,
    open_timeout: float = OPEN_TIMEOUT_S,
) -> Level:
    """One closed-loop level of ``c`` requests for ``model`` (the served model name) against the
    server at ``base_url``."""
    window = _Window(c, rounds)
    url = base_url + ROUTE
    tasks = [
        asyncio.create_task(
            _worker(
                client,
                url,
                headers=headers or {},
                worker=i,
                window=window,
                output_tokens=output_tokens,
                model=model,
            )
        )
        for i in range(c)
    ]
    try:
        if not await _until(window.opened, tasks, open_timeout):
            raise CalibrationError(f"not all {c} requests had a token within {open_timeout:g}s")
        await _until(window.closed, tasks, window_s)
        window.close(time.perf_counter())
    finally:
        for task in tasks:
            task.cancel()
        # Cancelled streams close their connections: the server aborts those requests.
        await asyncio.gather(*tasks, return_exceptions=True)
    span = window.end - window.start
    if window.tokens <= 0 or span <= 0:
        raise CalibrationError("no tokens in the measured window")
    return Level(
        c=c,
        tok_s=window.tokens / span,
        ttft_s=statistics.median(window.ttfts) if window.ttfts else None,
        tokens_per_chunk=statistics.fmean(window.chunks) if window.chunks else None,
        max_tokens_per_chunk=max(window.chunks, default=1),
        prompt_tokens=statistics.fmean(window.prompts) if window.prompts else None,
    )


def gauge(text: str, name: str) -> float | None:
    """The sum of a Prometheus gauge's samples (every label set) in ``text``; None if absent."""
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest[:1] not in ("{", " "):
            continue
        with contextlib.suppress(ValueError, IndexError):
            total += float(rest.rsplit(" ", 1)[1])
            found = True
    return total if found else None


async def read_metrics(
    client: httpx.AsyncClient, base_url: str, headers: Mapping[str, str] | None = None
) -> str | None:
    """The server's /metrics text; None when it has none to give."""
    try:
        r = await client.get(base_url + "/metrics", headers=headers or {}, timeout=5.0)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


async def wait_quiet(
    client: httpx.AsyncClient,
    base_url: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = QUIET_TIMEOUT_S,
) -> None:
    """Until the server reports no request running or queued (``sglang:num_running_reqs`` and
    ``sglang:num_queue_reqs``); at once when it exports neither."""
    deadline = time.monotonic() + timeout
    while True:
        text = await read_metrics(client, base_url, headers)
        if text is None:
            return
        running = gauge(text, "sglang:num_running_reqs")
        queued = gauge(text, "sglang:num_queue_reqs")
        if running is None and queued is None:
            return
        left = (running or 0.0) + (queued or 0.0)
        if left <= 0:
            return
        if time.monotonic() > deadline:
            raise CalibrationError(f"still {left:.0f} requests running {timeout:g}s after a level")
        await asyncio.sleep(0.1)
