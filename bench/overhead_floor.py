"""The floor: the cheapest streaming relay Python can be, as a reference row for the overhead bench.

Not a router: no policy, no validation, no metrics, no timeouts, round-robin over its upstreams.
It shows what relaying costs when nothing runs per chunk but the event loop, the parsers (C) and
two syscalls: client side, httptools' request parser on a bare asyncio protocol; upstream side, a
keep-alive pool of raw connections with httptools' response parser whose body callback frames each
piece and writes it straight to the client's transport. No task, future or coroutine per chunk.

``--mode asgi`` keeps the client side on uvicorn (httptools, uvloop, a bare ASGI app, as the router
does) and replaces only the HTTP client: the same raw upstream connections hand body pieces to the
request's task through one future, and each read goes out with one ASGI ``send``. The gap between
the two modes is what the ASGI server costs per chunk; the gap between ``asgi`` and the router is
what aiohttp and the router's own work cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from dynspec.common.cli import FlagParser, add_log_level, configure_logging, run_main

log = logging.getLogger(__name__)

Address = tuple[str, int]


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Upstream(asyncio.Protocol):
    def __init__(self, relay: Relay, address: Address) -> None:
        self.relay = relay
        self.address = address
        self.parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        with contextlib.suppress(ValueError):
            self.relay.idle[self.address].remove(self)
        client, self.client = self.client, None
        if client is not None:  # the server died mid-response: the client must see a break
            client.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_headers_complete(self) -> None:
        client = self.client
        if client is not None:
            client.transport.write(
                b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" % self.parser.get_status_code()
            )

    def on_body(self, body: bytes) -> None:
        client = self.client
        if client is not None:
            client.transport.write(b"%x\r\n%s\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.transport.write(b"0\r\n\r\n")
            client.upstream = None
        if not self.closed:
            self.relay.idle[self.address].append(self)


class _Client(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url = b""
        self.body: list[bytes] = []
        self.upstream: _Upstream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        up, self.upstream = self.upstream, None
        if up is not None and up.transport is not None:
            up.client = None
            up.transport.close()  # abandon the server's response, as SGLang expects

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0]
        if self.parser.get_method() == b"POST" and path.startswith(b"/v1/"):
            self.relay.forward(self, path, b"".join(self.body))
        elif path == b"/health":
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        else:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")


class Relay:
    def __init__(self, upstreams: Sequence[Address]) -> None:
        self.upstreams = list(upstreams)
        self._next = itertools.cycle(self.upstreams)
        self.idle: dict[Address, list[_Upstream]] = {a: [] for a in self.upstreams}

    def forward(self, client: _Client, path: bytes, body: bytes) -> None:
        address = next(self._next)
        pool = self.idle[address]
        if pool:
            self._send(pool.pop(), client, path, body)
        else:
            asyncio.get_running_loop().create_task(self._connect(address, client, path, body))

    async def _connect(self, address: Address, client: _Client, path: bytes, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(lambda: _Upstream(self, address), *address)
        except OSError as exc:
            log.warning("cannot reach %s:%d: %s", address[0], address[1], exc)
            client.transport.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        self._send(up, client, path, body)

    @staticmethod
    def _send(up: _Upstream, client: _Client, path: bytes, body: bytes) -> None:
        up.client = client
        client.upstream = up
        assert up.transport is not None
        host = b"%s:%d" % (up.address[0].encode(), up.address[1])
        up.transport.write(
            b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path, host, len(body), body)
        )


# -- the ASGI variant ------------------------------------------------------------------------------
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _Feed(asyncio.Protocol):
    """A raw upstream connection whose response body is read by one task, piece by piece."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.pieces: list[bytes] = []
        self.status = 0
        self.headers_done = False
        self.done = False
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)
        if len(self.pieces) == 1:
            self._wake()

    def on_message_complete(self) -> None:
        self.done = True
        self._wake()

    def start(self, path: bytes, body: bytes) -> None:
        self.pieces = []
        self.status = 0
        self.headers_done = self.done = False
        self.parser = httptools.HttpResponseParser(self)
        host = b"%s:%d" % (self.address[0].encode(), self.address[1])
        assert self.transport is not None
        self.transport.write(
            b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path, host, len(body), body)
        )

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def wait_headers(self) -> bool:
        while not self.headers_done and not self.closed:
            await self._wait()
        return self.headers_done

    async def next(self) -> bytes | None:
        while not self.pieces:
            if self.done or self.closed:
                return None
            await self._wait()
        data = b"".join(self.pieces) if len(self.pieces) > 1 else self.pieces[0]
        self.pieces = []
        return data


class AsgiRelay:
    def __init__(self, upstreams: Sequence[Address]) -> None:
        self._next = itertools.cycle(list(upstreams))
        self.idle: dict[Address, list[_Feed]] = {a: [] for a in upstreams}

    async def _feed(self, address: Address) -> _Feed:
        pool = self.idle[address]
        while pool:
            feed = pool.pop()
            if not feed.closed:
                return feed
        loop = asyncio.get_running_loop()
        _, feed = await loop.create_connection(lambda: _Feed(address), *address)
        return feed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if scope["method"] != "POST" or not path.startswith("/v1/"):
            code = 200 if path == "/health" else 404
            await send({"type": "http.response.start", "status": code, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        feed = await self._feed(next(self._next))
        feed.start(path.encode(), b"".join(chunks))
        if not await feed.wait_headers():
            await send({"type": "http.response.start", "status": 502, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": feed.status, "headers": headers})
        while (data := await feed.next()) is not None:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        if feed.done and not feed.closed:
            self.idle[feed.address].append(feed)
        elif feed.transport is not None:
            feed.transport.close()


def _serve_asgi(host: str, port: int, upstreams: Sequence[Address]) -> None:
    import uvicorn

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(address)
    sock.listen(4096)
    sock.setblocking(False)
    config = uvicorn.Config(
        AsgiRelay(upstreams),
        http="httptools",
        lifespan="on",
        access_log=False,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
    server = uvicorn.Server(config)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        asyncio.run(server.serve(sockets=[sock]))
        return
    uvloop.run(server.serve(sockets=[sock]))


def _address(url: str) -> Address:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"expected http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port


def main(argv: Sequence[str] | None = None) -> None:
    p = FlagParser(
        prog="python -m dynspec.bench.overhead_floor", description=__doc__.split("\n")[0]
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument("--upstream", action="append", required=True, help="http://HOST:PORT (repeat)")
    p.add_argument(
        "--mode",
        default="protocol",
        choices=("protocol", "asgi"),
        help="protocol: no ASGI server at all; asgi: uvicorn and a bare ASGI app, raw upstream "
        "connections",
    )
    add_log_level(p)
    args = p.parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> None:
        if args.mode == "asgi":
            _serve_asgi(args.host, args.port, [_address(u) for u in args.upstream])
            return
        relay = Relay([_address(u) for u in args.upstream])

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            server = await loop.create_server(
                lambda: _Client(relay), args.host, args.port, backlog=4096
            )
            try:
                await stop.wait()
            finally:
                server.close()

        try:
            import uvloop
        except ImportError:  # pragma: no cover
            asyncio.run(serve())
            return
        uvloop.run(serve())

    run_main("overhead_floor", body, args.log_level)


if __name__ == "__main__":
    main()
