"""``dynspec-router``: parse flags, bind the socket, serve on uvloop + httptools.

One process, one event loop: the in-flight counts, the routing mode and the hysteresis are state
that every request reads and changes. Several workers would each see only their own share of the
load (a threshold of 8 over 4 workers would switch at about 32 in total, or never), would flip
modes independently, and would report four different ``/status`` and ``/metrics``. One loop also
needs no locks: ``Pools`` changes counts synchronously between awaits. One core relays well over
ten thousand chunks per second, and ``--max-concurrency`` sheds load beyond that with a clear 503.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import sys
from collections.abc import Coroutine
from types import FrameType
from typing import Any, NoReturn

import uvicorn

from dynspec.common.cli import configure_logging, run_main
from dynspec.router.app import create_app
from dynspec.router.config import PROG, RouterConfig, build_parser, config_from_args
from dynspec.router.downstream import relay_protocol

logger = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket whose accepted connections have TCP_NODELAY on.

    The socket is made with an explicit ``IPPROTO_TCP``: asyncio sets TCP_NODELAY on accepted
    sockets only when their ``proto`` says TCP, and a socket made with proto 0 leaves Nagle on
    (measured: +40 ms time to first token from Nagle meeting delayed ACKs). The listener gets
    TCP_NODELAY too, which Linux copies to accepted sockets whatever the event loop does.
    """
    infos = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    # uvicorn.Config(loop="uvloop") only acts in Server.run(); serving our own socket means
    # running the loop ourselves, so uvloop is chosen here.
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it exists
        asyncio.run(main)
        return
    uvloop.run(main)


def _note_signal(signum: int, _frame: FrameType | None) -> None:
    # uvicorn handles SIGTERM/SIGINT while serving, then re-raises the signal into the handler
    # that was installed before: this one, so a graceful stop ends with exit 0, not a re-kill.
    logger.debug("stopped by signal %d", signum)


def serve(config: RouterConfig) -> int:
    sock = bind_socket(config.host, config.port)
    if config.open_to_others() and not config.api_key:
        logger.warning(
            "listening on %s:%d without --api-key: anyone who can reach this address can send "
            "requests (use --host 127.0.0.1, or set --api-key)",
            config.host,
            config.port,
        )
    app = create_app(config)
    # uvicorn's httptools protocol with the client limits and timeouts, plus (unless switched
    # off) the relay's shortcut for streamed chunks.
    protocol = relay_protocol(
        config.client_limits(),
        direct_relay=config.direct_relay,
        on_timeout=app.metrics.client_timeout,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            http=protocol,
            # uvicorn types it int; its timer takes any number of seconds.
            timeout_keep_alive=config.keep_alive_timeout,  # type: ignore[arg-type]
            lifespan="on",
            access_log=False,
            log_config=None,
            server_header=False,
            # The router reads no client address, so uvicorn's X-Forwarded-* middleware would
            # be pure per-request cost.
            proxy_headers=False,
            timeout_graceful_shutdown=math.ceil(config.drain_timeout),
        )
    )
    signal.signal(signal.SIGTERM, _note_signal)
    signal.signal(signal.SIGINT, _note_signal)
    try:
        run_loop(server.serve(sockets=[sock]))
    finally:
        sock.close()
    if not server.started:
        raise RuntimeError("the router did not start (see the log above)")
    return 0


def check(config: RouterConfig) -> int:
    """``--check``: the settings hold (``config_from_args`` raised nothing); serve nothing."""
    print(f"{PROG}: the settings hold: {config!r}")
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    ns = build_parser().parse_layered(sys.argv[1:] if argv is None else argv)
    configure_logging(ns.log_level)
    act = check if ns.check else serve
    run_main(PROG, lambda: act(config_from_args(ns)), ns.log_level)
