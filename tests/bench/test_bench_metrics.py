"""bench_serving's metric definitions against values computed by hand on a synthetic trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynspec.bench.load import (
    Prompts,
    Target,
    _has_content,
    _int_after,
    mode_switches,
    parse_target,
    random_prompts,
    thresholds,
)
from dynspec.bench.metrics import RequestTrace, compute, percentile, samples, window

MS = 1000.0


def traces() -> list[RequestTrace]:
    # A: 4 content chunks bringing 1, 2, 1, 3 tokens; [DONE] at 0.75.
    a = RequestTrace(
        send=0.0,
        chunk_times=[0.1, 0.3, 0.35, 0.65],
        chunk_tokens=[1, 2, 1, 3],
        end=0.75,
        output_tokens=7,
        prompt_tokens=10,
        success=True,
    )
    # B: the middle chunk brings no new token: its gap rolls into the next chunk.
    b = RequestTrace(
        send=0.2,
        chunk_times=[0.5, 0.6, 0.8],
        chunk_tokens=[1, 0, 2],
        end=0.85,
        output_tokens=3,
        prompt_tokens=20,
        success=True,
    )
    # C: failed; nothing of it counts except in "failed".
    c = RequestTrace(send=0.0, chunk_times=[0.2], end=0.3, output_tokens=5, error="HTTP 500")
    # D: the server sent no per-chunk counts: one ITL per chunk.
    d = RequestTrace(
        send=0.9,
        chunk_times=[1.0, 1.2, 1.5],
        end=1.5,
        output_tokens=3,
        prompt_tokens=30,
        success=True,
    )
    return [a, b, c, d]


def test_ttft_tpot_e2e_per_request() -> None:
    a, b, _, d = traces()
    assert a.ttft == pytest.approx(0.1)
    assert a.latency == pytest.approx(0.75)
    assert b.ttft == pytest.approx(0.3)
    assert d.latency == pytest.approx(0.6)


def test_itl_splits_multi_token_chunks_per_token() -> None:
    a, b, _, d = traces()
    # 0.3-0.1 over 2 tokens, 0.35-0.3 over 1, 0.65-0.35 over 3.
    assert a.itl() == pytest.approx([0.1, 0.1, 0.05, 0.1, 0.1, 0.1])
    # The empty chunk at 0.6 is skipped: 0.8-0.5 over 2 tokens.
    assert b.itl() == pytest.approx([0.15, 0.15])
    assert d.itl() == pytest.approx([0.2, 0.3])


def test_level_metrics_by_hand() -> None:
    m = compute(traces(), duration=2.0)
    assert m["completed"] == 3
    assert m["failed"] == 1
    assert m["total_output_tokens"] == 13
    assert m["total_input_tokens"] == 60
    assert m["output_throughput"] == pytest.approx(6.5)
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(30.0)
    # Achieved concurrency: summed E2E (0.75 + 0.65 + 0.6) over the duration.
    assert m["concurrency"] == pytest.approx(1.0)
    # TTFTs 0.1, 0.3, 0.1: median 0.1; p99 interpolates 98% of the way from 0.1 to 0.3.
    assert m["mean_ttft_ms"] == pytest.approx(500 / 3)
    assert m["median_ttft_ms"] == pytest.approx(100.0)
    assert m["p99_ttft_ms"] == pytest.approx(296.0)
    # TPOT (latency - TTFT) / (tokens - 1): A 0.65/6, B 0.35/2, D 0.5/2.
    tpots = [0.65 / 6 * MS, 0.35 / 2 * MS, 0.5 / 2 * MS]
    assert m["mean_tpot_ms"] == pytest.approx(sum(tpots) / 3)
    assert m["median_tpot_ms"] == pytest.approx(175.0)
    assert m["p90_tpot_ms"] == pytest.approx(175.0 + 0.8 * 75.0)
    # 10 ITL values: six of A, two of B, two of D.
    itls = [100, 100, 50, 100, 100, 100, 150, 150, 200, 300]
    assert m["mean_itl_ms"] == pytest.approx(sum(itls) / 10)
    assert m["median_itl_ms"] == pytest.approx(100.0)
    assert m["max_itl_ms"] == pytest.approx(300.0)
    assert m["std_itl_ms"] == pytest.approx(float(np.std(itls)))
    assert m["median_e2e_latency_ms"] == pytest.approx(650.0)
    # 13 tokens in 10 chunks.
    assert m["mean_tokens_per_chunk"] == pytest.approx(1.3)
    assert m["max_tokens_per_chunk"] == 3


def test_percentile_matches_numpy_linear() -> None:
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for p in (0, 10, 50, 90, 95, 99, 100):
        assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
    assert percentile([], 50) == 0.0


def test_window_counts_tokens_inside_it_from_every_request() -> None:
    a, b, c, d = traces()
    # A cancelled filler: no usage, so its chunks count at the given mean per chunk.
    filler = RequestTrace(send=0.4, chunk_times=[0.45, 0.55, 0.9])
    w = window([a, b, c, d, filler], 0.3, 0.8, tokens_per_chunk=2.5)
    # A: chunks at 0.3 (2), 0.35 (1), 0.65 (3); B: 0.5 (1), 0.6 (0), 0.8 (2);
    # C failed (its chunk at 0.2 is outside anyway); D none; filler: 0.45 and 0.55.
    assert w.output_tokens == pytest.approx(6 + 3 + 2 * 2.5)
    assert w.requests == 1  # A ends at 0.75; B at 0.85 is outside
    assert w.input_tokens == 10
    # In flight inside [0.3, 0.8]: A 0.45, B 0.5, C 0.0, D 0, filler (no end) 0.4.
    assert w.busy == pytest.approx(0.45 + 0.5 + 0.4)
    m = compute([a, b, d], 1.0, w)
    assert m["duration"] == pytest.approx(0.5)
    assert m["output_throughput"] == pytest.approx(14 / 0.5)
    assert m["concurrency"] == pytest.approx(1.35 / 0.5)
    assert m["median_ttft_ms"] == pytest.approx(100.0)  # latency metrics stay per request


def test_chunk_scanning_without_json_parsing() -> None:
    chunk = (
        b'{"choices":[{"index":0,"delta":{"content":" of day"}}],'
        b'"usage":{"prompt_tokens":9,"completion_tokens":12}}'
    )
    assert _has_content(chunk, b'"content":')
    assert _int_after(chunk, b'"completion_tokens":') == 12
    assert _int_after(chunk, b'"prompt_tokens":') == 9
    assert not _has_content(
        b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', b'"content":'
    )
    assert not _has_content(b'{"choices":[{"delta":{"content": null}}]}', b'"content":')
    assert _has_content(b'{"choices":[{"text": "x"}]}', b'"text":')
    assert _int_after(b'{"usage":{"completion_tokens": 7}}', b'"completion_tokens":') == 7
    assert _int_after(b'{"choices":[]}', b'"completion_tokens":') is None


def test_parse_target_and_router_metrics() -> None:
    t = parse_target("eagle=http://127.0.0.1:30001/")
    assert (t.label, t.base_url, t.endpoint) == ("eagle", "http://127.0.0.1:30001", "chat")
    t = parse_target("http://127.0.0.1:8000/v1/completions")
    assert (t.label, t.base_url, t.endpoint) == (
        "127.0.0.1:8000",
        "http://127.0.0.1:8000",
        "completions",
    )
    with pytest.raises(ValueError):
        parse_target("eagle=localhost:1")
    text = (
        "# TYPE dynspec_mode_switches_total counter\n"
        'dynspec_mode_switches_total{to="baseline"} 3.0\n'
        'dynspec_mode_switches_created{to="baseline"} 1.7e9\n'
        'dynspec_mode_switches_total{to="eagle"} 2.0\n'
    )
    assert mode_switches(text) == 5
    assert mode_switches("# TYPE dynspec_load gauge\ndynspec_load 0.0\n") == 0
    assert mode_switches("sglang:num_running_reqs 0.0\n") is None
    # The one reader of /metrics pages: labels or none, a longer name is another metric, NaN out.
    page = text + 'dynspec_mode_switches_totalx 9\ndynspec_mode_switches_total NaN\nx{a="b"} 1e3\n'
    assert samples(page, "dynspec_mode_switches_total") == [
        ('to="baseline"', 3.0),
        ('to="eagle"', 2.0),
    ]
    assert samples(page, "x") == [('a="b"', 1000.0)] and samples(page, "y") == []
    # Every routing group's threshold; a name that only starts like it is another metric.
    groups = 'dynspec_threshold{pair="0"} 69.0\ndynspec_threshold{pair="1"} 128.0\n'
    assert thresholds(groups + "dynspec_thresholds_other 3\n") == [69.0, 128.0]
    assert thresholds("sglang:num_running_reqs 3\n") == []


def test_random_prompts_fixed_and_ranged_lengths() -> None:
    fixed = random_prompts(20, 64, 32, seed=1)
    assert {(p.prompt_tokens, p.output_tokens) for p in fixed} == {(64, 32)}
    assert all(len(p.text.split()) == 64 for p in fixed)
    ranged = random_prompts(200, 64, 32, seed=1, range_ratio=0.5)
    assert all(32 <= p.prompt_tokens <= 64 and 16 <= p.output_tokens <= 32 for p in ranged)
    assert len({p.output_tokens for p in ranged}) > 5
    assert random_prompts(5, 8, 8, seed=3) == random_prompts(5, 8, 8, seed=3)


def test_prompts_fresh_for_every_request_across_levels() -> None:
    """Prompts without a pool: no two requests of a sweep send the same prompt (a prompt sent
    twice is what SGLang's radix cache serves from memory), the same ones for the same seed."""
    chat, text = Target("a", "http://127.0.0.1:1"), Target("b", "http://127.0.0.1:1", "completions")
    fresh = Prompts(input_len=64, output_len=32, seed=5, range_ratio=0.5)
    taken = [fresh.take(chat if i % 2 else text, "m") for i in range(3000)]
    texts = [p.text for _, p in taken]
    assert len(set(texts)) == 3000
    # Two prompts share at most a few first words: the cache holds no useful prefix either.
    firsts = {" ".join(t.split()[:6]) for t in texts}
    assert len(firsts) > 2990
    assert all(32 <= p.prompt_tokens <= 64 and 16 <= p.output_tokens <= 32 for _, p in taken)
    assert all(len(p.text.split()) == p.prompt_tokens for _, p in taken)
    body = json.loads(taken[1][0])
    assert body["messages"] == [{"role": "user", "content": texts[1]}]
    assert body["max_tokens"] == taken[1][1].output_tokens
    assert json.loads(taken[0][0])["prompt"] == texts[0]
    again = Prompts(input_len=64, output_len=32, seed=5, range_ratio=0.5)
    assert [again.take(chat, "m")[1] for _ in range(3)] == [p for _, p in taken[:3]]
    other = Prompts(input_len=64, output_len=32, seed=6, range_ratio=0.5)
    assert other.take(chat, "m")[1] != taken[0][1]


def test_prompts_pool_reused_in_turn_with_bodies_encoded_once() -> None:
    pool = random_prompts(3, 16, 8, seed=2)
    prompts = Prompts(3, 16, 8, seed=2)
    a, b = Target("a", "http://127.0.0.1:1"), Target("b", "http://127.0.0.1:2")
    first = [prompts.take(a, "m") for _ in range(7)]
    assert [p for _, p in first] == [pool[0], pool[1], pool[2]] * 2 + [pool[0]]
    assert first[0][0] is first[3][0] is first[6][0]  # encoded once
    body, prompt = prompts.take(b, "m")  # the counter is shared: another target goes on
    assert prompt == pool[1] and body is not first[1][0] and body == first[1][0]
