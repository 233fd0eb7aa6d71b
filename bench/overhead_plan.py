"""The overhead benchmark's plan: its settings, the workloads of each phase, and the processes of
a phase (two lean upstreams, the relays under test) with each target's URL."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from dynspec.bench.procs import free_port

# "floor" is a reference, not a router: the cheapest relay Python can be (overhead_floor.py).
# "floor-asgi" is the same on uvicorn with a bare ASGI app, as the router's client side is.
TARGETS = ("direct", "floor", "floor-asgi", "dynspec", "sglang")
RELAYS = ("floor", "floor-asgi", "dynspec", "sglang")
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Workload:
    """One load run's shape: token interval, concurrency, tokens per stream, requests."""

    interval_ms: float
    concurrency: int
    tokens: int
    requests: int


@dataclass
class OverheadConfig:
    """What to run: targets, phases (token intervals), concurrencies, stream lengths, repeats."""

    targets: list[str]
    intervals_ms: list[float]
    concurrency: list[int]
    tokens: int
    cost_tokens: list[int]
    cost_concurrency: int
    cost_interval_ms: float
    runs: int
    requests: dict[int, int]
    max_seconds: float
    threshold: int
    soak: int
    out: Path
    log_dir: Path
    dynspec_args: list[str]
    sglang_args: list[str]
    # None: one stream's duration (tokens x interval); else milliseconds.
    stagger_ms: float | None = None
    min_unpaced_requests: int = 300

    def stagger_for(self, workload: Workload) -> float:
        if self.stagger_ms is not None:
            return self.stagger_ms
        return workload.tokens * workload.interval_ms


def requests_for(s: OverheadConfig, c: int, tokens: int, interval: float) -> int:
    n = s.requests.get(c)
    if n is None:
        n = max(c * 8, 30)
    if interval == 0:
        # Unpaced streams end in about a millisecond: enough of them to last a while.
        n = max(n, s.min_unpaced_requests)
    # Long streams: as many chunks as the short ones would carry, but at least four rounds.
    if tokens > s.tokens:
        n = max(c * 4, n * s.tokens // tokens)
    return n


def workloads(s: OverheadConfig, interval: float) -> list[Workload]:
    """The workloads of the phase with this token interval: each concurrency with the main stream
    length, and in the cost-model phase each cost-model stream length too."""
    out = [
        Workload(interval, c, s.tokens, requests_for(s, c, s.tokens, interval))
        for c in s.concurrency
    ]
    if interval == s.cost_interval_ms:
        for t in s.cost_tokens:
            w = Workload(
                interval, s.cost_concurrency, t, requests_for(s, s.cost_concurrency, t, interval)
            )
            if w not in out:
                out.append(w)
    return out


@dataclass(frozen=True)
class Service:
    """One child of a phase: its name, command line, readiness URL and extra environment."""

    name: str
    argv: list[str]
    ready_url: str
    env: dict[str, str] = field(default_factory=dict)


def services(
    s: OverheadConfig, interval: float, model_dir: Path
) -> tuple[list[Service], dict[str, str]]:
    """The upstreams and routers of one phase, and each target's chat URL."""
    py = sys.executable
    ups: list[Service] = []
    for i in (1, 2):
        port = free_port()
        ups.append(
            Service(
                f"upstream{i}-{interval:g}ms",
                [
                    py, "-m", "dynspec.bench.overhead_upstream", "--port", str(port),
                    "--interval-ms", str(interval), "--model-path", str(model_dir),
                    "--log-level", "warning",
                ],
                f"http://127.0.0.1:{port}/health",
            )
        )  # fmt: skip
    up_urls = [svc.ready_url.removesuffix("/health") for svc in ups]
    phase = list(ups)
    urls = {"direct": ",".join(u + CHAT for u in up_urls)}
    for name, mode in (("floor", "protocol"), ("floor-asgi", "asgi")):
        if name not in s.targets:
            continue
        port = free_port()
        phase.append(
            Service(
                name,
                [
                    py, "-m", "dynspec.bench.overhead_floor", "--port", str(port), "--mode", mode,
                    "--upstream", up_urls[0], "--upstream", up_urls[1], "--log-level", "warning",
                ],
                f"http://127.0.0.1:{port}/health",
            )
        )  # fmt: skip
        urls[name] = f"http://127.0.0.1:{port}{CHAT}"
    if "dynspec" in s.targets:
        port = free_port()
        phase.append(
            Service(
                "dynspec",
                [
                    py, "-m", "dynspec.router",
                    "--eagle-url", up_urls[0], "--baseline-url", up_urls[1],
                    "--threshold", str(s.threshold), "--host", "127.0.0.1", "--port", str(port),
                    *s.dynspec_args,
                ],
                f"http://127.0.0.1:{port}/health",
            )
        )  # fmt: skip
        urls["dynspec"] = f"http://127.0.0.1:{port}{CHAT}"
    if "sglang" in s.targets:
        port = free_port()
        phase.append(
            Service(
                "sglang",
                [
                    py, "-m", "sglang_router.launch_router", "--worker-urls", *up_urls,
                    "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                    *s.sglang_args,
                ],
                f"http://127.0.0.1:{port}/readiness",
                # The upstreams report a local, empty model directory, so the Rust router looks for
                # a tokenizer there; these keep any hub fallback on this machine.
                env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
            )
        )  # fmt: skip
        urls["sglang"] = f"http://127.0.0.1:{port}{CHAT}"
    return phase, urls


def sglang_available() -> str | None:
    """None when SGLang's router can run, else why not."""
    if find_spec("sglang_router") is None:
        return "sglang-router is not installed (pip install sglang-router)"
    return None
