"""``fake_upstream`` behind TLS and a path prefix: it answers only under the prefix and records
every path it was asked for (``GET PREFIX/fake/paths``). Run as a script:
``python tls_upstream.py PORT CERT.pem KEY.pem PREFIX``."""

from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn
from fake_upstream import app as fake_app

paths: list[str] = []


def prefixed(prefix: str) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await fake_app(scope, receive, send)
            return
        path = scope["path"]
        paths.append(path)
        if not path.startswith(prefix + "/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"not under the prefix"})
            return
        inner = path[len(prefix) :]
        if inner == "/fake/paths":
            body = json.dumps(paths).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await fake_app({**scope, "path": inner, "raw_path": inner.encode()}, receive, send)

    return app


if __name__ == "__main__":
    port, cert, key, prefix = sys.argv[1:5]
    uvicorn.run(
        prefixed(prefix),
        host="127.0.0.1",
        port=int(port),
        ssl_certfile=cert,
        ssl_keyfile=key,
        log_level="warning",
        lifespan="on",
    )
