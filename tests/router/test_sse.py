"""The byte-level helpers of the relay: token detection, usage reading, usage-event removal,
and request validation, as plain tables."""

from __future__ import annotations

import orjson
import pytest

from dynspec.router.errors import BadRequest
from dynspec.router.request import prepare
from dynspec.router.sse import has_token, strip_usage_events, usage_in

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("data", "token"),
    [
        (ROLE, False),
        (TOKEN, True),
        (b'data: {"choices":[{"text":"a","index":0}]}\n\n', True),
        (b'data: {"choices":[{"text":"","index":0}]}\n\n', False),
        (b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n', True),
        (b'data: {"choices":[{"delta":{"content":null,"tool_calls":[{"id":"c"}]}}]}\n\n', True),
        (b'data: {"choices":[{"delta":{"content":"\\"q"}}]}\n\n', True),
    ],
)
def test_has_token(data: bytes, token: bool) -> None:
    assert has_token(data) is token


def test_strip_usage_keeps_everything_else() -> None:
    kept, usage = strip_usage_events(TOKEN + USAGE + DONE)
    assert kept == TOKEN + DONE
    assert usage == (7, 3)
    kept, usage = strip_usage_events(USAGE)
    assert (kept, usage) == (b"", (7, 3))
    # Text that merely mentions "choices":[] is an escaped string, never an event of its own.
    tricky = b'data: {"choices":[{"delta":{"content":"\\"choices\\":[]"}}]}\n\n'
    assert strip_usage_events(tricky) == (tricky, None)


def test_usage_in_ignores_generated_text() -> None:
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": '"completion_tokens": 999'}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5},
        }
    )
    assert usage_in(body) == (11, 5)
    assert usage_in(TOKEN) == (None, None)


@pytest.mark.parametrize(
    ("body", "required", "stream", "strip", "options"),
    [
        ({"messages": []}, "messages", False, False, None),
        ({"messages": [], "stream": True}, "messages", True, True, {"include_usage": True}),
        ({"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": False}},
         "prompt", True, True, {"continuous_usage_stats": False, "include_usage": True}),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
         "prompt", True, False, {"include_usage": True}),
        ({"prompt": "x", "stream": False, "stream_options": None}, "prompt", False, False, None),
    ],
)  # fmt: skip
def test_prepare(
    body: dict[str, object], required: str, stream: bool, strip: bool, options: object
) -> None:
    raw = orjson.dumps(body)
    sent, got_stream, got_strip = prepare(raw, required)
    assert (got_stream, got_strip) == (stream, strip)
    assert orjson.loads(sent).get("stream_options") == options
    if not strip:
        assert sent is raw  # forwarded untouched


@pytest.mark.parametrize(
    ("raw", "required"),
    [(b"{", "messages"), (b"[]", "messages"), (b"{}", "prompt"),
     (b'{"messages": [], "stream": true, "stream_options": []}', "messages")],
)  # fmt: skip
def test_prepare_rejects(raw: bytes, required: str) -> None:
    with pytest.raises(BadRequest):
        prepare(raw, required)
