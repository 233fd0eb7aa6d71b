"""A stream of several choices (``n > 1``) on the OpenAI routes, as SGLang interleaves them."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from dynspec.launcher.sim import wire
from dynspec.launcher.sim.asgi import SSE, Send
from dynspec.launcher.sim.engine import SimRequest

if TYPE_CHECKING:
    from dynspec.launcher.sim.app import SimApp


async def stream_choices(
    app: SimApp,
    send: Send,
    *,
    reqs: list[SimRequest],
    chat: bool,
    include_usage: bool,
    model: str,
    watcher: asyncio.Task[None],
    continuous_usage: bool = False,
) -> None:
    """A stream of n > 1 choices, as SGLang interleaves them: each choice's chunks carry its
    index and id as its tokens come; chat finish chunks come after every choice has ended."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    created = int(time.time())
    kind = wire.ChatChunks if chat else wire.CompletionChunks
    chunks = [kind(r.rid, created, model, i) for i, r in enumerate(reqs)]
    sent = [0] * len(reqs)
    ended = [False] * len(reqs)
    finished: list[int] = []
    loop = asyncio.get_running_loop()
    while True:
        moved = [not ended[i] and (r.released > sent[i] or r.done) for i, r in enumerate(reqs)]
        if not any(moved):
            # One future for all: whichever choice moves first wakes this loop.
            fut: asyncio.Future[None] = loop.create_future()
            for i, r in enumerate(reqs):
                if not ended[i]:
                    r.waiter = fut
            await fut
            continue
        events: list[bytes] = []
        for i, r in enumerate(reqs):
            if not moved[i]:
                continue
            c, n = chunks[i], r.released
            if isinstance(c, wire.ChatChunks):
                if sent[i] == 0 and i not in finished:
                    events.append(c.role())
                if n > sent[i]:
                    events.append(c.content(r.text(sent[i], n)))
                if r.done:
                    finished.append(i)
            else:
                usage = wire.usage_json(r.prompt_tokens, n) if continuous_usage else None
                if r.done:
                    events.append(
                        c.last(r.text(sent[i], n), r.finish_reason, r.matched_stop, usage)
                    )
                else:
                    events.append(c.text(r.text(sent[i], n), usage))
            sent[i] = n
            ended[i] = r.done
        last = all(ended)
        if last:
            for i in finished if chat else ():
                chat_chunks = chunks[i]
                assert isinstance(chat_chunks, wire.ChatChunks)
                events.append(chat_chunks.finish(reqs[i].finish_reason, reqs[i].matched_stop))
            if include_usage:
                events.append(chunks[0].usage(reqs[0].prompt_tokens, sum(sent)))
            events.append(wire.SSE_DONE)
        await app.emit(send, events, last=last)
        if last:
            return
        if app.faults.stall and any(sent):
            await watcher
            return
