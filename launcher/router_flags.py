"""Router settings the launcher passes through unchanged: one row per flag."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dynspec.common.cli import (
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

MIB = 1024 * 1024


@dataclass(frozen=True)
class RouterSetting:
    flag: str
    type: Callable[[str], object]
    default: object
    help: str
    # An on/off flag (no value): passed to the router, bare, when on.
    switch: bool = False
    # The values it may take, where the router lists them (argparse's choices).
    choices: tuple[str, ...] | None = None


# Router settings the launcher passes through as they are: each is a launcher flag and TOML key of
# the same name, with the router's check and default (tests hold them to the router's own parser);
# a value other than the default reaches the router. Adding one is one row here. Keys reach the
# router through its environment (see spec.SECRET_ENV). The launcher's own uses of a setting
# (threshold, drain-timeout, log-level) are flags of its own.
ROUTER_SETTINGS = (
    RouterSetting("--api-key", str, None, "key clients must send (Authorization: Bearer KEY)"),
    RouterSetting("--admin-api-key", str, None, "key for /admin/* and /status (else 403)"),
    RouterSetting(
        "--backend-api-key",
        str,
        None,
        "key the router sends to the servers; both SGLang servers get it as their --api-key",
    ),
    RouterSetting(
        "--return-delay",
        non_negative_float,
        None,
        "seconds the load must stay at or below threshold - hysteresis before new requests go "
        "back to the EAGLE pool (0: at once; default: 1 with pairs, else 0)",
    ),
    RouterSetting(
        "--switch-margin",
        fraction,
        0.0,
        "with --threshold auto, in a pair: EAGLE keeps a load only where it is predicted at least "
        "this share faster a token (0: where it is no slower)",
    ),
    RouterSetting(
        "--switch-lead",
        non_negative_float,
        0.0,
        "leave EAGLE when a rising load is predicted to pass the threshold within this many "
        "EAGLE stays (0: off)",
    ),
    RouterSetting(
        "--max-concurrency",
        non_negative_int,
        0,
        "requests in flight beyond this get 503 with Retry-After (0: no limit)",
    ),
    RouterSetting(
        "--request-timeout",
        positive_float,
        600.0,
        "seconds to wait for a server's first byte and between two reads, else 504",
    ),
    RouterSetting(
        "--connect-timeout", positive_float, 5.0, "seconds to open a connection to a server"
    ),
    RouterSetting(
        "--max-body-bytes",
        non_negative_int,
        32 * MIB,
        "largest request body the router accepts; larger ones get 413",
    ),
    RouterSetting(
        "--health-interval", positive_float, 2.0, "seconds between two health checks of a server"
    ),
    RouterSetting(
        "--upstream-ca",
        str,
        None,
        "PEM file of the CA(s) for https server URLs, in place of the system's trust store",
    ),
    RouterSetting(
        "--no-direct-relay",
        str,
        False,
        "the router sends every streamed chunk through uvicorn's ASGI send (slower)",
        switch=True,
    ),
    RouterSetting(
        "--metrics-interval",
        non_negative_float,
        1.0,
        "seconds between the router's polls of each server's /metrics for its speed (0: off)",
    ),
    # -- the router's client limits and timeouts (router/downstream.py) --
    RouterSetting(
        "--max-header-bytes",
        positive_int,
        32 * 1024,
        "largest request head the router accepts (each line at most 8 KiB, 100 headers; over: 431)",
    ),
    RouterSetting(
        "--client-header-timeout",
        positive_float,
        10.0,
        "seconds a client has to send its request head to the router",
    ),
    RouterSetting(
        "--client-body-timeout",
        positive_float,
        60.0,
        "seconds a client has to send its whole request body to the router (else 408)",
    ),
    RouterSetting(
        "--keep-alive-timeout",
        positive_float,
        5.0,
        "seconds an idle kept-alive client connection to the router stays open",
    ),
    # -- the shared load signal (router/loadsignal.py) --
    RouterSetting(
        "--load-signal",
        str,
        "local",
        "the load compared with the threshold: 'local' (this router's own requests) or "
        "'servers' (each server's running + queued, so several routers agree)",
        choices=("local", "servers"),
    ),
    RouterSetting(
        "--load-interval",
        positive_float,
        0.25,
        "with --load-signal servers: seconds between two reads of each server's load",
    ),
)
