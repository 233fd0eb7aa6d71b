"""The relay's per-chunk step on a response body, apart from how the bytes move.

A filter is fed each upstream piece (``feed``) and returns the bytes to send on; ``finish`` takes
the body's last piece, if the driver has it in hand, and returns what is left to send. Meanwhile
it records the time to the first token (``ttft``) and the token counts (``usage``). Both relay
drivers (through ASGI ``send``, and straight to the client's socket) call the same filter, so
what reaches the client and what is measured do not depend on the driver.

Per chunk it does no JSON parsing and no logging. It looks at bytes only where needed:
- until the first token is seen, a regex finds a non-empty ``content``/``text`` (the TTFT);
- ``EventStream`` keeps the last two pieces, where the usage of a stream that asked for it is;
- ``StrippedEventStream`` (the server was asked for usage on the client's behalf) passes whole
  SSE events only (a piece is cut after its last blank line and the rest waits for the next one),
  and the few events that contain ``"choices":[]`` are parsed and the usage-only one is dropped;
- ``Body`` (not streamed) keeps up to ``MAX_USAGE_SCAN`` bytes to read the usage at the end.

The hot path is ``EventStream.feed``: after the first token it is one attribute read and two
writes; the drivers bind ``feed`` to a local so no lookup is repeated per chunk.
"""

from __future__ import annotations

import time

from dynspec.router.sse import Usage, has_token, may_hold_usage_event, strip_usage_events, usage_in

# An incomplete SSE event longer than this is passed on as it is (no framing to wait for).
MAX_CARRY = 1 << 20
# Non-streamed bodies are kept up to this size to read their usage.
MAX_USAGE_SCAN = 1 << 20

_NO_USAGE: Usage = (None, None)


class RelayFilter:
    """The interface and the results; ``start`` is the request's arrival (``perf_counter``)."""

    __slots__ = ("_bad_usage", "_start", "_ttft", "_usage")

    def __init__(self, start: float) -> None:
        self._start = start
        self._ttft: float | None = None
        self._usage: Usage = _NO_USAGE
        self._bad_usage = False

    @property
    def ttft(self) -> float | None:
        """Seconds from the request's arrival to the first token passed on; None if none was."""
        return self._ttft

    @property
    def usage(self) -> Usage:
        """(prompt tokens, completion tokens), each None where the body did not say."""
        return self._usage

    @property
    def bad_usage(self) -> bool:
        """The body held a token count that is not one (ignored; a protocol error to count)."""
        return self._bad_usage

    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self, data: bytes = b"") -> bytes:
        """The body ended; ``data`` is its last piece when the driver has it (not yet fed)."""
        return data


class EventStream(RelayFilter):
    """An SSE stream passed on piece by piece, as it comes."""

    __slots__ = ("_last", "_prev")

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self._prev = self._last = b""

    def feed(self, data: bytes) -> bytes:
        if self._ttft is None and has_token(data):
            self._ttft = time.perf_counter() - self._start
        self._prev = self._last
        self._last = data
        return data

    def finish(self, data: bytes = b"") -> bytes:
        if data:
            self.feed(data)
        self._usage, self._bad_usage = usage_in(self._prev + self._last)
        return data


class StrippedEventStream(RelayFilter):
    """An SSE stream passed on in whole events, without the usage-only event."""

    __slots__ = ("_carry",)

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        carry = self._carry
        if carry:
            data = carry + data
            self._carry = b""
        end = data.rfind(b"\n\n")
        if end == -1:
            if len(data) < MAX_CARRY:
                self._carry = data
                return b""
        elif end + 2 < len(data):
            self._carry = data[end + 2 :]
            data = data[: end + 2]
        return self._events(data)

    def finish(self, data: bytes = b"") -> bytes:
        # What is left (an event the server did not end) goes out whole, with the last piece.
        carry = self._carry
        if carry:
            data = carry + data
            self._carry = b""
        return self._events(data) if data else b""

    def _events(self, data: bytes) -> bytes:
        if may_hold_usage_event(data):
            data, usage, bad = strip_usage_events(data)
            if usage is not None:
                self._usage = usage
            self._bad_usage = self._bad_usage or bad
        if self._ttft is None and has_token(data):
            self._ttft = time.perf_counter() - self._start
        return data


class Body(RelayFilter):
    """A body that is not an event stream: passed on as it comes, its usage read at the end."""

    __slots__ = ("_kept", "_ok", "_size")

    def __init__(self, start: float, *, ok: bool) -> None:
        super().__init__(start)
        self._ok = ok  # a 200: only a success has a usage worth counting
        self._kept: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> bytes:
        if self._size < MAX_USAGE_SCAN:
            self._kept.append(data)
            self._size += len(data)
        return data

    def finish(self, data: bytes = b"") -> bytes:
        if data:
            self.feed(data)
        if self._ok:
            self._usage, self._bad_usage = usage_in(b"".join(self._kept))
        return data


def relay_filter(start: float, *, status: int, event_stream: bool, strip: bool) -> RelayFilter:
    """The filter for one response: ``event_stream`` when the client asked for a stream and got
    a 200 ``text/event-stream``; ``strip`` when the usage event was asked for on its behalf."""
    if not event_stream:
        return Body(start, ok=status == 200)
    if strip:
        return StrippedEventStream(start)
    return EventStream(start)
