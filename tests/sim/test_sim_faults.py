"""Each fault switch of ``/sim/faults`` does what the router's tests rely on."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
from simkit import SimFactory, sse_json

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_switches_read_set_and_clear(sim_factory: SimFactory) -> None:
    sim = sim_factory("--speed", "10")
    url = sim.url + "/sim/faults"
    clear = {"health_status": 200, "fail_status": None, "stall": False, "exit_after_chunks": None}
    assert httpx.get(url).json() == clear
    got = sim.faults(health_status=503, stall=True)
    assert got == {**clear, "health_status": 503, "stall": True}
    assert sim.faults(fail_status=500)["health_status"] == 503  # switches add up
    assert httpx.delete(url).json() == clear
    for bad in ({"nope": 1}, {"health_status": "x"}, {"stall": 1}, {"exit_after_chunks": -1}):
        r = httpx.post(url, json=bad)
        assert r.status_code == 400, bad
        assert r.json()["object"] == "error"
    assert httpx.post(url, content=b"{").status_code == 400
    assert httpx.get(url).json() == clear


def test_health_status(sim_factory: SimFactory) -> None:
    sim = sim_factory("--speed", "10")
    sim.faults(health_status=503)
    assert httpx.get(sim.url + "/health").status_code == 503
    assert httpx.get(sim.url + "/health_generate").status_code == 503
    # Generation still works: only the health answer is faulty.
    assert httpx.post(sim.url + "/v1/chat/completions", json=BODY).status_code == 200
    sim.faults(health_status=200)
    assert httpx.get(sim.url + "/health").status_code == 200


@pytest.mark.parametrize("status", [500, 503, 429])
def test_fail_status(sim_factory: SimFactory, status: int) -> None:
    sim = sim_factory("--speed", "10")
    sim.faults(fail_status=status)
    for path, body in (
        ("/v1/chat/completions", {**BODY, "stream": True}),
        ("/v1/completions", {"model": "m", "prompt": "x"}),
    ):
        r = httpx.post(sim.url + path, json=body)
        assert r.status_code == status
        err = r.json()
        assert err["object"] == "error" and err["code"] == status
        assert set(err) == {"object", "message", "type", "param", "code"}
    assert httpx.get(sim.url + "/health").status_code == 200
    sim.faults(fail_status=None)
    assert httpx.post(sim.url + "/v1/chat/completions", json=BODY).status_code == 200


def test_stall_keeps_stream_open_and_silent(sim_factory: SimFactory) -> None:
    sim = sim_factory("--speed", "10")
    sim.faults(stall=True)
    body = {**BODY, "max_tokens": 50, "stream": True}
    events: list[bytes] = []
    t0 = time.monotonic()
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=1.0)) as client,
        client.stream("POST", sim.url + "/v1/chat/completions", json=body) as r,
        pytest.raises(httpx.ReadTimeout),
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:].encode())
    # 50 tokens at speed 10 would take ~0.1 s; the stream gave the role and one content chunk and
    # then stayed open and silent until the read timeout.
    assert time.monotonic() - t0 >= 1.0
    chunks = [orjson.loads(e) for e in events]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len(chunks) == 2 and chunks[1]["choices"][0]["delta"]["content"]
    # Clearing the switch lets new streams through whole.
    sim.faults(stall=False)
    r2 = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=10)
    assert sse_json(r2.content)[-1]["choices"][0]["finish_reason"] == "length"


def test_exit_after_chunks_kills_the_process_mid_stream(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "baseline", "--speed", "5")
    sim.faults(exit_after_chunks=4)
    body = {**BODY, "max_tokens": 100, "stream": True}
    events: list[str] = []
    # The body ends without its terminating chunk, as a dying server's does: a broken stream.
    with (
        pytest.raises(httpx.TransportError),
        httpx.stream("POST", sim.url + "/v1/chat/completions", json=body, timeout=10) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line)
    # Exactly four events (role + three content chunks) reached the client, then the process died.
    assert len(events) == 4
    assert "[DONE]" not in events[-1]
    assert sim.proc.wait(timeout=10) != 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.url + "/health")
