"""The request side of the relay: which paths, which headers, the body read and validated.

``read_body`` enforces ``--max-body-bytes`` while reading (a declared ``content-length`` over it is
refused before reading anything). ``prepare`` parses the JSON once to validate it and to learn
whether it streams, and asks the server for usage when a streaming client did not.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from starlette.types import Receive

from dynspec.router.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a generation request on one path must carry, and how its stream reports usage."""

    # The request must carry one of these fields.
    required: tuple[str, ...]
    # Streamed usage only when asked (OpenAI's ``stream_options.include_usage``): the relay asks
    # on the client's behalf and removes the answer. SGLang's native /generate puts the counts in
    # every event's ``meta_info``, and /v1/responses in its last event, unasked.
    usage_on_request: bool = False


# The generation paths: routed by the policy and accounted (in flight, metrics) one by one.
PROXY_PATHS = {
    "/v1/chat/completions": Endpoint(("messages",), usage_on_request=True),
    "/v1/completions": Endpoint(("prompt",), usage_on_request=True),
    "/v1/responses": Endpoint(("input",)),
    "/generate": Endpoint(("text", "input_ids", "input_embeds")),
}

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
# The header every proxied response carries: the pool that served it.
BACKEND_HEADER = {
    "eagle": (b"x-dynspec-backend", b"eagle"),
    "baseline": (b"x-dynspec-backend", b"baseline"),
}
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


def check_media_type(value: bytes | None) -> None:
    """Refuse a body labelled as something other than JSON; an unlabelled body is read as JSON.

    SGLang refuses them too (400), and relabelling a form or text body as JSON would hide the
    client's mistake. ``curl -d`` labels its body ``application/x-www-form-urlencoded``, hence
    the hint.
    """
    if value is None:
        return
    media = value.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    ):
        return
    raise UnsupportedMediaType(
        f"unsupported content-type {media.decode('latin-1')!r}: send the body as "
        "application/json (with curl: -H 'content-type: application/json')"
    )


def parse_object(body: bytes) -> dict[str, object]:
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the request body must be a JSON object")
    return request


def prepare(body: bytes, endpoint: Endpoint) -> tuple[bytes, bool, bool]:
    """Validate the request; returns (body to send, streamed?, strip the usage chunk?)."""
    request = parse_object(body)
    required = endpoint.required
    if not any(name in request for name in required):
        names = " or ".join(f"'{name}'" for name in required)
        raise BadRequest(f"{names} is a required property", param=required[0])
    stream = bool(request.get("stream") == 1)
    if not stream or not endpoint.usage_on_request:
        return body, stream, False
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
