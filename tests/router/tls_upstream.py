"""The tests' fake SGLang server behind TLS and a path prefix: it answers only under the prefix
and records every path it was asked for (``GET PREFIX/fake/paths``). Run as a script:
``python tls_upstream.py PORT CERT.pem KEY.pem PREFIX``."""

from __future__ import annotations

import json
import ssl
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fake_sglang import Handler

paths: list[str] = []
lock = threading.Lock()


class PrefixedHandler(Handler):
    prefix = ""

    def _route(self) -> bool:
        """Strip the prefix; False (answered 404) when the path is not under it."""
        with lock:
            paths.append(self.path)
        if not self.path.startswith(self.prefix + "/"):
            self._send_json(404, {"error": "not under the prefix"})
            return False
        self.path = self.path[len(self.prefix) :]
        if self.path == "/fake/paths":
            with lock:
                self._send_json(200, list(paths))
            return False
        return True

    def do_GET(self) -> None:
        if self._route():
            super().do_GET()

    def do_POST(self) -> None:
        if self._route():
            super().do_POST()


if __name__ == "__main__":
    port, cert, key, prefix = sys.argv[1:5]
    PrefixedHandler.prefix = prefix
    server = ThreadingHTTPServer(("127.0.0.1", int(port)), PrefixedHandler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print(json.dumps({"listening": port}), flush=True)
    server.serve_forever(poll_interval=0.1)
