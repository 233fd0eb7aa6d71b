"""Routing against real dynspec-sim servers with the official openai client.

The switch at the threshold under a ramp of concurrent streams, the left pool draining whole,
the switch back with hysteresis, operator drain/resume/threshold, and failover.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from routerkit import (
    RouterProc,
    clear_faults,
    fake_upstream,
    metric_value,
    router,
    set_faults,
    sim,
    sim_proc,
    wait_for,
)
from utils import kill_group

MESSAGES: Any = [{"role": "user", "content": "Tell me a long story."}]
ADMIN = "admin-secret"


def client(rp: RouterProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key="unused", max_retries=0, timeout=30)


async def open_stream(c: openai.AsyncOpenAI, max_tokens: int, **kw: Any) -> tuple[str, Any]:
    """Start a streamed chat request; returns (pool that serves it, the open stream)."""
    # ignore_eos (SGLang's extra field): the simulator would otherwise end answers by itself.
    raw = await c.chat.completions.with_raw_response.create(
        model="demo-model", messages=MESSAGES, stream=True, max_tokens=max_tokens,
        extra_body={"ignore_eos": True}, **kw,
    )  # fmt: skip
    return raw.headers["x-dynspec-backend"], raw.parse()


async def test_switch_at_threshold_drain_and_switch_back(
    sims: tuple[str, str], tmp_path: Path
) -> None:
    eagle, baseline = sims
    with router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline,
        "--threshold", "3", "--hysteresis", "1", admin=ADMIN,
    ) as rp:  # fmt: skip
        c = client(rp)
        streams: list[Any] = []
        pools: list[str] = []
        # Ramp: one long stream at a time; load counts the new request.
        for _ in range(5):
            pool, stream = await open_stream(c, 20000)
            pools.append(pool)
            streams.append(stream)
        assert pools == ["eagle", "eagle", "eagle", "baseline", "baseline"]
        st = rp.status()
        assert (st["mode"], st["active_pool"], st["load"]) == ("baseline", "baseline", 5)
        assert st["pools"]["eagle"] == {
            "in_flight": 3, "drained": False, "draining": True, "healthy_servers": 1
        }  # fmt: skip
        assert [s["draining"] for s in st["servers"]] == [True, False]
        m = rp.metrics()
        mv = metric_value
        assert mv(m, "dynspec_load") == 5
        assert mv(m, "dynspec_in_flight_requests", pool="eagle") == 3
        assert mv(m, "dynspec_pool_draining", pool="eagle") == 1
        assert mv(m, "dynspec_active_pool", pool="baseline") == 1
        assert mv(m, "dynspec_active_pool", pool="eagle") == 0
        assert mv(m, "dynspec_mode_switches_total", to="baseline") == 1

        # Down to 2 in flight: a new request has load 3, inside the band (> 3 - 1): baseline.
        for s in streams[2:]:
            await s.close()
        assert rp.wait_load(2)["load"] == 2
        pool, extra = await open_stream(c, 20000)
        assert pool == "baseline"
        await extra.close()
        assert rp.wait_load(2)["load"] == 2
        # Down to 1: the new request's load is 2 = threshold - hysteresis: back to eagle.
        await streams[1].close()
        assert rp.wait_load(1)["load"] == 1
        pool, extra = await open_stream(c, 20000)
        assert pool == "eagle"
        assert rp.status()["mode"] == "eagle"
        assert rp.metric("dynspec_mode_switches_total", to="eagle") == 1
        await extra.close()
        await streams[0].close()
        await c.close()


async def test_left_pool_finishes_whole(sims: tuple[str, str], tmp_path: Path) -> None:
    """Streams on the pool that was left run to their end: all tokens, usage, [DONE]."""
    eagle, baseline = sims
    with router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline,
        "--threshold", "2", "--hysteresis", "1",
    ) as rp:  # fmt: skip
        c = client(rp)
        tokens = 200
        first = await open_stream(c, tokens, stream_options={"include_usage": True})
        async with httpx.AsyncClient(timeout=30) as hc:
            body = {"messages": MESSAGES, "stream": True, "max_tokens": tokens, "ignore_eos": True}
            async with hc.stream("POST", rp.url + "/v1/chat/completions", json=body) as raw:
                assert raw.headers["x-dynspec-backend"] == "eagle"
                third = await open_stream(c, tokens)
                assert [first[0], third[0]] == ["eagle", "baseline"]
                assert rp.status()["pools"]["eagle"]["draining"] is True

                async def read_openai(stream: Any) -> tuple[str, Any, Any]:
                    text, finish, usage = "", None, None
                    async for chunk in stream:
                        if chunk.usage is not None:
                            usage = chunk.usage
                        for ch in chunk.choices:
                            text += ch.delta.content or ""
                            finish = ch.finish_reason or finish
                    return text, finish, usage

                raw_bytes = b"".join([piece async for piece in raw.aiter_bytes()])
                (text1, finish1, usage1), (text3, finish3, usage3) = await asyncio.gather(
                    read_openai(first[1]), read_openai(third[1])
                )
        assert finish1 == "length" and usage1.completion_tokens == tokens and text1
        assert finish3 == "length" and usage3 is None and text3  # usage not asked: not shown
        assert raw_bytes.endswith(b"data: [DONE]\n\n")
        assert b'"finish_reason":"length"' in raw_bytes
        assert b'"choices":[]' not in raw_bytes
        assert rp.metric("dynspec_requests_total", pool="eagle", code="200") == 2
        assert rp.metric("dynspec_output_tokens_total", pool="eagle") == 2 * tokens
        assert rp.metric("dynspec_output_tokens_total", pool="baseline") == tokens
        await c.close()


async def test_admin_drain_resume_and_threshold(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, baseline = sims
    with router(tmp_path, "--eagle-url", eagle, "--baseline-url", baseline, admin=ADMIN) as rp:
        auth = {"Authorization": f"Bearer {ADMIN}"}
        c = client(rp)
        async with httpx.AsyncClient(base_url=rp.url, timeout=10) as hc:
            assert (await hc.post("/admin/drain/eagle")).status_code == 401
            # With an admin key set, /status needs it.
            assert (await hc.get("/status")).status_code == 401
            assert (await hc.get("/status", headers=auth)).status_code == 200
            bad = await hc.post("/admin/drain/eagle", headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
            assert (await hc.post("/admin/drain/gpu", headers=auth)).status_code == 404
            for payload in ({"threshold": 0}, {"threshold": "8"}, {"threshold": 4, "hysteresis": 4},
                            {"hysteresis": 1}, [], {"threshold": True}):  # fmt: skip
                r = await hc.put("/admin/threshold", headers=auth, json=payload)
                assert r.status_code == 400, payload
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            r = await hc.put("/admin/threshold", headers=auth, content=b"{nope")
            assert r.status_code == 400

            r = await hc.post("/admin/drain/eagle", headers=auth)
            assert r.status_code == 200 and r.json()["drained"] is True
            pool, s1 = await open_stream(c, 20000)
            assert pool == "baseline"  # load 1, but eagle is drained
            st = rp.status()
            assert st["pools"]["eagle"]["drained"] is True and st["active_pool"] == "baseline"
            assert (await hc.post("/admin/resume/eagle", headers=auth)).status_code == 200
            pool, s2 = await open_stream(c, 20000)
            assert pool == "eagle"
            # Threshold 1 applies to the very next request: load 3 > 1.
            r = await hc.put(
                "/admin/threshold", headers=auth, json={"threshold": 1, "hysteresis": 0}
            )
            assert r.status_code == 200 and r.json() == {"threshold": 1, "hysteresis": 0}
            assert rp.metric("dynspec_threshold") == 1
            pool, s3 = await open_stream(c, 20000)
            assert pool == "baseline"
            st = rp.status()
            assert (st["threshold"], st["hysteresis"]) == (1, 0)
            for s in (s1, s2, s3):
                await s.close()
        await c.close()


def test_admin_off_without_key_is_403(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, baseline = sims
    with router(tmp_path, "--eagle-url", eagle, "--baseline-url", baseline) as rp:
        for method, path in (("POST", "/admin/drain/eagle"), ("POST", "/admin/resume/eagle"),
                             ("PUT", "/admin/threshold")):  # fmt: skip
            r = httpx.request(method, rp.url + path, json={"threshold": 3}, timeout=5)
            assert r.status_code == 403
            assert r.json()["error"]["type"] == "invalid_request_error"
        assert rp.status()["threshold"] == 8


async def test_unhealthy_pool_skipped_and_back(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, baseline = sims
    with router(tmp_path, "--eagle-url", eagle, "--baseline-url", baseline) as rp:
        c = client(rp)
        try:
            set_faults(eagle, health_status=503)
            assert wait_for(lambda: not rp.status()["servers"][0]["healthy"], timeout=5)
            assert rp.metric("dynspec_server_up", pool="eagle", server=eagle) == 0
            st = rp.status()
            assert (st["mode"], st["active_pool"]) == ("eagle", "baseline")
            raw = await c.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, max_tokens=3
            )
            assert raw.headers["x-dynspec-backend"] == "baseline"
            assert rp.get("/health").status_code == 200
        finally:
            clear_faults(eagle)
        assert wait_for(lambda: rp.status()["servers"][0]["healthy"], timeout=5)
        raw = await c.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, max_tokens=3
        )
        assert raw.headers["x-dynspec-backend"] == "eagle"
        await c.close()


async def test_connect_refused_is_retried_on_other_pool(
    sims: tuple[str, str], tmp_path: Path
) -> None:
    _, baseline = sims
    # A long health interval: the router still believes the eagle server is up.
    with sim_proc(tmp_path, "eagle") as (doomed, proc), router(
        tmp_path, "--eagle-url", doomed, "--baseline-url", baseline, "--health-interval", "60"
    ) as rp:  # fmt: skip
        assert rp.status()["servers"][0]["healthy"] is True
        kill_group(proc)
        c = client(rp)
        raw = await c.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, max_tokens=3
        )
        assert raw.headers["x-dynspec-backend"] == "baseline"
        assert raw.parse().choices[0].message.content
        # A refused connection marks the server down at once.
        assert rp.status()["servers"][0]["healthy"] is False
        assert rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="connect") == 1
        assert rp.metric("dynspec_requests_total", pool="baseline", code="200") == 1
        await c.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_server_that_closes_without_answering_hands_the_request_on(
    tmp_path: Path, stream: bool
) -> None:
    """The chosen server takes the request and closes the connection before any byte (it died
    with the request): the client has seen nothing, so the request moves once to the other
    pool and is answered there; the server stays up (a health check, not one request, says
    when it is down)."""
    with fake_upstream(tmp_path) as eagle, sim(tmp_path, "baseline") as baseline, router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline
    ) as rp:  # fmt: skip
        body = {"messages": MESSAGES, "max_tokens": 3, "stream": stream}
        r = httpx.post(
            rp.url + "/v1/chat/completions", json=body, headers={"x-fake-close": "1"}, timeout=10
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-dynspec-backend"] == "baseline"
        assert (b"data: [DONE]" in r.content) if stream else r.json()["choices"]
        assert rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="protocol") == 1
        assert rp.metric("dynspec_requests_total", pool="baseline", code="200") == 1
        assert rp.status()["servers"][0]["healthy"] is True
        assert "closed the connection without answering" in rp.log.read_text()
        assert wait_for(lambda: rp.status()["load"] == 0)


def test_both_closing_without_answering_is_502(tmp_path: Path) -> None:
    """Moved once, not round and round: when the second server closes too, a 502."""
    with fake_upstream(tmp_path) as eagle, fake_upstream(tmp_path) as baseline, router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline
    ) as rp:  # fmt: skip
        r = httpx.post(
            rp.url + "/v1/chat/completions",
            json={"messages": MESSAGES, "max_tokens": 3},
            headers={"x-fake-close": "1"},
            timeout=10,
        )
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "bad_gateway"
        for pool in ("eagle", "baseline"):
            assert rp.metric("dynspec_upstream_errors_total", pool=pool, kind="protocol") == 1
        assert rp.status()["load"] == 0


def test_both_unreachable_is_502(tmp_path: Path) -> None:
    with sim_proc(tmp_path, "eagle") as (e_url, e_proc), sim_proc(tmp_path, "baseline") as (
        b_url,
        b_proc,
    ), router(
        tmp_path, "--eagle-url", e_url, "--baseline-url", b_url, "--health-interval", "60"
    ) as rp:  # fmt: skip
        kill_group(e_proc)
        kill_group(b_proc)
        r = httpx.post(
            rp.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10
        )
        assert r.status_code == 502
        assert r.headers["x-dynspec-backend"] == "baseline"
        assert r.json()["error"]["code"] == "bad_gateway"
        assert rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="connect") == 1
        assert rp.metric("dynspec_upstream_errors_total", pool="baseline", kind="connect") == 1
        assert rp.metric("dynspec_requests_total", pool="baseline", code="502") == 1
        # No server answered: the router's delay counts only requests that reached one.
        for pool in ("eagle", "baseline"):
            assert rp.metric("dynspec_router_delay_seconds_count", pool=pool) == 0
        # Both refused: both down at once, so the next request is a 503, not a wait.
        r = httpx.post(
            rp.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10
        )
        assert r.status_code == 503 and r.headers["retry-after"]
        assert httpx.get(rp.url + "/health", timeout=5).status_code == 503
