"""End to end: ``dynspec-launch --simulate`` with the real router and dynspec-sim servers."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import openai
import pytest
from launcher_run import launched, router_takes_pairs, sim_serves_pairs

MODEL = "dynspec-sim"
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


async def stream(
    client: openai.AsyncOpenAI, max_tokens: int, started: asyncio.Event | None = None
) -> tuple[str, str, str | None]:
    """One streamed chat completion: (backend pool, text, finish reason)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
        stream=True,  # type: ignore[arg-type]
        # SGLang's ignore_eos: else the simulator may end an answer itself (64-768 tokens), "stop".
        extra_body={"ignore_eos": True},
    )
    text, finish = "", None
    async for chunk in raw.parse():
        if started is not None:
            started.set()
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return raw.headers["x-dynspec-backend"], text, finish


async def test_simulate_serves_shows_the_switch_and_drains_on_sigint(tmp_path: Path) -> None:
    with launched(tmp_path, "--simulate", "--drain-timeout", "20", fake=False) as (run, ports):
        await asyncio.to_thread(run.wait_for, r"\[dynspec\] policy threshold", 90)
        assert "[dynspec] see the switch: for i in $(seq 12); do curl -s " in run.out
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{ports['router']}/v1",
            api_key="unused",
            max_retries=0,
            timeout=60.0,
        )
        # Twelve at once: load goes above the default threshold 8, so the router switches pools.
        results = await asyncio.gather(*(stream(client, 96) for _ in range(12)))
        assert all(text and finish == "length" for _, text, finish in results), results
        assert {pool for pool, _, _ in results} == {"eagle", "baseline"}
        switch = await asyncio.to_thread(
            run.wait_for,
            r"\[dynspec\] switch: new requests go to the baseline pool "
            r"\(load went above the threshold, 8\)",
        )
        # A lone request: load 1 <= 8 - 2, back to EAGLE.
        lone = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
        )
        assert lone.headers["x-dynspec-backend"] == "eagle"
        back = await asyncio.to_thread(
            run.wait_for,
            r"\[dynspec\] switch: new requests go to the EAGLE pool again "
            r"\(load fell to 6 or less\)",
        )
        assert back.start() > switch.start()

        # Ctrl-C while two streams are in flight: the router drains them before anything stops.
        started = [asyncio.Event(), asyncio.Event()]
        streams = [asyncio.create_task(stream(client, 128, ev)) for ev in started]
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), 30)
        run.send(signal.SIGINT)
        drained = await asyncio.wait_for(asyncio.gather(*streams), 60)
        assert all(finish == "length" for _, _, finish in drained)
        code = await asyncio.to_thread(run.wait, 60)
        assert code == 130
        assert run.leftovers() == []
        assert len(run.seen) >= 3
        out = run.out
        assert out.index("router: draining") < out.index("servers: SIGTERM")
        await client.close()


async def test_router_settings_given_to_the_launcher_reach_the_router(tmp_path: Path) -> None:
    keys = {"DYNSPEC_ADMIN_API_KEY": "admin-secret", "DYNSPEC_API_KEY": "client-secret"}
    argv = ["--simulate", "--threshold", "1", "--hysteresis", "0", "--max-body-bytes", "2000"]
    with launched(tmp_path, *argv, env=keys, fake=False) as (run, ports):
        await asyncio.to_thread(run.wait_for, r"\[dynspec\] policy threshold", 90)
        base = f"http://127.0.0.1:{ports['router']}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            # /status takes the admin key when one is set; the client key is not enough.
            assert (await http.get("/status")).status_code == 401
            client_auth = {"Authorization": "Bearer client-secret"}
            assert (await http.get("/status", headers=client_auth)).status_code == 401
            admin_auth = {"Authorization": "Bearer admin-secret"}
            assert (await http.get("/status", headers=admin_auth)).status_code == 200
            big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 3000}]}
            r = await http.post("/v1/chat/completions", json=big, headers=client_auth)
            assert r.status_code == 413
        # The supervisor reads /status with the admin key: it still reports the switch.
        client = openai.AsyncOpenAI(
            base_url=base + "/v1", api_key="client-secret", max_retries=0, timeout=60.0
        )
        await asyncio.gather(*(stream(client, 48) for _ in range(3)))
        await asyncio.to_thread(
            run.wait_for, r"\[dynspec\] switch: new requests go to the baseline pool"
        )
        await client.close()
        assert "admin-secret" not in run.out + run.err


@pytest.mark.skipif(
    not (router_takes_pairs() and sim_serves_pairs()),
    reason="needs dynspec-sim --pair and the router's --pair flag",
)
async def test_simulated_pairs_serve_through_the_router_and_stop_clean(tmp_path: Path) -> None:
    argv = [
        "--simulate",
        "--layout",
        "paired",
        "--gpus",
        "0-1",
        "--tp",
        "1",
        "--drain-timeout",
        "5",
    ]
    with launched(tmp_path, *argv, fake=False) as (run, ports):
        await asyncio.to_thread(run.wait_for, r"\[dynspec\] policy threshold", 90)
        out = run.out
        assert "[pair0 sim] healthy after" in out and "[pair1 sim] healthy after" in out
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{ports['router']}/v1",
            api_key="unused",
            max_retries=0,
            timeout=60.0,
        )
        results = await asyncio.gather(*(stream(client, 32) for _ in range(4)))
        assert all(text and finish == "length" for _, text, finish in results), results
        await client.close()
        run.send(signal.SIGINT)
        assert await asyncio.to_thread(run.wait, 60) == 130
        assert run.leftovers() == []
        assert len(run.seen) >= 3  # two simulator processes and the router


async def test_simulate_balance_says_what_balance_does_and_prints_no_switch(
    tmp_path: Path,
) -> None:
    argv = ["--simulate", "--policy", "balance", "--drain-timeout", "20"]
    with launched(tmp_path, *argv, fake=False) as (run, ports):
        await asyncio.to_thread(run.wait_for, r"\[dynspec\] policy balance: each request", 90)
        base = f"http://127.0.0.1:{ports['router']}"
        client = openai.AsyncOpenAI(
            base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60.0
        )
        # Both pools serve, the pool of the last request flips back and forth: none is a switch.
        for _ in range(3):
            results = await asyncio.gather(*(stream(client, 32) for _ in range(6)))
            assert all(finish == "length" for _, _, finish in results), results
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            st = (await http.get("/status")).json()
        assert st["mode"] is None and st["active_pool"] is None
        await client.close()
        run.send(signal.SIGINT)
        assert await asyncio.to_thread(run.wait, 60) == 130
        out = run.out
        assert out.count("policy balance: each request") == 1
        assert "EAGLE up to load" not in out and "switch:" not in out
