"""The relay against real dynspec-sim servers: bad inputs, pass-through errors, disconnects,
concurrency limit, timeouts, a server dying mid-stream, and metric values."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from routerkit import (
    RouterProc,
    clear_faults,
    metric_value,
    router,
    set_faults,
    sim_proc,
    wait_for,
)

KEY = "client-key"
MESSAGES: Any = [{"role": "user", "content": "Tell me a long story."}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# SGLang's ignore_eos: the simulator would otherwise end an answer by itself (64-768 tokens).
LONG = {"ignore_eos": True}


@pytest.fixture(scope="module")
def keyed(sims: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    eagle, baseline = sims
    with router(
        tmp_path_factory.mktemp("keyed"), "--eagle-url", eagle, "--baseline-url", baseline,
        "--max-body-bytes", "4096", api_key=KEY,
    ) as rp:  # fmt: skip
        yield rp


def post(rp: RouterProc, path: str, key: str | None = KEY, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers |= kw.pop("headers", {})
    return httpx.post(rp.url + path, headers=headers, timeout=10, **kw)


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    return err  # type: ignore[no-any-return]


BAD_INPUTS = [
    ("invalid json", CHAT, b"{nope", 400, None),
    ("array", CHAT, b"[1, 2]", 400, None),
    ("string", COMPLETIONS, b'"hello"', 400, None),
    ("chat without messages", CHAT, b'{"model": "m", "prompt": "x"}', 400, "messages"),
    ("completion without prompt", COMPLETIONS, b'{"messages": []}', 400, "prompt"),
    ("bad stream_options", CHAT, b'{"messages": [], "stream": true, "stream_options": 3}', 400,
     "stream_options"),
    ("too large", CHAT, b'{"messages": [], "x": "' + b"a" * 5000 + b'"}', 413, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input(
    keyed: RouterProc, path: str, body: bytes, status: int, param: str | None
) -> None:
    r = post(keyed, path, content=body, headers={"content-type": "application/json"})
    err = assert_openai_error(r, status)
    assert err["param"] == param
    assert "x-dynspec-backend" not in r.headers


def test_body_limit_while_reading_chunked(keyed: RouterProc) -> None:
    """No content-length: the limit is enforced on the bytes read so far."""

    def body() -> Iterator[bytes]:
        yield b'{"messages": [], "x": "'
        for _ in range(20):
            yield b"a" * 1024
        yield b'"}'

    r = post(keyed, CHAT, content=body())
    assert_openai_error(r, 413)


@pytest.mark.parametrize("key", [None, "wrong", KEY + "x"])
def test_api_key_required(keyed: RouterProc, key: str | None) -> None:
    err = assert_openai_error(post(keyed, CHAT, key=key, json={"messages": MESSAGES}), 401)
    assert err["code"] == "invalid_api_key"
    assert httpx.get(keyed.url + "/v1/models", timeout=5).status_code == 401
    assert httpx.get(keyed.url + "/status", timeout=5).status_code == 401
    # /health and /metrics need no key, as in SGLang.
    assert httpx.get(keyed.url + "/health", timeout=5).status_code == 200
    assert httpx.get(keyed.url + "/metrics", timeout=5).status_code == 200


def test_get_on_completions_is_405(keyed: RouterProc) -> None:
    r = httpx.get(keyed.url + CHAT, headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert_openai_error(r, 405)


async def test_openai_client_sees_typed_errors(keyed: RouterProc) -> None:
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key="bad", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.chat.completions.create(model="m", messages=MESSAGES)
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0) as c:
        with pytest.raises(openai.BadRequestError):
            await c.completions.create(
                model="m", prompt="x", extra_body={"stream_options": 1}, stream=True
            )
        models = await c.models.list()
        assert [m.id for m in models.data] == ["demo-model"]
        reply = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
        assert reply.usage is not None and reply.usage.completion_tokens == 4


@pytest.mark.parametrize("stream", [False, True])
def test_server_error_passed_through(
    keyed: RouterProc, sims: tuple[str, str], stream: bool
) -> None:
    eagle, _ = sims
    body = {"messages": MESSAGES, "max_tokens": 3, "stream": stream}
    set_faults(eagle, fail_status=500)
    try:
        direct = httpx.post(eagle + CHAT, json=body, timeout=10)
        via = post(keyed, CHAT, json=body)
    finally:
        clear_faults(eagle)
    assert direct.status_code == 500
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    assert via.headers["x-dynspec-backend"] == "eagle"
    assert keyed.metric("dynspec_upstream_errors_total", pool="eagle", kind="status") >= 1
    # A client error of the server's own (here: an unknown field value) is passed through too.
    bad = {"messages": MESSAGES, "max_tokens": -5}
    direct = httpx.post(eagle + CHAT, json=bad, timeout=10)
    via = post(keyed, CHAT, json=bad)
    assert direct.status_code == 400
    assert (via.status_code, via.content) == (direct.status_code, direct.content)


def _aborted(sim_url: str) -> float:
    text = httpx.get(sim_url + "/metrics", timeout=5).text
    return metric_value(text, "sglang:num_aborted_requests_total")


async def test_disconnect_mid_stream_aborts_upstream(
    keyed: RouterProc, sims: tuple[str, str]
) -> None:
    eagle, _ = sims
    before = _aborted(eagle)
    disconnects = keyed.metric("dynspec_client_disconnects_total", pool="eagle")
    async with openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0) as c:
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=20000, stream=True, extra_body=LONG
        )
        async for _ in stream:
            break  # one chunk: the request is running on the server
        await stream.close()
    # The server counts an abort only for a request it dropped before its end (20000 tokens take
    # about a minute at the test's speed): the router passed the disconnect on.
    assert await asyncio.to_thread(wait_for, lambda: _aborted(eagle) == before + 1, 20.0)
    assert keyed.wait_load(0)["load"] == 0
    assert keyed.metric("dynspec_client_disconnects_total", pool="eagle") == disconnects + 1
    assert keyed.metric("dynspec_requests_total", pool="eagle", code="499") >= 1


async def test_disconnect_before_first_byte_aborts_upstream(
    keyed: RouterProc, sims: tuple[str, str]
) -> None:
    eagle, _ = sims
    before = _aborted(eagle)
    body = {"messages": MESSAGES, "max_tokens": 20000, **LONG}
    async with httpx.AsyncClient(timeout=0.5) as hc:
        with pytest.raises(httpx.ReadTimeout):
            await hc.post(keyed.url + CHAT, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert await asyncio.to_thread(wait_for, lambda: _aborted(eagle) == before + 1, 1.0)


async def test_max_concurrency_503(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, baseline = sims
    with router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline, "--max-concurrency", "2"
    ) as rp:
        async with openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key="x", max_retries=0) as c:
            streams = [
                await c.chat.completions.create(
                    model="m", messages=MESSAGES, max_tokens=20000, stream=True, extra_body=LONG
                )
                for _ in range(2)
            ]
            async with httpx.AsyncClient(timeout=5) as hc:
                r = await hc.post(rp.url + CHAT, json={"messages": MESSAGES, "max_tokens": 2})
            err = assert_openai_error(r, 503)
            assert err["code"] == "too_many_requests_in_flight"
            assert int(r.headers["retry-after"]) >= 1
            for s in streams:
                await s.close()
            assert await asyncio.to_thread(rp.wait_load, 0)
            reply = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
            assert reply.choices[0].message.content


@pytest.mark.parametrize("relay", [(), ("--no-direct-relay",)], ids=["direct", "no-direct-relay"])
async def test_stalled_stream_times_out(
    sims: tuple[str, str], tmp_path: Path, relay: tuple[str, ...]
) -> None:
    eagle, baseline = sims
    with router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline, "--request-timeout", "0.5",
        *relay,
    ) as rp:  # fmt: skip
        set_faults(eagle, stall=True)
        try:
            async with openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key="x", max_retries=0) as c:
                stream = await c.chat.completions.create(
                    model="m", messages=MESSAGES, max_tokens=200, stream=True
                )
                with pytest.raises((openai.APIError, httpx.HTTPError)):
                    async for _ in stream:
                        pass
        finally:
            clear_faults(eagle)
        assert rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="timeout") == 1


async def test_metric_values_after_known_requests(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, baseline = sims
    with router(tmp_path, "--eagle-url", eagle, "--baseline-url", baseline) as rp:
        # The prompt's token count, as the server reports it.
        async with httpx.AsyncClient(timeout=10) as hc:
            direct = await hc.post(eagle + CHAT, json={"messages": MESSAGES, "max_tokens": 1})
        prompt = direct.json()["usage"]["prompt_tokens"]
        async with openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key="x", max_retries=0) as c:
            streamed = [5, 6, 7]
            for n in streamed:
                stream = await c.chat.completions.create(
                    model="m", messages=MESSAGES, max_tokens=n, stream=True
                )
                chunks = [chunk async for chunk in stream]
                assert all(ch.usage is None for ch in chunks)  # usage was not asked for
            plain = await c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4)
            assert plain.usage is not None
        m = rp.metrics()
        assert metric_value(m, "dynspec_requests_total", pool="eagle", code="200") == 4
        assert metric_value(m, "dynspec_requests_total", pool="baseline", code="200") == 0
        # The usual error statuses are there at 0 before any error, so a first error is an increase.
        for code in ("499", "500", "502", "503", "504"):
            assert f'dynspec_requests_total{{code="{code}",pool="baseline"}} 0.0' in m
        assert metric_value(m, "dynspec_output_tokens_total", pool="eagle") == sum(streamed) + 4
        assert metric_value(m, "dynspec_prompt_tokens_total", pool="eagle") == 4 * prompt
        assert metric_value(m, "dynspec_time_to_first_token_seconds_count", pool="eagle") == 3
        assert metric_value(m, "dynspec_time_per_output_token_seconds_count", pool="eagle") == 3
        assert metric_value(m, "dynspec_request_duration_seconds_count", pool="eagle") == 4
        ttft = metric_value(m, "dynspec_time_to_first_token_seconds_sum", pool="eagle")
        duration = metric_value(m, "dynspec_request_duration_seconds_sum", pool="eagle")
        assert 0 < ttft < duration
        # The router's own share: every answered request, streamed or not, and a part of its TTFT.
        assert metric_value(m, "dynspec_router_delay_seconds_count", pool="eagle") == 4
        assert 0 < metric_value(m, "dynspec_router_delay_seconds_sum", pool="eagle") < ttft
        assert metric_value(m, "dynspec_mode_switches_total", to="baseline") == 0
        assert metric_value(m, "dynspec_client_disconnects_total", pool="eagle") == 0
        for kind in ("connect", "timeout", "status", "protocol"):
            assert metric_value(m, "dynspec_upstream_errors_total", pool="eagle", kind=kind) == 0
        assert metric_value(m, "dynspec_server_up", pool="eagle", server=eagle) == 1
        assert metric_value(m, "dynspec_server_up", pool="baseline", server=baseline) == 1
        assert metric_value(m, "dynspec_threshold") == 8
        assert metric_value(m, "dynspec_active_pool", pool="eagle") == 1
        assert metric_value(m, "dynspec_load") == 0
        assert metric_value(m, "dynspec_in_flight_requests", pool="eagle") == 0
        assert metric_value(m, "dynspec_pool_draining", pool="eagle") == 0


async def test_simulator_killed_mid_stream(sims: tuple[str, str], tmp_path: Path) -> None:
    """A real server death (SIGKILL) mid-stream: the client's stream breaks, nothing leaks,
    and the next request goes to the other pool."""
    import os
    import signal

    _, baseline = sims
    with sim_proc(tmp_path, "eagle") as (eagle, proc), router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline
    ) as rp:  # fmt: skip
        async with openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key="x", max_retries=0) as c:
            stream = await c.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=20000, stream=True, extra_body=LONG
            )
            seen = 0
            with pytest.raises((openai.APIError, httpx.HTTPError)):
                async for _ in stream:
                    seen += 1
                    if seen == 3:
                        os.killpg(proc.pid, signal.SIGKILL)
            assert await asyncio.to_thread(rp.wait_load, 0)
            assert rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="protocol") == 1
            raw = await c.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, max_tokens=2
            )
            assert raw.headers["x-dynspec-backend"] == "baseline"
