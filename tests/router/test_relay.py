"""Relay details that need an upstream which records requests and misbehaves on demand:
headers in and out, keys, usage injection and removal across split SSE events, timeouts and a
server dying mid-stream."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import openai
import orjson
import pytest
from routerkit import LIVE_ROUTERS, RouterProc, fake_upstream, router, wait_for
from utils import free_port, running

from dynspec.router.cli import bind_socket

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with fake_upstream(tmp_path_factory.mktemp("fake")) as url:
        yield url


@pytest.fixture(scope="module")
def rp(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router(
        tmp_path_factory.mktemp("relay"), "--eagle-url", upstream,
        "--backend-api-key", "backend-secret", "--request-timeout", "1", api_key="client-secret",
    ) as proc:  # fmt: skip
        yield proc


@pytest.fixture(scope="module")
def rp_asgi(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    """The same router with --no-direct-relay: every streamed chunk through ASGI send."""
    with router(
        tmp_path_factory.mktemp("relay-asgi"), "--eagle-url", upstream,
        "--backend-api-key", "backend-secret", "--request-timeout", "1", "--no-direct-relay",
        api_key="client-secret",
    ) as proc:  # fmt: skip
        yield proc


# The relay's two ways of writing a streamed body: straight to the socket, or through ASGI.
RELAYS = pytest.mark.parametrize("relay", ["rp", "rp_asgi"], ids=["direct", "no-direct-relay"])


def last(upstream: str) -> dict[str, Any]:
    return httpx.get(upstream + "/fake/last", timeout=5).json()  # type: ignore[no-any-return]


def test_request_headers_keys_and_hop_by_hop(rp: RouterProc, upstream: str) -> None:
    r = httpx.post(
        rp.url + CHAT,
        json={"messages": MESSAGES, "max_tokens": 2},
        headers={
            "Authorization": "Bearer client-secret",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "TE": "trailers",
            "Connection": "keep-alive",
            "x-request-id": "abc-123",
            "user-agent": "probe/1",
        },
        timeout=10,
    )
    assert r.status_code == 200
    seen = last(upstream)["headers"]
    assert seen["authorization"] == "Bearer backend-secret"
    assert "client-secret" not in str(seen)
    assert "proxy-authorization" not in seen and "te" not in seen
    assert seen["x-request-id"] == "abc-123" and seen["user-agent"] == "probe/1"
    log = rp.log.read_text()
    assert "client-secret" not in log and "backend-secret" not in log


def test_response_headers_not_duplicated(rp: RouterProc) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "stream": True}
    r = httpx.post(rp.url + CHAT, json=body, headers={"Authorization": "Bearer client-secret"})
    assert r.status_code == 200
    assert r.headers.get_list("date") and len(r.headers.get_list("date")) == 1
    assert "fake" not in r.headers.get_list("server")
    assert r.headers.get_list("x-dynspec-backend") == ["eagle"]
    assert r.headers["content-type"].startswith("text/event-stream")


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


@pytest.mark.parametrize("split", ["0", "1"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_usage_asked_for_and_removed(rp: RouterProc, upstream: str, split: str, path: str) -> None:
    """The server is asked for usage; the client, who did not ask, never sees the chunk, even
    when the server splits every SSE event over three writes."""
    body: dict[str, Any] = {"max_tokens": 5, "stream": True}
    body |= {"messages": MESSAGES} if path == CHAT else {"prompt": "x"}
    headers = {"Authorization": "Bearer client-secret", "x-fake-split": split}
    r = httpx.post(rp.url + path, json=body, headers=headers, timeout=10)
    assert last(upstream)["body"]["stream_options"] == {"include_usage": True}
    got = events(r.content)
    assert got[-1] == b"data: [DONE]"
    assert not any(b'"choices":[]' in e for e in got)
    assert all(e.startswith(b"data: ") for e in got)
    # Exactly the server's content events, whole and in order.
    assert len(got) == 5 + (path == CHAT) + 1
    assert b"".join(got).count(b"t4 ") == 1


def test_usage_kept_when_client_asks(rp: RouterProc, upstream: str) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"Authorization": "Bearer client-secret", "x-fake-split": "1"}
    r = httpx.post(rp.url + CHAT, json=body, headers=headers, timeout=10)
    got = events(r.content)
    assert got[-2].startswith(b'data: {"id":"x","choices":[],"usage"')
    assert last(upstream)["body"]["stream_options"] == {"include_usage": True}


async def test_openai_stream_through_split_events(rp: RouterProc) -> None:
    async with openai.AsyncOpenAI(
        base_url=rp.url + "/v1", api_key="client-secret", max_retries=0
    ) as c:
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=6, stream=True,
            extra_headers={"x-fake-split": "1"},
        )  # fmt: skip
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    assert text == "".join(f"t{i} " for i in range(6))
    assert rp.metric("dynspec_output_tokens_total", pool="eagle") >= 6


@RELAYS
def test_first_byte_timeout_is_504(relay: str, request: pytest.FixtureRequest) -> None:
    rp: RouterProc = request.getfixturevalue(relay)
    before = rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="timeout")
    r = httpx.post(
        rp.url + CHAT,
        json={"messages": MESSAGES},
        headers={"Authorization": "Bearer client-secret", "x-fake-sleep-first": "3"},
        timeout=10,
    )
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert r.headers["x-dynspec-backend"] == "eagle"
    after = rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="timeout")
    assert after == before + 1


async def test_server_dies_mid_stream(rp: RouterProc) -> None:
    """The client sees a broken stream (not a short one that looks complete); nothing leaks."""
    before = rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="protocol")
    async with openai.AsyncOpenAI(
        base_url=rp.url + "/v1", api_key="client-secret", max_retries=0
    ) as c:
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=50, stream=True,
            extra_headers={"x-fake-die-after": "4"},
        )  # fmt: skip
        seen = 0
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            async for _ in stream:
                seen += 1
        assert seen >= 3
    assert await asyncio.to_thread(rp.wait_load, 0)
    after = rp.metric("dynspec_upstream_errors_total", pool="eagle", kind="protocol")
    assert after == before + 1


async def test_accepted_sockets_have_nodelay() -> None:
    """The listener is made so that accepted connections skip Nagle (a 40 ms TTFT trap)."""
    import uvloop

    async def check() -> int:
        sock = bind_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        got: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            s = writer.get_extra_info("socket")
            got.set_result(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_conn, sock=sock)
        _, w = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(got, 5)
        w.close()
        server.close()
        return value

    assert await asyncio.to_thread(uvloop.run, check()) != 0
    assert await check() != 0


def test_no_healthy_server_is_503(tmp_path: Path) -> None:
    from utils import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with router(tmp_path, "--eagle-url", dead, ready="/metrics") as proc:
        assert httpx.get(proc.url + "/health", timeout=5).status_code == 503
        r = httpx.post(proc.url + CHAT, json={"messages": MESSAGES}, timeout=5)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "no_healthy_server"
        assert proc.metric("dynspec_server_up", pool="eagle", server=dead) == 0


@pytest.mark.parametrize("usage", [False, True])
def test_streamed_chunks_skip_asgi(rp: RouterProc, upstream: str, usage: bool) -> None:
    """Under the router's own server, a streamed body's chunks are written by the relay itself
    (downstream.RelayProtocol), with or without the usage chunk removed."""
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 5, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    rid = f"direct-{usage}"
    headers = {"Authorization": "Bearer client-secret", "x-request-id": rid, "x-fake-split": "1"}
    r = httpx.post(rp.url + CHAT, json=body, headers=headers, timeout=10)
    got = events(r.content)
    assert got[-1] == b"data: [DONE]"
    assert any(b'"choices":[]' in e for e in got) == usage
    assert len(got) == 1 + 5 + usage + 1
    line = f"{rid}: eagle 200 via {upstream} (direct)"
    assert wait_for(lambda: line in rp.log.read_text())  # logged just after the response


@RELAYS
async def test_slow_client_gets_every_chunk(relay: str, upstream: str, tmp_path: Path) -> None:
    """A client that stops reading holds the server back (the relay stops reading from it, so
    the server's writes stall well short of the end), then gets the whole stream, in order,
    once it reads again."""
    # Its own router: the module's --request-timeout 1 would end a stream held back that long.
    more = ["--no-direct-relay"] if relay == "rp_asgi" else []
    with router(
        tmp_path, "--eagle-url", upstream, "--backend-api-key", "backend-secret",
        "--request-timeout", "60", *more, api_key="client-secret",
    ) as rp:  # fmt: skip
        await _slow_client(rp, upstream)


async def _slow_client(rp: RouterProc, upstream: str) -> None:
    n = 8000  # 2 kB each, ~16 MB of events: more than the sockets between here and the server hold
    body = orjson.dumps({"messages": MESSAGES, "max_tokens": n, "stream": True,
                         "stream_options": {"include_usage": True}})  # fmt: skip
    port = int(rp.url.rsplit(":", 1)[1])
    # A small receive buffer of our own (no autotuning up to tcp_rmem's 32 MB on loopback), so the
    # sockets' share of what the server can write before it stalls is bounded.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer client-secret\r\n"
        b"x-fake-delay: 0\r\nx-fake-pad: 2000\r\ncontent-type: application/json\r\n"
        b"connection: close\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()

    async def written() -> int:
        async with httpx.AsyncClient(timeout=5) as hc:
            return int((await hc.get(upstream + "/fake/progress")).json()["events"])

    # Not reading: the server gets going, then stalls. A relay that buffered everything would
    # let it write all n events; one with backpressure leaves it stuck where the buffers fill.
    stalled, same = await written(), 0
    for _ in range(100):  # at most ~20 s; stalled = no progress over three samples
        await asyncio.sleep(0.2)
        now = await written()
        same = same + 1 if now == stalled and now > 0 else 0
        if same == 3:
            break
        stalled = now
    assert 0 < stalled < n, stalled
    await asyncio.sleep(0.5)
    assert await written() == stalled  # still held back while the client does not read
    raw = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    assert await written() == n + 3  # the role chunk, n tokens, usage, [DONE]: all of it
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    payload = bytearray()
    while True:
        size_line, _, chunked = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        payload += chunked[:size]
        chunked = chunked[size + 2 :]
    got = events(bytes(payload))
    assert got[-1] == b"data: [DONE]"
    texts = [e for e in got if b'"content":"t' in e]
    assert len(texts) == n
    assert all(b'"content":"t%d ' % i in e for i, e in enumerate(texts))


@pytest.mark.parametrize("usage", [False, True])
def test_no_direct_relay_sends_chunks_through_asgi(rp_asgi: RouterProc, usage: bool) -> None:
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 5, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    rid = f"asgi-{usage}"
    headers = {"Authorization": "Bearer client-secret", "x-request-id": rid, "x-fake-split": "1"}
    r = httpx.post(rp_asgi.url + CHAT, json=body, headers=headers, timeout=10)
    got = events(r.content)
    assert got[-1] == b"data: [DONE]" and len(got) == 1 + 5 + usage + 1
    assert wait_for(lambda: f"{rid}: eagle 200 via " in rp_asgi.log.read_text())
    assert "(direct)" not in rp_asgi.log.read_text()


@pytest.fixture(scope="module")
def plain(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    """The same router app under stock uvicorn: every chunk through ASGI ``send``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("plain") / "router.log"
    argv = [
        sys.executable, str(Path(__file__).parent / "plain_router.py"), str(port),
        "--eagle-url", upstream, "--request-timeout", "1", "--health-interval", "0.2",
    ]  # fmt: skip
    with running(argv, ready_url=url + "/health", timeout=30, log=log) as proc:
        rp = RouterProc(url, proc, log, None)
        LIVE_ROUTERS.append(rp)
        try:
            yield rp
        finally:
            LIVE_ROUTERS.remove(rp)


@pytest.mark.parametrize("usage", [False, True])
@pytest.mark.parametrize("split", ["0", "1"])
def test_streamed_chunks_through_asgi(plain: RouterProc, usage: bool, split: str) -> None:
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 5, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    rid = f"plain-{usage}-{split}"
    headers = {"x-request-id": rid, "x-fake-split": split}
    r = httpx.post(plain.url + CHAT, json=body, headers=headers, timeout=10)
    got = events(r.content)
    assert got[-1] == b"data: [DONE]"
    assert any(b'"choices":[]' in e for e in got) == usage
    assert len(got) == 1 + 5 + usage + 1
    assert all(e.startswith(b"data: ") for e in got)
    assert wait_for(lambda: f"{rid}: eagle 200 via " in plain.log.read_text())
    assert "(direct)" not in plain.log.read_text()


async def test_server_dies_mid_stream_through_asgi(plain: RouterProc) -> None:
    before = plain.metric("dynspec_upstream_errors_total", pool="eagle", kind="protocol")
    async with openai.AsyncOpenAI(base_url=plain.url + "/v1", api_key="x", max_retries=0) as c:
        stream = await c.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=50, stream=True,
            extra_headers={"x-fake-die-after": "4"},
        )  # fmt: skip
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            async for _ in stream:
                pass
    assert await asyncio.to_thread(plain.wait_load, 0)
    after = plain.metric("dynspec_upstream_errors_total", pool="eagle", kind="protocol")
    assert after == before + 1


def test_raw_body_unusable_on_an_unknown_response_cycle() -> None:
    # A future uvicorn with another cycle shape must make the relay fall back to ASGI send.
    from dynspec.router.downstream import RawBody

    class Cycle:
        response_started = True
        chunked_encoding = True
        response_complete = False
        scope: ClassVar[dict[str, str]] = {"method": "POST"}

    assert RawBody(Cycle()).usable() is False  # type: ignore[arg-type]


def test_uvicorn_bounded_to_the_tested_versions() -> None:
    """downstream.RelayProtocol subclasses uvicorn internals: pyproject allows only a range that
    CI tests at both ends (.ci/run), and the uvicorn installed here is inside it."""
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    (req,) = [Requirement(r) for r in requires("dynspec") or [] if r.startswith("uvicorn")]
    assert any(s.operator in ("<", "<=", "==") for s in req.specifier), req
    assert req.specifier.contains(version("uvicorn")), (req, version("uvicorn"))
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "pytest tests/router" in ci and "uvicorn==" in ci
