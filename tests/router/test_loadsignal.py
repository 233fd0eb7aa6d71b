"""The shared load signal: SGLang's /v1/loads parser, the per-server correction, the poller."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry
from routerkit import fake_upstream
from utils import free_port

from dynspec.router.config import parse_config
from dynspec.router.loadsignal import (
    MAX_COUNT,
    LoadParseError,
    LoadPoller,
    LoadReading,
    LoadSignal,
    parse_loads,
)
from dynspec.router.metrics import LoadSignalMetrics
from dynspec.router.upstream import Client


def rank(i: int, running: object, waiting: object) -> dict[str, object]:
    # The core section as SGLang 0.5.23's LoadSnapshot.to_dict writes it (some fields left out).
    return {
        "timestamp": 1764633600.5,
        "dp_rank": i,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_used_tokens": 9000,
        "num_total_tokens": 9500,
        "max_running_requests": 256,
        "token_usage": 0.31,
        "gen_throughput": 1210.5,
        "utilization": 0.4,
    }


def answer(*ranks: dict[str, object]) -> bytes:
    doc = {
        "timestamp": "2026-12-01T23:40:00+00:00",
        "version": "0.5.23",
        "accelerator": "NVIDIA H200",
        "num_accelerators": 4,
        "loads": list(ranks),
    }
    return orjson.dumps(doc)


def test_parse_sums_the_ranks() -> None:
    assert parse_loads(answer(rank(0, 12, 3), rank(1, 10, 0))) == LoadReading(22, 3)
    assert parse_loads(answer(rank(0, 0, 0))).total == 0


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'"loads"',
        b"{}",
        b'{"loads": {}}',
        b'{"loads": []}',
        b'{"loads": [7]}',
        answer({"dp_rank": 0, "num_running_reqs": 1}),  # no waiting count
        answer(rank(0, -1, 0)),
        answer(rank(0, 1.5, 0)),
        answer(rank(0, "3", 0)),
        answer(rank(0, True, 0)),
        answer(rank(0, None, 0)),
        answer(rank(0, MAX_COUNT + 1, 0)),
        answer(rank(0, MAX_COUNT, 0), rank(1, 1, 0)),  # each in range, the sum is not
        answer(*[rank(i, 0, 0) for i in range(2000)]),
        b"sglang:num_running_reqs 3\n",  # /metrics text, not /v1/loads
    ],
)
def test_garbage_is_an_error(body: bytes) -> None:
    with pytest.raises(LoadParseError):
        parse_loads(body)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


A = "http://127.0.0.1:30001"
B = "http://127.0.0.1:30002"


def test_reading_plus_admitted_minus_finished_since() -> None:
    clock = Clock()
    sig = LoadSignal([A, B], max_age=2.0, clock=clock)
    sig.admitted(A)
    sig.admitted(A)
    assert sig.load(A) == 2 and not sig.from_server(A)  # no reading yet: local
    poll_sent = clock.now = 101.0
    clock.now = 101.05
    sig.admitted(A)  # after the poll was sent: not in the reading
    clock.now = 101.1
    sig.reading(A, running=5, queued=2, at=poll_sent)
    assert sig.from_server(A)
    assert sig.load(A) == 7 + 1
    sig.finished(A)
    sig.finished(A)
    assert sig.load(A) == 7 + 1 - 2
    assert sig.load(B) == 0
    assert sig.total([A, B]) == 6
    # Finishes of requests the reading counted can only take the load to 0, not below.
    clock.now = 101.5
    sig.reading(A, running=1, queued=0, at=101.5)
    clock.now = 101.6
    for _ in range(3):
        sig.finished(A)
    assert sig.load(A) == 0


def test_an_older_answer_does_not_replace_a_newer_reading() -> None:
    clock = Clock()
    sig = LoadSignal([A], max_age=2.0, clock=clock)
    sig.reading(A, 9, 0, at=100.0)
    sig.reading(A, 1, 0, at=99.5)
    assert sig.load(A) == 9


def test_two_routers_agree_to_within_their_own_admissions() -> None:
    # Two replicas behind one Service: each admits half; the server counts all.
    clock = Clock()
    r1 = LoadSignal([A], max_age=2.0, clock=clock)
    r2 = LoadSignal([A], max_age=2.0, clock=clock)
    for _ in range(6):
        r1.admitted(A)
        r2.admitted(A)
    assert (r1.load(A), r2.load(A)) == (6, 6)  # local: each sees half of the 12
    clock.now = 101.0
    for r in (r1, r2):
        r.reading(A, running=12, queued=0, at=101.0)
    clock.now = 101.1
    r1.admitted(A)
    assert (r1.load(A), r2.load(A)) == (13, 12)


def test_a_stale_reading_falls_back_to_local_counts() -> None:
    clock = Clock()
    sig = LoadSignal([A], max_age=1.0, clock=clock)
    sig.admitted(A)
    sig.reading(A, 40, 0, at=clock.now)
    assert sig.load(A) == 40
    clock.now += 1.5
    assert sig.load(A) == 1 and not sig.from_server(A)


def test_failure_counts_warns_once_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    errors: list[str] = []
    sig = LoadSignal([A], max_age=2.0, clock=clock, on_error=errors.append)
    sig.admitted(A)
    sig.reading(A, 30, 0, at=clock.now)
    with caplog.at_level(logging.WARNING, logger="dynspec.router.loadsignal"):
        sig.failed(A, "garbage")
        sig.failed(A, "garbage")
    assert errors == [A, A]
    assert sum("not readable" in r.getMessage() for r in caplog.records) == 1
    assert sig.load(A) == 1  # this router's own in flight
    clock.now += 0.1
    sig.reading(A, 4, 0, at=clock.now)
    assert sig.load(A) == 4


def _metric(registry: CollectorRegistry, server: str) -> float:
    value = registry.get_sample_value("dynspec_load_signal_errors_total", {"server": server})
    assert value is not None
    return value


async def test_poller_reads_a_real_server_and_survives_garbage(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    dead = f"http://127.0.0.1:{free_port()}"
    with fake_upstream(tmp_path) as url:
        metrics = LoadSignalMetrics(registry, [url, dead])
        sig = LoadSignal([url, dead], max_age=10.0, on_error=metrics.error)
        client = Client(connect_timeout=2.0)
        poller = LoadPoller(sig, client, interval=0.25)
        try:
            await poller.poll_once(url)
            assert sig.from_server(url) and sig.load(url) == 0
            assert _metric(registry, url) == 0

            def set_loads(body: bytes, status: int = 200) -> None:
                headers = {"x-fake-status": str(status)}
                httpx.post(url + "/fake/loads", content=body, headers=headers).raise_for_status()

            set_loads(answer(rank(0, 7, 2), rank(1, 3, 0)))
            await poller.poll_once(url)
            sig.admitted(url)
            assert sig.load(url) == 13

            # Garbage, a wrong type, an error status: ignored and counted, local counts used.
            for body, status in (
                (b"<html>oops</html>", 200),
                (answer(rank(0, "lots", 0)), 200),
                (b'{"error": "x"}', 500),
            ):
                set_loads(body, status)
                await poller.poll_once(url)
                assert not sig.from_server(url)
                assert sig.load(url) == 1
            assert _metric(registry, url) == 3

            set_loads(answer(rank(0, 2, 0)))
            await poller.poll_once(url)
            assert sig.load(url) == 2

            await poller.poll_once(dead)  # refused
            assert _metric(registry, dead) == 1
            assert sig.load(dead) == 0
        finally:
            await poller.stop()
            client.close()


def test_too_many_events_between_readings_fall_back_to_local(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("dynspec.router.loadsignal.MAX_EVENTS", 3)
    clock = Clock()
    sig = LoadSignal([A], max_age=2.0, clock=clock)
    sig.reading(A, 50, 0, at=clock.now)
    clock.now += 0.1
    for _ in range(3):
        sig.admitted(A)
    assert sig.from_server(A) and sig.load(A) == 53
    sig.admitted(A)  # the fourth: the correction would be short, so the reading is dropped
    assert not sig.from_server(A) and sig.load(A) == 4


def test_flags_and_environment() -> None:
    base = ["--eagle-url", A, "--baseline-url", B]
    assert (parse_config(base).load_signal, parse_config(base).load_interval) == ("local", 0.25)
    c = parse_config([*base, "--load-signal", "servers", "--load-interval", "0.5"])
    assert (c.load_signal, c.load_interval) == ("servers", 0.5)
    env = {"DYNSPEC_LOAD_SIGNAL": "servers", "DYNSPEC_LOAD_INTERVAL": "1"}
    c = parse_config(base, environ=env)
    assert (c.load_signal, c.load_interval) == ("servers", 1.0)
    for bad in (["--load-signal", "gossip"], ["--load-interval", "0"], ["--load-interval", "-1"]):
        with pytest.raises(SystemExit) as exc:
            parse_config([*base, *bad])
        assert exc.value.code == 2


async def _set_loads(url: str, body: bytes) -> None:
    async with httpx.AsyncClient(timeout=5) as hc:
        (await hc.post(url + "/fake/loads", content=body)).raise_for_status()


async def test_the_poller_task_keeps_the_reading_fresh(tmp_path: Path) -> None:
    with fake_upstream(tmp_path) as url:
        await _set_loads(url, answer(rank(0, 5, 1)))
        sig = LoadSignal([url], max_age=5.0)
        client = Client(connect_timeout=2.0)
        poller = LoadPoller(sig, client, interval=0.05)
        poller.start()
        try:
            for _ in range(200):  # bounded: 10 s at most
                if sig.from_server(url):
                    break
                await asyncio.sleep(0.05)
            assert sig.load(url) == 6
            await _set_loads(url, answer(rank(0, 2, 0)))
            for _ in range(200):
                if sig.load(url) == 2:
                    break
                await asyncio.sleep(0.05)
            assert sig.load(url) == 2
        finally:
            await poller.stop()
            client.close()
