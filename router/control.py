"""The control routes, on FastAPI: ``/health``, ``/metrics``, ``/status`` and ``/admin/*``, plus
SGLang's other endpoints (``passthrough.py``); errors in OpenAI's JSON shape.

None of them is on the hot path (the completions go to the bare ASGI relay before FastAPI), so
they are written for clarity. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from dynspec.router.config import RouterConfig
from dynspec.router.errors import (
    BadRequest,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    RouterError,
    Unauthorized,
)
from dynspec.router.learning import SpeedLearner
from dynspec.router.passthrough import Passthrough, add_passthrough_routes
from dynspec.router.policy import POOLS, PoolName
from dynspec.router.pool import Pools
from dynspec.router.server import Server

logger = logging.getLogger(__name__)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status, headers, media_type="application/json")


def _error_response(exc: RouterError) -> Response:
    headers = {k.decode(): v.decode() for k, v in exc.headers()}
    return Response(exc.body(), exc.status, headers, media_type="application/json")


def _has_key(request: Request, expected: bytes) -> bool:
    given = request.headers.get("authorization")
    return given is not None and hmac.compare_digest(given.encode("latin-1"), expected)


def control_api(
    config: RouterConfig,
    pools: Pools,
    learner: SpeedLearner,
    registry: CollectorRegistry,
) -> FastAPI:
    """The FastAPI app. It sees no lifespan (``app.RouterApp`` handles it); a route that needs the
    running ``Runtime`` reads it from its scope's state (``runtime.running``)."""
    api = FastAPI(
        title="dynspec-router",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    api_key = config.api_auth
    admin_key = config.admin_auth

    def require_api_key(request: Request) -> None:
        if api_key is not None and not _has_key(request, api_key):
            raise Unauthorized("missing or wrong API key")

    def require_admin_key(request: Request) -> None:
        if admin_key is None:
            raise Forbidden("admin endpoints are off: start the router with --admin-api-key")
        if not _has_key(request, admin_key):
            raise Unauthorized("missing or wrong admin API key")

    def pool_name(name: str) -> PoolName:
        for pool in POOLS:
            if pool == name:
                return pool
        raise NotFound(f"unknown pool {name!r} (eagle or baseline)")

    add_passthrough_routes(
        api,
        Passthrough(
            pools,
            max_body_bytes=config.max_body_bytes,
            timeout=config.request_timeout,
        ),
        require_api_key,
    )

    @api.exception_handler(RouterError)
    async def on_router_error(_: Request, exc: RouterError) -> Response:
        return _error_response(exc)

    @api.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Starlette's own answers: an unknown path or a method the path does not take.
        err: RouterError
        if exc.status_code == 404:
            err = NotFound(f"no such endpoint: {request.method} {request.url.path}")
        elif exc.status_code == 405:
            err = MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
        else:
            err = RouterError(str(exc.detail))
            err.status = exc.status_code
        response = _error_response(err)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @api.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> Response:
        return _error_response(BadRequest(str(exc)))

    # HEAD too, as SGLang answers it: load balancers and uptime checks probe with HEAD.
    @api.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        healthy = sum(1 for s in pools.servers if s.healthy)
        if healthy:
            return _json({"status": "ok", "healthy_servers": healthy})
        return _json({"status": "unavailable", "healthy_servers": 0}, 503)

    @api.get("/metrics")
    async def metrics_route() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/status")
    async def status(request: Request) -> Response:
        if admin_key is not None:
            if not _has_key(request, admin_key):
                raise Unauthorized("missing or wrong admin API key")
        else:
            require_api_key(request)
        return _json(status_of(pools, learner))

    @api.post("/admin/drain/{pool}")
    async def drain(pool: str, request: Request) -> Response:
        require_admin_key(request)
        name = pool_name(pool)
        pools.drain(name)
        return _json({"pool": name, "drained": True, "in_flight": pools.in_flight(name)})

    @api.post("/admin/resume/{pool}")
    async def resume(pool: str, request: Request) -> Response:
        require_admin_key(request)
        name = pool_name(pool)
        pools.resume(name)
        return _json({"pool": name, "drained": False, "in_flight": pools.in_flight(name)})

    @api.put("/admin/threshold")
    async def threshold(request: Request) -> Response:
        require_admin_key(request)
        try:
            data = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise BadRequest("the request body is not valid JSON") from None
        if not isinstance(data, dict) or "threshold" not in data:
            raise BadRequest("expected a JSON object with 'threshold'", param="threshold")
        new_threshold = data["threshold"]
        new_hysteresis = data.get("hysteresis", pools.settings.hysteresis)
        for name, value in (("threshold", new_threshold), ("hysteresis", new_hysteresis)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise BadRequest(f"'{name}' must be an integer", param=name)
        try:
            # The one check of the pair (``thresholds.validate_settings``), in ``set_settings``.
            pools.set_settings(new_threshold, new_hysteresis)
        except ValueError as exc:
            raise BadRequest(str(exc), param="threshold") from None
        return _json({"threshold": new_threshold, "hysteresis": new_hysteresis})

    return api


def status_of(pools: Pools, learner: SpeedLearner | None = None) -> dict[str, Any]:
    """The router's state. Under ``balance`` (no modes: each request picks its server) ``mode``
    and ``active_pool`` are null, and a pool is ``draining`` only when an operator drained it."""
    active = pools.active_pool()
    # Each group's own are in ``pairs`` with --pair; the top-level figures are group 0's.
    settings = pools.groups[0].settings
    return {
        "policy": pools.policy.name,
        "threshold": settings.threshold,
        "hysteresis": settings.hysteresis,
        "return_delay": pools.return_delay,
        "switch_margin": pools.switch_margin,
        "switch_lead": pools.switch_lead,
        "threshold_auto": pools.auto,
        "mode": pools.mode,
        "active_pool": active,
        "load": pools.load,
        # "local" or "servers"; with "servers" the load the mode is switched by is signal_load.
        "load_signal": "local" if pools.signal is None else "servers",
        "signal_load": pools.policy_load(),
        "pools": {
            pool: {
                "in_flight": pools.in_flight(pool),
                "drained": pool in pools.drained,
                "draining": pools.draining(pool),
                "healthy_servers": sum(1 for s in pools.servers if s.pool == pool and s.healthy),
            }
            for pool in POOLS
        },
        "servers": [
            {
                "url": s.url,
                "pool": s.pool,
                "healthy": s.healthy,
                "in_flight": s.in_flight,
                # The load the policy counts for it (with --load-signal servers: the signal's).
                "signal_load": pools.server_load(s),
                # A server drains while it is inactive (or drained) and still holds requests.
                "draining": pools.server_draining(s),
                **(learner.status(s.url, s.in_flight) if learner is not None else {}),
            }
            for s in pools.servers
        ],
        # With --pair: each pair's state (the server entries above are in pair order).
        "pairs": [
            {
                "index": g.index,
                "eagle_url": _url(g.eagle),
                "baseline_url": _url(g.baseline),
                "load": pools.group_load(g),
                "mode": g.mode,
                "active_pool": g.active_pool(pools.drained),
                "threshold": g.settings.threshold,
                "hysteresis": g.settings.hysteresis,
                "switches": g.switches,
            }
            for g in pools.groups
            if g.label is not None  # the split layout's one group is the top level
        ],
    }


def _url(server: Server | None) -> str | None:
    return server.url if server is not None else None
