"""The router's own errors, each rendered in the OpenAI error shape by one function, and sent as
a whole ASGI response by another (``send_error``)."""

from __future__ import annotations

from typing import ClassVar

import orjson
from starlette.types import Send


class RouterError(Exception):
    status: int = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def headers(self) -> list[tuple[bytes, bytes]]:
        return []

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )


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


class MethodNotAllowed(RouterError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class BadRequest(RouterError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(RouterError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(RouterError):
    status = 403
    type = "invalid_request_error"
    code = "forbidden"


class NotFound(RouterError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class UnsupportedMediaType(RouterError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class PayloadTooLarge(RouterError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class Unavailable(RouterError):
    """503 with ``Retry-After``: no healthy server, or the concurrency limit is reached."""

    status = 503
    type = "server_error"
    code = "service_unavailable"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after).encode())]


class NoServer(Unavailable):
    code = "no_healthy_server"


def not_serving() -> NoServer:
    """The answer while the router starts or stops (no running ``Runtime``)."""
    return NoServer("the router is not serving (starting or stopping)")


class Overloaded(Unavailable):
    code = "too_many_requests_in_flight"


class BadGateway(RouterError):
    status = 502
    type = "server_error"
    code = "bad_gateway"


class GatewayTimeout(RouterError):
    status = 504
    type = "server_error"
    code = "upstream_timeout"


class RequestTimeout(RouterError):
    """408: the client did not send its request (head or body) in time."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class HeadersTooLarge(RouterError):
    """431: the request line or headers are over the limits."""

    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"
