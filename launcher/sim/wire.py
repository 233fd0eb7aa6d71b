"""SGLang 0.5.23's OpenAI-compatible bodies, byte for byte in shape.

Chat streams (``serving_chat.py``, chunks built by ``sse_utils.build_sse_content`` with msgspec,
so ``delta`` always has ``reasoning_content`` first and no ``usage`` key): a role chunk, content
chunks, a separate finish chunk with ``finish_reason`` and ``matched_stop``, a usage chunk with
``"choices": []`` only when ``stream_options.include_usage`` is true (pydantic, all usage fields),
then ``data: [DONE]``. Completion streams (``serving_completions.py``, pydantic, ``"usage": null``
in each chunk, or the usage so far with ``stream_options.continuous_usage_stats``): text chunks,
the last one carrying ``finish_reason``; the usage chunk drops nulls.
Chunks are built from per-request byte templates: one ``orjson.dumps`` of the text per chunk.
With ``n`` choices each has its own templates (its ``index``, and SGLang's id of that choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

# What SGLang reports as matched_stop: a stop token id, a stop string, or None.
MatchedStop = int | str | None


@dataclass(frozen=True)
class Choice:
    text: str
    finish_reason: str
    matched_stop: MatchedStop = None


SSE_DONE = b"data: [DONE]\n\n"
_TAIL_OPEN = b',"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
_TAIL_OPEN_COMPLETION = (
    b',"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
)
_TAIL_OPEN_USAGE = b',"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":'


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> bytes:
    """SGLang's flat error body (``ErrorResponse``)."""
    return orjson.dumps(
        {"object": "error", "message": message, "type": err_type, "param": None, "code": code}
    )


def _finish_fields(finish_reason: str, matched_stop: MatchedStop) -> bytes:
    return (
        b',"logprobs":null,"finish_reason":'
        + orjson.dumps(finish_reason)
        + b',"matched_stop":'
        + orjson.dumps(matched_stop)
    )


def _event_top(rid: str, obj: bytes, created: int, model: str) -> bytes:
    """The start every streamed event of one response shares, up to its ``choices``."""
    return (
        b'data: {"id":'
        + orjson.dumps(rid)
        + b',"object":"'
        + obj
        + b'","created":'
        + str(created).encode()
        + b',"model":'
        + orjson.dumps(model)
    )


def _choice_head(index: int) -> bytes:
    return b',"choices":[{"index":' + str(index).encode()


class ChatChunks:
    """The SSE events of one streamed chat completion."""

    __slots__ = ("_head", "_usage_head")

    def __init__(self, rid: str, created: int, model: str, index: int = 0) -> None:
        top = _event_top(rid, b"chat.completion.chunk", created, model)
        self._head = top + _choice_head(index) + b',"delta":{"reasoning_content":null'
        self._usage_head = top + b',"choices":[],"usage":'

    def role(self) -> bytes:
        return self._head + b',"role":"assistant","content":""}' + _TAIL_OPEN

    def content(self, text: str) -> bytes:
        return self._head + b',"content":' + orjson.dumps(text) + b"}" + _TAIL_OPEN

    def finish(self, finish_reason: str, matched_stop: MatchedStop) -> bytes:
        return self._head + b"}" + _finish_fields(finish_reason, matched_stop) + b"}]}\n\n"

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return self._usage_head + usage_json(prompt_tokens, completion_tokens) + b"}\n\n"


class CompletionChunks:
    """The SSE events of one streamed text completion."""

    __slots__ = ("_head", "_usage_head")

    def __init__(self, rid: str, created: int, model: str, index: int = 0) -> None:
        top = _event_top(rid, b"text_completion", created, model)
        self._head = top + _choice_head(index) + b',"text":'
        self._usage_head = top + b',"choices":[],"usage":'

    def text(self, text: str, usage: bytes | None = None) -> bytes:
        """A text chunk; ``usage`` (``usage_json``) where continuous usage stats were asked for."""
        if usage is None:
            return self._head + orjson.dumps(text) + _TAIL_OPEN_COMPLETION
        return self._head + orjson.dumps(text) + _TAIL_OPEN_USAGE + usage + b"}\n\n"

    def last(
        self, text: str, finish_reason: str, matched_stop: MatchedStop, usage: bytes | None = None
    ) -> bytes:
        return (
            self._head
            + orjson.dumps(text)
            + _finish_fields(finish_reason, matched_stop)
            + b'}],"usage":'
            + (b"null" if usage is None else usage)
            + b"}\n\n"
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        body = orjson.dumps(
            {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "reasoning_tokens": 0,
            }
        )
        return self._usage_head + body + b"}\n\n"


def usage_json(prompt_tokens: int, completion_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
    )


def chat_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: Sequence[Choice],
    prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    return orjson.dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": c.text, "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "matched_stop": c.matched_stop,
                }
                for i, c in enumerate(choices)
            ],
            "usage": orjson.Fragment(usage_json(prompt_tokens, completion_tokens)),
            "metadata": {"weight_version": "default"},
        }
    )


def completion_response(
    *,
    rid: str,
    created: int,
    model: str,
    choices: Sequence[Choice],
    prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    return orjson.dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": i,
                    "text": c.text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "matched_stop": c.matched_stop,
                }
                for i, c in enumerate(choices)
            ],
            "usage": orjson.Fragment(usage_json(prompt_tokens, completion_tokens)),
            "metadata": {"weight_version": "default"},
        }
    )
