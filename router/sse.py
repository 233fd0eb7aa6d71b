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
# The value is taken whole (up to the next delimiter) and checked by ``_count``: a regex for digits
# would read ``-5`` or ``1e9`` as nothing, or as a prefix.
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens":\s*([^,}\]\s]*)')
_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens":\s*([^,}\]\s]*)')
# A token count is a non-negative integer JSON can hold exactly (and a float counter can add).
MAX_COUNT = 1 << 53
_MAX_DIGITS = len(str(MAX_COUNT))
_EMPTY_CHOICES = (b'"choices":[]', b'"choices": []')

Usage = tuple[int | None, int | None]  # (prompt tokens, completion tokens)


def has_token(data: bytes) -> bool:
    return _TOKEN.search(data) is not None


def may_hold_usage_event(data: bytes) -> bool:
    """Cheap pre-check: only bytes that pass it are split into events and parsed."""
    return _EMPTY_CHOICES[0] in data or _EMPTY_CHOICES[1] in data


def _count(raw: bytes) -> int | None:
    """A token count's JSON text as a count; None for ``null``; raises ``ValueError`` for
    anything else (negative, fractional, a string, over ``MAX_COUNT``), before converting it:
    ``int()`` of a 5,000-digit text raises, and a 400-digit one overflows a float counter."""
    if raw == b"null":
        return None
    if not raw.isdigit() or len(raw) > _MAX_DIGITS:
        raise ValueError(raw[:32])
    count = int(raw)
    if count > MAX_COUNT:
        raise ValueError(raw)
    return count


def _last_count(pattern: re.Pattern[bytes], blob: bytes) -> int | None:
    found = pattern.findall(blob)
    return _count(found[-1]) if found else None


def usage_in(blob: bytes) -> tuple[Usage, bool]:
    """The last prompt/completion token counts in ``blob`` (a body or the tail of a stream), and
    whether a count was there but unusable (ignored: the caller counts a protocol error)."""
    if b"_tokens" not in blob:
        return (None, None), False
    bad = False
    try:
        prompt = _last_count(_PROMPT_TOKENS, blob)
    except ValueError:
        prompt, bad = None, True
    try:
        completion = _last_count(_COMPLETION_TOKENS, blob)
    except ValueError:
        completion, bad = None, True
    return (prompt, completion), bad


def _usage_only(event: bytes) -> bool:
    """Whether one SSE event is a usage-only chunk (``"choices": []``)."""
    try:
        payload: Any = orjson.loads(event[5:])
    except orjson.JSONDecodeError:
        # orjson refuses an integer too large for a double: such a chunk is still the usage
        # chunk (and its counts are junk), and the client did not ask for it.
        return b'"usage"' in event
    return isinstance(payload, dict) and payload.get("choices") == []


def strip_usage_events(data: bytes) -> tuple[bytes, Usage | None, bool]:
    """Drop the usage-only events (``"choices": []``) from whole SSE events.

    ``data`` holds whole events (it ends at an event boundary, or the stream ended). Returns the
    remaining bytes, the usage of the dropped event, if one was dropped, and whether its counts
    were unusable (see ``usage_in``).
    """
    kept: list[bytes] = []
    usage: Usage | None = None
    bad = False
    for event in data.split(b"\n\n"):
        if may_hold_usage_event(event) and event.startswith(b"data:") and _usage_only(event):
            found, junk = usage_in(event)
            usage, bad = found, bad or junk
            continue
        kept.append(event)
    return b"\n\n".join(kept), usage, bad
