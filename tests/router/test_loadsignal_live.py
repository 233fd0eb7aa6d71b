"""Two routers in front of the same two ``dynspec-sim`` servers, requests spread over both.

Eight long requests in flight, four through each router, threshold 6: above it in total, below
it per router. With ``--load-signal servers`` both routers read the servers' ``/v1/loads`` and the
next request through either goes to the baseline; with ``--load-signal local`` each counts its own
four and stays on EAGLE (the problem of issue 19). Bounded: 8 + 2 requests, each phase timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from routerkit import RouterProc, fake_upstream, router, sim, wait_for

LONG = 8  # requests held in flight, round-robin over the two routers
THRESHOLD = 6


def chat(max_tokens: int, stream: bool) -> dict[str, object]:
    return {
        "model": "demo-model",
        "messages": [{"role": "user", "content": "count to a thousand"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
    }


@contextlib.asynccontextmanager
async def held(client: httpx.AsyncClient, routers: list[RouterProc]) -> AsyncIterator[None]:
    """``LONG`` streams open (their headers read, so each is routed), closed on the way out."""
    async with contextlib.AsyncExitStack() as stack:
        for i in range(LONG):
            url = routers[i % 2].url + "/v1/chat/completions"
            r = await stack.enter_async_context(
                client.stream("POST", url, json=chat(4000, stream=True))
            )
            assert r.status_code == 200
        yield


async def probe(routers: list[RouterProc], signal: str) -> list[str]:
    """With the long requests held: the pool one more request through each router goes to."""
    async with httpx.AsyncClient(timeout=30) as client, held(client, routers):
        assert [rp.status()["load"] for rp in routers] == [LONG // 2] * 2
        if signal == "servers":
            # Each router's signal counts all eight (a reading covers both routers' requests).
            for rp in routers:
                ok = await asyncio.to_thread(
                    wait_for, lambda rp=rp: rp.status()["signal_load"] >= LONG, 10
                )
                assert ok, rp.status()
        picked = []
        for rp in routers:
            r = await client.post(rp.url + "/v1/chat/completions", json=chat(2, stream=False))
            assert r.status_code == 200
            picked.append(r.headers["x-dynspec-backend"])
        return picked


@pytest.mark.parametrize("signal", ["servers", "local"])
def test_two_routers_switch_together_on_the_shared_signal(tmp_path: Path, signal: str) -> None:
    flags = (
        "--threshold", str(THRESHOLD), "--hysteresis", "1", "--load-signal", signal,
        "--load-interval", "0.05",
    )  # fmt: skip
    with (
        sim(tmp_path, "eagle", speed=1.0) as eagle,
        sim(tmp_path, "baseline", speed=1.0) as baseline,
    ):
        servers = ("--eagle-url", eagle, "--baseline-url", baseline)
        with router(tmp_path, *servers, *flags) as a, router(tmp_path, *servers, *flags) as b:
            routers = [a, b]
            for rp in routers:
                assert rp.status()["load_signal"] == signal

            picked = asyncio.run(asyncio.wait_for(probe(routers, signal), 60))
            modes = [rp.status()["mode"] for rp in routers]
            want = "baseline" if signal == "servers" else "eagle"
            assert picked == [want, want] and modes == [want, want]
            for rp in routers:
                assert rp.wait_load(0)["load"] == 0
            if signal == "servers":
                text = a.metrics()
                assert "dynspec_load_signal_errors_total" in text


def test_a_servers_reading_switches_and_garbage_is_counted(tmp_path: Path) -> None:
    """The EAGLE server says 10 run (another router's): this router's first request goes to the
    baseline. The baseline answers garbage: counted per server, and routing goes on."""
    busy = b'{"loads": [{"dp_rank": 0, "num_running_reqs": 10, "num_waiting_reqs": 0}]}'
    with fake_upstream(tmp_path) as eagle, fake_upstream(tmp_path) as baseline:
        httpx.post(eagle + "/fake/loads", content=busy, timeout=5).raise_for_status()
        httpx.post(baseline + "/fake/loads", content=b"not json", timeout=5).raise_for_status()
        with router(
            tmp_path, "--eagle-url", eagle, "--baseline-url", baseline,
            "--threshold", str(THRESHOLD), "--load-signal", "servers", "--load-interval", "0.05",
        ) as rp:  # fmt: skip
            errors = "dynspec_load_signal_errors_total"
            assert wait_for(lambda: rp.metric(errors, server=baseline) >= 1)
            assert wait_for(lambda: rp.status()["signal_load"] == 10)
            r = httpx.post(rp.url + "/v1/chat/completions", json=chat(2, stream=False), timeout=10)
            assert r.status_code == 200 and r.headers["x-dynspec-backend"] == "baseline"
            st = rp.status()
            assert st["mode"] == "baseline"
            loads = {s["url"]: s["signal_load"] for s in st["servers"]}
            assert loads == {eagle: 10, baseline: 0}
            assert rp.metric(errors, server=eagle) == 0
