"""A lean SGLang-like upstream for the router overhead benchmark.

It answers ``/v1/chat/completions`` and ``/v1/completions`` with SSE streams in SGLang's chunk
shapes (role chunk, one content chunk per token, finish chunk, usage chunk when
``stream_options.include_usage`` is true, ``data: [DONE]``), plus ``/health``, ``/v1/models`` and
the info endpoints a router probes at startup.

It must stay far cheaper than whatever it is compared with, so it is a bare asyncio protocol on
uvloop with httptools' parser, and every stream is paced by one shared ticker: at each tick every
active stream gets its next token, as an SGLang decode step emits one token for every running
request at once. One timer per tick instead of one per chunk, and each chunk is a prebuilt bytes
frame written straight to the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any, cast

import httptools
import orjson

from dynspec.common.cli import FlagParser, add_log_level, configure_logging, run_main

log = logging.getLogger(__name__)

DEFAULT_TOKENS = 16
_TOKEN = " tok"


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk of the chunked transfer encoding."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n"
    b"\r\n"
)
_DONE = _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _response(
    status: int, body: bytes, keep_alive: bool, ctype: bytes = b"application/json"
) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    conn = b"keep-alive" if keep_alive else b"close"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n%s"
        % (status, reason, ctype, len(body), conn, body)
    )


class _Stream:
    """One streaming response: prebuilt frames, written one token per tick."""

    __slots__ = ("alive", "conn", "content", "left", "tail")

    def __init__(self, conn: _Conn, content: bytes, tail: bytes, left: int) -> None:
        self.conn = conn
        self.content = content
        self.tail = tail
        self.left = left
        self.alive = True


class Upstream:
    """The shared state: served model name, pacing and the active streams."""

    def __init__(
        self, model: str, interval: float, default_tokens: int, model_path: str = ""
    ) -> None:
        self.model = model
        # What /model_info reports. A router that loads a tokenizer from it (SGLang's Rust router
        # does) must find a local directory, never a hub model id it would try to download.
        self.model_path = model_path or "/nonexistent/bench-model"
        self.interval = interval
        self.default_tokens = default_tokens
        self.active: list[_Stream] = []
        self.requests = 0
        self._ticking = False
        self._next = 0.0
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- pacing ---------------------------------------------------------------------------------
    def add(self, stream: _Stream) -> None:
        self.active.append(stream)
        if not self._ticking:
            self._ticking = True
            loop = self._loop or asyncio.get_running_loop()
            self._loop = loop
            if self.interval > 0:
                self._next = loop.time() + self.interval
                loop.call_at(self._next, self._tick)
            else:
                loop.call_soon(self._tick)

    def _tick(self) -> None:
        keep: list[_Stream] = []
        for s in self.active:
            if not s.alive:
                continue
            write = s.conn.transport.write
            if s.left > 0:
                write(s.content)
                s.left -= 1
            if s.left == 0:
                write(s.tail)
                s.conn.stream_done(s)
            else:
                keep.append(s)
        self.active = keep
        if not keep:
            self._ticking = False
            return
        assert self._loop is not None
        if self.interval > 0:
            now = self._loop.time()
            self._next += self.interval
            if self._next < now:  # fell behind: keep the rate, drop the backlog
                self._next = now + self.interval
            self._loop.call_at(self._next, self._tick)
        else:
            self._loop.call_soon(self._tick)

    # -- responses ------------------------------------------------------------------------------
    def start_stream(self, conn: _Conn, req: dict[str, Any], chat: bool) -> None:
        self.requests += 1
        self._seq += 1
        rid = f"{self._seq:x}"
        created = int(time.time())
        tokens = _tokens(req, self.default_tokens)
        opts = req.get("stream_options")
        usage_on = isinstance(opts, dict) and bool(opts.get("include_usage"))
        prompt_tokens = 8
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + tokens,
            "completion_tokens": tokens,
            "prompt_tokens_details": None,
        }
        if chat:
            base: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
            }

            def choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
                return {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": None,
                }

            first = _event(
                {
                    **base,
                    "choices": [choice({"role": "assistant", "content": ""}, None)],
                    "usage": None,
                }
            )
            content = _event(
                {**base, "choices": [choice({"content": _TOKEN}, None)], "usage": None}
            )
            finish = _event({**base, "choices": [choice({}, "length")], "usage": None})
        else:
            base = {"id": rid, "object": "text_completion", "created": created, "model": self.model}

            def cchoice(text: str, finish: str | None) -> dict[str, Any]:
                return {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": None,
                }

            first = b""
            content = _event({**base, "choices": [cchoice(_TOKEN, None)], "usage": None})
            finish = _event({**base, "choices": [cchoice("", "length")], "usage": None})
        tail = _frame(finish)
        if usage_on:
            tail += _frame(_event({**base, "choices": [], "usage": usage}))
        tail += _DONE
        content_frame = _frame(content)
        # The first token comes with the headers (prefill takes no time here); the rest follow
        # one per tick.
        head = _STREAM_HEAD + (_frame(first) if first else b"")
        if tokens > 0:
            head += content_frame
        conn.transport.write(head)
        stream = _Stream(conn, content_frame, tail, max(tokens - 1, 0))
        conn.stream = stream
        self.add(stream)

    def full_response(self, req: dict[str, Any], chat: bool) -> bytes:
        self.requests += 1
        tokens = _tokens(req, self.default_tokens)
        text = _TOKEN * tokens
        usage = {"prompt_tokens": 8, "total_tokens": 8 + tokens, "completion_tokens": tokens}
        created = int(time.time())
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
                "matched_stop": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        return orjson.dumps(
            {
                "id": "x",
                "object": obj,
                "created": created,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )


def _tokens(req: dict[str, Any], default: int) -> int:
    value = req.get("max_tokens", req.get("max_completion_tokens"))
    if isinstance(value, int) and value >= 0:
        return value
    return default


class _Conn(asyncio.Protocol):
    """One client connection: httptools parses, the upstream answers; keep-alive."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.stream: _Stream | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only duck-typed ones.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.alive = False
            self.stream = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_response(400, b'{"error":"bad request"}', False))
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = bool(self.parser.should_keep_alive())
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        self._handle(method, path, b"".join(self.body))

    def stream_done(self, stream: _Stream) -> None:
        if self.stream is stream:
            self.stream = None
        if not self.keep_alive:
            self.transport.close()

    def _reply(self, status: int, body: bytes) -> None:
        self.transport.write(_response(status, body, self.keep_alive))
        if not self.keep_alive:
            self.transport.close()

    def _handle(self, method: bytes, path: bytes, body: bytes) -> None:
        up = self.upstream
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            try:
                req = orjson.loads(body)
            except orjson.JSONDecodeError:
                req = None
            if not isinstance(req, dict):
                self._reply(400, b'{"error":{"message":"invalid JSON","type":"BadRequest"}}')
                return
            chat = path == b"/v1/chat/completions"
            if req.get("stream"):
                up.start_stream(self, req, chat)
            else:
                self._reply(200, up.full_response(req, chat))
            return
        if method == b"GET" and path in (b"/health", b"/health_generate"):
            self._reply(200, b"")
        elif method == b"GET" and path == b"/v1/models":
            model = {
                "id": up.model,
                "object": "model",
                "created": 0,
                "owned_by": "sglang",
                "root": up.model,
            }
            self._reply(200, orjson.dumps({"object": "list", "data": [model]}))
        elif method == b"GET" and path in (b"/model_info", b"/get_model_info"):
            info = {
                "model_path": up.model_path,
                "tokenizer_path": up.model_path,
                "is_generation": True,
            }
            self._reply(200, orjson.dumps(info))
        elif method == b"GET" and path in (b"/server_info", b"/get_server_info"):
            self._reply(200, orjson.dumps({"model_path": up.model_path, "version": "0.5.23-bench"}))
        elif method == b"GET" and path == b"/stats":
            self._reply(200, orjson.dumps({"requests": up.requests, "active": len(up.active)}))
        else:
            self._reply(404, b'{"error":{"message":"not found","type":"NotFound"}}')


async def serve(host: str, port: int, upstream: Upstream, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(upstream), host, port, backlog=4096)
    log.info(
        "overhead upstream on http://%s:%d (interval %.1f ms)", host, port, upstream.interval * 1e3
    )
    try:
        await stop.wait()
    finally:
        server.close()


def _parser() -> FlagParser:
    p = FlagParser(
        prog="python -m dynspec.bench.overhead_upstream", description=__doc__.split("\n")[0]
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, required=True, help="port to listen on")
    p.add_argument(
        "--interval-ms", type=float, default=10.0, help="time between tokens of a stream"
    )
    p.add_argument(
        "--tokens", type=int, default=DEFAULT_TOKENS, help="tokens when max_tokens is absent"
    )
    p.add_argument("--served-model-name", default="bench-model", help="model name in answers")
    p.add_argument(
        "--model-path",
        default="",
        help="model path reported by /model_info; an existing local directory keeps a router "
        "that loads its tokenizer from there offline",
    )
    add_log_level(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_layered(argv)
    configure_logging(args.log_level)

    def body() -> None:
        _install_uvloop()
        upstream = Upstream(
            args.served_model_name, args.interval_ms / 1e3, args.tokens, args.model_path
        )

        async def run() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await serve(args.host, args.port, upstream, stop)

        asyncio.run(run())

    run_main("overhead_upstream", body, args.log_level)


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every platform we run on
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


if __name__ == "__main__":
    main()
