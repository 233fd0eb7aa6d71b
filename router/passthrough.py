"""SGLang's endpoints besides generation, relayed so that the router stands in for one server.

Three kinds, by who should answer:

- One server (``GET /v1/models``, ``/v1/models/{id}``, ``/get_server_info``, ``/server_info``,
  ``/get_model_info``, ``/model_info``, ``POST /tokenize``, ``/detokenize``): a healthy server of
  the pool new requests go to now (the least busy), the next one if it cannot be reached. Both
  pools serve the same model, so any server's answer is the answer; the response says which
  pool gave it (``x-dynspec-backend``). The server's own status and body pass through unchanged.
  These are not generation requests: they do not count as load and take no lease.
- Every server (``POST /flush_cache``, ``/abort_request``): the router does not know which server
  holds a request id, and a cache flush concerns each one. The answer lists every server's
  status and body; 200 only when all answered 2xx, else 502 with the same list.
- The router itself (``GET /health_generate``): 200 when one server of the active pool (under
  ``balance``, which has none: any healthy server of a pool not drained) passes its own
  ``/health_generate`` (a one-token generation), else 503.

The generation endpoints (``/generate``, ``/v1/responses``) are not here: they go through the
relay with the completions (``request.PROXY_PATHS``), routed and accounted like chat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response

from dynspec.router.errors import BadGateway, BadRequest, NoServer
from dynspec.router.pool import Pools, Server
from dynspec.router.request import check_media_type, parse_object, read_body
from dynspec.router.runtime import Runtime, running
from dynspec.router.upstream import UpstreamError

logger = logging.getLogger(__name__)

# GET, answered by one server.
READ_PATHS = ("/v1/models", "/get_server_info", "/server_info", "/get_model_info", "/model_info")
# POST with a JSON body, answered by one server.
ONE_SERVER_POSTS = ("/tokenize", "/detokenize")
# A server's body in the every-server answer is cut to this many characters.
_MAX_SHOWN = 2000
# SGLang gives its own /health_generate 20 s before it answers 503.
HEALTH_GENERATE_TIMEOUT = 30.0


def _answer(
    status: int, body: bytes, content_type: bytes | None, pool: str | None = None
) -> Response:
    headers = {"x-dynspec-backend": pool} if pool else None
    media = (content_type or b"application/json").decode("latin-1")
    return Response(body, status, headers, media_type=media)


class Passthrough:
    def __init__(
        self,
        pools: Pools,
        *,
        max_body_bytes: int,
        timeout: float,
    ) -> None:
        self.pools = pools
        self.max_body_bytes = max_body_bytes
        self.timeout = timeout

    def candidates(self) -> list[Server]:
        """Healthy servers of the active pool (least in flight first), then the other pool's,
        then the rest (the health check may lag behind a server that just came back). Under
        ``balance`` (no active pool) healthy servers of pools not drained, least in flight first."""
        active = self.pools.active_pool()

        def rank(s: Server) -> tuple[int, int, int]:
            return (not s.healthy, s.pool != active or s.pool in self.pools.drained, s.in_flight)

        return sorted(self.pools.servers, key=rank)

    @staticmethod
    async def _fetch(
        run: Runtime,
        server: Server,
        method: bytes,
        path: str,
        body: bytes | None,
        *,
        timeout: float,
    ) -> tuple[int, bytes, bytes | None]:
        # ``run``: the running upstream client and the header lines the router sends.
        headers = run.backend_headers
        if body is not None:
            headers += b"content-type: application/json\r\n"
        resp, answer = await asyncio.wait_for(
            run.client.fetch(server.url, method, path, headers, body), timeout
        )
        return resp.status, answer, resp.header(b"content-type")

    async def one(
        self, run: Runtime, method: bytes, path: str, body: bytes | None = None
    ) -> Response:
        """The answer of the first server that gives one, in ``candidates`` order; a 5xx
        answer is passed on only when no other server does better (these requests change
        nothing, so asking the next server is safe)."""
        failed: Response | None = None
        for server in self.candidates():
            try:
                status, answer, media = await self._fetch(
                    run, server, method, path, body, timeout=self.timeout
                )
            except (UpstreamError, asyncio.TimeoutError) as exc:
                logger.warning("%s%s failed: %r", server.url, path, exc)
                continue
            if status < 500:
                return _answer(status, answer, media, server.pool)
            logger.warning("%s%s answered %d", server.url, path, status)
            failed = failed or _answer(status, answer, media, server.pool)
        if failed is not None:
            return failed
        if not self.pools.any_healthy():
            raise NoServer(f"no healthy server to answer {path}")
        raise BadGateway(f"no server answered {path}")

    async def every(self, run: Runtime, method: bytes, path: str, body: bytes | None) -> Response:
        servers = self.pools.servers

        async def one(server: Server) -> dict[str, Any]:
            result: dict[str, Any] = {"url": server.url, "pool": server.pool}
            try:
                status, answer, _ = await self._fetch(
                    run, server, method, path, body, timeout=self.timeout
                )
            except (UpstreamError, asyncio.TimeoutError) as exc:
                reason = str(exc) or "no answer in time"
                return {**result, "status": None, "error": reason}
            text = answer.decode("utf-8", "replace")[:_MAX_SHOWN]
            return {**result, "status": status, "body": text}

        results = await asyncio.gather(*(one(s) for s in servers))
        failed = [r for r in results if not (r["status"] and 200 <= r["status"] < 300)]
        if not failed:
            return _answer(200, orjson.dumps({"servers": results}), None)
        err = BadGateway(f"{path} failed on {len(failed)} of {len(results)} servers")
        data = orjson.loads(err.body())
        data["servers"] = results
        return _answer(err.status, orjson.dumps(data), None)

    async def health_generate(self, run: Runtime) -> Response:
        """200 when one server that new requests may go to passes its own ``/health_generate``:
        the active pool's, each pair's active one, or under ``balance`` (no active pool) any
        healthy server of a pool not drained. The answer names the active pool, or under
        ``balance`` the pool of the server that passed."""
        active = self.pools.active_pool()
        servers = self.pools.active_servers()
        where = "in the active pool" if active is not None else "that can take a request"
        if not servers:
            raise NoServer(f"no healthy server {where}")
        timeout = min(self.timeout, HEALTH_GENERATE_TIMEOUT)

        async def ask(s: Server) -> tuple[Server, int]:
            status, _, _ = await self._fetch(
                run, s, b"GET", "/health_generate", None, timeout=timeout
            )
            return s, status

        tasks = [asyncio.ensure_future(ask(s)) for s in servers]
        try:
            for done in asyncio.as_completed(tasks):
                try:
                    server, status = await done
                except (UpstreamError, asyncio.TimeoutError):
                    continue
                if status == 200:
                    pool = active if active is not None else server.pool
                    return _answer(200, orjson.dumps({"status": "ok", "pool": pool}), None)
        finally:
            for task in tasks:
                task.cancel()
        raise NoServer(f"no healthy server {where} passed /health_generate")

    async def json_body(self, request: Request) -> bytes:
        """The request's body, held to the same rules as the relay's: JSON, within the limit."""
        check_media_type(request.headers.get("content-type", "").encode("latin-1") or None)
        length = request.headers.get("content-length")
        body = await read_body(
            request.receive, length.encode() if length else None, self.max_body_bytes
        )
        if body is None:
            # The client left while sending: nothing goes to the servers (nobody will read the
            # answer to this error either).
            raise BadRequest("the client left before its body was complete")
        parse_object(body)
        return body


def add_passthrough_routes(
    api: FastAPI, passthrough: Passthrough, require_api_key: Callable[[Request], None]
) -> None:
    """Register SGLang's non-generation endpoints on ``api``."""

    async def read(request: Request) -> Response:
        require_api_key(request)
        return await passthrough.one(running(request.scope), b"GET", request.url.path)

    for path in READ_PATHS:
        api.add_api_route(path, read, methods=["GET"])

    @api.get("/v1/models/{model:path}")
    async def model(request: Request) -> Response:
        # The raw path: the id goes on as the client encoded it.
        require_api_key(request)
        raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
        return await passthrough.one(running(request.scope), b"GET", raw.decode("latin-1"))

    async def post_one(request: Request) -> Response:
        require_api_key(request)
        body = await passthrough.json_body(request)
        return await passthrough.one(running(request.scope), b"POST", request.url.path, body)

    for path in ONE_SERVER_POSTS:
        api.add_api_route(path, post_one, methods=["POST"])

    @api.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(request: Request) -> Response:
        require_api_key(request)
        return await passthrough.every(running(request.scope), b"POST", "/flush_cache", b"")

    @api.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        require_api_key(request)
        body = await passthrough.json_body(request)
        return await passthrough.every(running(request.scope), b"POST", "/abort_request", body)

    # No key, like /health (SGLang exempts every /health* path from its key).
    @api.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        return await passthrough.health_generate(running(request.scope))
