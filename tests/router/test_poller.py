"""The /metrics and /get_server_info parsers, on SGLang's own lines, and the poller's rounds."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from dynspec.launcher.sim.metrics import Metrics
from dynspec.router.learning import SpeedLearner
from dynspec.router.poller import (
    MetricsParseError,
    MetricsPoller,
    parse_metrics,
    parse_running_limit,
)
from dynspec.router.server import Server
from dynspec.router.upstream import Client

# As SGLang 0.5.23 writes them (prometheus-client text), two data-parallel ranks, with a
# histogram and a label value holding spaces and a brace.
RANK = (
    'model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0",'
    'moe_ep_rank="0",dp_rank="{}"'
)
R0, R1 = "{" + RANK.format(0) + "}", "{" + RANK.format(1) + "}"
SGLANG_TEXT = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{R0} 12.0
sglang:num_running_reqs{R1} 10.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{R0} 3.0
sglang:num_queue_reqs{R1} 0.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{R0} 1211.5
sglang:gen_throughput{R1} 1000.0
# HELP sglang:spec_accept_length The average acceptance length.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{R0} 3.1
sglang:spec_accept_length{R1} 2.9
# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="a {{b}} c"}} 7.0
sglang:e2e_request_latency_seconds_sum{{model_name="a {{b}} c"}} 12.5 1733000000000
sglang:cache_hit_rate{{model_name="m"}} NaN
"""


def test_sglang_lines() -> None:
    m = parse_metrics(SGLANG_TEXT)
    assert (m.running, m.queued, m.gen_throughput) == (22.0, 3.0, 2211.5)
    assert m.accept_length == pytest.approx(3.0)  # a mean per request: averaged over ranks
    assert m.has_speed


@pytest.mark.parametrize("speculative", [True, False])
def test_the_simulators_metrics(speculative: bool) -> None:
    body = Metrics("m", speculative).render(
        running=5, queued=2, gen_throughput=250.0, token_usage=0.1, used_tokens=10,
        accept_length=2.5,
    )  # fmt: skip
    m = parse_metrics(body.decode())
    assert (m.running, m.queued, m.gen_throughput) == (5, 2, 250.0)
    assert m.accept_length == (2.5 if speculative else None)


def test_a_server_without_sglang_metrics() -> None:
    m = parse_metrics("# HELP up x\n# TYPE up gauge\nup 1\nprocess_cpu_seconds_total 3.5\n")
    assert m.running is None and m.gen_throughput is None and not m.has_speed


@pytest.mark.parametrize(
    "body",
    [
        "<html><body>Not Found</body></html>",
        'sglang:num_running_reqs{tp_rank="0" 3.0',
        "sglang:num_running_reqs three",
        "sglang:num_running_reqs 1 2 3",
        '{"detail": "Not Found"}',
    ],
)
def test_a_body_that_does_not_parse(body: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics(body)


@pytest.mark.parametrize(
    ("info", "limit"),
    [
        (
            {
                "max_running_requests": 48,
                "internal_states": [{"effective_max_running_requests_per_dp": 40}],
            },
            40,
        ),
        ({"max_running_requests": 24}, 24),
        ({"max_running_requests": None, "internal_states": [{}]}, None),
        ({"max_running_requests": True}, None),
        ([1, 2], None),
    ],
)  # fmt: skip
def test_running_limit_from_server_info(info: object, limit: int | None) -> None:
    assert parse_running_limit(orjson.dumps(info)) == limit


def test_running_limit_from_garbage() -> None:
    assert parse_running_limit(b"<html>") is None


# -- the poller against loopback servers -----------------------------------------------------------


async def _serve(bodies: dict[str, tuple[int, bytes]]) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                code, body = bodies.get(path, (404, b"not found"))
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (code, len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
        except asyncio.CancelledError:
            # The loop ends with the test: nothing to report.
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def test_poll_rounds_feed_the_learner_count_errors_and_warn_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    info = orjson.dumps({"internal_states": [{"effective_max_running_requests_per_dp": 30}]})
    good_bodies = {"/metrics": (200, SGLANG_TEXT.encode()), "/get_server_info": (200, info)}
    good, good_url = await _serve(good_bodies)
    bad, bad_url = await _serve({"/metrics": (200, b"<html>oops</html>")})
    bare, bare_url = await _serve({"/metrics": (200, b"up 1\n")})
    errors: list[str] = []
    records = [
        Server(good_url, "eagle"), Server(bad_url, "baseline"), Server(bare_url, "baseline")
    ]  # fmt: skip
    lr = SpeedLearner(records)
    client = Client(connect_timeout=2.0)
    poller = MetricsPoller(lr, records, client, interval=1.0, on_error=errors.append)
    try:
        with caplog.at_level(logging.WARNING, logger="dynspec.router.poller"):
            for i in range(4):
                # SGLang's gauges move between polls under steady load (a poll whose gauges did
                # not move is not learned: learning.steady).
                text = SGLANG_TEXT.replace("1211.5", f"{1211.5 + i / 1000:.3f}")
                good_bodies["/metrics"] = (200, text.encode())
                for record in records:
                    await poller.poll_once(record)
        lr.rebuild()
    finally:
        client.close()
        for s in (good, bad, bare):
            s.close()
    speed = lr.servers[good_url]
    assert speed.accept_length == pytest.approx(3.0)
    assert lr.curve(good_url).limit == 30
    # Three polls learned at load 25 (the first has no poll before it to be steady against)
    # against the neutral prior's one observation's worth: every request there, the 3 queued
    # too, shares the tokens made (a stay's time per token, not the running batch's TPOT).
    assert lr.curve(good_url).at(25) == pytest.approx(25 / 2211.5, rel=0.03)
    assert errors == [bad_url] * 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bare_url in warnings[0]
