"""The router application: the bare ASGI relay in front of a FastAPI app for control routes.

``create_app`` builds what lasts as long as the app object: one ``Pools`` (the counts), one
``SpeedLearner`` (each server's speed curve), one ``RouterMetrics`` (on the given registry) and
the control routes (``control.py``). What lives as long as the server — the upstream client, the
health checks, the proxy and its watchdog — is one ``Runtime``, built and started when the ASGI
lifespan starts and stopped when it ends. ``RouterApp`` handles the lifespan scope itself (the
FastAPI app sees none) and puts the runtime in the lifespan state, which the server copies into
every request's ``scope["state"]``: that is where the control routes find it
(``runtime.running``).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from dynspec.router.config import RouterConfig
from dynspec.router.control import control_api
from dynspec.router.errors import MethodNotAllowed, not_serving, send_error
from dynspec.router.learning import SpeedLearner
from dynspec.router.metrics import RouterMetrics
from dynspec.router.policy import POLICIES, Policy
from dynspec.router.pool import Pools
from dynspec.router.request import PROXY_PATHS
from dynspec.router.runtime import STATE_KEY, Runtime, load_signal

logger = logging.getLogger(__name__)


class RouterApp:
    """The ASGI callable: completions go to the relay, the lifespan to ``_lifespan``, everything
    else to FastAPI."""

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
        # Set while the server runs (between the lifespan's start and its end): the relay reads
        # it here, the control routes from their scope's state.
        self.runtime: Runtime | None = None
        self.api = control_api(config, pools, learner, registry)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    runtime = Runtime(self.config, self.pools, self.learner, self.metrics)
                    await runtime.start()
                except Exception as exc:
                    logger.exception("the router could not start")
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                self.runtime = runtime
                # A server without lifespan state gives none: the control routes then answer
                # 503 as while starting (uvicorn has given it since 0.21).
                state = scope.get("state")
                if state is not None:
                    state[STATE_KEY] = runtime
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                scope.get("state", {}).pop(STATE_KEY, None)
                if self.runtime is not None:
                    stopping, self.runtime = self.runtime, None
                    await stopping.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and scope["path"] in PROXY_PATHS:
            if scope["method"] != "POST":
                exc = MethodNotAllowed(f"method {scope['method']} not allowed, use POST")
                await send_error(send, exc, [(b"allow", b"POST")])
                return
            runtime = self.runtime
            if runtime is None:
                await send_error(send, not_serving())
                return
            await runtime.proxy(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(scope, receive, send)
        else:
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
        return_delay=config.return_delay,
        switch_margin=config.switch_margin,
        switch_lead=config.switch_lead,
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
