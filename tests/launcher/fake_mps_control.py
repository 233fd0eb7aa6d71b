"""A fake ``nvidia-cuda-mps-control`` for the launcher's --mps tests.

``-d``: start a daemon (detached, its own session) that holds ``$CUDA_MPS_PIPE_DIRECTORY/control``
and writes its pid to ``daemon.pid`` there, until told to quit. No flag: read commands from stdin;
``quit`` ends the daemon of that pipe directory (exit 1 when there is none, as the real one
says "Cannot find MPS control daemon process"). Every call appends one line to ``$FAKE_MPS_LOG``:
the arguments, the stdin text, CUDA_VISIBLE_DEVICES and the pipe directory.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
control, pid_file, quit_file = pipe / "control", pipe / "daemon.pid", pipe / "quit"


def record(stdin: str) -> None:
    line = (
        f"{time.time():.3f} args={' '.join(sys.argv[1:]) or '-'} stdin={stdin.strip() or '-'} "
        f"cvd={os.environ.get('CUDA_VISIBLE_DEVICES', '-')} pipe={pipe} "
        f"log={os.environ.get('CUDA_MPS_LOG_DIRECTORY', '-')}\n"
    )
    with open(os.environ["FAKE_MPS_LOG"], "a") as f:
        f.write(line)


def daemon() -> None:
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    pid_file.write_text(str(os.getpid()))
    control.write_text("")
    deadline = time.monotonic() + 300  # never outlive a test run by much
    while not quit_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    quit_file.unlink(missing_ok=True)
    control.unlink(missing_ok=True)
    os._exit(0)


def main() -> int:
    if sys.argv[1:] == ["-d"]:
        record("")
        if control.exists():
            print("An instance of this daemon is already running")
            return 1
        daemon()
        while not control.exists():
            time.sleep(0.02)
        return 0
    text = sys.stdin.read()
    record(text)
    if text.strip() != "quit":
        return 0
    if not control.exists():
        print("Cannot find MPS control daemon process")
        return 1
    quit_file.write_text("")
    while control.exists():
        time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main())
