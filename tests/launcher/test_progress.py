"""Start-up progress: a live line per server on a terminal, plain lines otherwise."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from launcher_run import FAKE_SGLANG, alive, children
from utils import free_port

from dynspec.launcher.printer import Printer


def test_printer_redraws_its_block_under_new_lines() -> None:
    out = io.StringIO()
    printer = Printer(out, tty=True)
    printer.status(["[eagle gpu0-3]  3s loading", "[baseline gpu4-7]  3s loading"])
    printer.status(["[eagle gpu0-3]  4s loading", "[baseline gpu4-7]  4s warming up"])
    printer.line("[router]", "hello", "router")
    printer.clear_status()
    text = out.getvalue()
    # Each redraw goes back up the block's two lines and clears to the end of the screen.
    assert text.count("\x1b[2F\x1b[J") == 3
    assert text.endswith("\x1b[2F\x1b[J")
    assert "\x1b[33m[router]\x1b[0m hello\n[eagle gpu0-3]  4s loading\n" in text


def test_printer_without_a_terminal_prints_only_lines() -> None:
    out = io.StringIO()
    printer = Printer(out, tty=False)
    printer.status(["[eagle gpu0-3] 3s"])
    printer.line("[eagle gpu0-3]", "log line")
    printer.clear_status()
    assert out.getvalue() == "[eagle gpu0-3] log line\n"


def test_live_progress_on_a_terminal_shows_elapsed_time_and_latest_log_line(
    tmp_path: Path,
) -> None:
    ports = [free_port() for _ in range(3)]
    argv = [sys.executable, "-m", "dynspec.launcher", "--host", "127.0.0.1"]
    argv += ["--port", str(ports[0]), "--eagle-port", str(ports[1])]
    argv += ["--baseline-port", str(ports[2]), "--log-dir", str(tmp_path / "logs")]
    argv += ["--gpus", "0-7", "--model-path", "org/m", "--draft-model-path", "org/d"]
    argv += ["--server-command", f"{sys.executable} {FAKE_SGLANG}", "--no-preflight"]
    argv += ["--kill-grace", "1", "--drain-timeout", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYNSPEC_", "FAKE_"))}
    env.update(FAKE_SGLANG_EAGLE="slow", FAKE_SGLANG_REFUSE="2", FAKE_SGLANG_WARM="1.5")
    master, slave = pty.openpty()
    # A terminal 160 columns wide: status lines are cut to the width, the test reads them whole.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(
        argv, stdout=slave, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        start_new_session=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        with contextlib.suppress(OSError):  # EIO once the launcher has closed the terminal
            while data := os.read(master, 65536):
                chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while b" ready: OpenAI" not in b"".join(chunks):
            assert time.monotonic() < deadline and proc.poll() is None, b"".join(chunks)[-2000:]
            seen.update(children(proc.pid))
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in seen:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
        reader.join(5)
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    status = re.findall(r"\[eagle gpu0-3\] +(\d+)s (.*?) \| (.*?)\r?\n", text)
    notes = {note for _, note, _ in status}
    assert "loading (port not open yet)" in notes
    assert "warming up (HTTP 503)" in notes
    assert any(latest.startswith("loading weights") for _, _, latest in status)
    assert int(status[-1][0]) >= 2  # elapsed time counts up while it loads
    assert "\x1b[2F\x1b[J" in text  # the block is redrawn in place
    # While the status block is shown the servers' own lines stay in their log files.
    before_ready = text[: text.index(" ready: OpenAI")]
    assert "fake sglang eagle" not in before_ready.replace("| fake sglang eagle", "")
    assert "loading weights" in (tmp_path / "logs" / "eagle.log").read_text()
    assert not [p for p in seen if alive(p)]
