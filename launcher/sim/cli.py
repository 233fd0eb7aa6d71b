"""``dynspec-sim``: one simulated SGLang server on uvicorn (uvloop + httptools), or with ``--pair``
both servers of a pair (EAGLE-3 and baseline) sharing one simulated GPU, from one process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from collections.abc import Sequence
from typing import Any

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
from dynspec.launcher.sim.profile import SHARING_WAYS

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
    p.add_argument(
        "--port", type=port_or_zero, default=None, help="port to listen on (default 30000)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument(
        "--mode",
        choices=("eagle", "baseline"),
        default=None,
        help="which server of the profile's pair to simulate (EAGLE-3 or plain decoding; "
        "default eagle)",
    )
    p.add_argument(
        "--pair",
        action="store_true",
        help="serve BOTH servers of the pair from one process on one simulated GPU: EAGLE-3 on "
        "--eagle-port, the baseline on --baseline-port (not with --port or --mode)",
    )
    p.add_argument("--eagle-port", type=port_or_zero, default=None, help="--pair: EAGLE's port")
    p.add_argument(
        "--baseline-port", type=port_or_zero, default=None, help="--pair: the baseline's port"
    )
    p.add_argument(
        "--sharing",
        choices=SHARING_WAYS,
        default="timeslice",
        help="--pair: how the two servers share the GPU (CUDA time-slicing or MPS); each one's "
        "share while both run comes from the profile's 'sharing' entry, else measured defaults",
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
        "--stream-interval",
        type=positive_int,
        default=1,
        help="SGLang's flag: a streamed request's tokens go out every N (the first at once; "
        "a step that passes the mark waits for the next), all of them at its end "
        "(default 1: token by token; with --pair, both servers)",
    )
    p.add_argument(
        "--baseline-stream-interval",
        type=positive_int,
        default=None,
        help="--pair: the baseline's --stream-interval (default: --stream-interval)",
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


def check_pair(args: argparse.Namespace) -> None:
    """The flag combinations of --pair (UsageError: one line, exit 2)."""
    if args.pair:
        if args.port is not None or args.mode is not None:
            raise UsageError(
                "--pair serves both modes on --eagle-port/--baseline-port: drop --port and --mode"
            )
        if args.eagle_port is None or args.baseline_port is None:
            raise UsageError("--pair needs both --eagle-port and --baseline-port")
        if args.eagle_port == args.baseline_port and args.eagle_port != 0:
            raise UsageError("--eagle-port and --baseline-port must differ")
    elif args.eagle_port is not None or args.baseline_port is not None:
        raise UsageError("--eagle-port and --baseline-port need --pair")
    elif args.baseline_stream_interval is not None:
        raise UsageError("--baseline-stream-interval needs --pair (else: --stream-interval)")


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dynspec.launcher.sim.app import SimApp, SimConfig
    from dynspec.launcher.sim.profile import ProfileError, load_profile
    from dynspec.launcher.sim.shared_gpu import SharedGpu

    check_pair(args)
    modes = ("eagle", "baseline") if args.pair else (args.mode or "eagle",)
    try:
        profile = load_profile(args.profile)
        for mode in modes:
            profile.mode(mode)
        shared = SharedGpu(profile.share_model(args.sharing), args.sharing) if args.pair else None
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    ports = {"eagle": args.eagle_port, "baseline": args.baseline_port} if args.pair else {}
    servers: list[tuple[uvicorn.Server, socket.socket]] = []
    for mode in modes:
        port = ports[mode] if args.pair else (30000 if args.port is None else args.port)
        config = SimConfig(
            profile=profile,
            mode=mode,
            served_model_name=args.served_model_name,
            max_running_requests=args.max_running_requests,
            startup_delay=args.startup_delay,
            speed=args.speed,
            seed=args.seed,
            host=args.host,
            port=port,
            shared=shared,
            stream_interval=(
                args.baseline_stream_interval
                if mode == "baseline" and args.baseline_stream_interval is not None
                else args.stream_interval
            ),
        )
        servers.append((_server(SimApp(config), args), _listen(args.host, port)))
        logger.info(
            "dynspec-sim %s on %s:%d, profile %s%s%s",
            mode,
            args.host,
            port,
            profile.name,
            " (illustrative, not measured)" if profile.illustrative else "",
            f", GPU shared with its pair ({args.sharing})" if args.pair else "",
        )
    if len(servers) == 1:
        server, sock = servers[0]
        # Server.run() builds the event loop from config.loop (asyncio.run(server.serve()) would
        # not).
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:
            raise RuntimeError(
                f"the server stopped during startup (uvicorn exit {exc.code})"
            ) from None
        return 0
    _run_pair(servers)
    return 0


def _run_pair(servers: list[tuple[Any, socket.socket]]) -> None:
    """Both servers on one event loop; a signal to either stops both."""
    import uvloop

    everyone = [s for s, _ in servers]
    for server, _ in servers:
        own = server.handle_exit

        def handle_exit(sig: int, frame: Any, own: Any = own) -> None:
            own(sig, frame)
            for other in everyone:
                other.should_exit = True

        server.handle_exit = handle_exit

    async def both() -> None:
        await asyncio.gather(*(s.serve(sockets=[sock]) for s, sock in servers))

    try:
        uvloop.run(both())
    except SystemExit as exc:
        raise RuntimeError(f"a server stopped during startup (uvicorn exit {exc.code})") from None


def _server(app: Any, args: argparse.Namespace) -> Any:
    import uvicorn

    loop = "uvloop" if sys.platform != "win32" else "asyncio"
    uv_config = uvicorn.Config(
        app,
        host=args.host,
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
    return uvicorn.Server(uv_config)


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
