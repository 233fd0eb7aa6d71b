"""Byte-level looks at OpenAI-style SSE and JSON bodies, with no JSON parse per chunk.

The relay calls these on raw upstream bytes. They rely on one property of JSON: inside a string
every quote is escaped, so a key pattern such as ``"completion_tokens":`` (quote, key, quote,
colon) can only match a real key, never text the model generated.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# A token reached the client: a non-empty content/text/reasoning string, a tool call, or a
# Responses API text delta (a chat delta is an object, never a string). SGLang's first chat chunk
# carries only the role and ``"content":""``, which does not match.
_TOKEN = re.compile(rb'"(?:content|text|reasoning_content|delta)":\s*"[^"]|"tool_calls":\s*\[\s*\{')
# Chat, completions and the native /generate's ``meta_info`` say prompt/completion; the
# Responses API says input/output.
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens":\s*(\d+)')
_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')

Usage = tuple[int | None, int | None]  # (prompt tokens, completion tokens)


def has_token(data: bytes) -> bool:
    return _TOKEN.search(data) is not None


def may_hold_usage_event(data: bytes) -> bool:
    """Cheap pre-check: only bytes that pass it are split into events and parsed."""
    return _EMPTY_CHOICES[0] in data or _EMPTY_CHOICES[1] in data


def _last_int(pattern: re.Pattern[bytes], blob: bytes) -> int | None:
    found = pattern.findall(blob)
    return int(found[-1]) if found else None


def usage_in(blob: bytes) -> Usage:
    """The last prompt/completion token counts in ``blob`` (a body or the tail of a stream)."""
    if b"_tokens" not in blob:
        return None, None
    return _last_int(_PROMPT_TOKENS, blob), _last_int(_COMPLETION_TOKENS, blob)


def strip_usage_events(data: bytes) -> tuple[bytes, Usage | None]:
    """Drop the usage-only events (``"choices": []``) from whole SSE events.

    ``data`` holds whole events (it ends at an event boundary, or the stream ended). Returns the
    remaining bytes and the usage of the dropped event, if one was dropped.
    """
    kept: list[bytes] = []
    usage: Usage | None = None
    for event in data.split(b"\n\n"):
        if may_hold_usage_event(event) and event.startswith(b"data:"):
            try:
                payload: Any = orjson.loads(event[5:])
            except orjson.JSONDecodeError:
                payload = None
            if isinstance(payload, dict) and payload.get("choices") == []:
                found = payload.get("usage")
                if isinstance(found, dict):
                    prompt, completion = found.get("prompt_tokens"), found.get("completion_tokens")
                    usage = (
                        prompt if isinstance(prompt, int) else None,
                        completion if isinstance(completion, int) else None,
                    )
                continue
        kept.append(event)
    return b"\n\n".join(kept), usage
