"""The engine seen from outside: queueing, aborts, prefill, accept lengths, --seed, startup."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
from simkit import Sim, SimFactory, metric_value, sse_json
from utils import wait_http

CHAT = [{"role": "user", "content": "Tell me a story."}]


def _stream_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": CHAT, "max_tokens": max_tokens, "stream": True, **extra}


def _wait_metric(sim: Sim, name: str, value: float, timeout: float = 10.0, **labels: str) -> float:
    deadline = time.monotonic() + timeout
    while True:
        got = sim.metric(name, **labels)
        if got == value or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


async def _metric(sim: Sim, name: str, **labels: str) -> float:
    return await asyncio.to_thread(sim.metric, name, **labels)


async def _await_metric(
    sim: Sim, name: str, done: Callable[[float], bool], timeout: float = 10.0, **labels: str
) -> float:
    """Poll ``name`` off the event loop until ``done(value)`` or the deadline; the last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(sim.metric, name, **labels)
        if done(got) or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.02)


async def _first_event(lines: AsyncIterator[str]) -> dict[str, Any]:
    """The first event of a stream's lines. The caller keeps ``lines``: an abandoned line iterator
    is closed when the event loop finalizes it, and that closes the response (a disconnect)."""
    async for line in lines:
        if line.startswith("data: "):
            return orjson.loads(line[6:])  # type: ignore[no-any-return]
    raise AssertionError("stream ended before its first event")


async def test_queue_beyond_max_running_shows_in_metrics(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "baseline", "--max-running-requests", "2", "--speed", "2")
    async with httpx.AsyncClient(timeout=30) as client:
        ctxs = [
            client.stream("POST", sim.url + "/v1/chat/completions", json=_stream_body(2000))
            for _ in range(5)
        ]
        resps = [await c.__aenter__() for c in ctxs]
        try:
            assert await _await_metric(sim, "sglang:num_queue_reqs", lambda v: v == 3) == 3
            assert await _metric(sim, "sglang:num_running_reqs") == 2
            # After a few decode steps the two running requests hold their tokens.
            used = await _await_metric(sim, "sglang:num_used_tokens", lambda v: v >= 2 * 12)
            assert used >= 2 * 12
            text = await asyncio.to_thread(sim.metrics)
            assert metric_value(text, "sglang:gen_throughput") > 0
            assert metric_value(text, "sglang:token_usage") > 0
            # The two running ones stream; the queued ones have not started.
            lines = resps[0].aiter_lines()
            first = await asyncio.wait_for(_first_event(lines), 10)
            assert first["choices"][0]["delta"]["role"] == "assistant"
            r = await client.post(sim.url + "/abort_request", json={"abort_all": True})
            r.raise_for_status()
            aborted = await _await_metric(
                sim, "sglang:num_aborted_requests_total", lambda v: v == 5
            )
            assert aborted == 5
            assert await _metric(sim, "sglang:num_running_reqs") == 0
            assert await _metric(sim, "sglang:num_queue_reqs") == 0
        finally:
            for c in ctxs:
                await c.__aexit__(None, None, None)


async def test_client_disconnect_aborts_the_request(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "eagle", "--speed", "1")
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", sim.url + "/v1/chat/completions", json=_stream_body(5000)) as resp,
    ):
        lines = resp.aiter_lines()
        await _first_event(lines)
        assert await _metric(sim, "sglang:num_running_reqs") == 1
    # Gone: the request leaves the batch and is counted as aborted. Decoding all 5000 tokens
    # would take about a minute at real speed (demo EAGLE: ~3 tokens per ~32 ms step), so a batch
    # that empties before the deadline has dropped it, and the counter says it was an abort.
    left = await _await_metric(sim, "sglang:num_running_reqs", lambda v: v == 0, timeout=20)
    assert left == 0
    assert await _metric(sim, "sglang:num_aborted_requests_total") == 1
    assert await _metric(sim, "sglang:num_requests_total", is_streaming="true") == 1


async def test_abort_request_by_rid_ends_stream_with_abort(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "baseline", "--speed", "1")
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream(
            "POST",
            sim.url + "/v1/chat/completions",
            json=_stream_body(5000, stream_options={"include_usage": True}),
        ) as resp,
    ):
        events: list[Any] = []
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            events.append(orjson.loads(line[6:]))
            if len(events) == 2:
                r = await client.post(sim.url + "/abort_request", json={"rid": events[0]["id"]})
                assert r.status_code == 200
        else:
            raise AssertionError("no [DONE] after the abort")
    finish = events[-2]["choices"][0]
    assert finish["finish_reason"] == "abort"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] < 5000
    assert await _metric(sim, "sglang:num_aborted_requests_total") == 1
    # An unknown or empty rid aborts nothing.
    async with httpx.AsyncClient(timeout=30) as client:
        for rid in ("nope", ""):
            (await client.post(sim.url + "/abort_request", json={"rid": rid})).raise_for_status()
    assert await _metric(sim, "sglang:num_aborted_requests_total") == 1


def test_non_streamed_disconnect_is_an_abort(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "baseline", "--speed", "1")
    body = {"model": "m", "prompt": "x", "max_tokens": 5000}
    try:
        httpx.post(sim.url + "/v1/completions", json=body, timeout=0.5)
        raise AssertionError("a 5000-token answer at real speed came back within 0.5 s")
    except httpx.ReadTimeout:
        pass
    assert _wait_metric(sim, "sglang:num_aborted_requests_total", 1, timeout=5) == 1
    assert _wait_metric(sim, "sglang:num_running_reqs", 0, timeout=5) == 0


def _chunk_tokens(sim: Sim, prompt: str, max_tokens: int) -> list[int]:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    r = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
    chunks = sse_json(r.content)[1:-1]
    # Every simulated token is one word with a leading space.
    return [c["choices"][0]["delta"]["content"].count(" ") for c in chunks]


def test_eagle_sends_several_tokens_per_chunk_baseline_one(sim_factory: SimFactory) -> None:
    eagle = sim_factory("--mode", "eagle", "--speed", "2", "--seed", "3")
    base = sim_factory("--mode", "baseline", "--speed", "2", "--seed", "3")

    def decode_steps(sim: Sim, before: dict[str, int]) -> int:
        after = sim.stats()
        return (after["steps"] - before["steps"]) - (
            after["prefill_steps"] - before["prefill_steps"]
        )

    e0, b0 = eagle.stats(), base.stats()
    e = _chunk_tokens(eagle, "hello", 120)
    b = _chunk_tokens(base, "hello", 60)
    e_steps, b_steps = decode_steps(eagle, e0), decode_steps(base, b0)
    assert sum(e) == 120 and sum(b) == 60
    # The engine's own count, which a slow reader cannot change (a late one only merges steps
    # into fewer chunks): demo's EAGLE accepts 3.0 tokens a step on average, baseline exactly 1
    # (the first token comes from the prefill step).
    assert 2.2 <= 120 / e_steps <= 3.6, e_steps
    assert b_steps == 59, b_steps
    # A chunk carries whole steps: never more chunks than steps that made tokens.
    assert len(e) <= e_steps + 1 and len(b) <= b_steps + 1


def test_stream_interval_releases_tokens_as_sglang_does(sim_factory: SimFactory) -> None:
    # SGLang (output_streamer.py): with --stream-interval N > 1 a streamed request's tokens go out
    # after a step that leaves it at 1 past a multiple of N, and at its end. Where a chunk
    # ends, so many tokens had gone out: the first at once, then each mark; a slow reader may
    # only merge chunks, so every end but the last is still at a mark.
    for mode, tokens in (("baseline", 58), ("eagle", 118)):
        sim = sim_factory("--mode", mode, "--speed", "2", "--seed", "3", "--stream-interval", "4")
        chunks = _chunk_tokens(sim, "hello", tokens)
        ends = list(itertools.accumulate(chunks))
        assert ends[-1] == tokens and chunks[0] == 1, (mode, chunks)
        assert all(end % 4 == 1 for end in ends[:-1]), (mode, chunks)
        assert len(chunks) <= tokens // 4 + 2, (mode, chunks)


def test_seed_makes_text_and_chunks_reproducible(sim_factory: SimFactory) -> None:
    a = sim_factory("--mode", "eagle", "--speed", "4", "--seed", "11")
    b = sim_factory("--mode", "eagle", "--speed", "4", "--seed", "11")
    c = sim_factory("--mode", "eagle", "--speed", "4", "--seed", "12")

    def contents(sim: Sim, prompt: str) -> list[str]:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 80,
            "stream": True,
        }
        r = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30)
        return [ch["choices"][0]["delta"].get("content") for ch in sse_json(r.content)]

    first = contents(a, "same prompt")
    assert contents(b, "same prompt") == first
    assert contents(a, "same prompt") == first
    assert contents(c, "same prompt") != first
    assert contents(a, "another prompt") != first


def test_prefill_delays_first_token(sim_factory: SimFactory) -> None:
    # demo prefill: 10 ms + prompt / 20k tok/s; a ~25k-token prompt takes ~1.26 s simulated.
    sim = sim_factory("--mode", "baseline", "--speed", "5")

    def ttft(prompt: str) -> float:
        body = {"model": "m", "prompt": prompt, "max_tokens": 2, "stream": True}
        t0 = time.perf_counter()
        with httpx.stream("POST", sim.url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    return time.perf_counter() - t0
        raise AssertionError("no event")

    short = ttft("hi")
    long = ttft("abcd" * 25000)
    assert long >= 0.2, long  # 1.26 s / speed 5 = 0.25 s
    assert long - short >= 0.15, (short, long)
    hist_sum = sim.metric("sglang:time_to_first_token_seconds_sum", is_streaming="true")
    assert hist_sum >= 1.2  # reported in simulated seconds


def test_startup_delay_health_503_then_200(sim_factory: SimFactory) -> None:
    t0 = time.monotonic()
    sim = sim_factory("--startup-delay", "2", ready=False)
    wait_http(sim.url + "/health", timeout=20, status=503)
    assert httpx.get(sim.url + "/health_generate").status_code == 503
    wait_http(sim.url + "/health", timeout=20, status=200)
    assert time.monotonic() - t0 >= 1.9
    assert httpx.get(sim.url + "/health_generate").status_code == 200
    assert httpx.get(sim.url + "/health").content == b""


def test_request_during_startup_waits_for_it(sim_factory: SimFactory) -> None:
    # The delay starts after the process does, so no answer can come before spawned + 1.5 s;
    # measuring from the 503 instead would depend on how long the process took to listen.
    spawned = time.monotonic()
    sim = sim_factory("--startup-delay", "1.5", "--speed", "10", ready=False)
    wait_http(sim.url + "/health", timeout=20, status=503)
    body = {"model": "m", "prompt": "x", "max_tokens": 3}
    r = httpx.post(sim.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200
    assert time.monotonic() - spawned >= 1.5
    assert httpx.get(sim.url + "/health").status_code == 200
