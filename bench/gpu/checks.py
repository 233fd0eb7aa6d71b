"""Functional checks of dynspec-router in front of two real SGLang servers.

Each check asserts what the router promises (docs/router.md's "HTTP surface" and "Metrics")
against what the servers really send:
streams end in ``[DONE]``, usage is injected for the router's own accounting and stripped again
when the client did not ask for it, completions and ``/v1/models`` pass through, a client that
leaves mid-stream makes SGLang stop the request, concurrent load crosses the threshold and uses
both pools and leaves no load behind, and every ``sglang:*`` metric the dashboard and alerts use
exists in the real servers' ``/metrics``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

METRIC_IN_FILES = re.compile(r"sglang:[a-z_]+")
# A sample line's metric name, without the suffixes Prometheus adds to histograms and counters.
METRIC_IN_EXPOSITION = re.compile(
    r"^(sglang:[a-zA-Z_]+?)(?:_bucket|_sum|_count|_total|_created)?[{ ]", re.M
)


class CheckFailed(AssertionError):
    pass


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def chat_body(max_tokens: int = 16, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "any",
        "messages": [{"role": "user", "content": "the time of the new one"}],
        "max_tokens": max_tokens,
        "stream": stream,
        "temperature": 0,
        "ignore_eos": True,
    }
    body.update(extra)
    return body


def sse_events(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[int, str, list[str]]:
    events: list[str] = []
    with client.stream("POST", url, json=body) as r:
        backend = r.headers.get("x-dynspec-backend", "")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
        return r.status_code, backend, events


def usage_events(events: list[str]) -> list[str]:
    return [e for e in events if e != "[DONE]" and json.loads(e).get("usage")]


def running_requests(client: httpx.Client, server: str) -> float | None:
    text = client.get(f"{server}/metrics").text
    found = re.findall(r"^sglang:num_running_reqs\{[^}]*\} ([0-9.e+-]+)", text, re.M)
    return sum(float(x) for x in found) if found else None


def metric_names(text: str) -> set[str]:
    return set(METRIC_IN_EXPOSITION.findall(text))


def used_metric_names(files: list[Path]) -> set[str]:
    used: set[str] = set()
    for f in files:
        used |= set(METRIC_IN_FILES.findall(f.read_text(encoding="utf-8")))
    return used


def missing_metrics(used: set[str], exported: set[str]) -> list[str]:
    """Names used but not exported (a histogram's base name covers its _bucket/_sum/_count)."""
    suffix = re.compile(r"_(bucket|sum|count|total|created)$")
    return sorted(u for u in used if u not in exported and suffix.sub("", u) not in exported)


class RouterChecks:
    """The checks, in order; ``threshold`` is the router's (the concurrency check exceeds it)."""

    def __init__(
        self,
        router: str,
        *,
        eagle: str,
        baseline: str,
        threshold: int,
        deploy_files: list[Path],
        timeout: float = 120.0,
    ) -> None:
        self.router, self.eagle, self.baseline = router, eagle, baseline
        self.threshold = threshold
        self.deploy_files = deploy_files
        self.client = httpx.Client(timeout=timeout, trust_env=False)
        self.facts: dict[str, Any] = {}

    def close(self) -> None:
        self.client.close()

    def run(self) -> list[Result]:
        checks: list[tuple[str, Callable[[], str]]] = [
            ("chat, not streamed", self.chat),
            ("stream with include_usage: one usage event, last before [DONE]", self.stream_usage),
            ("stream without include_usage: the injected usage is stripped", self.stream_plain),
            ("completions, streamed", self.completions),
            ("/v1/models", self.models),
            ("client disconnect: the server's running requests back to 0", self.disconnect),
            ("concurrency above the threshold: both pools, load back to 0", self.concurrency),
            ("every sglang:* metric of the dashboard and alerts exists", self.metrics),
        ]
        results = []
        for name, fn in checks:
            try:
                results.append(Result(name, True, fn()))
            except Exception as exc:  # a failed or broken check is reported, the rest still run
                results.append(Result(name, False, f"{type(exc).__name__}: {exc}"))
        return results

    def chat(self) -> str:
        r = self.client.post(f"{self.router}/v1/chat/completions", json=chat_body())
        require(r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}")
        j = r.json()
        require(j["usage"]["completion_tokens"] == 16, f"usage {j.get('usage')}")
        content = j["choices"][0]["message"]["content"]
        require(bool(content), "empty content (is token 0 a special token?)")
        return f"backend {r.headers.get('x-dynspec-backend')}, content {content[:40]!r}"

    def stream_usage(self) -> str:
        body = chat_body(stream=True, stream_options={"include_usage": True})
        status, backend, ev = sse_events(self.client, f"{self.router}/v1/chat/completions", body)
        require(status == 200, f"HTTP {status}")
        require(bool(ev) and ev[-1] == "[DONE]", f"last event {ev[-1:]}")
        usage = usage_events(ev)
        require(len(usage) == 1 and usage[0] == ev[-2], f"{len(usage)} usage events")
        return f"backend {backend}, {len(ev)} events"

    def stream_plain(self) -> str:
        body = chat_body(stream=True)
        status, backend, ev = sse_events(self.client, f"{self.router}/v1/chat/completions", body)
        require(status == 200 and bool(ev) and ev[-1] == "[DONE]", f"HTTP {status}, {ev[-1:]}")
        require(not usage_events(ev), "a usage event reached a client that did not ask")
        return f"backend {backend}, {len(ev)} events"

    def completions(self) -> str:
        body = {"model": "any", "prompt": "the one", "max_tokens": 8, "stream": True}
        body["ignore_eos"] = True
        status, backend, ev = sse_events(self.client, f"{self.router}/v1/completions", body)
        require(status == 200 and bool(ev) and ev[-1] == "[DONE]", f"HTTP {status}, {ev[-1:]}")
        text = "".join(json.loads(e)["choices"][0].get("text") or "" for e in ev[:-1] if e)
        require(bool(text.strip()), "no text streamed")
        return f"backend {backend}, {len(ev)} events, text {text[:30]!r}"

    def models(self) -> str:
        r = self.client.get(f"{self.router}/v1/models")
        require(r.status_code == 200, f"HTTP {r.status_code}")
        ids = [m["id"] for m in r.json()["data"]]
        require(bool(ids), "no models listed")
        return f"ids {ids}"

    def disconnect(self) -> str:
        body = chat_body(max_tokens=4000, stream=True)
        with self.client.stream("POST", f"{self.router}/v1/chat/completions", json=body) as r:
            backend = r.headers.get("x-dynspec-backend", "")
            for n, _ in enumerate(r.iter_lines()):
                if n >= 20:
                    break
        server = self.eagle if backend == "eagle" else self.baseline
        left = time.monotonic()
        seen: float | None = None
        while time.monotonic() - left < 20.0:
            seen = running_requests(self.client, server)
            if seen == 0:
                break
            time.sleep(0.05)
        took = time.monotonic() - left
        self.facts["disconnect_to_zero_s"] = round(took, 2)
        require(
            seen == 0, f"{backend} server still runs {seen} request(s) 20 s after the client left"
        )
        load = self.client.get(f"{self.router}/status").json().get("load")
        require(load == 0, f"router load {load} after the disconnect")
        return f"via {backend}: 0 running after {took:.2f} s; router load 0"

    def concurrency(self) -> str:
        n = self.threshold + max(6, self.threshold // 2)

        def one(_: int) -> tuple[int, str]:
            r = self.client.post(
                f"{self.router}/v1/chat/completions", json=chat_body(max_tokens=300)
            )
            return r.status_code, r.headers.get("x-dynspec-backend", "")

        with ThreadPoolExecutor(n) as pool:
            got = list(pool.map(one, range(n)))
        statuses = sorted({s for s, _ in got})
        pools = {b for _, b in got}
        require(statuses == [200], f"statuses {statuses}")
        require(pools == {"eagle", "baseline"}, f"pools used {sorted(pools)}")
        status = self.client.get(f"{self.router}/status").json()
        require(status.get("load") == 0, f"router load {status.get('load')} after the burst")
        counts = {p: sum(1 for _, b in got if b == p) for p in sorted(pools)}
        return f"{n} at once: {counts}, load back to 0"

    def metrics(self) -> str:
        exported: set[str] = set()
        for server in (self.eagle, self.baseline):
            exported |= metric_names(self.client.get(f"{server}/metrics").text)
        used = used_metric_names(self.deploy_files)
        require(bool(used), f"no sglang:* names in {[str(f) for f in self.deploy_files]}")
        self.facts["sglang_metrics"] = sorted(exported)
        missing = missing_metrics(used, exported)
        require(not missing, f"missing {missing}")
        return f"{len(used)} used, all among {len(exported)} exported"
