"""The tests' one fake SGLang server: ``python fake_sglang.py --port N [SGLang flags]``.

It stands in for ``python -m sglang.launch_server`` (the launcher tests point ``--server-command``
at it) and for an upstream that does on request what the simulator never does (the router
tests). Only --port, --host, --speculative-algorithm and --served-model-name matter; the EAGLE
server is the one given --speculative-algorithm.

How it starts, per pool, from the environment:
  FAKE_SGLANG_EAGLE / FAKE_SGLANG_BASELINE: comma-separated behaviours, default "ok":
    ok             listen at once; /health and /health_generate answer 200
    slow           refuse connections for FAKE_SGLANG_REFUSE s, then 503 for FAKE_SGLANG_WARM s
    crash-start    print a few lines and exit 1 before listening
    crash-later    on its first start only, exit 3 once the file <state>/crash-<pool> exists
    hold-restart   when started again (a restart), refuse connections until the file
                   <state>/release-<pool> exists
    ignore-term    ignore SIGTERM (only SIGKILL ends it)
    fork           start two worker grandchildren that ignore SIGTERM (like SGLang's schedulers)
  FAKE_SGLANG_STATE: the <state> directory; each start appends "<pool> <pid> <worker pids...>" to
    <state>/starts.log, which the tests read to find every process that ever ran.

How it answers /v1/chat/completions and /v1/completions: ``max_tokens`` tokens "t0 t1 ...", in
SGLang's chunk shapes when streamed (role chunk for chat, one chunk per token, a usage chunk when
``stream_options.include_usage`` is true, ``[DONE]``). Request headers change that (they travel
through the router untouched):
  x-fake-sleep-first: S   wait S seconds before answering
  x-fake-close: 1         read the request, close the connection without answering (a server
                          that died with the request)
  x-fake-status: N        answer N with an OpenAI-shaped error (and x-fake-origin: upstream)
  x-fake-split: 1         write each SSE event in three pieces, each its own HTTP chunk
  x-fake-delay: S         seconds between two writes of a stream (default 0.005)
  x-fake-die-after: K     close the connection before the K-th event, mid-body
  x-fake-prompt-tokens: T the usage's prompt_tokens is the JSON text T, as given (a 5,000-digit
                          number, -1, 1e9: what a broken server might send)
  x-fake-pad: P           P more characters ("x") after each token's text (bigger events)
GET /fake/last returns the headers (lower-cased) and body of the last completion request;
GET /fake/progress {"events": N}: the events the last stream has written so far.
GET /v1/loads answers what the last POST /fake/loads sent (its body, and the status in its
x-fake-status header, default 200); before any, SGLang's shape with zero counts.
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
from typing import Any

WORKER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


PROMPT_TOKENS = 7  # stands for the x-fake-prompt-tokens text in the usage, replaced when sent
_SPLICE = threading.local()  # .text: the request's x-fake-prompt-tokens (one thread a request)


def _dumps(obj: Any) -> bytes:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    text = getattr(_SPLICE, "text", b"")
    if text:
        raw = raw.replace(b'"prompt_tokens":%d' % PROMPT_TOKENS, b'"prompt_tokens":' + text)
    return raw


def _event(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


def _wait_for_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def stream_events(
    req: dict[str, Any], chat: bool, usage: dict[str, int], pad: int = 0
) -> list[bytes]:
    n = int(req.get("max_tokens", 4))
    events = []
    if chat:
        events.append(
            _event(
                {
                    "id": "x",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                }
            )
        )
    for i in range(n):
        word = f"t{i} " + "x" * pad
        delta = {"delta": {"content": word}} if chat else {"text": word}
        events.append(
            _event({"id": "x", "choices": [{"index": 0, **delta, "finish_reason": None}]})
        )
    if (req.get("stream_options") or {}).get("include_usage"):
        events.append(_event({"id": "x", "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return events


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as SGLang's uvicorn
    disable_nagle_algorithm = True
    model = "fake"
    ready_at = 0.0
    last_request: dict[str, Any] = {}  # noqa: RUF012 - one fake, one last request
    loads: tuple[int, bytes] = (
        200,
        b'{"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}',
    )
    lock = threading.Lock()
    events_written = 0  # by the last stream so far (GET /fake/progress)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send_json(self, status: int, obj: Any, extra: dict[str, str] | None = None) -> None:
        body = _dumps(obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in ("/health", "/health_generate"):
            if time.monotonic() < self.ready_at:
                self._send_json(503, {"error": "warming up"})
            else:
                self._send_json(200, {})
        elif self.path == "/v1/models":
            self._send_json(
                200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            )
        elif self.path.split("?")[0] == "/v1/loads":
            with self.lock:
                status, body = self.loads
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/fake/last":
            with self.lock:
                self._send_json(200, self.last_request)
        elif self.path == "/fake/progress":
            self._send_json(200, {"events": Handler.events_written})
        else:
            self._send_json(404, {"error": "not found"})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.path == "/fake/loads":
            with self.lock:
                Handler.loads = (int(headers.get("x-fake-status", "200")), raw)
            self._send_json(200, {})
            return
        req = json.loads(raw or b"{}")
        with self.lock:
            Handler.last_request = {"headers": headers, "body": req}
        time.sleep(float(headers.get("x-fake-sleep-first", "0")))
        if headers.get("x-fake-close") == "1":
            self.close_connection = True
            return
        _SPLICE.text = headers.get("x-fake-prompt-tokens", "").encode()
        if "x-fake-status" in headers:
            status = int(headers["x-fake-status"])
            error = {"object": "error", "message": "fake failure", "type": "X", "code": status}
            self._send_json(status, error, {"x-fake-origin": "upstream"})
            return
        chat = self.path == "/v1/chat/completions"
        n = int(req.get("max_tokens", 4))
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": 7 + n}
        if not req.get("stream"):
            text = "".join(f"t{i} " for i in range(n))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
            choice |= (
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            obj = {"id": "x", "object": "chat.completion", "model": self.model}
            self._send_json(200, {**obj, "choices": [choice], "usage": usage})
            return
        self.send_response_only(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Date", "Thu, 01 Jan 1970 00:00:00 GMT")
        self.send_header("Server", "fake")
        self.end_headers()
        split = headers.get("x-fake-split") == "1"
        delay = float(headers.get("x-fake-delay", "0.005"))
        die_after = int(headers.get("x-fake-die-after", "-1"))
        Handler.events_written = 0
        try:
            pad = int(headers.get("x-fake-pad", "0"))
            for i, ev in enumerate(stream_events(req, chat, usage, pad)):
                if i == die_after:
                    # Mid-body, without the chunked terminator: a broken stream.
                    self.close_connection = True
                    return
                third = max(1, len(ev) // 3)
                pieces = (ev[:third], ev[third : 2 * third], ev[2 * third :]) if split else (ev,)
                for piece in pieces:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    time.sleep(delay)
                Handler.events_written = i + 1
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the reader went away (a timeout, a disconnect)


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

    Handler.ready_at = time.monotonic()
    if "slow" in behaviours:
        refuse = float(os.environ.get("FAKE_SGLANG_REFUSE", "1.0"))
        warm = float(os.environ.get("FAKE_SGLANG_WARM", "1.0"))
        for i in range(int(refuse * 10)):
            if i % 5 == 0:
                print(f"loading weights {i * 10 // int(refuse * 10)}0%", flush=True)
            time.sleep(0.1)
        Handler.ready_at = time.monotonic() + warm
    if "hold-restart" in behaviours and starts_before > 0 and state is not None:
        print("loading weights (held until released)", flush=True)
        _wait_for_file(state / f"release-{pool}")

    Handler.model = args.served_model_name
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"fake sglang {pool} listening on {args.port}", flush=True)
    if "crash-later" in behaviours and starts_before == 0 and state is not None:
        trigger = state / f"crash-{pool}"

        def crash() -> None:
            _wait_for_file(trigger)
            print("Scheduler hit an exception (fake)", flush=True)
            os._exit(3)

        threading.Thread(target=crash, daemon=True).start()
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
