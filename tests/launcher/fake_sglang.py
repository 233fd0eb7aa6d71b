"""A stand-in for ``python -m sglang.launch_server`` that the launcher tests point it at.

It takes SGLang's flags (only --port, --host and --speculative-algorithm matter) and behaves as
the environment says, per pool (the EAGLE server is the one given --speculative-algorithm):

  FAKE_SGLANG_EAGLE / FAKE_SGLANG_BASELINE: comma-separated behaviours, default "ok":
    ok             listen at once; /health and /health_generate answer 200
    slow           refuse connections for FAKE_SGLANG_REFUSE s, then 503 for FAKE_SGLANG_WARM s
    crash-start    print a few lines and exit 1 before listening
    crash-later    on its first start only, exit 3 after FAKE_SGLANG_CRASH_AFTER s of serving
    slow-restart   "slow", but only when started again (a restart)
    ignore-term    ignore SIGTERM (only SIGKILL ends it)
    fork           start two worker grandchildren that ignore SIGTERM (like SGLang's schedulers)
  FAKE_SGLANG_STATE: a directory; each start appends "<pool> <pid> <worker pids...>" to
    <dir>/starts.log, which the tests read to find every process that ever ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WORKER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--served-model-name", default="fake")
    args, _ = p.parse_known_args()
    pool = "eagle" if args.speculative_algorithm else "baseline"
    behaviours = set(os.environ.get(f"FAKE_SGLANG_{pool.upper()}", "ok").split(","))
    state = Path(os.environ["FAKE_SGLANG_STATE"]) if "FAKE_SGLANG_STATE" in os.environ else None
    starts_before = 0
    if state is not None:
        log = state / "starts.log"
        if log.exists():
            starts_before = sum(1 for ln in log.read_text().splitlines() if ln.startswith(pool))

    workers: list[subprocess.Popen[bytes]] = []
    if "fork" in behaviours:
        workers = [subprocess.Popen([sys.executable, "-c", WORKER]) for _ in range(2)]
    if state is not None:
        with open(state / "starts.log", "a") as f:
            f.write(" ".join([pool, str(os.getpid()), *(str(w.pid) for w in workers)]) + "\n")
    if "ignore-term" in behaviours:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        # Exit on SIGTERM without waiting for the workers, as a crashing leader would.
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    print(f"fake sglang {pool} pid {os.getpid()} starting", flush=True)
    if "crash-start" in behaviours:
        time.sleep(0.3)
        print("Loading safetensors checkpoint shards: 0%", flush=True)
        print("RuntimeError: CUDA out of memory (fake)", flush=True)
        sys.exit(1)

    ready_at = time.monotonic()
    if "slow" in behaviours or ("slow-restart" in behaviours and starts_before > 0):
        refuse = float(os.environ.get("FAKE_SGLANG_REFUSE", "1.0"))
        warm = float(os.environ.get("FAKE_SGLANG_WARM", "1.0"))
        for i in range(int(refuse * 10)):
            if i % 5 == 0:
                print(f"loading weights {i * 10 // int(refuse * 10)}0%", flush=True)
            time.sleep(0.1)
        ready_at = time.monotonic() + warm

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:
            pass

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                if time.monotonic() < ready_at:
                    self._send(503, {"error": "warming up"})
                else:
                    self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": args.served_model_name}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self.rfile.read(length)
            self._send(
                200,
                {
                    "id": "fake",
                    "object": "chat.completion",
                    "model": args.served_model_name,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"from {pool}"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
                },
            )

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake sglang {pool} listening on {args.port}", flush=True)
    if "crash-later" in behaviours and starts_before == 0:
        delay = float(os.environ.get("FAKE_SGLANG_CRASH_AFTER", "1.0"))

        def crash() -> None:
            time.sleep(delay)
            print("Scheduler hit an exception (fake)", flush=True)
            os._exit(3)

        threading.Thread(target=crash, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
