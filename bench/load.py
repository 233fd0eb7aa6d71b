"""Closed-loop load at a fixed concurrency (``sglang.bench_serving --max-concurrency C``) and
the streamed request every load sends; how a level is measured: docs/benchmarks.md, "sweep".
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from dynspec.bench.metrics import RequestTrace, samples
from dynspec.common.words import WORDS

logger = logging.getLogger(__name__)

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_DATA = b"data:"
_DONE = b"[DONE]"
_COMPLETION_TOKENS = b'"completion_tokens":'
_PROMPT_TOKENS = b'"prompt_tokens":'
_CONTENT = {"chat": b'"content":', "completions": b'"text":'}


def words(rng: random.Random, n: int) -> str:
    """``n`` random words: a prompt of about ``n`` tokens."""
    return " ".join(rng.choices(WORDS, k=n))


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Target:
    label: str
    base_url: str
    endpoint: str = "chat"
    # The levels this target runs at in a sweep (None: every level of the sweep).
    levels: frozenset[int] | None = None

    @property
    def url(self) -> str:
        return self.base_url + ENDPOINTS[self.endpoint]


def parse_target(text: str, endpoint: str = "chat") -> Target:
    """``URL`` or ``LABEL=URL``; a URL that ends in a known endpoint path selects that endpoint."""
    label, sep, url = text.partition("=")
    if not sep or "://" in label:
        label, url = "", text
    url = url.rstrip("/")
    if "://" not in url:
        raise ValueError(f"not a URL: {url!r}")
    for name, path in ENDPOINTS.items():
        if url.endswith(path):
            url, endpoint = url[: -len(path)], name
    url = url.removesuffix("/v1")
    return Target(label or url.split("://", 1)[1], url, endpoint)


def random_prompts(
    n: int, input_len: int, output_len: int, seed: int = 0, range_ratio: float = 1.0
) -> list[Prompt]:
    """Random prompts; ``range_ratio`` < 1 keeps closed-loop requests from ending in lockstep."""
    rng = random.Random(seed)
    return [_random_prompt(rng, input_len, output_len, range_ratio) for _ in range(n)]


def _random_prompt(
    rng: random.Random, input_len: int, output_len: int, range_ratio: float
) -> Prompt:
    i = rng.randint(max(1, int(input_len * range_ratio)), input_len)
    o = rng.randint(max(1, int(output_len * range_ratio)), output_len)
    return Prompt(words(rng, i), i, o)


class Prompts:
    """The random prompts of a load across its levels: ``pool`` of them reused in turn (each body
    encoded once), or (0) a new one for every request, as bench_serving's random dataset sends."""

    def __init__(
        self,
        pool: int = 0,
        input_len: int = 256,
        output_len: int = 128,
        seed: int = 0,
        range_ratio: float = 1.0,
    ) -> None:
        self.fixed = tuple(random_prompts(pool, input_len, output_len, seed, range_ratio))
        self.input_len, self.output_len = input_len, output_len
        self.seed, self.range_ratio = seed, range_ratio
        self.taken = 0
        self._bodies: dict[tuple[str, str, int], bytes] = {}

    def take(self, target: Target, model: str) -> tuple[bytes, Prompt]:
        """The next request's body and prompt."""
        i = self.taken
        self.taken += 1
        if not self.fixed:
            rng = random.Random(f"{self.seed}:{i}")
            prompt = _random_prompt(rng, self.input_len, self.output_len, self.range_ratio)
            return request_body(target, model, prompt), prompt
        k = i % len(self.fixed)
        key = (target.url, model, k)
        body = self._bodies.get(key)
        if body is None:
            body = self._bodies[key] = request_body(target, model, self.fixed[k])
        return body, self.fixed[k]


def request_body(target: Target, model: str, prompt: Prompt) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": prompt.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,  # SGLang's extension: fixed output lengths, as bench_serving sends
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    return json.dumps(body).encode()


def _after(payload: bytes, i: int, key: bytes) -> int:
    """Where the value of the key found at ``i`` starts (-1: not found)."""
    if i < 0:
        return -1
    i += len(key)
    while i < len(payload) and payload[i] == 0x20:
        i += 1
    return i


def _int_after(payload: bytes, key: bytes) -> int | None:
    i = j = _after(payload, payload.rfind(key), key)
    while 0 <= j < len(payload) and 0x30 <= payload[j] <= 0x39:
        j += 1
    return int(payload[i:j]) if j > i else None


def _has_content(payload: bytes, key: bytes) -> bool:
    i = _after(payload, payload.find(key), key)
    # A string that is not empty: '"' then anything but the closing '"'.
    return i >= 0 and payload[i : i + 1] == b'"' and payload[i + 1 : i + 2] not in (b'"', b"")


async def send_request(
    session: aiohttp.ClientSession,
    target: Target,
    body: bytes,
    prompt: Prompt,
    headers: dict[str, str],
    *,
    trace: RequestTrace,
) -> RequestTrace:
    """One streamed request; never raises (failures are in the trace). ``trace`` is filled in
    place as chunks arrive, so a caller that cancels the request still sees what arrived."""
    trace.send = time.perf_counter()
    trace.prompt_tokens = prompt.prompt_tokens
    content_key = _CONTENT[target.endpoint]
    times = trace.chunk_times
    tokens: list[int] = []
    counted = True  # every content chunk carried a cumulative token count
    cum = 0
    usage_output: int | None = None
    done = False
    try:
        async with session.post(target.url, data=body, headers=headers) as resp:
            trace.backend = resp.headers.get("x-dynspec-backend")
            trace.status = resp.status
            if resp.status != 200:
                trace.retry_after = resp.headers.get("Retry-After")
                text = await resp.text()
                trace.error = f"HTTP {resp.status}: {text[:200]}"
                trace.end = time.perf_counter()
                return trace
            async for line in resp.content:
                if not line.startswith(_DATA):
                    continue
                now = time.perf_counter()
                if trace.first_byte is None:
                    trace.first_byte = now
                trace.end = now
                payload = line[5:].strip()
                if payload == _DONE:
                    done = trace.done = True
                    continue
                if payload.startswith(b'{"error"'):
                    trace.error = payload[:200].decode(errors="replace")
                    return trace
                total = _int_after(payload, _COMPLETION_TOKENS)
                if _has_content(payload, content_key):
                    times.append(now)
                    if total is None:
                        counted = False
                        tokens.append(1)
                    else:
                        tokens.append(total - cum)
                        cum = total
                elif total is not None:
                    usage_output = total
                    p = _int_after(payload, _PROMPT_TOKENS)
                    if p is not None:
                        trace.prompt_tokens = p
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        trace.end = time.perf_counter()
        trace.error = f"{type(exc).__name__}: {exc}"
        return trace
    if not done:
        trace.error = "stream ended without [DONE]"
        return trace
    trace.chunk_tokens = tokens if counted else None
    trace.output_tokens = usage_output if usage_output is not None else sum(tokens)
    trace.success = bool(times)
    if not trace.success:
        trace.error = "no content in the stream"
    return trace


@dataclass
class LevelRun:
    traces: list[RequestTrace]  # the measured requests
    window: tuple[float, float]  # the first measured send to the last measured end
    everything: list[RequestTrace]  # every request of the level (the window's throughputs)
    warmup_failed: int = 0
    warmup_sent: int = 0
    mode_switches: int | None = None

    @property
    def duration(self) -> float:
        return max(0.0, self.window[1] - self.window[0])


async def run_level(
    session: aiohttp.ClientSession,
    target: Target,
    model: str,
    prompts: Prompts,
    *,
    concurrency: int,
    requests: int,
    warmup: int,
    headers: dict[str, str] | None = None,
    on_measure: Callable[[], Awaitable[None]] | None = None,
    min_seconds: float = 0.0,
) -> LevelRun:
    """One level of ``concurrency`` closed-loop workers: warm-up, measured, filler requests
    (docs/benchmarks.md, "How a level is measured")."""
    measured: list[RequestTrace] = []
    every: list[RequestTrace] = []
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    state = {"sent": 0, "warm_left": warmup, "warm_sent": 0, "warm_failed": 0, "ended": 0}
    hook = on_measure
    all_ended = asyncio.Event()
    if requests <= 0:
        all_ended.set()
    closed = False  # no more measured sends: enough requests, and min_seconds since the first

    def done_at(now: float) -> bool:
        return len(measured) >= max(1, requests) and now - measured[0].send >= min_seconds

    def still_measuring(now: float, *, ended: bool) -> bool:
        # Closed at a measured end or while one is open: the window is never below min_seconds.
        nonlocal closed
        if not closed and done_at(now) and (ended or state["ended"] < len(measured)):
            closed = True
        return not closed

    async def worker() -> None:
        nonlocal hook
        while not all_ended.is_set():
            measuring = state["warm_left"] <= 0 and still_measuring(
                time.perf_counter(), ended=False
            )
            first_warm = state["sent"] < warmup
            if measuring and hook is not None:
                h, hook = hook, None
                await h()
            body, prompt = prompts.take(target, model)
            state["sent"] += 1
            trace = RequestTrace(send=time.perf_counter())
            every.append(trace)
            if measuring:
                measured.append(trace)
            elif state["warm_left"] > 0:
                state["warm_sent"] += 1
            await send_request(session, target, body, prompt, hdrs, trace=trace)
            if measuring:
                state["ended"] += 1
                still = still_measuring(trace.end, ended=True)
                if not still and state["ended"] >= len(measured):
                    all_ended.set()
            elif first_warm:
                state["warm_left"] -= 1
                if not trace.success:
                    state["warm_failed"] += 1
                    if state["warm_failed"] == 1:
                        logger.warning("%s: warm-up request failed: %s", target.label, trace.error)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        waiter = asyncio.create_task(all_ended.wait())
        # Workers only end on their own when something broke; then let the exception through.
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            waiter.cancel()
            for t in tasks:
                exc = t.exception() if t.done() else None
                if exc is not None:
                    raise exc
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    t0 = min((t.send for t in measured), default=0.0)
    t1 = max((t.end for t in measured), default=0.0)
    return LevelRun(measured, (t0, t1), every, state["warm_failed"], state["warm_sent"])


async def fetch_text(session: aiohttp.ClientSession, url: str, timeout: float = 10.0) -> str | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None


def mode_switches(metrics_text: str) -> int | None:
    """Sum of ``dynspec_mode_switches_total`` samples; None when this is not a dynspec router."""
    if "dynspec_" not in metrics_text:
        return None
    return round(sum(v for _, v in samples(metrics_text, "dynspec_mode_switches_total")))


def thresholds(metrics_text: str) -> list[float]:
    """Every ``dynspec_threshold`` sample (one per routing group); empty for another server."""
    return [v for _, v in samples(metrics_text, "dynspec_threshold")]


async def model_name(
    session: aiohttp.ClientSession, target: Target, headers: dict[str, str] | None = None
) -> str:
    """The first model id in ``/v1/models``."""
    url = target.base_url + "/v1/models"
    try:
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}")
            data = await resp.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise RuntimeError(f"cannot reach {url}: {exc}") from exc
    models = data.get("data") if isinstance(data, dict) else None
    if not models:
        raise RuntimeError(f"{url} lists no model")
    return str(models[0]["id"])


# Idle pooled connections are dropped after this long, below uvicorn's 5-s keep-alive (SGLang's
# server and the router's both), so no request goes out on a connection the server is closing.
# aiohttp's 15 s reused such connections: one H100 traffic run (1a53ba8) lost 3 of 21,606
# requests to ServerDisconnectedError, two of them sent to the EAGLE server directly.
KEEPALIVE_S = 4.0


def make_session(request_timeout: float) -> aiohttp.ClientSession:
    # No total timeout: a long stream is not an error; a silent one for request_timeout is.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=request_timeout),
    )
