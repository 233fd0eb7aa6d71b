"""Router test helpers: real router and upstream processes on loopback, reaped always.

Every router a test starts is registered in ``LIVE_ROUTERS``; conftest's autouse ``no_leak``
fixture checks after each test that every live router reads zero in flight. (A module of its own,
not conftest, so that several test folders can run in one pytest command.)
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from utils import free_port, running

HERE = Path(__file__).parent
LIVE_ROUTERS: list[RouterProc] = []


class RouterProc:
    def __init__(
        self, url: str, proc: subprocess.Popen[bytes], log: Path, status_key: str | None
    ) -> None:
        self.url = url
        self.proc = proc
        self.log = log
        self.status_key = status_key

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.status_key}"} if self.status_key else {}

    def status(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/status", headers=self.headers(), timeout=5)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers(), timeout=5)

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def wait_load(self, load: int, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st["load"] == load or time.monotonic() > deadline:
                return st
            time.sleep(0.02)


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text; 0 when the series is absent."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(4))
    return 0.0


@contextlib.contextmanager
def router(
    tmp_path: Path,
    *args: str,
    ready: str = "/health",
    env: dict[str, str] | None = None,
    admin: str | None = None,
    api_key: str | None = None,
) -> Iterator[RouterProc]:
    port = free_port()
    log = tmp_path / f"router-{port}.log"
    argv = [
        sys.executable, "-m", "dynspec.router", "--host", "127.0.0.1", "--port", str(port),
        "--health-interval", "0.2", "--log-level", "debug", *args,
    ]  # fmt: skip
    if admin:
        argv += ["--admin-api-key", admin]
    if api_key:
        argv += ["--api-key", api_key]
    url = f"http://127.0.0.1:{port}"
    with running(argv, ready_url=url + ready, timeout=30, env=env, log=log) as proc:
        rp = RouterProc(url, proc, log, admin or api_key)
        LIVE_ROUTERS.append(rp)
        try:
            yield rp
        finally:
            LIVE_ROUTERS.remove(rp)


@contextlib.contextmanager
def fake_upstream(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, str(HERE.parent / "fake_sglang.py"), "--port", str(port)]
    with running(argv, ready_url=url + "/health", timeout=30, log=tmp_path / f"fake-{port}.log"):
        yield url


@contextlib.contextmanager
def sim_proc(
    log_dir: Path, mode: str, *args: str, speed: float = 4.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One ``dynspec-sim`` process (demo profile) on a free loopback port: (URL, process)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable, "-m", "dynspec.launcher.sim", "--port", str(port), "--mode", mode,
        "--profile", "demo", "--speed", str(speed), "--seed", "1", *args,
    ]  # fmt: skip
    log = log_dir / f"sim-{mode}-{port}.log"
    with running(argv, ready_url=url + "/health", timeout=30, log=log) as proc:
        yield url, proc


@contextlib.contextmanager
def sim(log_dir: Path, mode: str, *args: str, speed: float = 4.0) -> Iterator[str]:
    with sim_proc(log_dir, mode, *args, speed=speed) as (url, _):
        yield url


def set_faults(url: str, **faults: object) -> None:
    httpx.post(url + "/sim/faults", json=faults, timeout=5).raise_for_status()


def clear_faults(url: str) -> None:
    httpx.delete(url + "/sim/faults", timeout=5).raise_for_status()


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
