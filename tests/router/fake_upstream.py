"""A tiny SGLang-like upstream for what the simulator does not do on purpose.

It splits SSE events across writes, records what the router sent it, and delays or breaks on
request (headers ``x-fake-*`` travel through the router untouched). Run as a script:
``python fake_upstream.py PORT``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import uvicorn

last_request: dict[str, Any] = {}


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


async def _json(send: Any, obj: Any, status: int = 200, headers: list[Any] | None = None) -> None:
    body = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    path = scope["path"]
    headers = {k.decode(): v.decode() for k, v in scope["headers"]}
    if path == "/health":
        await _json(send, {})
        return
    if path == "/fake/last":
        await _json(send, last_request)
        return
    if path == "/v1/models":
        await _json(send, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
        return
    raw = await _body(receive)
    req = json.loads(raw)
    last_request.clear()
    last_request.update({"headers": headers, "body": req})
    await asyncio.sleep(float(headers.get("x-fake-sleep-first", "0")))
    if "x-fake-status" in headers:
        status = int(headers["x-fake-status"])
        await _json(
            send,
            {"object": "error", "message": "fake failure", "type": "X", "code": status},
            status,
            [(b"x-fake-origin", b"upstream")],
        )
        return
    n = int(req.get("max_tokens", 4))
    chat = path == "/v1/chat/completions"
    usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
    if not req.get("stream"):
        text = "".join(f"t{i} " for i in range(n))
        choice = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        await _json(
            send, {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}
        )
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"date", b"Thu, 01 Jan 1970 00:00:00 GMT"),
                (b"server", b"fake"),
            ],
        }
    )
    split = headers.get("x-fake-split") == "1"
    delay = float(headers.get("x-fake-delay", "0.005"))
    die_after = int(headers.get("x-fake-die-after", "-1"))
    events = []
    if chat:
        events.append(
            _event(
                {
                    "id": "x",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                }
            )
        )
    for i in range(n):
        delta = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
        events.append(
            _event({"id": "x", "choices": [{"index": 0, **delta, "finish_reason": None}]})
        )
    if (req.get("stream_options") or {}).get("include_usage"):
        events.append(_event({"id": "x", "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    for i, ev in enumerate(events):
        if i == die_after:
            raise RuntimeError("fake upstream dies mid-stream")
        if split:
            third = max(1, len(ev) // 3)
            for piece in (ev[:third], ev[third : 2 * third], ev[2 * third :]):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                await asyncio.sleep(delay)
        else:
            await send({"type": "http.response.body", "body": ev, "more_body": True})
            await asyncio.sleep(delay)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="on")
