"""What lives exactly as long as the server: the upstream client and the tasks around it.

``Runtime`` is built and started in the app's lifespan and stopped at its end. It makes the one
shared ``upstream.Client``, then each part that uses it, in the order they depend on each other:
the health checker, the proxy (which tells the checker of a refused connection). Its background
parts are ``services``: started in order once the first health round is in, so routing starts
from the truth, and stopped in reverse before the client closes. The metrics poller (speed
learning) is one of them, and with ``--load-signal servers`` the load poller.
"""

from __future__ import annotations

import logging
from typing import Protocol

from prometheus_client import CollectorRegistry
from starlette.types import Scope

from dynspec.router.config import RouterConfig
from dynspec.router.errors import not_serving
from dynspec.router.health import HealthChecker
from dynspec.router.learning import SpeedLearner
from dynspec.router.loadsignal import LoadPoller, LoadSignal
from dynspec.router.metrics import LoadSignalMetrics, RouterMetrics
from dynspec.router.poller import MetricsPoller
from dynspec.router.pool import Pools
from dynspec.router.proxy import Proxy
from dynspec.router.upstream import Client

logger = logging.getLogger(__name__)

# The key of the running ``Runtime`` in the ASGI lifespan state (``app.RouterApp``), which the
# server copies into each request's ``scope["state"]``.
STATE_KEY = "dynspec.runtime"


# A reading older than this many load intervals (and at least MIN_AGE_S) is not used.
MAX_AGE_INTERVALS = 4
MIN_AGE_S = 2.0


def load_signal(config: RouterConfig, registry: CollectorRegistry) -> LoadSignal | None:
    """The shared load signal for ``--load-signal servers`` (None for ``local``), its error
    counter registered on ``registry``."""
    if config.load_signal != "servers":
        return None
    urls = [url for url, _ in config.servers()]
    metrics = LoadSignalMetrics(registry, urls)
    max_age = max(MAX_AGE_INTERVALS * config.load_interval, MIN_AGE_S)
    return LoadSignal(urls, max_age=max_age, on_error=metrics.error)


class Service(Protocol):
    """A part with background tasks: ``start`` creates them, ``stop`` cancels and awaits them."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class Runtime:
    def __init__(
        self, config: RouterConfig, pools: Pools, learner: SpeedLearner, metrics: RouterMetrics
    ) -> None:
        self.config = config
        # Header lines for the router's own requests to a server (health, model list).
        self.backend_headers = config.backend_headers
        # No cap on connections: --max-concurrency is the limit, and it answers 503 rather
        # than queue. Idle ones close after upstream.IDLE_TIMEOUT. Every request to a server
        # (relay, health checks, the passthrough endpoints) goes through this client and its TLS.
        self.client = Client(connect_timeout=config.connect_timeout, tls=config.tls())
        self.health = HealthChecker(
            pools, self.client, config.health_interval, self.backend_headers
        )
        self.proxy = Proxy(
            pools,
            metrics,
            self.client,
            api_auth=config.api_auth,
            backend_headers=config.backend_headers,
            max_body_bytes=config.max_body_bytes,
            request_timeout=config.request_timeout,
            on_refused=self.health.refused,
            on_finish=learner.finished,
        )
        # Feeds the speed learner from each server's /metrics (off with --metrics-interval 0).
        self.poller = MetricsPoller(
            learner,
            pools.servers,
            self.client,
            interval=config.metrics_interval,
            headers=self.backend_headers,
            on_error=metrics.poll_error,
        )
        self.services: list[Service] = [self.health, self.proxy, self.poller]
        if pools.signal is not None:
            self.services.append(
                LoadPoller(
                    pools.signal,
                    self.client,
                    interval=config.load_interval,
                    headers=self.backend_headers,
                )
            )

    async def start(self) -> None:
        await self.health.check_all()
        for service in self.services:
            service.start()
        config = self.config
        servers = (
            "pairs " + " ".join(f"{e},{b}" for e, b in config.pairs)
            if config.pairs
            else f"eagle {','.join(config.eagle_urls) or '-'}, "
            f"baseline {','.join(config.baseline_urls) or '-'}"
        )
        logger.info(
            "routing %s: %s, threshold %s, hysteresis %d, speed profile %s, metrics poll %s, "
            "load signal %s",
            config.policy,
            servers,
            "auto" if config.threshold_auto else config.threshold,
            config.hysteresis,
            config.speed_profile_path or "none (neutral start)",
            f"every {config.metrics_interval:g}s" if config.metrics_interval > 0 else "off",
            f"servers every {config.load_interval:g}s"
            if config.load_signal == "servers"
            else "local",
        )

    async def stop(self) -> None:
        for service in reversed(self.services):
            await service.stop()
        self.client.close()


def running(scope: Scope) -> Runtime:
    """The running ``Runtime`` from a request's ``scope["state"]``; ``NoServer`` (503) when the
    router is not serving."""
    runtime = scope.get("state", {}).get(STATE_KEY)
    if runtime is None:
        raise not_serving()
    assert isinstance(runtime, Runtime)
    return runtime
