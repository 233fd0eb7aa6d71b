"""The child-process helper the benchmarks and the tests share: start, ready, stop the group."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from utils import running

from dynspec.bench.procs import Children, free_port, http_status, wait_http

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_child_that_exits_before_ready_is_one_clear_error(tmp_path: Path) -> None:
    with Children(tmp_path) as children:
        proc = children.start("quits", [PY, "-c", "print('bye'); raise SystemExit(3)"])
        url = f"http://127.0.0.1:{free_port()}/health"
        with pytest.raises(RuntimeError) as exc:
            children.wait_ready(proc, url, 30, name="quits")
    assert str(exc.value) == f"quits exited with 3 before ready (log: {tmp_path / 'quits.log'})"
    assert (tmp_path / "quits.log").read_text() == "bye\n"


def test_ready_child_and_its_whole_group_are_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNSPEC_FOR_ANOTHER_RUN", "x")
    port = free_port()
    # A grandchild in the same group, as a server's workers are, then an HTTP server.
    script = (
        'sleep 600 & echo "worker $!"; echo "env ${DYNSPEC_FOR_ANOTHER_RUN:-none} $EXTRA"; '
        f"exec {PY} -m http.server {port} --bind 127.0.0.1"
    )
    with Children(tmp_path, drop_env=("DYNSPEC_",)) as children:
        proc = children.start("server", ["sh", "-c", script], env={"EXTRA": "given"})
        children.wait_ready(proc, f"http://127.0.0.1:{port}/", 30, name="server")
        lines = (tmp_path / "server.log").read_text().splitlines()
        worker = int(lines[0].split()[1])
        assert lines[1] == "env none given"
        assert _alive(worker)
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def test_wait_http_waits_for_the_status_asked_and_times_out_with_the_last_one() -> None:
    port = free_port()
    argv = [PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    url = f"http://127.0.0.1:{port}"
    with running(argv, url + "/", timeout=30) as proc:
        assert http_status(url + "/nothing-here") == 404
        wait_http(url + "/nothing-here", timeout=5, status=404)
        with pytest.raises(TimeoutError, match=r"did not answer 200 .* \(last: 404\)"):
            wait_http(url + "/nothing-here", timeout=0.3, status=200)
    assert proc.returncode is not None
    assert http_status(url + "/") is None  # nobody listens any more


def test_readiness_never_goes_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy variable meant for the package index must not take loopback requests elsewhere.
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    argv = [PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with running(argv, f"http://127.0.0.1:{port}/", timeout=30):
        assert http_status(f"http://127.0.0.1:{port}/") == 200
