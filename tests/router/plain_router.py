"""The router app under stock uvicorn (httptools), without ``downstream.RelayProtocol``: streamed
chunks then go through ASGI ``send`` one by one, the relay's path under any other ASGI server.
Run as a script: ``python plain_router.py PORT ROUTER-FLAGS...``."""

from __future__ import annotations

import logging
import sys

import uvicorn

from dynspec.router.app import create_app
from dynspec.router.config import build_parser, config_from_args

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.DEBUG, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args(build_parser().parse_layered(sys.argv[2:]))
    uvicorn.run(
        create_app(config),
        host="127.0.0.1",
        port=int(sys.argv[1]),
        http="httptools",
        log_config=None,
        access_log=False,
    )
