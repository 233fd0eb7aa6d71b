"""The floor: the cheapest streaming relay Python can be, as a reference row for the overhead bench.

Not a router: no policy, no validation, no metrics, no timeouts, round-robin over its upstreams.
It shows what relaying costs when nothing runs per chunk but the event loop, the parsers (C) and
two syscalls: client side, httptools' request parser on a bare asyncio protocol; upstream side, a
keep-alive pool of raw connections with httptools' response parser whose body callback frames each
piece and writes it straight to the client's transport. No task, future or coroutine per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import socket
from collections.abc import Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

from dynspec.router.entry import FlagParser, add_log_level, configure_logging, run_main

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
    add_log_level(p)
    args = p.parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> None:
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
