"""The request side of the relay: which paths, which headers, the body read and validated.

``read_body`` enforces ``--max-body-bytes`` while reading (a declared ``content-length`` over it is
refused before reading anything). ``prepare`` parses the JSON once to validate it and to learn
whether it streams, and asks the server for usage when a streaming client did not.
"""

from __future__ import annotations

import orjson
from starlette.types import Receive

from dynspec.router.errors import BadRequest, PayloadTooLarge

# Path -> the field a request must carry.
PROXY_PATHS = {"/v1/chat/completions": "messages", "/v1/completions": "prompt"}

# Request headers never sent upstream: hop-by-hop ones, ours to set (host, length, encoding),
# and the client's credentials (the server gets --backend-api-key instead).
DROP_REQUEST = frozenset(
    {
        b"host",
        b"authorization",
        b"content-length",
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
        b"accept-encoding",
        b"cookie",
        b"content-type",
    }
)
# Response headers never sent back: hop-by-hop ones, and date/server (uvicorn adds its own;
# copying them would send each twice).
DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"date",
        b"server",
    }
)


async def read_body(receive: Receive, length: bytes | None, limit: int) -> bytes | None:
    """The request body, enforcing ``limit`` before it is all in memory; None if the client left."""
    too_large = PayloadTooLarge(f"request body is larger than {limit} bytes")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise BadRequest("invalid content-length") from None
        if declared > limit:
            raise too_large
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    first: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(first) > limit:
            raise too_large
        return first
    buf = bytearray(first)
    while True:
        if len(buf) > limit:
            raise too_large
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        buf += message.get("body", b"")
        if not message.get("more_body", False):
            break
    if len(buf) > limit:
        raise too_large
    return bytes(buf)


def prepare(body: bytes, required: str) -> tuple[bytes, bool, bool]:
    """Validate the request; returns (body to send, streamed?, strip the usage chunk?)."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the request body must be a JSON object")
    if required not in request:
        raise BadRequest(f"'{required}' is a required property", param=required)
    stream = bool(request.get("stream") == 1)
    if not stream:
        return body, False, False
    options = request.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    if options.get("include_usage"):
        return body, True, False
    # Ask the server for usage (the token metrics need it); the client will not see it.
    request["stream_options"] = {**options, "include_usage": True}
    return orjson.dumps(request), True, True
