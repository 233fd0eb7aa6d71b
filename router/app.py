"""The router application: the bare ASGI relay in front of a FastAPI app for control routes.

``create_app`` builds what lasts as long as the app object: one ``Pools`` (the counts), one
``SpeedLearner`` (each server's speed curve), one ``RouterMetrics`` (on the given registry) and
the control routes (``control.py``). What lives
as long as the server — the upstream client, the health checks, the proxy and its watchdog — is
one ``Runtime``, built and started in the FastAPI lifespan and stopped at its end.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from dynspec.router.config import RouterConfig
from dynspec.router.control import control_api
from dynspec.router.errors import MethodNotAllowed, NoServer
from dynspec.router.learning import SpeedLearner
from dynspec.router.metrics import RouterMetrics
from dynspec.router.policy import POLICIES, Policy
from dynspec.router.pool import Pools
from dynspec.router.proxy import send_error
from dynspec.router.request import PROXY_PATHS
from dynspec.router.runtime import Runtime, load_signal


class RouterApp:
    """The ASGI callable: completions go to the relay, everything else to FastAPI."""

    def __init__(
        self,
        config: RouterConfig,
        pools: Pools,
        learner: SpeedLearner,
        metrics: RouterMetrics,
        registry: CollectorRegistry,
    ) -> None:
        self.config = config
        self.pools = pools
        self.learner = learner
        self.metrics = metrics
        # Set while the server runs (between the lifespan's start and its end).
        self.runtime: Runtime | None = None
        self.api = control_api(
            config, pools, learner, registry, runtime=self.running, lifespan=self._lifespan
        )

    def running(self) -> Runtime:
        runtime = self.runtime
        if runtime is None:
            raise NoServer("the router is not serving (starting or stopping)")
        return runtime

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(self.config, self.pools, self.learner, self.metrics)
        await runtime.start()
        self.runtime = runtime
        try:
            yield
        finally:
            self.runtime = None
            await runtime.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROXY_PATHS:
            if scope["method"] != "POST":
                exc = MethodNotAllowed(f"method {scope['method']} not allowed, use POST")
                await send_error(send, exc, [(b"allow", b"POST")])
                return
            runtime = self.runtime
            if runtime is None:
                await send_error(send, NoServer("the router is not serving (starting or stopping)"))
                return
            await runtime.proxy(scope, receive, send)
            return
        await self.api(scope, receive, send)


def create_app(
    config: RouterConfig,
    *,
    policy: Policy | None = None,
    registry: CollectorRegistry | None = None,
) -> RouterApp:
    registry = registry if registry is not None else CollectorRegistry()
    pools = Pools(
        config.servers(),
        policy if policy is not None else POLICIES[config.policy](),
        threshold=config.threshold,
        hysteresis=config.hysteresis,
        max_concurrency=config.max_concurrency,
        pairs=config.pairs,
        auto=config.threshold_auto,
        signal=load_signal(config, registry),
    )
    metrics = RouterMetrics(registry, pools)
    pools.on_switch = metrics.switched
    pools.on_route = metrics.routed
    # Learned under every policy: ``balance`` routes by the curves, ``--threshold auto`` derives
    # thresholds from them; otherwise they are shown in /status and /metrics. Each server record
    # gets its ServerSpeed.
    learner = SpeedLearner(pools.servers, config.speed_profile)
    if config.threshold_auto:
        pools.derive()
    return RouterApp(config, pools, learner, metrics, registry)
