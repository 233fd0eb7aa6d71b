"""The streaming relay: a bare ASGI handler for POST /v1/chat/completions and /v1/completions.

Why bare ASGI and our own client (issue 3's table, shared/notes/proxy-hot-path.md, issue 7):
FastAPI's response machinery costs a third of the throughput at 256 concurrent streams, httpx's
transport collapses at that load, and aiohttp's reader cost ~15 us of a relayed chunk's CPU, so
the hot path skips all three. One shared ``upstream.Client`` (made in the app's lifespan) talks to
the servers over keep-alive connections; upstream bytes go to the client as they arrive.

Per chunk the relay does no JSON parsing and no logging. It looks at bytes only where needed:
- until the first token is seen, a regex finds a non-empty ``content``/``text`` (the TTFT);
- when it asked the server for usage on the client's behalf, it forwards whole SSE events only
  (a chunk is cut after its last blank line and the rest waits for the next read), and the few
  events that contain ``"choices":[]`` are parsed and the usage-only one is dropped.

A streamed response's chunks skip ASGI when the server is ours (``downstream.RelayProtocol``):
the upstream connection's parser callback runs the relay's per-chunk step and writes the chunk to
the client's socket, so the request's task wakes once per response rather than once per chunk.

The read timeout (``--request-timeout``: to the first byte, then between chunks) is a watchdog
task that looks at every exchange a few times per timeout, not a per-read timer: aiohttp's
``sock_read`` cancelled and re-armed one on every chunk received, measured at ~6 us a chunk under
uvloop, a fifth of the relay's whole budget. A chunk here costs one integer increment.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from dynspec.router.downstream import RAW_BODY, RawBody
from dynspec.router.errors import (
    BadGateway,
    GatewayTimeout,
    NoServer,
    PayloadTooLarge,
    RouterError,
    Unauthorized,
)
from dynspec.router.metrics import CLIENT_CLOSED, RouterMetrics
from dynspec.router.pool import Lease, Pools
from dynspec.router.request import DROP_REQUEST, DROP_RESPONSE, PROXY_PATHS, prepare, read_body
from dynspec.router.sse import (
    Usage,
    has_token,
    may_hold_usage_event,
    strip_usage_events,
    usage_in,
)
from dynspec.router.upstream import Client, ConnectError, Response, UpstreamError

logger = logging.getLogger(__name__)

_BACKEND = {
    "eagle": (b"x-dynspec-backend", b"eagle"),
    "baseline": (b"x-dynspec-backend", b"baseline"),
}

# An incomplete SSE event longer than this is forwarded as it is (no framing to wait for).
_MAX_CARRY = 1 << 20
# Non-streamed bodies are kept up to this size to read their usage.
_MAX_USAGE_SCAN = 1 << 20


async def send_error(
    send: Send, exc: RouterError, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = exc.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *exc.headers(),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Exchange:
    """One request's state, kept outside the coroutine so a cancellation cannot lose it."""

    __slots__ = (
        "body",
        "client_gone",
        "code",
        "finished",
        "headers",
        "lease",
        "output_tokens",
        "path",
        "progress",
        "prompt_tokens",
        "raw",
        "rid",
        "seen",
        "seen_at",
        "start",
        "started",
        "stream",
        "strip",
        "task",
        "timed_out",
        "ttft",
    )

    def __init__(
        self,
        lease: Lease,
        rid: str,
        *,
        path: str,
        body: bytes,
        headers: bytes,
        start: float,
    ) -> None:
        self.lease = lease
        self.rid = rid
        self.path = path
        self.body = body
        self.headers = headers
        self.start = start
        self.stream = False
        self.strip = False
        self.code = 0
        self.ttft: float | None = None
        self.prompt_tokens: int | None = None
        self.output_tokens: int | None = None
        self.finished = False
        self.client_gone = False
        # Set once the response's start went to the client: from then on, no error status.
        self.started = False
        # The watchdog's view: ``progress`` grows with every chunk; it compares it with what it
        # saw last (``seen``) and since when (``seen_at``, monotonic seconds).
        self.progress = 0
        self.seen = 0
        self.seen_at = time.monotonic()
        self.timed_out = False
        self.task: asyncio.Task[Any] | None = None
        self.raw: RawBody | None = None


class Proxy:
    def __init__(
        self,
        pools: Pools,
        metrics: RouterMetrics,
        *,
        api_key: str | None,
        backend_api_key: str | None,
        max_body_bytes: int,
        request_timeout: float,
        connect_timeout: float,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.pools = pools
        self.metrics = metrics
        self.client: Client | None = None
        self.max_body_bytes = max_body_bytes
        self.on_refused = on_refused
        self._api_auth = ("Bearer " + api_key).encode() if api_key else None
        # Every request's own header lines: the body is validated JSON whatever the client
        # labelled it, and SGLang (FastAPI) wants it labelled so; no compression, the relay
        # looks at bytes.
        self._fixed_headers = b"content-type: application/json\r\naccept-encoding: identity\r\n"
        if backend_api_key:
            self._fixed_headers += b"authorization: Bearer %s\r\n" % backend_api_key.encode()
        self.request_timeout = request_timeout
        self._active: set[_Exchange] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)

    # -- read timeout ------------------------------------------------------------------------------

    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch_timeouts())

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None

    async def _watch_timeouts(self) -> None:
        timeout = self.request_timeout
        tick = min(1.0, timeout / 4)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for ex in list(self._active):
                if ex.progress != ex.seen:
                    ex.seen = ex.progress
                    ex.seen_at = now
                elif now - ex.seen_at >= timeout and not (ex.finished or ex.timed_out):
                    ex.timed_out = True
                    if ex.task is not None:
                        ex.task.cancel()

    # -- request side ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        required = PROXY_PATHS[scope["path"]]
        auth: bytes | None = None
        length: bytes | None = None
        rid: str | None = None
        lines: list[bytes] = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"content-length":
                length = value
            elif name == b"x-request-id":
                rid = value.decode("latin-1")
            if name not in DROP_REQUEST:
                # Parsed by httptools: no CR or LF can hide in a name or a value.
                lines += (name, b": ", value, b"\r\n")
        lines.append(self._fixed_headers)
        headers = b"".join(lines)
        if rid is None:
            rid = f"r{next(self._ids)}"
        try:
            if self._api_auth is not None and (
                auth is None or not hmac.compare_digest(auth, self._api_auth)
            ):
                raise Unauthorized("missing or wrong API key")
            body = await read_body(receive, length, self.max_body_bytes)
            if body is None:
                logger.debug("%s: client left while sending its body", rid)
                return
            body, stream, strip = prepare(body, required)
            lease = self.pools.acquire()
        except RouterError as exc:
            extra = [(b"connection", b"close")] if isinstance(exc, PayloadTooLarge) else None
            logger.debug("%s: %d %s", rid, exc.status, exc.message)
            await send_error(send, exc, extra)
            return
        ex = _Exchange(lease, rid, path=scope["path"], body=body, headers=headers, start=start)
        ex.stream = stream
        ex.strip = strip
        extensions = scope.get("extensions")
        if stream and extensions and RAW_BODY in extensions:
            ex.raw = extensions[RAW_BODY]["body"]
        await self._relay(ex, receive, send)

    # -- upstream side -----------------------------------------------------------------------------

    async def _open(self, ex: _Exchange) -> Response:
        """POST to the chosen server; a connect failure is retried once on another server."""
        client = self.client
        assert client is not None, "the proxy runs inside the app's lifespan"
        path = ex.path.encode()
        tried: set[str] = set()
        while True:
            server = ex.lease.server
            head = client.head(server.url, b"POST", path, ex.headers, len(ex.body))
            try:
                return await client.request(server.url, head + ex.body)
            except ConnectError as exc:
                self.metrics.upstream_error(server.pool, "connect")
                logger.warning("%s: cannot reach %s: %s", ex.rid, server.url, exc)
                if exc.refused and self.on_refused is not None:
                    self.on_refused(server.url)
                tried.add(server.url)
                if len(tried) > 1:
                    raise BadGateway("no server could be reached") from None
                ex.lease.release()
                try:
                    # Same load as before: the request is moving, not arriving again.
                    ex.lease = self.pools.acquire(frozenset(tried), limit=False)
                except NoServer:
                    raise BadGateway(
                        f"the server {server.url} cannot be reached and no other can take "
                        "the request"
                    ) from None
            except UpstreamError as exc:
                self.metrics.upstream_error(server.pool, "protocol")
                logger.warning("%s: %s failed before answering: %s", ex.rid, server.url, exc)
                raise BadGateway("the server closed the connection without answering") from None

    async def _relay(self, ex: _Exchange, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            # The body is read; the next message is the disconnect (or the response's end).
            while (await receive())["type"] != "http.disconnect":
                pass
            if not ex.finished:
                ex.client_gone = True
                task.cancel()

        ex.task = task
        self._active.add(ex)
        watcher = asyncio.create_task(watch())
        try:
            await self._exchange(ex, send)
        except asyncio.CancelledError:
            if not (ex.client_gone or ex.timed_out):
                raise
            # Our own cancellation, from the disconnect watcher or the timeout watchdog.
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                uncancel()
            if ex.client_gone:
                ex.code = CLIENT_CLOSED
                self.metrics.client_disconnect(ex.lease.pool)
                logger.debug("%s: client left, upstream request closed", ex.rid)
            else:
                await self._timed_out(ex, send)
        finally:
            ex.finished = True
            self._active.discard(ex)
            if not watcher.done():
                watcher.cancel()
            ex.lease.release()
            self.metrics.finished(
                ex.lease.pool,
                ex.code,
                duration=time.perf_counter() - ex.start,
                ttft=ex.ttft,
                prompt_tokens=ex.prompt_tokens,
                output_tokens=ex.output_tokens,
            )
            logger.debug(
                "%s: %s %d via %s%s",
                ex.rid,
                ex.lease.pool,
                ex.code,
                ex.lease.server.url,
                " (direct)" if ex.raw is not None else "",
            )

    async def _timed_out(self, ex: _Exchange, send: Send) -> None:
        self.metrics.upstream_error(ex.lease.pool, "timeout")
        logger.warning(
            "%s: %s sent nothing for %gs", ex.rid, ex.lease.server.url, self.request_timeout
        )
        if ex.started:
            # Mid-response: end the connection without a proper end (see _exchange).
            return
        ex.code = GatewayTimeout.status
        exc = GatewayTimeout("the server did not answer in time")
        await send_error(send, exc, [_BACKEND[ex.lease.pool]])

    async def _exchange(self, ex: _Exchange, send: Send) -> None:
        try:
            resp = await self._open(ex)
        except RouterError as exc:
            ex.code = exc.status
            await send_error(send, exc, [_BACKEND[ex.lease.pool]])
            return
        pool = ex.lease.pool
        ex.progress += 1
        try:
            ex.code = resp.status
            if resp.status >= 500:
                self.metrics.upstream_error(pool, "status")
            sse = ex.stream and resp.status == 200 and resp.content_type == b"text/event-stream"
            strip = ex.strip and sse
            out: list[tuple[bytes, bytes]] = [_BACKEND[pool]]
            for name, value in resp.headers:
                lname = name.lower()
                if lname in DROP_RESPONSE or (strip and lname == b"content-length"):
                    continue
                out.append((lname, value))
            ex.started = True
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            raw = ex.raw = ex.raw if sse and ex.raw is not None and ex.raw.usable() else None
            try:
                if raw is not None:
                    relay = self._relay_stripping_direct if strip else self._relay_stream_direct
                    ended = await relay(ex, resp, raw, send)
                elif strip:
                    ended = await self._relay_stripping(ex, resp, send)
                elif sse:
                    ended = await self._relay_stream(ex, resp, send)
                else:
                    ended = await self._relay_body(ex, resp, send)
            except UpstreamError as exc:
                # The server failed mid-response: end the client's connection without a proper
                # end, so it sees a broken response, not a short one that looks complete.
                self.metrics.upstream_error(pool, "protocol")
                logger.warning("%s: %s failed mid-response: %s", ex.rid, ex.lease.server.url, exc)
                return
            if not ended:
                ex.finished = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            # An unfinished response closes its connection (not back to the pool), which is how
            # SGLang learns that the request was abandoned and aborts it.
            resp.release()

    # Each relay returns True when it sent the response's end itself: when the server's last
    # bytes and its end arrive together (the usual case), the client gets both in one write.

    async def _relay_stream(self, ex: _Exchange, resp: Response, send: Send) -> bool:
        prev = last = b""
        while True:
            data = await resp.read()
            ex.progress += 1
            if not data:
                self._take_usage(ex, usage_in(prev + last))
                return False
            if ex.ttft is None and has_token(data):
                ex.ttft = time.perf_counter() - ex.start
            prev, last = last, data
            if resp.at_eof():
                self._take_usage(ex, usage_in(prev + last))
                ex.finished = True
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return True
            await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _relay_body(self, ex: _Exchange, resp: Response, send: Send) -> bool:
        kept: list[bytes] = []
        size = 0
        while True:
            data = await resp.read()
            ex.progress += 1
            eof = not data or resp.at_eof()
            if data and size < _MAX_USAGE_SCAN:
                kept.append(data)
                size += len(data)
            if eof and resp.status == 200:
                self._take_usage(ex, usage_in(b"".join(kept)))
            if not data:
                return False
            if eof:
                ex.finished = True
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return True
            await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _relay_stripping(self, ex: _Exchange, resp: Response, send: Send) -> bool:
        carry = b""
        while True:
            data = await resp.read()
            ex.progress += 1
            if not data:
                if carry:
                    await send({"type": "http.response.body", "body": carry, "more_body": True})
                return False
            eof = resp.at_eof()
            if carry:
                data = carry + data
                carry = b""
            if not eof:
                end = data.rfind(b"\n\n")
                if end == -1:
                    if len(data) < _MAX_CARRY:
                        carry = data
                        continue
                elif end + 2 < len(data):
                    carry = data[end + 2 :]
                    data = data[: end + 2]
            if may_hold_usage_event(data):
                data, usage = strip_usage_events(data)
                if usage is not None:
                    self._take_usage(ex, usage)
            if ex.ttft is None and has_token(data):
                ex.ttft = time.perf_counter() - ex.start
            if eof:
                ex.finished = True
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return True
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})

    # The direct relays: the same per-chunk steps as above, run by the upstream connection as each
    # piece arrives (see downstream.py). The task waits for the end, or for a full client socket.

    @staticmethod
    async def _stream_until_end(resp: Response, raw: RawBody) -> None:
        while not await resp.wait():
            await raw.drain()
            resp.unhold()

    async def _relay_stream_direct(
        self, ex: _Exchange, resp: Response, raw: RawBody, send: Send
    ) -> bool:
        start = ex.start
        prev = last = b""

        def sink(data: bytes) -> None:
            nonlocal prev, last
            ex.progress += 1
            if ex.ttft is None and has_token(data):
                ex.ttft = time.perf_counter() - start
            prev, last = last, data
            write(data)

        write = raw.write
        resp.stream_to(sink, raw.flush)
        await self._stream_until_end(resp, raw)
        self._take_usage(ex, usage_in(prev + last))
        ex.finished = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True

    async def _relay_stripping_direct(
        self, ex: _Exchange, resp: Response, raw: RawBody, send: Send
    ) -> bool:
        start = ex.start
        carry = b""

        def events(data: bytes) -> bytes:
            if may_hold_usage_event(data):
                data, usage = strip_usage_events(data)
                if usage is not None:
                    self._take_usage(ex, usage)
            if ex.ttft is None and has_token(data):
                ex.ttft = time.perf_counter() - start
            return data

        def sink(data: bytes) -> None:
            nonlocal carry
            ex.progress += 1
            if carry:
                data = carry + data
                carry = b""
            end = data.rfind(b"\n\n")
            if end == -1:
                if len(data) < _MAX_CARRY:
                    carry = data
                    return
            elif end + 2 < len(data):
                carry = data[end + 2 :]
                data = data[: end + 2]
            data = events(data)
            if data:
                write(data)

        write = raw.write
        resp.stream_to(sink, raw.flush)
        await self._stream_until_end(resp, raw)
        # What is left (an event the server did not end) goes out with the response's end.
        last = events(carry) if carry else b""
        ex.finished = True
        await send({"type": "http.response.body", "body": last, "more_body": False})
        return True

    @staticmethod
    def _take_usage(ex: _Exchange, usage: Usage) -> None:
        ex.prompt_tokens, ex.output_tokens = usage
