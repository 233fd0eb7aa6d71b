"""Helpers for dynspec-sim tests: real ``python -m dynspec.launcher.sim`` processes on loopback."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from utils import free_port, running


class Sim:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/sim/stats", timeout=5).json()  # type: ignore[no-any-return]

    def faults(self, **switches: Any) -> dict[str, Any]:
        r = httpx.post(self.url + "/sim/faults", json=switches, timeout=5)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    found = False
    pattern = re.compile(r"^([^{\s]+)(\{[^}]*\})?\s+(\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
            found = True
    if not found:
        raise KeyError(f"no sample {name}{labels}")
    return total


def sse_events(raw: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, checking the framing on the way."""
    assert raw.endswith(b"\n\n"), raw[-80:]
    events = raw[:-2].split(b"\n\n")
    out = []
    for ev in events:
        assert ev.startswith(b"data: "), ev[:80]
        out.append(ev[len(b"data: ") :])
    return out


def sse_json(raw: bytes) -> list[Any]:
    events = sse_events(raw)
    assert events[-1] == b"[DONE]"
    return [orjson.loads(e) for e in events[:-1]]


@contextlib.contextmanager
def start_sim(
    tmp_path: Path, *flags: str, ready: bool = True, env: dict[str, str] | None = None
) -> Iterator[Sim]:
    port = free_port()
    log = tmp_path / f"sim-{port}.log"
    argv = [sys.executable, "-m", "dynspec.launcher.sim", "--port", str(port), *flags]
    url = f"http://127.0.0.1:{port}"
    with running(
        argv, ready_url=url + "/health" if ready else None, timeout=30, env=env, log=log
    ) as p:
        yield Sim(url, p, log)


SimFactory = Callable[..., Sim]
