"""The streaming relay: a bare ASGI handler for the generation paths (``request.PROXY_PATHS``:
POST /v1/chat/completions, /v1/completions, /v1/responses and SGLang's native /generate).

Why bare ASGI and our own client (the retired ``dynspec-bench overhead``, docs/benchmarks.md):
FastAPI's response machinery costs a third of the throughput at 256 concurrent streams, httpx's
transport collapses at that load, and aiohttp's reader cost ~15 us of a relayed chunk's CPU, so the
hot path skips all three. One shared ``upstream.Client`` (made with the app's runtime) talks to the
servers over keep-alive connections; upstream bytes go to the client as they arrive.

This module holds intake, failover, what a timeout answers and the two drivers that move a
response's bytes: through ASGI ``send``, or, when the server is ours (``downstream.RelayProtocol``),
from the upstream connection's parser callback straight to the client's socket, so the request's
task wakes once per response rather than once per chunk. What happens to the bytes on the way
(TTFT, usage, dropping the usage event we asked for) is the response's ``relayfilter``; the read
timeout is ``watchdog.py``'s, which the drivers feed by counting each chunk.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from dynspec.router.downstream import ABORT, RAW_BODY, RawBody
from dynspec.router.errors import (
    BadGateway,
    GatewayTimeout,
    NoServer,
    PayloadTooLarge,
    RouterError,
    Unauthorized,
    send_error,
)
from dynspec.router.metrics import CLIENT_CLOSED, RouterMetrics
from dynspec.router.pool import Lease, Pools
from dynspec.router.relayfilter import RelayFilter, relay_filter
from dynspec.router.request import (
    BACKEND_HEADER,
    DROP_REQUEST,
    DROP_RESPONSE,
    PROXY_PATHS,
    check_media_type,
    prepare,
    read_body,
)
from dynspec.router.server import Server
from dynspec.router.upstream import Client, ConnectError, NoAnswer, Response, UpstreamError
from dynspec.router.watchdog import Watchdog, Watched

logger = logging.getLogger(__name__)

# Called once per request that ended with 200: (server URL, the server's mean in-flight count over
# the request's stay, the stay in seconds (``Lease.stay``: routed to released), output tokens or
# None, whether nothing else ran on its GPUs meanwhile, ``Lease.alone``).
FinishHook = Callable[[str, float, float, "int | None", bool], None]


class _Request(Watched):
    """One request's state, kept outside the coroutine so a cancellation cannot lose it."""

    __slots__ = (
        "abort",
        "body",
        "client_gone",
        "code",
        "delay",
        "filter",
        "headers",
        "lease",
        "path",
        "raw",
        "rid",
        "start",
        "started",
        "stream",
        "strip",
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
        super().__init__()
        self.lease = lease
        self.rid = rid
        self.path = path
        self.body = body
        self.headers = headers
        self.start = start
        self.stream = False
        self.strip = False
        self.code = 0
        # What the response's body is run through, and where TTFT and usage end up.
        self.filter: RelayFilter | None = None
        # Seconds from the arrival to the request's last byte sent to the server that answered.
        self.delay: float | None = None
        self.client_gone = False
        # Set once the response's start went to the client: from then on, no error status.
        self.started = False
        self.raw: RawBody | None = None
        # Ends the client's connection without a proper end (downstream.ABORT); None under
        # another server, where returning mid-response does the same.
        self.abort: Callable[[], None] | None = None


class Proxy:
    def __init__(
        self,
        pools: Pools,
        metrics: RouterMetrics,
        client: Client,
        *,
        api_auth: bytes | None,
        backend_headers: bytes,
        max_body_bytes: int,
        request_timeout: float,
        on_refused: Callable[[Server], None] | None = None,
        on_finish: FinishHook | None = None,
    ) -> None:
        self.pools = pools
        self.metrics = metrics
        self.client = client
        self.max_body_bytes = max_body_bytes
        self.on_refused = on_refused
        self.on_finish = on_finish
        # 'Bearer KEY' as a client must send it (``RouterConfig.api_auth``); None: no key.
        self._api_auth = api_auth
        # Every request's own header lines: the body is validated JSON whatever the client
        # labelled it, and SGLang (FastAPI) wants it labelled so; no compression, the relay
        # looks at bytes.
        self._fixed_headers = (
            b"content-type: application/json\r\naccept-encoding: identity\r\n" + backend_headers
        )
        self.request_timeout = request_timeout
        self._watchdog = Watchdog(request_timeout)
        self._active = self._watchdog.active
        self._ids = itertools.count(1)

    def start(self) -> None:
        self._watchdog.start()

    async def stop(self) -> None:
        await self._watchdog.stop()

    # -- request side ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        endpoint = PROXY_PATHS[scope["path"]]
        auth: bytes | None = None
        length: bytes | None = None
        media: bytes | None = None
        rid: str | None = None
        lines: list[bytes] = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"content-length":
                length = value
            elif name == b"content-type":
                media = value
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
            check_media_type(media)
            body = await read_body(receive, length, self.max_body_bytes)
            if body is None:
                logger.debug("%s: client left while sending its body", rid)
                return
            body, stream, strip = prepare(body, endpoint)
            lease = self.pools.acquire()
        except RouterError as exc:
            extra = [(b"connection", b"close")] if isinstance(exc, PayloadTooLarge) else None
            logger.debug("%s: %d %s", rid, exc.status, exc.message)
            await send_error(send, exc, extra)
            return
        req = _Request(lease, rid, path=scope["path"], body=body, headers=headers, start=start)
        req.stream = stream
        req.strip = strip
        extensions = scope.get("extensions")
        if extensions:
            if stream and RAW_BODY in extensions:
                req.raw = extensions[RAW_BODY]["body"]
            if ABORT in extensions:
                req.abort = extensions[ABORT]["abort"]
        await self._relay(req, receive, send)

    # -- upstream side -----------------------------------------------------------------------------

    async def _open(self, req: _Request) -> Response:
        """POST to the chosen server. A server that cannot be reached, or that closes the
        connection before any byte of its answer (it died with the request), gets the request
        moved once to another server: the client has seen nothing yet, and generation has no
        side effect a second server could repeat."""
        client = self.client
        path = req.path.encode()
        tried: set[str] = set()
        while True:
            server = req.lease.server
            head = client.head(server.url, b"POST", path, req.headers, len(req.body))
            try:
                return await client.request(server.url, head + req.body)
            except ConnectError as exc:
                self.metrics.upstream_error(server.pool, "connect")
                logger.warning("%s: cannot reach %s: %s", req.rid, server.url, exc)
                if exc.refused and self.on_refused is not None:
                    self.on_refused(server)
                failure = "cannot be reached"
            except NoAnswer:
                self.metrics.upstream_error(server.pool, "protocol")
                logger.warning(
                    "%s: %s closed the connection without answering", req.rid, server.url
                )
                failure = "closed the connection without answering"
            except UpstreamError as exc:
                self.metrics.upstream_error(server.pool, "protocol")
                logger.warning("%s: %s failed before answering: %s", req.rid, server.url, exc)
                raise BadGateway("the server broke the exchange before answering") from None
            tried.add(server.url)
            if len(tried) > 1:
                raise BadGateway(
                    f"no server could take the request: the last one tried, {server.url}, {failure}"
                )
            req.lease.release()
            try:
                # The load does not grow: the request is moving, not arriving again.
                req.lease = self.pools.acquire(frozenset(tried), limit=False)
            except NoServer:
                raise BadGateway(
                    f"the server {server.url} {failure} and no other can take the request"
                ) from None

    async def _relay(self, req: _Request, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            # The body is read; the next message is the disconnect (or the response's end).
            while (await receive())["type"] != "http.disconnect":
                pass
            if not req.finished:
                req.client_gone = True
                task.cancel()

        req.task = task
        self._active.add(req)
        watcher = asyncio.create_task(watch())
        try:
            await self._respond(req, send)
        except asyncio.CancelledError:
            if not (req.client_gone or req.timed_out):
                raise
            # Our own cancellation, from the disconnect watcher or the timeout watchdog.
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                uncancel()
            if req.client_gone:
                req.code = CLIENT_CLOSED
                self.metrics.client_disconnect(req.lease.pool)
                logger.debug("%s: client left, upstream request closed", req.rid)
            else:
                await self._timed_out(req, send)
        finally:
            req.finished = True
            self._active.discard(req)
            if not watcher.done():
                watcher.cancel()
            lease = req.lease
            lease.release()
            duration = time.perf_counter() - req.start
            filt = req.filter
            prompt_tokens, output_tokens = filt.usage if filt is not None else (None, None)
            ttft = filt.ttft if filt is not None else None
            if filt is not None and filt.bad_usage:
                self.metrics.upstream_error(lease.pool, "protocol")
                logger.warning(
                    "%s: %s sent a token count that is not one (ignored)", req.rid, lease.server.url
                )
            self.metrics.finished(
                lease.pool,
                req.code,
                duration=duration,
                ttft=ttft,
                delay=req.delay,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
            )
            if req.code == 200 and self.on_finish is not None:
                mean, alone = lease.mean_in_flight, lease.alone
                self.on_finish(lease.server.url, mean, lease.stay, output_tokens, alone)
            how = " (direct)" if req.raw is not None else ""
            logger.debug("%s: %s %d via %s%s", req.rid, lease.pool, req.code, lease.server.url, how)

    async def _timed_out(self, req: _Request, send: Send) -> None:
        self.metrics.upstream_error(req.lease.pool, "timeout")
        logger.warning(
            "%s: %s sent nothing for %gs", req.rid, req.lease.server.url, self.request_timeout
        )
        if req.started:
            # Mid-response: end the connection without a proper end (see _respond).
            if req.abort is not None:
                req.abort()
            return
        req.code = GatewayTimeout.status
        exc = GatewayTimeout("the server did not answer in time")
        await send_error(send, exc, [BACKEND_HEADER[req.lease.pool]])

    async def _respond(self, req: _Request, send: Send) -> None:
        try:
            resp = await self._open(req)
        except RouterError as exc:
            req.code = exc.status
            await send_error(send, exc, [BACKEND_HEADER[req.lease.pool]])
            return
        pool = req.lease.pool
        req.delay = resp.sent - req.start
        req.progress += 1
        try:
            req.code = resp.status
            if resp.status >= 500:
                self.metrics.upstream_error(pool, "status")
            sse = req.stream and resp.status == 200 and resp.content_type == b"text/event-stream"
            strip = req.strip and sse
            out: list[tuple[bytes, bytes]] = [BACKEND_HEADER[pool]]
            for name, value in resp.headers:
                lname = name.lower()
                if lname in DROP_RESPONSE or (strip and lname == b"content-length"):
                    continue
                out.append((lname, value))
            req.started = True
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            filt = req.filter = relay_filter(
                req.start, status=resp.status, event_stream=sse, strip=strip
            )
            raw = req.raw = req.raw if sse and req.raw is not None and req.raw.usable() else None
            try:
                if raw is not None:
                    await self._relay_direct(req, filt, resp, raw, send)
                else:
                    await self._relay_asgi(req, filt, resp, send)
            except UpstreamError as exc:
                # The server failed mid-response: end the client's connection without a proper
                # end, so it sees a broken response, not a short one that looks complete.
                self.metrics.upstream_error(pool, "protocol")
                logger.warning("%s: %s failed mid-response: %s", req.rid, req.lease.server.url, exc)
                if req.abort is not None:
                    req.abort()
        finally:
            # An unfinished response closes its connection (not back to the pool), which is how
            # SGLang learns that the request was abandoned and aborts it.
            resp.release()

    # The two drivers move the bytes; the request's filter decides what they are. Each sends the
    # response's end itself: when the server's last bytes and its end arrive together (the usual
    # case), the client gets both in one write.

    @staticmethod
    async def _relay_asgi(req: _Request, filt: RelayFilter, resp: Response, send: Send) -> None:
        feed = filt.feed
        read = resp.read
        at_eof = resp.at_eof
        while True:
            data = await read()
            req.progress += 1
            if not data or at_eof():
                data = filt.finish(data)
                req.finished = True
                await send({"type": "http.response.body", "body": data, "more_body": False})
                return
            data = feed(data)
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})

    @staticmethod
    async def _relay_direct(
        req: _Request, filt: RelayFilter, resp: Response, raw: RawBody, send: Send
    ) -> None:
        """The upstream connection runs the filter and the write as each piece arrives (see
        downstream.py); the task waits for the end, or for a full client socket."""
        feed = filt.feed
        write = raw.write

        def sink(data: bytes) -> None:
            req.progress += 1
            data = feed(data)
            if data:
                write(data)

        resp.stream_to(sink, raw.flush)
        while not await resp.wait():
            await raw.drain()
            resp.unhold()
        data = filt.finish()
        req.finished = True
        await send({"type": "http.response.body", "body": data, "more_body": False})
