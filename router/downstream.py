"""The client side's one shortcut: the relay writes a streamed body's chunks to the socket itself.

Measured with ``dynspec-bench overhead`` (retired; its figures: docs/benchmarks.md, "Router
overhead on a mock upstream"): going through ASGI, every relayed chunk costs a task wake-up (the
relay's task waits for the next upstream piece) plus uvicorn's ``send``; together about a third of
the router's CPU per chunk. With this shortcut the upstream connection's parser callback frames
each piece and writes it to the client's transport on the spot; the relay's task wakes once per
response (its end, a break, or a client that stops reading), not once per chunk.

Only the body's middle takes the shortcut. The response's start and its end still go through
uvicorn's ``send``, so uvicorn's own state (chunked framing chosen, response complete, keep-alive,
``connection: close``) stays exactly what it would be without it. ``RelayProtocol`` is uvicorn's
httptools protocol with one addition: each request's scope carries a ``RawBody`` for its response
(``scope["extensions"]["dynspec.raw_body"]["body"]``). Under any other server the key is absent
and the relay sends every chunk through ASGI ``send``.

The same protocol guards the request side (``ClientLimits``), at request head and body time only,
never per response chunk:
- the request line, each header and the whole head are capped (431, OpenAI error shape, nothing
  forwarded, connection closed). The per-line caps are checked in ``on_url``/``on_header``; the
  whole head's in ``data_received``, because httptools keeps a header's value in its own buffer
  until the value ends, so one 64 MB header would be in memory before ``on_header`` saw it;
- a head not complete within ``header_timeout`` of the connection (or of its first byte, on a
  kept-alive connection), and a body not complete within ``body_timeout`` of its head, end the
  connection (the body with a 408); idle kept-alive connections are uvicorn's
  ``timeout_keep_alive``. Each is logged once and counted (``on_timeout(kind)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from dynspec.router.errors import HeadersTooLarge, RequestTimeout, RouterError

logger = logging.getLogger(__name__)

RAW_BODY = "dynspec.raw_body"
# ``scope["extensions"][ABORT]["abort"]()`` ends the client's connection at once, without a
# proper end, and without uvicorn's "returned without completing response" ERROR on top of the
# relay's own line (a server died mid-response: one event, one line).
ABORT = "dynspec.abort"


class RawBody:
    """Chunked body frames written straight to one response's connection."""

    __slots__ = ("_cycle", "_frames")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        self._frames: list[bytes] = []

    def usable(self) -> bool:
        """The response's head went out with chunked framing, and its end has not."""
        cycle = self._cycle
        try:
            return (
                cycle.response_started
                and cycle.chunked_encoding is True
                and not cycle.response_complete
                and cycle.scope["method"] != "HEAD"
                and cycle.flow is not None
                and cycle.transport is not None
                and not cycle.disconnected
            )
        except AttributeError:
            # A uvicorn whose response cycle is shaped otherwise: relay through ASGI ``send``.
            return False

    def write(self, data: bytes) -> None:
        """Frame one chunk; it goes out with the next ``flush``."""
        self._frames.append(b"%x\r\n%s\r\n" % (len(data), data))

    def flush(self) -> bool:
        """Write the framed chunks in one go; False when the client's socket is full (wait for
        ``drain``)."""
        frames = self._frames
        if not frames:
            return True
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        frames.clear()
        cycle = self._cycle
        if cycle.disconnected:
            return True  # the relay learns it from the ASGI disconnect, as without the shortcut
        try:
            cycle.transport.write(data)
        except RuntimeError:
            # uvloop: the socket is closed and uvicorn's connection_lost has yet to run.
            return True
        return not cycle.flow.write_paused

    async def drain(self) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()


# Each request line and header line alone (nginx's large_client_header_buffers 4 x 8k: a line
# must fit one 8k buffer); ``ClientLimits.max_header_bytes`` is the four buffers together.
MAX_LINE_BYTES = 8 * 1024


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client may send and how slowly (defaults: nginx's, see docs/router.md, "Limits
    and timeouts")."""

    # The whole head (request line and headers), each line alone, and how many headers
    # (Envoy's 100).
    max_header_bytes: int = 32 * 1024
    max_line_bytes: int = MAX_LINE_BYTES
    max_headers: int = 100
    # Seconds: the head from the connection (or its first byte), the body from the head.
    header_timeout: float = 10.0
    body_timeout: float = 60.0


# Called with "header", "body" or "idle" once per connection timed out.
TimeoutHook = Callable[[str], None]


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a head that is over a limit."""

    def __init__(self, error: RouterError) -> None:
        super().__init__(error.message)
        self.error = error


class _HeadParser(httptools.HttpRequestParser):
    """httptools' parser, letting a refusal out as itself: httptools wraps whatever a callback
    raises in ``HttpParserCallbackError``, which uvicorn answers with its own plain-text 400."""

    def feed_data(self, data: bytes | bytearray | memoryview) -> None:  # type: ignore[override]
        try:
            super().feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refused):
                raise exc.__context__ from None
            raise


def _error_response(error: RouterError) -> bytes:
    body = error.body()
    reason = _REASONS.get(error.status, b"")
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (error.status, reason, len(body), body)
    )


_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class RelayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request side's limits; each request's scope also
    carries its ``RawBody`` (``direct_relay``) and its ``ABORT``. ``relay_protocol`` makes the
    class with the router's settings (uvicorn builds one protocol object per connection)."""

    limits: ClassVar[ClientLimits] = ClientLimits()
    direct_relay: ClassVar[bool] = True
    on_timeout: ClassVar[TimeoutHook | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = _HeadParser(self)
        # As uvicorn does (a response to the first of pipelined requests); httptools < 0.6.3
        # has no leniencies.
        with contextlib.suppress(AttributeError):
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        # Bytes received since this head began; -1 while no head is being read.
        self._head_size = 0
        self._header_count = 0
        # The head's lines as parsed (request line and headers, without line ends), for the
        # total when the whole head came in one read.
        self._head_parsed = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # -- connection --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        reading_head = self._head_size >= 0
        if reading_head:
            self._head_size += len(data)
        try:
            super().data_received(data)
        except _Refused as exc:
            self._refuse(exc.error)
            return
        # Still in the head after this read: httptools holds all of it (at most one read over).
        if self._head_size > self.limits.max_header_bytes:
            self._refuse(HeadersTooLarge(f"request head over {self.limits.max_header_bytes} bytes"))

    # -- parser callbacks --------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # At least this request's first byte came (uncounted when it shared a read with the body
        # of the one before).
        self._head_size = max(self._head_size, 1)
        self._header_count = 0
        self._head_parsed = 0
        if self._header_timer is None:  # a kept-alive connection's next request
            self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_late)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_parsed += len(url)
        if len(self.url) > self.limits.max_line_bytes:
            raise _Refused(HeadersTooLarge(f"request line over {self.limits.max_line_bytes} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.limits
        self._header_count += 1
        if self._header_count > limits.max_headers:
            raise _Refused(HeadersTooLarge(f"more than {limits.max_headers} request headers"))
        if len(name) + len(value) > limits.max_line_bytes:
            raise _Refused(
                HeadersTooLarge(
                    f"request header {name[:64].decode('latin-1')!r} over "
                    f"{limits.max_line_bytes} bytes"
                )
            )
        self._head_parsed += len(name) + len(value)
        if self._head_parsed > limits.max_header_bytes:
            raise _Refused(HeadersTooLarge(f"request head over {limits.max_header_bytes} bytes"))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_size = -1
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        # No new cycle for an upgrade; a pipelined request's cycle waits, with its own scope.
        if cycle is not None and getattr(cycle, "scope", None) is self.scope:
            # ASGI extensions map a name to a dict.
            extensions = dict(self.scope.get("extensions") or {})
            if self.direct_relay:
                extensions[RAW_BODY] = {"body": RawBody(cycle)}
            extensions[ABORT] = {"abort": lambda: _abort(cycle)}
            self.scope["extensions"] = extensions
            # Cancelled by on_message_complete, at once for a request without a body.
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_late)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- refusals and timeouts ---------------------------------------------------------------------

    def _answerable(self) -> bool:
        """No earlier response is still being written on this connection."""
        cycle = getattr(self, "cycle", None)
        return not self.pipeline and (cycle is None or cycle.response_complete)

    def _refuse(self, error: RouterError) -> None:
        logger.info("client %s: %d %s: closed", _peer(self), error.status, error.message)
        self._end(error if self._answerable() else None)

    def _header_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if not self._answerable():
            # A pipelined head behind a response still being written: it waits its turn (and
            # closing now would cut that response).
            self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_late)
            return
        self._timed_out(
            "header", f"request head not complete within {self.limits.header_timeout:g}s"
        )
        error = RequestTimeout("the request head was not sent in time")
        # A connection that sent nothing gets no answer, only the close.
        self._end(error if self._head_size > 0 else None)

    def _body_late(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        self._timed_out("body", f"request body not complete within {self.limits.body_timeout:g}s")
        cycle = self.cycle
        answer = not cycle.response_started and not self.pipeline
        if not cycle.response_complete:
            # The app waits in receive(): it gets the disconnect, and uvicorn logs nothing.
            cycle.disconnected = True
            cycle.message_event.set()
        self._end(RequestTimeout("the request body was not sent in time") if answer else None)

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            # Normal for kept-alive clients: counted, logged at DEBUG only.
            logger.debug("client %s: idle for %gs: closed", _peer(self), self.timeout_keep_alive)
            hook = type(self).on_timeout
            if hook is not None:
                hook("idle")
        super().timeout_keep_alive_handler()

    def _timed_out(self, kind: str, what: str) -> None:
        logger.info("client %s: %s: closed", _peer(self), what)
        hook = type(self).on_timeout
        if hook is not None:
            hook(kind)

    def _end(self, error: RouterError | None) -> None:
        self._stop_timers()
        self._head_size = -1
        transport = self.transport
        if transport.is_closing():
            return
        if error is not None:
            transport.write(_error_response(error))
        transport.close()

    def _stop_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None


def _abort(cycle: RequestResponseCycle) -> None:
    cycle.disconnected = True
    cycle.transport.close()


def _peer(protocol: HttpToolsProtocol) -> str:
    client = protocol.client
    return f"{client[0]}:{client[1]}" if client else "?"


def relay_protocol(
    limits: ClientLimits, *, direct_relay: bool, on_timeout: TimeoutHook | None
) -> type[RelayProtocol]:
    """The protocol class uvicorn is given (``Config(http=...)``), with these settings."""
    hook = staticmethod(on_timeout) if on_timeout is not None else None
    attrs = {"limits": limits, "direct_relay": direct_relay, "on_timeout": hook}
    return type("RouterProtocol", (RelayProtocol,), attrs)
