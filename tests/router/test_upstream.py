"""The router's own HTTP/1.1 client against scripted loopback servers: pooling, a stale pooled
connection, framing (content-length, chunked, until close), responses cut at every byte,
backpressure under a slow reader, and what a broken or abandoned response does."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from utils import free_port

from dynspec.router.upstream import (
    HIGH_WATER,
    Client,
    ConnectError,
    Connection,
    ProtocolError,
    Response,
)

# (connection number, request number on that connection, the request's head) -> what to do.
Handler = Callable[[int, int, bytes, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class Server:
    url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[Server]:
    """A loopback server; ``handler`` answers each request, or returns False to close the
    connection at once."""
    port = free_port()
    server = Server(f"http://127.0.0.1:{port}")

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = server.connections
        server.connections += 1
        i = 0
        try:
            while (head := await _read_request(reader)) is not None:
                server.requests.append(head)
                if not await handler(n, i, head, writer):
                    break
                i += 1
        finally:
            writer.close()
            server.closed.set()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", port)
    try:
        yield server
    finally:
        srv.close()


async def spin(rounds: int = 20) -> None:
    """Let the event loop run a few rounds: bytes written on loopback are read by then, as the
    server and the client share this loop."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after {timeout:g}s"
        await asyncio.sleep(0.01)


def chunked(*pieces: bytes, status: int = 200) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return (
        b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        % status
        + body
        + b"0\r\n\r\n"
    )


def sized(body: bytes, status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)


async def answer(data: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(data)
    await writer.drain()
    return True


async def post(client: Client, url: str, body: bytes = b"{}") -> Response:
    head = client.head(url, b"POST", b"/v1/completions", b"x-test: 1\r\n", len(body))
    return await client.request(url, head + body)


async def test_sequential_requests_share_one_connection() -> None:
    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        return await answer(chunked(b"data: %d\n\n" % i, b"data: [DONE]\n\n"), w)

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        for i in range(3):
            resp = await post(client, server.url)
            assert resp.status == 200 and resp.content_type == b"text/event-stream"
            assert await resp.body() == b"data: %d\n\ndata: [DONE]\n\n" % i
            assert resp.at_eof()
            resp.release()
            resp.release()  # twice is harmless
        assert (await client.get(server.url, "/health"))[0] == 200
        assert server.connections == 1
        assert server.requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:")
        assert b"x-test: 1\r\ncontent-length: 2\r\n\r\n" in server.requests[0]
        assert server.requests[3].startswith(b"GET /health HTTP/1.1\r\n")
        assert b"content-length" not in server.requests[3]
        client.close()


async def test_content_length_body_and_status_passed_on() -> None:
    payload = b'{"error": "nope"}' * 1000

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        return await answer(sized(payload, 503), w)

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        assert resp.status == 503
        assert resp.header(b"content-length") == str(len(payload)).encode()
        assert await resp.body() == payload
        resp.release()
        assert (await client.get(server.url, "/x")) == (503, payload)
        assert server.connections == 1
        client.close()


async def test_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    """The server closes a kept-alive connection just as the next request arrives on it."""

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        if n == 0 and i == 1:
            return False  # close without a byte of answer
        return await answer(sized(b"ok %d" % n), w)

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        assert (await client.get(server.url, "/")) == (200, b"ok 0")
        assert (await client.get(server.url, "/")) == (200, b"ok 1")
        assert server.connections == 2
        client.close()


async def test_fresh_connection_closed_without_answer_is_an_error() -> None:
    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        return False

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        with pytest.raises(ProtocolError):
            await client.get(server.url, "/")
        assert server.connections == 1  # a fresh connection is not retried
        client.close()


async def test_idle_connection_is_dropped_after_idle_timeout() -> None:
    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        return await answer(sized(b"ok"), w)

    async with serve(handler) as server:
        client = Client(connect_timeout=2, idle_timeout=0.2)
        assert (await client.get(server.url, "/")) == (200, b"ok")
        # The sweeper closes it: the server sees the connection end without another request.
        await asyncio.wait_for(server.closed.wait(), 10)
        assert (await client.get(server.url, "/")) == (200, b"ok")
        assert server.connections == 2
        client.close()


async def test_refused_connection() -> None:
    client = Client(connect_timeout=2)
    with pytest.raises(ConnectError) as info:
        await client.get(f"http://127.0.0.1:{free_port()}", "/")
    assert info.value.refused


async def test_server_dies_mid_body() -> None:
    """Bytes that did arrive are handed out, then the break; the connection is not pooled."""
    first_read = asyncio.Event()

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        full = chunked(b"data: 1\n\n", b"data: 2\n\n")
        w.write(full[: full.index(b"data: 2")])
        await w.drain()
        await first_read.wait()
        w.transport.abort()
        return False

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        assert await resp.read() == b"data: 1\n\n"
        first_read.set()
        with pytest.raises(ProtocolError):
            await resp.read()
        resp.release()
        assert not client.origin(server.url).idle
        client.close()


async def test_body_until_close() -> None:
    first_read = asyncio.Event()

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst ")
        await w.drain()
        if n == 0:
            await first_read.wait()
        w.write(b"second")
        await w.drain()
        return False

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        assert await resp.read() == b"first "
        first_read.set()
        assert await resp.body() == b"second"
        resp.release()
        assert not client.origin(server.url).idle  # ended by the close: not reusable
        assert (await client.get(server.url, "/")) == (200, b"first second")
        client.close()


async def test_abandoned_response_closes_its_connection() -> None:
    """What SGLang relies on to abort a request: the connection ends at once."""

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await w.drain()
        return True

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        assert await resp.read() == b"hello"
        resp.release()  # not read whole: closed, not pooled
        await asyncio.wait_for(server.closed.wait(), 10)
        client.close()


async def test_cancelled_read_closes_the_connection() -> None:
    asked = asyncio.Event()

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        asked.set()
        return True  # never answers

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        task = asyncio.create_task(post(client, server.url))
        await asyncio.wait_for(asked.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(server.closed.wait(), 10)
        client.close()


async def test_slow_reader_pauses_the_server() -> None:
    piece = bytes(range(256)) * 256  # 64 KiB
    count = 512  # 32 MiB in all: more than the kernel's socket buffers hold
    sent = asyncio.Event()

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(count):
            w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()
        sent.set()
        return True

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        conn = resp.connection
        await until(lambda: conn.paused, "paused")  # a client that does not read
        # One socket read (up to 256 KiB) can land on top of the high-water mark.
        assert conn.buffered < HIGH_WATER + 512 * 1024
        assert not sent.is_set()  # the server is held back
        assert await resp.body() == piece * count
        assert sent.is_set() and not conn.paused
        resp.release()
        assert (await client.get(server.url, "/")) is not None
        assert server.connections == 1
        client.close()


async def test_response_cut_at_every_byte() -> None:
    """Each split point of a chunked SSE response, fed to one connection in two reads."""
    events = [b'data: {"choices":[{"text":"t%d"}]}\n\n' % i for i in range(3)]
    raw = chunked(*events)

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        return True  # never answers: the test feeds the connection itself

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        origin = client.origin(server.url)
        conn = await client._connect(origin)
        for cut in range(1, len(raw)):
            # The same connection carries every round, as a pooled one would.
            conn.send(b"")
            conn.data_received(raw[:cut])
            conn.data_received(raw[cut:])
            await conn.wait_headers()
            resp = Response(client, origin, conn, time.perf_counter())
            assert resp.status == 200 and resp.content_type == b"text/event-stream"
            assert await resp.body() == b"".join(events), cut
            assert resp.at_eof() and conn.keep_alive
        conn.close()
        client.close()


async def test_response_written_one_byte_at_a_time() -> None:
    events = [b"data: %d\n\n" % i for i in range(4)]
    raw = chunked(*events)

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        for b in range(len(raw)):
            w.write(raw[b : b + 1])
            await w.drain()
            await asyncio.sleep(0)
        return True

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        assert await resp.body() == b"".join(events)
        resp.release()
        assert isinstance(resp.connection, Connection) and not resp.connection.closed
        client.close()


async def test_sink_gets_pieces_and_can_hold_the_server() -> None:
    """``stream_to``: pieces already received first, then each as it arrives; ``hold`` stops
    reading and wakes ``wait``, which returns True at the end."""
    go = asyncio.Event()
    held = asyncio.Event()
    c_sent = asyncio.Event()

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await w.drain()
        await go.wait()
        w.write(b"1\r\nb\r\n")
        await w.drain()
        await held.wait()
        w.write(b"1\r\nc\r\n0\r\n\r\n")
        await w.drain()
        c_sent.set()
        return True

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        await until(lambda: bool(resp.connection.pieces), '"a" received')  # before the sink
        got: list[bytes] = []

        def sink(data: bytes) -> None:
            got.append(data)
            if data == b"b":
                resp.hold()

        resp.stream_to(sink, lambda: True)
        assert got == [b"a"]
        go.set()
        assert await resp.wait() is False  # held after "b"
        assert got == [b"a", b"b"] and resp.connection.paused
        held.set()
        await c_sent.wait()
        await spin()
        assert got == [b"a", b"b"]  # "c" waits in the socket
        resp.unhold()
        assert await resp.wait() is True
        assert got == [b"a", b"b", b"c"] and resp.at_eof()
        resp.release()
        assert (await client.get(server.url, "/")) == (200, b"abc")
        assert server.connections == 1
        client.close()


async def test_interim_response_is_skipped() -> None:
    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 100 Continue\r\nx-interim: 1\r\n\r\n")
        await w.drain()
        await spin()  # the client reads the interim head on its own
        return await answer(sized(b"done"), w)

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        assert resp.status == 200 and resp.header(b"x-interim") is None
        assert await resp.body() == b"done"
        resp.release()
        client.close()


async def test_flush_once_per_read_and_hold_from_flush() -> None:
    """A burst read at once reaches the sink piece by piece and ``flush`` once; a False from
    ``flush`` holds the connection."""
    go = asyncio.Event()
    held = asyncio.Event()

    async def handler(n: int, i: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await w.drain()
        await go.wait()
        w.write(b"1\r\na\r\n1\r\nb\r\n1\r\nc\r\n")  # one write, one read
        await w.drain()
        await held.wait()
        w.write(b"1\r\nd\r\n0\r\n\r\n")
        await w.drain()
        return True

    async with serve(handler) as server:
        client = Client(connect_timeout=2)
        resp = await post(client, server.url)
        log: list[bytes] = []

        def flush() -> bool:
            log.append(b"|")
            return b"c" not in log  # the client's socket is "full" after "c"

        resp.stream_to(log.append, flush)
        assert log == [b"|"]
        go.set()
        assert await resp.wait() is False
        assert log == [b"|", b"a", b"b", b"c", b"|"]
        held.set()
        resp.unhold()
        log.clear()
        assert await resp.wait() is True
        assert log == [b"d", b"|"]
        resp.release()
        assert server.connections == 1
        client.close()


async def test_connect_timeout() -> None:
    """A server whose accept queue is full drops the SYN: the connect times out (loopback)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    # The first connection completes and fills the queue (backlog 0 holds one); the next ones'
    # SYNs are dropped, as the client's will be.
    fillers = [socket.create_connection(("127.0.0.1", port), timeout=10)]
    try:
        for _ in range(3):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        client = Client(connect_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(ConnectError) as info:
            await client.get(f"http://127.0.0.1:{port}", "/")
        assert info.value.timeout and not info.value.refused
        assert time.monotonic() - started > 0.25
    finally:
        for s in fillers:
            s.close()
        listener.close()


@pytest.mark.parametrize(
    ("url", "port", "prefix", "host", "tls"),
    [
        ("http://127.0.0.1:8000", 8000, b"", b"127.0.0.1:8000", False),
        ("https://sglang.internal", 443, b"", b"sglang.internal", True),
        ("http://h/gpu/3/", 80, b"/gpu/3", b"h", False),
        ("https://u:p@h:9443/x", 9443, b"/x", b"h:9443", True),
    ],
)
def test_server_url_parts(url: str, port: int, prefix: bytes, host: bytes, tls: bool) -> None:
    client = Client(connect_timeout=1)
    origin = client.origin(url)
    assert (origin.port, origin.prefix, origin.host_header) == (port, prefix, host)
    assert (origin.tls is not None) is tls
    head = client.head(url, b"GET", b"/health", b"", None)
    assert head.startswith(b"GET " + prefix + b"/health HTTP/1.1\r\nhost: " + host + b"\r\n")
