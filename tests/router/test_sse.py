"""The byte-level helpers of the relay: token detection, usage reading, usage-event removal,
and request validation, as plain tables."""

from __future__ import annotations

import orjson
import pytest

from dynspec.router.errors import BadRequest, UnsupportedMediaType
from dynspec.router.request import PROXY_PATHS, check_media_type, prepare
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
        # SGLang's native /generate, and a Responses API text delta.
        (b'data: {"text":"Hel","meta_info":{"completion_tokens":1}}\n\n', True),
        (b'data: {"text":"","meta_info":{"completion_tokens":0}}\n\n', False),
        (b'event: response.output_text.delta\ndata: {"delta":"Hi"}\n\n', True),
        (b'event: response.created\ndata: {"response":{"status":"in_progress"}}\n\n', False),
    ],
)
def test_has_token(data: bytes, token: bool) -> None:
    assert has_token(data) is token


def test_strip_usage_keeps_everything_else() -> None:
    kept, usage, bad = strip_usage_events(TOKEN + USAGE + DONE)
    assert kept == TOKEN + DONE
    assert usage == (7, 3) and not bad
    assert strip_usage_events(USAGE) == (b"", (7, 3), False)
    # Text that merely mentions "choices":[] is an escaped string, never an event of its own.
    tricky = b'data: {"choices":[{"delta":{"content":"\\"choices\\":[]"}}]}\n\n'
    assert strip_usage_events(tricky) == (tricky, None, False)


@pytest.mark.parametrize("value", [b"9" * 400, b"9" * 5000, b"-1", b"1e3", b"2.5", b'"7"'])
def test_strip_usage_drops_a_usage_chunk_with_junk_counts(value: bytes) -> None:
    junk = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":%s,"completion_tokens":3}}\n\n'
    kept, usage, bad = strip_usage_events(TOKEN + junk % value + DONE)
    assert kept == TOKEN + DONE  # dropped all the same (orjson refuses the 400 digits)
    assert usage == (None, 3) and bad


def test_usage_in_ignores_generated_text() -> None:
    body = orjson.dumps(
        {
            "choices": [{"message": {"content": '"completion_tokens": 999'}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5},
        }
    )
    assert usage_in(body) == ((11, 5), False)
    assert usage_in(TOKEN) == ((None, None), False)
    native = b'data: {"text":"a b","meta_info":{"prompt_tokens":9,"completion_tokens":2}}\n\n'
    assert usage_in(native + DONE) == ((9, 2), False)
    responses = b'data: {"response":{"usage":{"input_tokens":4,"output_tokens":6}}}\n\n'
    assert usage_in(responses) == ((4, 6), False)


@pytest.mark.parametrize(
    "value, count, bad",
    [
        (b"0", 0, False),
        (b"%d" % (1 << 53), 1 << 53, False),
        (b"null", None, False),
        (b"%d" % ((1 << 53) + 1), None, True),
        (b"9" * 400, None, True),
        (b"9" * 5000, None, True),
        (b"-4", None, True),
        (b"4.0", None, True),
        (b"1e9", None, True),
        (b'"4"', None, True),
        (b"\xd9\xa3", None, True),  # a digit to str.isdigit, not to JSON
    ],
)
def test_usage_counts_are_bounded(value: bytes, count: int | None, bad: bool) -> None:
    body = b'{"usage":{"prompt_tokens":%s,"completion_tokens":2}}' % value
    assert usage_in(body) == ((count, 2), bad)


CHAT, COMPLETIONS, GENERATE, RESPONSES = (
    "/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses"
)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "path", "stream", "strip", "options"),
    [
        ({"messages": []}, CHAT, False, False, None),
        ({"messages": [], "stream": True}, CHAT, True, True, {"include_usage": True}),
        ({"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": False}},
         COMPLETIONS, True, True, {"continuous_usage_stats": False, "include_usage": True}),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
         COMPLETIONS, True, False, {"include_usage": True}),
        ({"prompt": "x", "stream": False, "stream_options": None}, COMPLETIONS, False, False, None),
        # Native and Responses streams carry their counts unasked: forwarded untouched.
        ({"text": "x", "stream": True}, GENERATE, True, False, None),
        ({"input_ids": [1, 2], "sampling_params": {}}, GENERATE, False, False, None),
        ({"input": "x", "stream": True}, RESPONSES, True, False, None),
    ],
)  # fmt: skip
def test_prepare(
    body: dict[str, object], path: str, stream: bool, strip: bool, options: object
) -> None:
    raw = orjson.dumps(body)
    sent, got_stream, got_strip = prepare(raw, PROXY_PATHS[path])
    assert (got_stream, got_strip) == (stream, strip)
    assert orjson.loads(sent).get("stream_options") == options
    if not strip:
        assert sent is raw  # forwarded untouched


@pytest.mark.parametrize(
    ("raw", "path"),
    [(b"{", CHAT), (b"[]", CHAT), (b"{}", COMPLETIONS),
     (b'{"messages": [], "stream": true, "stream_options": []}', CHAT),
     (b'{"sampling_params": {}}', GENERATE), (b'"text"', GENERATE), (b'{"model": "m"}', RESPONSES)],
)  # fmt: skip
def test_prepare_rejects(raw: bytes, path: str) -> None:
    with pytest.raises(BadRequest):
        prepare(raw, PROXY_PATHS[path])


@pytest.mark.parametrize(
    "value",
    [None, b"application/json", b"Application/JSON; charset=utf-8", b"application/vnd.x+json"],
)
def test_json_media_types_accepted(value: bytes | None) -> None:
    check_media_type(value)


@pytest.mark.parametrize(
    "value", [b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; b=x"]
)
def test_other_media_types_refused(value: bytes) -> None:
    with pytest.raises(UnsupportedMediaType):
        check_media_type(value)
