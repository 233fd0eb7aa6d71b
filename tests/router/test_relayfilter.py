"""The relay's per-chunk step on its own: whatever the pieces, the same bytes out and the same
TTFT and usage as the whole body gives."""

from __future__ import annotations

import time

from dynspec.router.relayfilter import (
    MAX_USAGE_SCAN,
    Body,
    EventStream,
    RelayFilter,
    StrippedEventStream,
    relay_filter,
)

ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
TOKENS = [b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i for i in range(3)]
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = ROLE + b"".join(TOKENS) + USAGE + DONE


def run(filt: RelayFilter, pieces: list[bytes], *, last_in_hand: bool) -> bytes:
    """Feed the pieces as a driver does; ``last_in_hand``: the last piece goes to ``finish``."""
    out = [filt.feed(p) for p in (pieces[:-1] if last_in_hand else pieces)]
    out.append(filt.finish(pieces[-1]) if last_in_hand else filt.finish())
    return b"".join(out)


def test_event_stream_passes_every_piece_and_reads_usage_at_the_end() -> None:
    for cut in range(1, len(STREAM)):
        for last_in_hand in (False, True):
            filt = EventStream(time.perf_counter())
            assert run(filt, [STREAM[:cut], STREAM[cut:]], last_in_hand=last_in_hand) == STREAM
            assert filt.usage == (7, 3)
            assert filt.ttft is not None


def test_stripped_stream_drops_the_usage_event_at_every_split() -> None:
    expected = ROLE + b"".join(TOKENS) + DONE
    for cut in range(1, len(STREAM)):
        for last_in_hand in (False, True):
            filt = StrippedEventStream(time.perf_counter())
            got = run(filt, [STREAM[:cut], STREAM[cut:]], last_in_hand=last_in_hand)
            assert got == expected, cut
            assert filt.usage == (7, 3)
            assert filt.ttft is not None


def test_stripped_stream_passes_whole_events_only() -> None:
    filt = StrippedEventStream(time.perf_counter())
    assert filt.feed(TOKENS[0][:10]) == b""
    assert filt.feed(TOKENS[0][10:] + TOKENS[1][:5]) == TOKENS[0]
    # An event the server never ended goes out at the end.
    assert filt.finish() == TOKENS[1][:5]


def test_no_ttft_without_a_token() -> None:
    for filt in (EventStream(0.0), StrippedEventStream(0.0)):
        assert filt.feed(ROLE) == ROLE
        assert filt.finish(DONE) == DONE
        assert filt.ttft is None
        assert filt.usage == (None, None)


def test_ttft_counts_from_the_start() -> None:
    start = time.perf_counter()
    filt = EventStream(start - 5.0)
    filt.feed(TOKENS[0])
    assert filt.ttft is not None and filt.ttft >= 5.0


def test_body_usage_only_for_a_success() -> None:
    body = b'{"choices":[{"text":"x"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}'
    ok = Body(0.0, ok=True)
    assert ok.feed(body[:20]) == body[:20]
    assert ok.finish(body[20:]) == body[20:]
    assert ok.usage == (4, 1) and ok.ttft is None
    failed = Body(0.0, ok=False)
    failed.feed(body)
    failed.finish()
    assert failed.usage == (None, None)


def test_body_keeps_a_bounded_prefix() -> None:
    filt = Body(0.0, ok=True)
    big = b"x" * MAX_USAGE_SCAN
    filt.feed(big)
    filt.feed(b'"completion_tokens": 9')  # past the scan: not kept
    filt.finish()
    assert filt.usage == (None, None)


def test_relay_filter_picks_by_response() -> None:
    assert type(relay_filter(0.0, status=200, event_stream=True, strip=False)) is EventStream
    assert type(relay_filter(0.0, status=200, event_stream=True, strip=True)) is (
        StrippedEventStream
    )
    assert type(relay_filter(0.0, status=500, event_stream=False, strip=False)) is Body


def test_junk_counts_are_flagged_and_every_byte_passes() -> None:
    """A 5,000-digit prompt_tokens: each filter passes the stream on whole (the stripped one
    without the usage chunk), ignores the count and flags it; good counts are not flagged."""
    junk = USAGE.replace(b"7", b"9" * 5000)
    stream = ROLE + b"".join(TOKENS) + junk + DONE
    pieces = [stream[i : i + 50] for i in range(0, len(stream), 50)]
    # The plain stream reads its usage from its last two pieces: the server's usage event is one.
    events = [ROLE, *TOKENS, junk, DONE]
    plain = EventStream(time.perf_counter())
    assert run(plain, events, last_in_hand=True) == stream
    assert plain.usage == (None, 3) and plain.bad_usage
    stripped = StrippedEventStream(time.perf_counter())
    assert run(stripped, pieces, last_in_hand=False) == stream.replace(junk, b"")
    assert stripped.usage == (None, 3) and stripped.bad_usage
    body = Body(time.perf_counter(), ok=True)
    assert run(body, [junk], last_in_hand=True) == junk
    assert body.bad_usage
    good = EventStream(time.perf_counter())
    run(good, [STREAM], last_in_hand=True)
    assert good.usage == (7, 3) and not good.bad_usage
