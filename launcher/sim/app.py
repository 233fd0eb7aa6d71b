"""The simulated server's HTTP surface: a bare ASGI app with SGLang 0.5.23's paths and bodies.

Bare ASGI rather than FastAPI: the streaming path is the yardstick others are measured against, so
each chunk costs one template concatenation and one ``send``. Paths:

- ``/health``, ``/health_generate``: empty body; 503 until the startup delay has passed, then 200.
- ``/model_info``, ``/server_info`` (and SGLang's deprecated ``/get_*`` aliases), ``/v1/models``.
- ``/v1/chat/completions``, ``/v1/completions``: streamed or not; errors in SGLang's flat body.
- ``/abort_request``: ``{"rid": ...}`` or ``{"abort_all": true}``.
- ``/generate`` (native), ``/v1/responses``, ``/tokenize``, ``/detokenize``, ``/flush_cache``: see
  ``native.py``.
- ``/metrics``: SGLang's metric names and labels.
- ``/sim/faults`` (GET, POST a JSON object of switches, DELETE to clear) and ``/sim/stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from typing import Any

import orjson

from dynspec.launcher.sim import info, native, streams, wire
from dynspec.launcher.sim.asgi import SSE, Handler, Receive, Scope, Send, respond
from dynspec.launcher.sim.engine import Engine, SimRequest
from dynspec.launcher.sim.faults import Faults
from dynspec.launcher.sim.inputs import (
    GenerationInput,
    InvalidRequest,
    labelled_json,
    media_type,
    parse_generation,
    parse_object,
    read_body,
)
from dynspec.launcher.sim.metrics import Metrics
from dynspec.launcher.sim.profile import (
    BASELINE_DEFAULT_MAX_RUNNING,
    EAGLE_DEFAULT_MAX_RUNNING,
    Profile,
)
from dynspec.launcher.sim.shared_gpu import SharedGpu

logger = logging.getLogger(__name__)

SGLANG_VERSION = info.SGLANG_VERSION
_ANY = "*"  # a route that answers every method
_NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'


@dataclass(frozen=True)
class SimConfig:
    profile: Profile
    mode: str = "eagle"
    served_model_name: str | None = None
    max_running_requests: int | None = None
    startup_delay: float = 0.0
    speed: float = 1.0
    seed: int | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    # --pair: the GPU this server shares with the other server of its pair (one process).
    shared: SharedGpu | None = None
    stream_interval: int = 1  # SGLang's --stream-interval (Engine)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.profile.model

    @property
    def max_running(self) -> int:
        if self.max_running_requests is not None:
            return self.max_running_requests
        mp = self.profile.mode(self.mode)
        if mp.max_running_requests is not None:
            return int(mp.max_running_requests)
        return EAGLE_DEFAULT_MAX_RUNNING if self.mode == "eagle" else BASELINE_DEFAULT_MAX_RUNNING


class SimApp:
    """The ASGI application of one simulated SGLang server."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.mode_profile = config.profile.mode(config.mode)
        self.speculative = config.mode == "eagle"
        self.model = config.model_name
        self.seed = (
            config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "little")
        )
        self.metrics = Metrics(
            self.model, self.speculative, draft_tokens=self.mode_profile.max_accept_length
        )
        self.faults = Faults()
        self.engine: Engine | None = None
        self.ready = False
        self.started_at = time.time()
        self._tasks: list[asyncio.Task[None]] = []
        self._chunks_left: int | None = None
        # (method, path) -> handler; a known path with another method is a 405.
        self._routes: dict[tuple[str, str], Handler] = {}
        for path in ("/health", "/health_generate"):
            self._route(_ANY, path, self._health)
        for path, endpoint in (
            ("/metrics", info.metrics),
            ("/v1/loads", info.loads),
            ("/v1/models", info.models),
            ("/model_info", info.model_info),
            ("/get_model_info", info.model_info),
            ("/server_info", info.server_info),
            ("/get_server_info", info.server_info),
            ("/flush_cache", info.flush_cache),
            ("/sim/stats", info.stats),
        ):
            self._route(_ANY, path, partial(endpoint, self))
        for path, handler in (
            ("/v1/chat/completions", partial(self._generate, chat=True)),
            ("/v1/completions", partial(self._generate, chat=False)),
            ("/abort_request", self._abort_request),
            ("/generate", self._native_generate),
            ("/v1/responses", self._responses),
            ("/tokenize", self._tokenize),
            ("/detokenize", self._detokenize),
        ):
            self._route("POST", path, handler)
        for method in ("GET", "POST", "DELETE"):
            self._route(method, "/sim/faults", self._faults)
        self._paths = {path for _, path in self._routes}

    def _route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method, path)] = handler

    def _handler(self, method: str, path: str) -> Handler | None:
        """The route's handler; a 405 answer for a known path; None for an unknown one."""
        handler = self._routes.get((method, path)) or self._routes.get((_ANY, path))
        if handler is not None:
            return handler
        if path in self._paths:
            return _method_not_allowed
        if path.startswith("/v1/models/"):
            return partial(info.model_card, self)
        return None

    # -- lifecycle ---------------------------------------------------------------------------
    async def startup(self) -> None:
        cfg = self.config
        self.engine = Engine(
            mode_profile=self.mode_profile,
            speculative=self.speculative,
            max_running=cfg.max_running,
            speed=cfg.speed,
            seed=self.seed,
            metrics=self.metrics,
            max_total_tokens=cfg.profile.max_total_tokens,
            shared=cfg.shared,
            stream_interval=cfg.stream_interval,
        )
        if cfg.shared is not None:
            cfg.shared.join(cfg.mode, self.engine)
        self._tasks.append(asyncio.create_task(self._engine_task(self.engine)))
        self._tasks.append(asyncio.create_task(self._open_after_delay(self.engine)))

    async def _engine_task(self, engine: Engine) -> None:
        try:
            await engine.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the engine loop failed")
            os._exit(1)

    async def _open_after_delay(self, engine: Engine) -> None:
        if self.config.startup_delay > 0:
            await asyncio.sleep(self.config.startup_delay)
        engine.open()
        self.ready = True
        logger.info(
            "ready: mode %s, profile %s, max running %d, speed %g",
            self.config.mode,
            self.config.profile.name,
            self.config.max_running,
            self.config.speed,
        )

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            handler = self._handler(scope["method"], scope["path"])
            if handler is None:
                await respond(send, 404, b'{"detail":"Not Found"}')
                return
            try:
                await handler(scope, receive, send)
            except asyncio.CancelledError:
                # uvicorn cancels responses still open when its graceful-shutdown time is up (a
                # stalled stream, say): that is the end of this response, not an error to log.
                logger.debug("%s cancelled at shutdown", scope["path"])
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await self.startup()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    # -- simple endpoints --------------------------------------------------------------------
    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = self.faults.health_status or (200 if self.ready else 503)
        await respond(send, status, b"", [])

    async def _abort_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            obj = parse_object(await read_body(receive))
        except InvalidRequest as exc:
            await respond(send, 400, wire.error_body(str(exc), exc.err_type))
            return
        engine = self.running_engine()
        if obj.get("abort_all"):
            n = engine.abort_all()
        else:
            n = engine.abort_rid(str(obj.get("rid") or ""))
        logger.debug("abort_request aborted %d request(s)", n)
        await respond(send, 200, b"", [])

    async def _faults(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method == "DELETE":
            self._set_faults(Faults())
        elif method == "POST":
            try:
                self._set_faults(self.faults.updated(parse_object(await read_body(receive))))
            except InvalidRequest as exc:
                await respond(send, 400, wire.error_body(str(exc), exc.err_type))
                return
        await respond(send, 200, orjson.dumps(self.faults.view()))

    def _set_faults(self, faults: Faults) -> None:
        self.faults = faults
        self._chunks_left = faults.exit_after_chunks
        logger.info("faults now %s", faults.view())

    def running_engine(self) -> Engine:
        assert self.engine is not None, "the app has not started"
        return self.engine

    # -- generation --------------------------------------------------------------------------
    async def _generate(self, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
        try:
            body = await read_body(receive)
        except InvalidRequest as exc:
            await respond(send, 400, wire.error_body(str(exc), exc.err_type))
            return
        if media_type(scope["headers"]) != b"application/json":
            # SGLang's validate_json_request dependency on both OpenAI generation routes.
            message = "Unsupported Media Type: Only 'application/json' is allowed"
            await respond(send, 400, wire.error_body(message, HTTPStatus.BAD_REQUEST.phrase))
            return
        if await self._fault(send, openai=True):
            return
        try:
            inp = parse_generation(body, chat, self.config.profile.context_length)
        except InvalidRequest as exc:
            await respond(send, 400, wire.error_body(str(exc), exc.err_type))
            return
        # n choices are n requests to the engine, with SGLang's ids for them (rid_0, rid_1, ...).
        rids = [inp.rid] if inp.n == 1 else [f"{inp.rid}_{i}" for i in range(inp.n)]
        reqs = [self._request(inp, rid, i) for i, rid in enumerate(rids)]
        engine = self.running_engine()
        for req in reqs:
            engine.submit(req)
        watcher = asyncio.create_task(self._watch_disconnect(receive, engine, reqs))
        try:
            if inp.stream and len(reqs) == 1:
                await self._stream(
                    send,
                    req=reqs[0],
                    chat=chat,
                    include_usage=inp.include_usage,
                    model=inp.model,
                    watcher=watcher,
                    continuous_usage=inp.continuous_usage,
                )
            elif inp.stream:
                await streams.stream_choices(
                    self,
                    send,
                    reqs=reqs,
                    chat=chat,
                    include_usage=inp.include_usage,
                    model=inp.model,
                    watcher=watcher,
                    continuous_usage=inp.continuous_usage,
                )
            else:
                await self._answer(send, reqs, chat, inp.model)
        finally:
            watcher.cancel()
            for req in reqs:
                engine.abort(req)  # a no-op unless the response was cut short

    def _request(self, inp: GenerationInput, rid: str, i: int) -> SimRequest:
        """The admission step: one engine request for choice ``i`` of a parsed input."""
        return SimRequest(
            rid=rid,
            prompt_tokens=inp.prompt_tokens,
            max_new_tokens=inp.max_new_tokens,
            limit=self.config.profile.context_length - inp.prompt_tokens,
            stream=inp.stream,
            # The request's own seed makes its text the same on every server and run.
            seed=self.seed if inp.seed is None else inp.seed,
            prompt_key=inp.prompt_key if i == 0 else f"{inp.prompt_key}\x1f{i}",
            ignore_eos=inp.ignore_eos,
            stop=inp.stop,
        )

    async def _fault(self, send: Send, openai: bool = False) -> bool:
        """Answer the ``fail_status`` fault if one is set (True: answered). The OpenAI routes
        word it as SGLang's HTTP error handler does; the others in SGLang's plain error body."""
        fail = self.faults.fail_status
        if fail is None:
            return False
        if openai:
            phrase = HTTPStatus(fail).phrase if fail in HTTPStatus._value2member_map_ else "Error"
            message = f"{phrase} (simulated fault)"
            err_type = "InternalServerError" if fail == 500 else phrase.replace(" ", "")
            await respond(send, fail, wire.error_body(message, err_type, fail))
        else:
            await respond(send, fail, wire.error_body("simulated fault", "Error", fail))
        return True

    async def _watch_disconnect(
        self, receive: Receive, engine: Engine, reqs: list[SimRequest]
    ) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                for req in reqs:
                    if not req.done and engine.abort(req):
                        logger.debug("client left: aborted %s", req.rid)
                return

    async def _answer(self, send: Send, reqs: list[SimRequest], chat: bool, model: str) -> None:
        for req in reqs:
            while not req.done:
                await req.wait(req.target)
        created = int(time.time())
        build = wire.chat_response if chat else wire.completion_response
        body = build(
            rid=reqs[0].rid,
            created=created,
            model=model,
            choices=[
                wire.Choice(r.text(0, r.generated), r.finish_reason, r.matched_stop) for r in reqs
            ],
            # As SGLang counts n choices: the prompt once, every choice's output.
            prompt_tokens=reqs[0].prompt_tokens,
            completion_tokens=sum(r.generated for r in reqs),
        )
        await respond(send, 200, body)

    async def _stream(
        self,
        send: Send,
        *,
        req: SimRequest,
        chat: bool,
        include_usage: bool,
        model: str,
        watcher: asyncio.Task[None],
        continuous_usage: bool = False,
    ) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        created = int(time.time())
        chunks: wire.ChatChunks | wire.CompletionChunks
        chunks = (wire.ChatChunks if chat else wire.CompletionChunks)(req.rid, created, model)
        sent = 0
        content_chunks = 0
        first = True
        while True:
            await req.wait(sent)
            n = req.released
            events: list[bytes] = []
            if chat:
                assert isinstance(chunks, wire.ChatChunks)
                if first:
                    events.append(chunks.role())
                    first = False
                if n > sent:
                    events.append(chunks.content(req.text(sent, n)))
                if req.done:
                    events.append(chunks.finish(req.finish_reason, req.matched_stop))
            else:
                assert isinstance(chunks, wire.CompletionChunks)
                usage = wire.usage_json(req.prompt_tokens, n) if continuous_usage else None
                if req.done:
                    events.append(
                        chunks.last(req.text(sent, n), req.finish_reason, req.matched_stop, usage)
                    )
                elif n > sent:
                    events.append(chunks.text(req.text(sent, n), usage))
            if n > sent:
                content_chunks += 1
            sent = n
            if req.done:
                if include_usage:
                    events.append(chunks.usage(req.prompt_tokens, n))
                events.append(wire.SSE_DONE)
            await self.emit(send, events, last=req.done)
            if req.done:
                return
            if self.faults.stall and content_chunks >= 1:
                # A stalled stream: the connection stays open and silent until the client leaves.
                await watcher
                return

    async def emit(self, send: Send, events: list[bytes], last: bool) -> None:
        left = self._chunks_left
        if left is not None:
            if len(events) >= left:
                if left:
                    # more_body: the stream must end broken, as a dying server's does, not complete.
                    body = b"".join(events[:left])
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                logger.warning("exit_after_chunks reached: exiting abruptly")
                os._exit(1)
            self._chunks_left = left - len(events)
        await send({"type": "http.response.body", "body": b"".join(events), "more_body": not last})

    # -- SGLang's native API, the Responses API, tokenizer and cache ----------------------------
    async def _native_generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = self.config.profile.context_length
        await self._run(scope, receive, send, lambda b: native.parse_native(b, context))

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = self.config.profile.context_length
        await self._run(
            scope, receive, send, lambda b: native.parse_responses(b, context, self.model)
        )

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        parse: Callable[[bytes], GenerationInput],
    ) -> None:
        fail = self.faults.fail_status
        try:
            body = await read_body(receive)
            if not labelled_json(scope["headers"]):
                raise InvalidRequest(
                    "Input should be a valid dictionary or object to extract fields from "
                    "(the body was not labelled application/json)",
                    HTTPStatus.BAD_REQUEST.phrase,
                )
            if fail is None:
                inp = parse(body)
        except InvalidRequest as exc:
            await respond(send, 400, wire.error_body(str(exc), exc.err_type))
            return
        if await self._fault(send):
            return
        req = self._request(inp, inp.rid, 0)
        engine = self.running_engine()
        engine.submit(req)
        watcher = asyncio.create_task(self._watch_disconnect(receive, engine, [req]))
        try:
            if scope["path"] == "/generate":
                await self._native_answer(send, req)
            else:
                await self._responses_answer(send, req, inp.model)
        finally:
            watcher.cancel()
            engine.abort(req)

    async def _native_answer(self, send: Send, req: SimRequest) -> None:
        started = time.monotonic()

        def result(n: int) -> dict[str, Any]:
            finish = (req.finish_reason, req.matched_stop) if req.done else None
            return native.native_result(
                req.rid,
                req.text(0, n),
                prompt_tokens=req.prompt_tokens,
                completion_tokens=n,
                finish=finish,
                started=started,
            )

        if not req.stream:
            while not req.done:
                await req.wait(req.target)
            await respond(send, 200, orjson.dumps(result(req.generated)))
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        sent = 0
        while True:
            await req.wait(sent)
            n = req.released
            events = [native.native_event(result(n))] if n > sent or req.done else []
            sent = n
            if req.done:
                events.append(wire.SSE_DONE)
            await self.emit(send, events, last=req.done)
            if req.done:
                return

    async def _responses_answer(self, send: Send, req: SimRequest, model: str) -> None:
        created = int(time.time())

        def response(text: str | None) -> dict[str, Any]:
            return native.response_object(
                req.rid,
                model,
                created,
                text=text,
                prompt_tokens=req.prompt_tokens,
                completion_tokens=req.generated,
            )

        if not req.stream:
            while not req.done:
                await req.wait(req.target)
            await respond(send, 200, orjson.dumps(response(req.text(0, req.generated))))
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        seq = 0
        events = [native.response_event("response.created", seq, {"response": response(None)})]
        item = {"item_id": "msg_" + req.rid[5:], "output_index": 0, "content_index": 0}
        sent = 0
        while True:
            await req.wait(sent)
            n = req.released
            if n > sent:
                seq += 1
                delta = {**item, "delta": req.text(sent, n)}
                events.append(native.response_event("response.output_text.delta", seq, delta))
            sent = n
            if req.done:
                seq += 1
                final = {"response": response(req.text(0, n))}
                events.append(native.response_event("response.completed", seq, final))
            await self.emit(send, events, last=req.done)
            events = []
            if req.done:
                return

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        context = self.config.profile.context_length
        await self._small_post(scope, receive, send, lambda b: native.tokenize(b, context))

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._small_post(scope, receive, send, native.detokenize)

    async def _small_post(
        self, scope: Scope, receive: Receive, send: Send, answer: Callable[[bytes], bytes]
    ) -> None:
        if await self._fault(send):
            return
        try:
            body = answer(await read_body(receive))
        except InvalidRequest as exc:
            await respond(send, 400, wire.error_body(str(exc), exc.err_type))
            return
        await respond(send, 200, body)


async def _method_not_allowed(scope: Scope, receive: Receive, send: Send) -> None:
    await respond(send, 405, _NOT_ALLOWED)
