"""The client side's one shortcut: the relay writes a streamed body's chunks to the socket itself.

Measured with ``dynspec-bench overhead``: going through ASGI, every relayed chunk costs a task
wake-up (the relay's task waits for the next upstream piece) plus uvicorn's ``send``; together
about a third of the router's CPU per chunk. With this shortcut the upstream connection's parser
callback frames each piece and writes it to the client's transport on the spot; the relay's task
wakes once per response (its end, a break, or a client that stops reading), not once per chunk.

Only the body's middle takes the shortcut. The response's start and its end still go through
uvicorn's ``send``, so uvicorn's own state (chunked framing chosen, response complete, keep-alive,
``connection: close``) stays exactly what it would be without it. ``RelayProtocol`` is uvicorn's
httptools protocol with one addition: each request's scope carries a ``RawBody`` for its response
(``scope["extensions"]["dynspec.raw_body"]["body"]``). Under any other server the key is absent
and the relay sends every chunk through ASGI ``send``.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

RAW_BODY = "dynspec.raw_body"


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


class RelayProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; each request's scope also carries its ``RawBody``."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        # No new cycle for an upgrade; a pipelined request's cycle waits, with its own scope.
        if cycle is not None and getattr(cycle, "scope", None) is self.scope:
            # ASGI extensions map a name to a dict.
            extensions = dict(self.scope.get("extensions") or {})
            extensions[RAW_BODY] = {"body": RawBody(cycle)}
            self.scope["extensions"] = extensions
