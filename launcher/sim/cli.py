"""``dynspec-sim``: one simulated SGLang server on uvicorn (uvloop + httptools)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Sequence

from dynspec.common.cli import (
    FlagParser,
    UsageError,
    add_log_level,
    configure_logging,
    non_negative_float,
    port_or_zero,
    positive_float,
    positive_int,
    run_main,
)

logger = logging.getLogger(__name__)
PROG = "dynspec-sim"


def build_parser() -> FlagParser:
    p = FlagParser(
        prog=PROG,
        description=(
            "A simulated SGLang 0.5.23 server: the same HTTP surface (OpenAI chat and completions, "
            "streamed or not, /health, /metrics, /server_info, /abort_request) with a modelled "
            "continuous-batching engine whose speed comes from a profile. No GPU, no model."
        ),
    )
    p.add_argument("--port", type=port_or_zero, default=30000, help="port to listen on")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--mode",
        choices=("eagle", "baseline"),
        default="eagle",
        help="which server of the profile's pair to simulate (EAGLE-3 or plain decoding)",
    )
    p.add_argument(
        "--profile",
        default="demo",
        help="a shipped profile name (demo, seed, eagle3-h100) or a profile FILE.json",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="model name in /v1/models and answers (default: the profile's model)",
    )
    p.add_argument(
        "--max-running-requests",
        type=positive_int,
        default=None,
        help="requests decoded at once; more wait in a FIFO queue "
        "(default: the profile's, else 48 for eagle as SGLang forces, 1024 for baseline)",
    )
    p.add_argument(
        "--startup-delay",
        type=non_negative_float,
        default=0.0,
        help="seconds (real time) during which /health and /health_generate answer 503",
    )
    p.add_argument(
        "--speed",
        type=positive_float,
        default=1.0,
        help="simulated time runs this many times faster than real time (1 = real time)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="makes generated text and accept lengths reproducible (same seed + same prompt "
        "= same answer and chunks); default: random",
    )
    add_log_level(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_layered(argv)
    configure_logging(args.log_level)
    run_main(PROG, lambda: serve(args), args.log_level)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dynspec.launcher.sim.app import SimApp, SimConfig
    from dynspec.launcher.sim.profile import ProfileError, load_profile

    try:
        profile = load_profile(args.profile)
        profile.mode(args.mode)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    config = SimConfig(
        profile=profile,
        mode=args.mode,
        served_model_name=args.served_model_name,
        max_running_requests=args.max_running_requests,
        startup_delay=args.startup_delay,
        speed=args.speed,
        seed=args.seed,
        host=args.host,
        port=args.port,
    )
    app = SimApp(config)
    loop = "uvloop" if sys.platform != "win32" else "asyncio"
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop=loop,
        http="httptools",
        lifespan="on",
        access_log=False,
        proxy_headers=False,  # no X-Forwarded-* rewriting: one middleware less per request
        log_level="warning" if args.log_level != "debug" else "debug",
        timeout_keep_alive=60,
        # On SIGTERM, streams still open (long or stalled ones) get this long before they are cut.
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    server = uvicorn.Server(uv_config)
    sock = _listen(args.host, args.port)
    logger.info(
        "dynspec-sim %s on %s:%d, profile %s%s",
        args.mode,
        args.host,
        args.port,
        profile.name,
        " (illustrative, not measured)" if profile.illustrative else "",
    )
    # Server.run() builds the event loop from config.loop (asyncio.run(server.serve()) would not).
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:
        raise RuntimeError(f"the server stopped during startup (uvicorn exit {exc.code})") from None
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """Bind here, so a busy port is one clear line; IPPROTO_TCP keeps TCP_NODELAY on accepts."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(4096)
    except OSError as exc:
        raise RuntimeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
