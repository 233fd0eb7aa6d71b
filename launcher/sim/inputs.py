"""Reading a generation request as SGLang 0.5.23 does, with its error messages and types.

Two kinds of 400 exist in SGLang: FastAPI request-validation errors (invalid JSON, a missing or
mistyped field, a wrong content type), which it answers with ``type: "Bad Request"``, and the
serving layer's own checks (empty ``messages``, a prompt or ``max_tokens`` beyond the context
length), answered with ``type: "BadRequestError"``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import orjson

MAX_BODY_BYTES = 64 * 1024 * 1024
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # SGLang's CompletionRequest.max_tokens default
MAX_CHOICES = 128  # OpenAI's cap on n; SGLang has none, but each choice is a request here too
DEFAULT_MODEL_NAME = "default"  # what SGLang answers under when the request names no model


class InvalidRequest(Exception):
    """A request SGLang answers with 400; ``err_type`` is the error type it names."""

    def __init__(self, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.err_type = err_type


def validation(message: str) -> InvalidRequest:
    """A FastAPI request-validation error, which SGLang turns into 400 "Bad Request"."""
    return InvalidRequest(message, HTTPStatus.BAD_REQUEST.phrase)


@dataclass(frozen=True)
class GenerationInput:
    rid: str
    model: str
    prompt_tokens: int
    prompt_key: str  # what --seed mixes with to choose the answer
    max_new_tokens: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool
    n: int = 1  # choices, each its own request in the engine (SGLang's parallel sampling)
    stop: tuple[str, ...] = ()  # the answer ends before the first of these it produces
    seed: int | None = None  # the request's own seed: same seed, same request, same text
    # stream_options.continuous_usage_stats: each completion chunk carries the usage so far
    continuous_usage: bool = False


def media_type(headers: list[tuple[bytes, bytes]]) -> bytes:
    for name, value in headers:
        if name == b"content-type":
            return bytes(value.split(b";", 1)[0].strip().lower())
    return b""


def labelled_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """A body FastAPI reads as JSON for a model parameter (SGLang's /generate, /v1/responses):
    ``application/json`` or ``application/*+json``. FastAPI's ``strict_content_type`` (on by
    default since 0.12x; SGLang 0.5.17's bundle has 0.165) reads an unlabelled body as bytes,
    which fails validation: 400."""
    media = media_type(headers)
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


async def read_body(receive: Callable[[], Awaitable[MutableMapping[str, Any]]]) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        part = message.get("body", b"")
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise validation("request body too large")
        chunks.append(part)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_object(body: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise validation(f"JSON decode error: {exc}") from None
    if not isinstance(obj, dict):
        raise validation("Input should be a valid dictionary or object to extract fields from")
    return obj


def parse_generation(body: bytes, chat: bool, context_length: int) -> GenerationInput:
    """Validate a chat or completions body; raise ``InvalidRequest`` as SGLang would answer 400."""
    obj = parse_object(body)
    model = obj.get("model", DEFAULT_MODEL_NAME)
    if not isinstance(model, str):
        raise validation("model: Input should be a valid string")
    if chat:
        if "messages" not in obj:
            raise validation("messages: Field required")
        messages = obj["messages"]
        if not isinstance(messages, list):
            raise validation("messages: Input should be a valid list")
        if not messages:
            raise InvalidRequest("Messages cannot be empty.")
        prompt_tokens, key = _chat_prompt(messages)
        max_new = _positive_int(obj, "max_completion_tokens") or _positive_int(obj, "max_tokens")
    else:
        if "prompt" not in obj:
            raise validation("prompt: Field required")
        prompt_tokens, key = _completion_prompt(obj["prompt"])
        max_new = (
            _positive_int(obj, "max_tokens")
            if "max_tokens" in obj
            else COMPLETIONS_DEFAULT_MAX_TOKENS
        )
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise validation("stream: Input should be a valid boolean")
    opts = obj.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise validation("stream_options: Input should be a valid dictionary")
    if prompt_tokens >= context_length:
        raise InvalidRequest(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
    if max_new is not None and max_new + prompt_tokens > context_length:
        raise InvalidRequest(
            "Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {max_new + prompt_tokens} "
            f"tokens: {prompt_tokens} tokens from the input messages and {max_new} tokens for "
            "the completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit."
        )
    n = _positive_int(obj, "n") or 1
    if n > MAX_CHOICES:
        raise validation(f"n: Input should be less than or equal to {MAX_CHOICES}")
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise validation("seed: Input should be a valid integer")
    rid = obj.get("rid")
    if not isinstance(rid, str) or not rid:
        rid = ("chatcmpl-" if chat else "cmpl-") + os.urandom(16).hex()
    return GenerationInput(
        rid=rid,
        model=model,
        prompt_tokens=prompt_tokens,
        prompt_key=key,
        max_new_tokens=max_new,
        stream=stream,
        include_usage=bool(opts and opts.get("include_usage")),
        ignore_eos=bool(obj.get("ignore_eos", False)),
        n=n,
        stop=_stop_strings(obj.get("stop")),
        seed=seed,
        continuous_usage=bool(opts and opts.get("continuous_usage_stats")),
    )


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise validation("stop: Input should be a valid string or a list of strings")


def _count_text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


def _chat_prompt(messages: list[Any]) -> tuple[int, str]:
    """Prompt tokens (about 4 characters a token plus template overhead) and the prompt key."""
    tokens = 3
    parts: list[str] = []
    for msg in messages:
        if not isinstance(msg, dict) or "role" not in msg:
            raise validation("each message must be an object with a 'role'")
        content = msg.get("content")
        text = ""
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text = " ".join(
                str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
            )
        elif content is not None:
            raise validation("message content must be a string, a list of parts or null")
        tokens += 4 + _count_text_tokens(text)
        parts.append(f"{msg['role']}:{text}")
    return tokens, "\x1e".join(parts)


def _completion_prompt(prompt: Any) -> tuple[int, str]:
    if isinstance(prompt, str):
        return _count_text_tokens(prompt), prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt), ",".join(map(str, prompt))
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return _count_text_tokens(prompt[0]), prompt[0]
    raise validation("prompt must be a string, a list of token ids, or a list of one string")


def _positive_int(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation(f"{key}: Input should be a valid integer")
    if value <= 0:
        raise validation(f"Value error, {key} must be positive")
    return value
