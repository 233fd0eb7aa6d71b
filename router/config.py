"""The router's one frozen configuration, built once from flags and ``DYNSPEC_*`` variables."""

from __future__ import annotations

import argparse
import ipaddress
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from dynspec.common.cli import (
    FlagParser,
    UsageError,
    add_log_level,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from dynspec.router.autothreshold import AUTO_START
from dynspec.router.downstream import MAX_LINE_BYTES, ClientLimits
from dynspec.router.loadsignal import SIGNALS
from dynspec.router.policy import POLICIES, PoolName
from dynspec.router.speed import ProfileError, SpeedProfile, profile_from_json
from dynspec.router.thresholds import validate_settings
from dynspec.router.upstream import tls_context

PROG = "dynspec-router"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RouterConfig:
    eagle_urls: tuple[str, ...]
    baseline_urls: tuple[str, ...]
    policy: str = "threshold"
    threshold: int = 8
    hysteresis: int = 2
    # Seconds a group's load must stay at or below threshold - hysteresis before its new
    # requests go back to EAGLE (0: at once). The flag's default: PAIR_RETURN_DELAY_S with
    # --pair, else 0.
    return_delay: float = 0.0
    # --switch-margin: in a pair, EAGLE keeps a load only where it is predicted this much faster
    # a token (--threshold auto).
    switch_margin: float = 0.0
    # --switch-lead: a rising load is judged this many EAGLE stays ahead (``trend``; 0: off).
    switch_lead: float = 0.0
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    backend_api_key: str | None = None
    admin_api_key: str | None = None
    max_body_bytes: int = 32 * MIB
    request_timeout: float = 600.0
    connect_timeout: float = 5.0
    health_interval: float = 2.0
    max_concurrency: int = 0
    drain_timeout: float = 30.0
    upstream_ca: str | None = None
    direct_relay: bool = True
    log_level: str = "info"
    # The speed curves read from --speed-profile (a prior for the speed learner), and the file.
    speed_profile: SpeedProfile | None = None
    speed_profile_path: str | None = None
    metrics_interval: float = 1.0
    # --- the shared load signal (router/loadsignal.py) ---
    load_signal: str = "local"
    load_interval: float = 0.25
    # -- client limits and timeouts (router/downstream.py) --
    max_header_bytes: int = 32 * 1024
    client_header_timeout: float = 10.0
    client_body_timeout: float = 60.0
    keep_alive_timeout: float = 5.0
    # -- end client limits --

    def client_limits(self) -> ClientLimits:
        return ClientLimits(
            max_header_bytes=self.max_header_bytes,
            max_line_bytes=min(MAX_LINE_BYTES, self.max_header_bytes),
            header_timeout=self.client_header_timeout,
            body_timeout=self.client_body_timeout,
        )

    # -- pairs and the learned threshold (issue 16) --
    # (eagle URL, baseline URL) per --pair, in the order given; empty: the pools layout.
    pairs: tuple[tuple[str, str], ...] = ()
    # --threshold auto: ``threshold`` is the starting value, then derived from the speed curves.
    threshold_auto: bool = False

    # -- the key header bytes, built once from the keys above (``__post_init__``) --
    # What a client sends on /v1/* ('Bearer KEY'); None: no key asked.
    api_auth: bytes | None = field(default=None, init=False, repr=False, compare=False)
    # What an operator sends on /admin/* (and /status); None: the admin endpoints are off.
    admin_auth: bytes | None = field(default=None, init=False, repr=False, compare=False)
    # The header line the router sends to the servers (relay, health, metrics, passthrough).
    backend_headers: bytes = field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        def bearer(key: str | None) -> bytes | None:
            return b"Bearer " + key.encode() if key else None

        backend = bearer(self.backend_api_key)
        object.__setattr__(self, "api_auth", bearer(self.api_key))
        object.__setattr__(self, "admin_auth", bearer(self.admin_api_key))
        object.__setattr__(
            self, "backend_headers", b"authorization: " + backend + b"\r\n" if backend else b""
        )

    def servers(self) -> list[tuple[str, PoolName]]:
        if self.pairs:
            out: list[tuple[str, PoolName]] = []
            for e, b in self.pairs:
                out += [(e, "eagle"), (b, "baseline")]
            return out
        eagle: list[tuple[str, PoolName]] = [(u, "eagle") for u in self.eagle_urls]
        baseline: list[tuple[str, PoolName]] = [(u, "baseline") for u in self.baseline_urls]
        return eagle + baseline

    def __repr__(self) -> str:
        # Keys never reach a log line, even through a debug dump of the config.
        def mask(v: str | None) -> str:
            return "None" if v is None else "'***'"

        return (
            f"RouterConfig(eagle_urls={self.eagle_urls!r}, baseline_urls={self.baseline_urls!r}, "
            f"policy={self.policy!r}, threshold={self.threshold}, hysteresis={self.hysteresis}, "
            f"return_delay={self.return_delay}, switch_margin={self.switch_margin}, "
            f"switch_lead={self.switch_lead}, "
            f"host={self.host!r}, port={self.port}, "
            f"api_key={mask(self.api_key)}, "
            f"backend_api_key={mask(self.backend_api_key)}, "
            f"admin_api_key={mask(self.admin_api_key)}, max_body_bytes={self.max_body_bytes}, "
            f"request_timeout={self.request_timeout}, connect_timeout={self.connect_timeout}, "
            f"health_interval={self.health_interval}, max_concurrency={self.max_concurrency}, "
            f"drain_timeout={self.drain_timeout}, upstream_ca={self.upstream_ca!r}, "
            f"direct_relay={self.direct_relay}, log_level={self.log_level!r}, "
            f"speed_profile_path={self.speed_profile_path!r}, "
            f"metrics_interval={self.metrics_interval}, "
            f"load_signal={self.load_signal!r}, load_interval={self.load_interval}, "
            f"max_header_bytes={self.max_header_bytes}, "
            f"client_header_timeout={self.client_header_timeout}, "
            f"client_body_timeout={self.client_body_timeout}, "
            f"keep_alive_timeout={self.keep_alive_timeout}, "
            f"pairs={self.pairs!r}, threshold_auto={self.threshold_auto})"
        )

    def tls(self) -> ssl.SSLContext | None:
        """The TLS settings for https servers (None: the system's trust store)."""
        return tls_context(self.upstream_ca) if self.upstream_ca else None

    def open_to_others(self) -> bool:
        """Whether ``host`` is reachable from other machines (not a loopback address)."""
        if self.host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return True  # a host name that is not localhost: assume it is reachable


def parse_urls(text: str) -> tuple[str, ...]:
    urls: list[str] = []
    for raw in text.split(","):
        url = raw.strip().rstrip("/")
        if not url:
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise argparse.ArgumentTypeError(f"not an http(s) URL: {raw.strip()!r}")
        if parts.query or parts.fragment:
            raise argparse.ArgumentTypeError(f"a server URL takes no query: {raw.strip()!r}")
        urls.append(url)
    return tuple(urls)


# -- pairs and the learned threshold (issue 16) ----------------------------------------------------

# --return-delay's default with --pair: a pair's EAGLE server shares its baseline's GPU, so a
# request sent to EAGLE in a dip of the load (a closed loop's wave ending: the load falls to 1 for
# milliseconds, then its next wave comes) runs beside the baseline's next batch and slows all of
# it. Simulated h200-8b-accept2 (envelope --eight-gpus, with the share read as a step goes on):
# 1-2 requests a dip on EAGLE made paired-auto 0.81x 2x-baseline at C=64. A load that stays low
# this long goes back to EAGLE; the split layout's servers have GPUs of their own (0).
PAIR_RETURN_DELAY_S = 1.0


def parse_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``EAGLE_URL,BASELINE_URL`` entries, separated by whitespace or ';' (DYNSPEC_PAIR may hold
    several)."""
    pairs: list[tuple[str, str]] = []
    for entry in text.replace(";", " ").split():
        urls = parse_urls(entry)
        if len(urls) != 2 or len(entry.split(",")) != 2:
            raise argparse.ArgumentTypeError(
                f"a pair is exactly two URLs, EAGLE_URL,BASELINE_URL: {entry!r}"
            )
        pairs.append((urls[0], urls[1]))
    if not pairs:
        raise argparse.ArgumentTypeError("a pair is exactly two URLs, EAGLE_URL,BASELINE_URL")
    return tuple(pairs)


class _PairsAction(argparse.Action):
    """Repeatable ``--pair``: the command line's replace the environment's (a tuple default)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        if not isinstance(current, list):
            current = []
            setattr(namespace, self.dest, current)
        current.extend(values)  # type: ignore[arg-type]


def parse_threshold(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer or 'auto': {text!r}") from None


def check_pairs(ns: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The --pair flags, checked; a ``UsageError`` for each way they can be wrong."""
    pairs: tuple[tuple[str, str], ...] = tuple(ns.pair or ())
    if not pairs:
        return ()
    if ns.eagle_url or ns.baseline_url:
        raise UsageError("--pair cannot be used with --eagle-url/--baseline-url: use one layout")
    if ns.policy == "balance":
        raise UsageError(
            "--policy balance is for the split layout (--eagle-url/--baseline-url), not --pair"
        )
    seen: set[str] = set()
    for pair in pairs:
        if pair[0] == pair[1]:
            raise UsageError(f"--pair: a pair needs two different servers ({pair[0]})")
        for url in pair:
            if url in seen:
                what = "a pair is given twice" if pairs.count(pair) > 1 else "a URL is in two pairs"
                raise UsageError(f"--pair: {what} ({url})")
            seen.add(url)
    return pairs


def build_parser() -> FlagParser:
    p = FlagParser(
        prog=PROG,
        description=(
            "Load-aware router in front of an EAGLE-3 pool and a baseline pool of SGLang servers: "
            "light load goes to EAGLE-3 (lower latency), heavy load to the baseline (more "
            "throughput). OpenAI-compatible: POST /v1/chat/completions, /v1/completions, "
            "/v1/responses and SGLang's /generate are routed. "
            "Policies: 'threshold' switches pools at a load threshold; 'balance' sends each "
            "request to the server with the lowest predicted time per output token, from speed "
            "curves learned online (and seeded by --speed-profile)."
        ),
    )
    p.add_argument(
        "--eagle-url",
        type=parse_urls,
        default=(),
        help="EAGLE-3 server URL(s), comma-separated, e.g. http://127.0.0.1:30001",
    )
    p.add_argument(
        "--baseline-url",
        type=parse_urls,
        default=(),
        help="baseline server URL(s), comma-separated, e.g. http://127.0.0.1:30002",
    )
    p.add_argument(
        "--policy",
        default="threshold",
        choices=sorted(POLICIES),
        help="routing policy: 'threshold' (EAGLE up to --threshold, then baseline) or 'balance' "
        "(lowest predicted time per output token; both pools serve at every load)",
    )
    p.add_argument(
        "--threshold",
        type=parse_threshold,
        default=8,
        help="in eagle mode, a request whose load (in flight, counting it) exceeds this "
        "switches to the baseline pool; 'auto': the largest load at which EAGLE's predicted "
        "time per output token is no worse than the baseline's, from the speed curves",
    )
    p.add_argument(
        "--pair",
        type=parse_pairs,
        action=_PairsAction,
        default=(),
        metavar="EAGLE_URL,BASELINE_URL",
        help="an EAGLE-3 and a baseline server that share GPUs (repeatable; DYNSPEC_PAIR: "
        "entries separated by spaces or ';'): each pair has its own mode, switched by its own "
        "load; a new request goes to the least loaded pair. Not with --eagle-url/--baseline-url",
    )
    p.add_argument(
        "--hysteresis",
        type=int,
        default=2,
        help="in baseline mode, a request whose load is at or below threshold - hysteresis "
        "switches back to the eagle pool",
    )
    p.add_argument(
        "--return-delay",
        type=non_negative_float,
        default=None,
        help="seconds the load must stay at or below threshold - hysteresis (seen at every "
        "request routed and every one finished) before new requests go back to the eagle pool "
        "(0: at once); leaving it is never delayed. Stops a load that hovers near the "
        "threshold, or a learned threshold that moves, from switching the mode back and forth "
        f"(default: {PAIR_RETURN_DELAY_S:g} with --pair, where EAGLE shares the baseline's GPU; "
        "else 0)",
    )
    p.add_argument(
        "--switch-margin",
        type=fraction,
        default=0.0,
        help="with --threshold auto, in a pair (servers that share GPUs): EAGLE keeps a load only "
        "where it is predicted at least this share faster a token (0.1: 10%%), so a rising load "
        "leaves it with fewer of its requests to drain beside the baseline; 0: where it is no "
        "slower",
    )
    p.add_argument(
        "--switch-lead",
        type=non_negative_float,
        default=0.0,
        help="under a rising load, leave EAGLE (and stay off it) when the load is predicted to "
        "pass the threshold within this many EAGLE stays (the mean time a request of the group "
        "stays on EAGLE), so fewer of its requests are left to drain beside the baseline; 0: "
        "off, the load now alone",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 serves other machines (then set --api-key)",
    )
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument(
        "--api-key",
        default=None,
        help="clients must send 'Authorization: Bearer KEY' on /v1/* (default: no key)",
    )
    p.add_argument(
        "--backend-api-key",
        default=None,
        help="key sent to the servers as 'Authorization: Bearer KEY' (the client's is never "
        "forwarded)",
    )
    p.add_argument(
        "--admin-api-key",
        default=None,
        help="key for /admin/* (and /status); without it the admin endpoints answer 403",
    )
    p.add_argument(
        "--max-body-bytes",
        type=non_negative_int,
        default=32 * MIB,
        help="largest request body accepted; larger ones get 413",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds to wait for a server's first byte and between two reads, else 504",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=5.0,
        help="seconds to open a connection to a server (a failure is retried on another)",
    )
    p.add_argument(
        "--health-interval",
        type=positive_float,
        default=2.0,
        help="seconds between two health checks of each server",
    )
    p.add_argument(
        "--max-concurrency",
        type=non_negative_int,
        default=0,
        help="requests in flight beyond this get 503 with Retry-After (0: no limit)",
    )
    p.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds to let in-flight requests finish before exiting",
    )
    p.add_argument(
        "--upstream-ca",
        default=None,
        metavar="FILE",
        help="PEM file of the CA(s) that signed the https servers' certificates, in place of "
        "the system's trust store (certificates are always verified)",
    )
    p.add_argument(
        "--no-direct-relay",
        action="store_true",
        help="send every streamed chunk through uvicorn's ASGI send instead of writing it to "
        "the client's socket from the upstream reader (slower; for a uvicorn the shortcut "
        "has not been tested with)",
    )
    p.add_argument(
        "--speed-profile",
        default=None,
        metavar="FILE.json",
        help="per-mode speed curves in dynspec-sim's profile format (dynspec-bench profile "
        "writes one): the starting point of each server's learned curve (its pool's mode); "
        "without it both pools start from one neutral curve and are learned",
    )
    p.add_argument(
        "--metrics-interval",
        type=non_negative_float,
        default=1.0,
        metavar="S",
        help="seconds between two polls of each server's /metrics for its speed (running, "
        "queued, gen_throughput, accept length); 0 turns polling off",
    )
    add_load_signal(p)
    # -- client limits and timeouts (router/downstream.py) --
    p.add_argument(
        "--max-header-bytes",
        type=positive_int,
        default=32 * 1024,
        metavar="N",
        help="largest request head (request line and headers together) accepted; each line "
        "is also capped at 8 KiB and the headers at 100 (nginx's and Envoy's defaults); "
        "over any of them gets 431",
    )
    p.add_argument(
        "--client-header-timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="seconds a client has to send its request head, from connecting (or, on a "
        "kept-alive connection, from its first byte); then the connection is closed",
    )
    p.add_argument(
        "--client-body-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="seconds a client has to send its whole request body after the head, else 408",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=positive_float,
        default=5.0,
        metavar="S",
        help="seconds an idle kept-alive client connection stays open",
    )
    # -- end client limits --
    add_log_level(p)
    p.add_argument(
        "--check",
        action="store_true",
        help="read every flag, DYNSPEC_* variable "
        "and --speed-profile, say whether they hold and exit (0, else 2): no serving",
    )
    return p


# --- the shared load signal (router/loadsignal.py): its two flags, kept together ---------------


def add_load_signal(p: FlagParser) -> None:
    p.add_argument(
        "--load-signal",
        default="local",
        choices=SIGNALS,
        help="the load compared with the threshold: 'local' counts this router's own requests in "
        "flight; 'servers' reads each server's running + queued requests (SGLang's /v1/loads) "
        "and adds this router's admissions since the reading, so several routers in front of "
        "the same servers agree (a server that cannot be read is counted locally)",
    )
    p.add_argument(
        "--load-interval",
        type=positive_float,
        default=0.25,
        metavar="S",
        help="with --load-signal servers: seconds between two reads of each server's load",
    )


def _key(value: str | None) -> str | None:
    return value if value else None


def config_from_args(ns: argparse.Namespace) -> RouterConfig:
    pairs = check_pairs(ns)
    eagle: tuple[str, ...] = tuple(ns.eagle_url)
    baseline: tuple[str, ...] = tuple(ns.baseline_url)
    if pairs:
        eagle = tuple(e for e, _ in pairs)
        baseline = tuple(b for _, b in pairs)
    if not eagle and not baseline:
        raise UsageError("give at least one server: --eagle-url and/or --baseline-url, or --pair")
    auto = ns.threshold == "auto"
    threshold: int = AUTO_START if auto else ns.threshold
    if auto and ns.hysteresis >= 0:
        # Clamped below each learned threshold; the start value needs it below too.
        hysteresis_checked = min(ns.hysteresis, threshold - 1)
    else:
        hysteresis_checked = ns.hysteresis
    dupes = set(eagle) & set(baseline)
    if dupes or len(set(eagle)) != len(eagle) or len(set(baseline)) != len(baseline):
        raise UsageError("a server URL appears twice")
    reason = validate_settings(threshold, hysteresis_checked)
    if reason is not None:
        raise UsageError(reason)
    if not 0 <= ns.port <= 65535:
        raise UsageError(f"--port out of range: {ns.port}")
    ca = ns.upstream_ca or None
    if ca is not None:
        try:
            tls_context(ca)
        except (OSError, ssl.SSLError) as exc:
            reason = exc.strerror or str(exc)
            raise UsageError(f"--upstream-ca {ca}: not a readable PEM CA file ({reason})") from None
    profile = None
    if ns.speed_profile:
        profile = read_speed_profile(ns.speed_profile)
        for pool, urls in (("eagle", eagle), ("baseline", baseline)):
            if urls and pool not in profile.modes:
                raise UsageError(
                    f"--speed-profile {ns.speed_profile}: no {pool!r} mode for the {pool} servers"
                )
    return RouterConfig(
        eagle_urls=eagle,
        baseline_urls=baseline,
        policy=ns.policy,
        threshold=threshold,
        hysteresis=ns.hysteresis,
        return_delay=(
            ns.return_delay
            if ns.return_delay is not None
            else (PAIR_RETURN_DELAY_S if pairs else 0.0)
        ),
        switch_margin=ns.switch_margin,
        switch_lead=ns.switch_lead,
        host=ns.host,
        port=ns.port,
        api_key=_key(ns.api_key),
        backend_api_key=_key(ns.backend_api_key),
        admin_api_key=_key(ns.admin_api_key),
        max_body_bytes=ns.max_body_bytes,
        request_timeout=ns.request_timeout,
        connect_timeout=ns.connect_timeout,
        health_interval=ns.health_interval,
        max_concurrency=ns.max_concurrency,
        drain_timeout=ns.drain_timeout,
        upstream_ca=ca,
        direct_relay=not ns.no_direct_relay,
        log_level=ns.log_level,
        speed_profile=profile,
        speed_profile_path=ns.speed_profile or None,
        metrics_interval=ns.metrics_interval,
        load_signal=ns.load_signal,
        load_interval=ns.load_interval,
        # -- client limits and timeouts --
        max_header_bytes=ns.max_header_bytes,
        client_header_timeout=ns.client_header_timeout,
        client_body_timeout=ns.client_body_timeout,
        keep_alive_timeout=ns.keep_alive_timeout,
        pairs=pairs,
        threshold_auto=auto,
    )


def read_speed_profile(path: str) -> SpeedProfile:
    """Read and check a --speed-profile file; any problem is a one-line ``UsageError``."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise UsageError(f"--speed-profile: cannot read {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"--speed-profile {path}: not valid JSON ({reason})") from None
    try:
        return profile_from_json(raw)
    except ProfileError as exc:
        raise UsageError(f"--speed-profile {path}: {exc}") from None


def parse_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> RouterConfig:
    """Flags over ``DYNSPEC_*``; argparse errors exit 2, semantic ones raise ``UsageError``."""
    return config_from_args(build_parser().parse_layered(argv, environ=environ))
