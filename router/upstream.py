"""The router's HTTP/1.1 client: asyncio protocol connections, httptools, a keep-alive pool.

Why not aiohttp (measured with ``dynspec-bench overhead``, retired: docs/benchmarks.md): its reader
costs about 15 us of a relayed chunk's CPU, more than half of the 25 us budget, through layers the
relay does not use (a ``StreamReader`` with its own buffering and timers, response objects, cookie
and redirect logic). Here a body piece goes from ``data_received`` through httptools' C parser
either into a list, waking the one task that ``read``s it at most once per ``data_received``, or,
for the relay's streams, straight into a callback (``stream_to``) that forwards it on the spot;
nothing else runs per chunk.

What it does: one request at a time per connection (no pipelining); request head and body written
in one ``transport.write``; TCP_NODELAY on every connection; responses framed by content-length,
chunked encoding, or the connection's end; a per-server pool of idle connections, newest first,
dropped after ``idle_timeout`` (below the server's keep-alive, so the server never closes one
under a request) or as soon as the server closes it. A reused connection that the server closed
just as the request went out (nothing of a response came back) is retried once on a fresh one.
When the reader falls behind, the connection stops reading from the socket (``pause_reading``)
until it catches up, so a slow client holds back the server instead of filling memory here.

Timeouts: connect only. Waiting for the first byte and between chunks is the relay's watchdog
(see ``watchdog.py``), which cancels the reading task; a cancelled response closes its connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

# Pause reading from the server when this much response body waits for the reader.
HIGH_WATER = 256 * 1024
# Idle connections close after this long, below uvicorn's 5 s keep-alive (SGLang's server), so
# the server does not close a pooled connection under a request.
IDLE_TIMEOUT = 4.0
# A response with neither header ends when the server closes the connection.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class UpstreamError(Exception):
    """The server could not be reached, or broke the exchange."""


class ConnectError(UpstreamError):
    """No connection: refused, unreachable, or not made within the connect timeout."""

    def __init__(self, message: str, *, refused: bool = False, timeout: bool = False) -> None:
        super().__init__(message)
        self.refused = refused
        self.timeout = timeout


class ProtocolError(UpstreamError):
    """The connection ended (or sent garbage) before the response was complete."""


class NoAnswer(ProtocolError):
    """A fresh connection closed before any byte of the response (the server died, or was
    killed, with the request sent or being sent): nothing of it reached the client, so the
    request may go to another server."""


class _Stale(Exception):
    """A reused connection closed before any byte of the response: safe to send again."""


Headers = list[tuple[bytes, bytes]]


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The TLS settings for https servers: the system's trust store, or ``ca_file`` (PEM) in its
    place; certificates and host names are always verified. Raises ``OSError`` or
    ``ssl.SSLError`` for a file that cannot be read or holds no certificate."""
    return ssl.create_default_context(cafile=ca_file)


class Origin:
    """One server as the client sees it: its address, path prefix, Host header, TLS settings
    and idle connections."""

    __slots__ = ("host", "host_header", "idle", "port", "prefix", "tls", "url")

    def __init__(self, url: str, tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) server URL: {url!r}")
        https = parts.scheme == "https"
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or (443 if https else 80)
        self.host_header = parts.netloc.rpartition("@")[2].encode("latin-1")
        # A server behind a path (``http://host/sglang``) gets it before every request's path.
        self.prefix = parts.path.rstrip("/").encode("latin-1")
        self.tls = (tls or tls_context()) if https else None
        self.idle: collections.deque[Connection] = collections.deque()


class Connection(asyncio.Protocol):
    """One TCP connection and the response it is reading (if any)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._loop = asyncio.get_running_loop()
        self._reset()

    def _reset(self) -> None:
        self.busy = False
        self.began = False  # any byte of the current response seen
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.status = 0
        self.headers: Headers = []
        self.pieces: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.held = False
        self.error: Exception | None = None
        self.until_close = False
        # When set, body pieces go to it as they arrive instead of waiting for ``read``.
        self.sink: Callable[[bytes], None] | None = None
        # Called once after each read's pieces went to the sink; False holds the connection.
        self.flush: Callable[[], bool] | None = None
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.busy or self.complete:
            return
        if self.until_close and self.headers_done:
            # A body framed by the connection's end: this is its end.
            self.complete = True
        elif not self.began:
            self.error = _Stale()
        else:
            reason = f": {exc}" if exc else ""
            self.error = ProtocolError(f"the server closed the connection mid-response{reason}")
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            # Nothing was asked: a server talking out of turn is not to be trusted with more.
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.error = ProtocolError("the server switched protocols")
            self.close()
            self._wake()
        except httptools.HttpParserError as exc:
            self.error = ProtocolError(f"invalid response from the server: {exc}")
            self.close()
            self._wake()
        flush = self.flush
        if flush is not None and not flush():
            self.hold()

    def hold(self) -> None:
        self.held = True
        self.pause()
        self._wake()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    def raise_if_broken(self) -> None:
        """Raise ``ProtocolError`` if the response broke before it completed."""
        error = self.error
        if error is not None:
            raise error if isinstance(error, ProtocolError) else ProtocolError(str(error))
        if self.closed:
            raise ProtocolError("the server closed the connection mid-response")

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost decides what the end meant

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.began = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:
            return  # an interim response (100 Continue): the real one follows
        self.headers_done = True
        if self.status not in (204, 304):
            self.until_close = not any(name.lower() in _FRAMING for name, _ in self.headers)
        self._wake()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            sink(body)
            return
        self.pieces.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER:
            self.pause()
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self.status < 200:
            self.headers = []
            return
        self.complete = True
        # Asked now: once the callback returns, the parser has reset for the next message.
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # -- the reading side --------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait_event(self) -> None:
        """Until the parser reports something: the head, a body piece, the end, or a break."""
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def send(self, data: bytes) -> None:
        self._reset()
        self.busy = True
        assert self.transport is not None
        self.transport.write(data)

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise ProtocolError("the server closed the connection")
            await self.wait_event()

    def detach(self) -> None:
        """The response is over for its reader: no sink, and not busy."""
        self.sink = self.flush = None
        self.busy = False

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """A response being read; ``read`` until it returns b"", then ``release`` (or ``close``)."""

    __slots__ = ("_client", "_conn", "_origin", "headers", "sent", "status")

    def __init__(self, client: Client, origin: Origin, conn: Connection, sent: float) -> None:
        self._client = client
        self._origin = origin
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers
        # When the request (its last byte too: one write) went to the socket, read just before
        # the write (``time.perf_counter``).
        self.sent = sent

    @property
    def connection(self) -> Connection:
        """The connection the response arrives on (to look at its state, not to drive it)."""
        return self._conn

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (``name`` in lower case)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def content_type(self) -> bytes:
        value = self.header(b"content-type") or b""
        return value.split(b";", 1)[0].strip().lower()

    async def read(self) -> bytes:
        """Everything received since the last read; b"" at the end. Raises ``ProtocolError``
        once the bytes that did arrive are handed out, if the response broke."""
        conn = self._conn
        while not conn.pieces:
            if conn.complete:
                return b""
            conn.raise_if_broken()
            await conn.wait_event()
        pieces = conn.pieces
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        conn.pieces = []
        conn.buffered = 0
        conn.resume()
        return data

    def stream_to(self, sink: Callable[[bytes], None], flush: Callable[[], bool]) -> None:
        """Hand every body piece to ``sink`` from now on, starting with those already here,
        instead of ``read``; ``flush`` runs once after the pieces of each socket read (so a
        burst goes on in one write) and returns False to ``hold`` the connection. Both run
        inside the connection's ``data_received`` and must not raise. ``wait`` for the end."""
        conn = self._conn
        pieces = conn.pieces
        conn.pieces = []
        conn.buffered = 0
        for piece in pieces:
            sink(piece)
        conn.sink = sink
        conn.flush = flush
        if not flush():
            conn.hold()
        elif not conn.held:
            conn.resume()

    def hold(self) -> None:
        """Stop reading from the server (the reader cannot take more) and wake ``wait``."""
        self._conn.hold()

    def unhold(self) -> None:
        conn = self._conn
        conn.held = False
        conn.resume()

    async def wait(self) -> bool:
        """With a sink: until the body is complete (True) or the sink held the connection
        (False). Raises ``ProtocolError`` if the response broke."""
        conn = self._conn
        while True:
            if conn.held:
                return False
            if conn.complete:
                return True
            conn.raise_if_broken()
            await conn.wait_event()

    def at_eof(self) -> bool:
        """All of the body was received and read."""
        conn = self._conn
        return conn.complete and not conn.pieces

    async def body(self) -> bytes:
        chunks: list[bytes] = []
        while data := await self.read():
            chunks.append(data)
        return b"".join(chunks)

    def release(self) -> None:
        """Back to the pool if the response was read whole and the connection may stay open,
        else closed. Safe to call twice."""
        conn = self._conn
        if conn.busy and self.at_eof() and not conn.closed and conn.keep_alive:
            self._client.reuse(self._origin, conn)
        elif conn.busy:
            self.close()

    def close(self) -> None:
        """Drop the connection: the server sees the request abandoned."""
        conn = self._conn
        conn.detach()
        conn.close()


class Client:
    """Requests to the servers over pooled keep-alive connections."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        idle_timeout: float = IDLE_TIMEOUT,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        # For https servers; None: the system's trust store, made on the first https server.
        self.tls = tls
        self._origins: dict[str, Origin] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    def origin(self, url: str) -> Origin:
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = Origin(url, self.tls)
        return origin

    def head(
        self, url: str, method: bytes, path: bytes, headers: bytes, length: int | None
    ) -> bytes:
        """A request's head: ``headers`` are whole ``name: value\\r\\n`` lines."""
        origin = self.origin(url)
        size = b"" if length is None else b"content-length: %d\r\n" % length
        return b"%s %s%s HTTP/1.1\r\nhost: %s\r\n%s%s\r\n" % (
            method,
            origin.prefix,
            path,
            origin.host_header,
            headers,
            size,
        )

    async def request(self, url: str, data: bytes) -> Response:
        """Send ``data`` (a whole request: ``head`` + body) to the server at ``url`` and wait for
        the response's head. Raises ``ConnectError`` before anything was sent, ``ProtocolError``
        after; on cancellation the connection is closed."""
        origin = self.origin(url)
        conn = self._take(origin)
        if conn is not None:
            try:
                return await self._send_on(origin, conn, data)
            except _Stale:
                pass  # the server closed it as we sent: once more, on a fresh connection
        conn = await self._connect(origin)
        try:
            return await self._send_on(origin, conn, data)
        except _Stale:
            raise NoAnswer("the server closed the connection without answering") from None

    async def get(self, url: str, path: str, headers: bytes = b"") -> tuple[int, bytes]:
        """A whole GET: (status, body). For health checks and the model list, not the relay."""
        resp, body = await self.fetch(url, b"GET", path, headers)
        return resp.status, body

    async def fetch(
        self, url: str, method: bytes, path: str, headers: bytes = b"", body: bytes | None = None
    ) -> tuple[Response, bytes]:
        """A whole exchange, the response read to its end (and its connection released): for
        small answers, not the relay. ``body`` None sends no content-length (a GET)."""
        length = None if body is None else len(body)
        data = self.head(url, method, path.encode("latin-1"), headers, length)
        resp = await self.request(url, data + (body or b""))
        try:
            answer = await resp.body()
        except BaseException:
            resp.close()
            raise
        resp.release()
        return resp, answer

    async def _send_on(self, origin: Origin, conn: Connection, data: bytes) -> Response:
        # Read before the write, not after: the write wakes the server, which on a busy machine
        # could otherwise start its own clock before this one stopped (the router's share of
        # TTFT, ``Response.sent``, overlapping the server's).
        sent = time.perf_counter()
        try:
            conn.send(data)
            await conn.wait_headers()
        except BaseException:
            conn.detach()
            conn.close()
            raise
        return Response(self, origin, conn, sent)

    def _take(self, origin: Origin) -> Connection | None:
        idle = origin.idle
        deadline = time.monotonic() - self.idle_timeout
        while idle:
            conn = idle.pop()
            if conn.closed or conn.idle_since < deadline:
                conn.close()
                continue
            return conn
        return None

    async def _connect(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        where = f"{origin.host}:{origin.port}"
        tls = origin.tls
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    Connection,
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls is not None else None,
                ),
                self.connect_timeout,
            )
        except asyncio.TimeoutError:
            raise ConnectError(
                f"no connection to {where} within {self.connect_timeout:g}s", timeout=True
            ) from None
        except ConnectionRefusedError as exc:
            raise ConnectError(f"{where} refused the connection: {exc}", refused=True) from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {where}: {exc}") from None
        return conn

    # -- idle connections --------------------------------------------------------------------------

    def reuse(self, origin: Origin, conn: Connection) -> None:
        """Pool a connection whose response was read whole and that may stay open."""
        conn.detach()
        conn.idle_since = time.monotonic()
        origin.idle.append(conn)
        self._sweep_later()

    def _sweep_later(self) -> None:
        if self._sweep is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(self.idle_timeout / 2, self._sweep_idle)

    def _sweep_idle(self) -> None:
        self._sweep = None
        deadline = time.monotonic() - self.idle_timeout
        left = False
        for origin in self._origins.values():
            idle = origin.idle
            # Oldest first: stop at the first one still fresh.
            while idle and (idle[0].closed or idle[0].idle_since < deadline):
                idle.popleft().close()
            left = left or bool(idle)
        if left:
            self._sweep_later()

    def close(self) -> None:
        """Close the idle connections (responses being read close with their relays)."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().close()
