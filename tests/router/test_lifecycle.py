"""SIGTERM: stop accepting, let in-flight streams finish (up to --drain-timeout), exit 0."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest
from routerkit import router

from dynspec.router.app import create_app
from dynspec.router.config import build_parser, config_from_args

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


async def read_stream(hc: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[str, bytes]:
    body = {"messages": MESSAGES, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    async with hc.stream("POST", url + "/v1/chat/completions", json=body) as r:
        pool = r.headers["x-dynspec-backend"]
        return pool, b"".join([piece async for piece in r.aiter_bytes()])


async def wait_refused(url: str, timeout: float) -> bool:
    """True once a new connection is refused (no keep-alive: each probe is a new connection)."""
    deadline = time.monotonic() + timeout
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=1, limits=limits) as hc:
        while time.monotonic() < deadline:
            try:
                await hc.get(url + "/health")
            except httpx.ConnectError:
                return True
            except httpx.TransportError:
                pass  # accepted just before the listener closed, then closed: not yet refused
            await asyncio.sleep(0.02)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_drains_in_flight_then_exits_0(
    sims: tuple[str, str], tmp_path: Path, sig: signal.Signals
) -> None:
    eagle, baseline = sims
    with router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline, "--drain-timeout", "20"
    ) as rp:

        def log() -> str:
            return "router log tail:\n" + "\n".join(rp.log.read_text().splitlines()[-15:])

        async with httpx.AsyncClient(timeout=30) as hc:
            tasks = [asyncio.create_task(read_stream(hc, rp.url, 400)) for _ in range(2)]
            st = await asyncio.to_thread(rp.wait_load, 2, 20.0)
            assert st["load"] == 2, f"{st}\n{log()}"
            rp.proc.send_signal(sig)
            assert await wait_refused(rp.url, 5.0), f"still accepting after {sig.name}\n{log()}"
            results = await asyncio.gather(*tasks)
        for _, raw in results:
            assert raw.endswith(b"data: [DONE]\n\n"), f"{raw[-300:]!r}\n{log()}"
            assert b'"finish_reason":"length"' in raw
        assert await asyncio.to_thread(rp.proc.wait, 20) == 0, log()


async def test_drain_timeout_bounds_shutdown(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, baseline = sims
    with router(
        tmp_path, "--eagle-url", eagle, "--baseline-url", baseline, "--drain-timeout", "1"
    ) as rp:
        async with httpx.AsyncClient(timeout=30) as hc:
            task = asyncio.create_task(read_stream(hc, rp.url, 20000))
            await asyncio.to_thread(rp.wait_load, 1)
            sent = time.monotonic()
            rp.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(rp.proc.wait, 15) == 0
            took = time.monotonic() - sent
            with pytest.raises(httpx.HTTPError):
                await task
        # It waited the drain timeout (at least; uvicorn rounds it up to whole seconds), then
        # cut the 20,000-token stream instead of waiting for it (the task failed above). How
        # much longer a busy machine takes to exit is not this test's business.
        assert took > 0.9, took
        assert "timeout graceful shutdown exceeded" in rp.log.read_text()


async def test_outside_the_lifespan_completions_get_503() -> None:
    """Before the lifespan starts the runtime (or after it stopped), the relay answers 503 in
    OpenAI's shape instead of failing: the app object alone holds no upstream client."""
    config = config_from_args(build_parser().parse_layered(["--eagle-url", "http://127.0.0.1:9"]))
    app = create_app(config)
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    await app(scope, receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 503
    assert b'"error"' in sent[1]["body"]  # type: ignore[operator]
