"""The simulator speaks SGLang 0.5.23's wire: the openai client parses it, chunks come in order."""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from simkit import Sim, SimFactory, sse_events, sse_json

CHAT = [{"role": "user", "content": "Say something."}]

# --- the official openai client ---------------------------------------------------------------


def test_openai_sync_chat_and_completions(eagle_sim: Sim) -> None:
    client = openai.OpenAI(base_url=eagle_sim.v1, api_key="none", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == ["demo-model"]

    resp = client.chat.completions.create(model="demo-model", messages=CHAT, max_tokens=12)  # type: ignore[arg-type]
    assert resp.id.startswith("chatcmpl-")
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 12

    comp = client.completions.create(model="demo-model", prompt="Once upon", max_tokens=7)
    assert comp.id.startswith("cmpl-")
    assert comp.object == "text_completion"
    assert comp.choices[0].text
    assert comp.usage is not None and comp.usage.completion_tokens == 7

    text = ""
    finish = None
    stream = client.chat.completions.create(
        model="demo-model",
        messages=CHAT,  # type: ignore[arg-type]
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        else:
            usage = chunk.usage
    assert text and finish == "length"
    assert usage is not None and usage.completion_tokens == 20

    ctext = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="demo-model", prompt="x", max_tokens=9, stream=True
        )
    )
    assert ctext


async def test_openai_async_chat_and_completions(eagle_sim: Sim) -> None:
    client = openai.AsyncOpenAI(base_url=eagle_sim.v1, api_key="none", max_retries=0)
    try:
        resp = await client.chat.completions.create(
            model="demo-model",
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=5,
        )
        assert resp.choices[0].message.content
        stream = await client.chat.completions.create(
            model="demo-model",
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=15,
            stream=True,
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(pieces)
        comp = await client.completions.create(model="demo-model", prompt="x", max_tokens=3)
        assert comp.choices[0].finish_reason == "length"
        cstream = await client.completions.create(
            model="demo-model", prompt="x", max_tokens=6, stream=True
        )
        assert "".join([c.choices[0].text async for c in cstream])
    finally:
        await client.close()


# --- the exact chunk sequence -----------------------------------------------------------------


def _post(sim: Sim, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(sim.url + path, json=body, timeout=30)


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_chunk_sequence(eagle_sim: Sim, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "m", "messages": CHAT, "max_tokens": 30, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    r = _post(eagle_sim, "/v1/chat/completions", body)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = sse_json(r.content)
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and re.fullmatch(r"chatcmpl-[0-9a-f]{32}", ids.pop())
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        assert c["model"] == "m"  # SGLang echoes the request's model name
        assert isinstance(c["created"], int)
        assert "usage" in c if c["choices"] == [] else "usage" not in c

    role, *rest = chunks
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "matched_stop": None,
        }
    ]
    if include_usage:
        *rest, usage_chunk = rest
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"]["completion_tokens"] == 30
        assert set(usage_chunk["usage"]) == {
            "prompt_tokens",
            "total_tokens",
            "completion_tokens",
            "prompt_tokens_details",
            "reasoning_tokens",
            "completion_tokens_details",
        }
    *contents, finish = rest
    assert finish["choices"] == [
        {
            "index": 0,
            "delta": {"reasoning_content": None},
            "logprobs": None,
            "finish_reason": "length",
            "matched_stop": None,
        }
    ]
    assert contents, "no content chunk"
    for c in contents:
        (choice,) = c["choices"]
        assert list(choice["delta"]) == ["reasoning_content", "content"]
        assert choice["delta"]["content"]
        assert choice["finish_reason"] is None and choice["matched_stop"] is None
    # Byte shape: msgspec's compact JSON in SGLang's field order.
    raw = sse_events(r.content)
    assert raw[0].startswith(b'{"id":"chatcmpl-')
    assert b'"object":"chat.completion.chunk","created":' in raw[0]
    assert raw[-1] == b"[DONE]"


def test_chat_stream_natural_stop_reports_matched_stop(eagle_sim: Sim) -> None:
    # Without max_tokens an answer ends by itself: finish_reason stop with the EOS token id.
    r = _post(eagle_sim, "/v1/chat/completions", {"model": "m", "messages": CHAT, "stream": True})
    finish = sse_json(r.content)[-1]["choices"][0]
    assert finish["finish_reason"] == "stop"
    assert isinstance(finish["matched_stop"], int)


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_stream_chunk_sequence(eagle_sim: Sim, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "m", "prompt": "abc", "max_tokens": 25, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    r = _post(eagle_sim, "/v1/completions", body)
    chunks = sse_json(r.content)
    if include_usage:
        *chunks, usage_chunk = chunks
        assert usage_chunk["choices"] == []
        assert usage_chunk["object"] == "text_completion"
        assert usage_chunk["usage"]["completion_tokens"] == 25
        assert "prompt_tokens_details" not in usage_chunk["usage"]  # exclude_none in SGLang
    for c in chunks:
        assert c["object"] == "text_completion"
        assert c["usage"] is None
        assert re.fullmatch(r"cmpl-[0-9a-f]{32}", c["id"])
    *middle, last = chunks
    for c in middle:
        assert c["choices"][0]["finish_reason"] is None and c["choices"][0]["text"]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["matched_stop"] is None


@pytest.mark.parametrize("n", [1, 2])
def test_completion_stream_with_continuous_usage(eagle_sim: Sim, n: int) -> None:
    # SGLang's serving_completions with stream_options.continuous_usage_stats: every chunk of a
    # choice carries that choice's usage so far (the launcher's calibration counts tokens so).
    opts = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "m", "prompt": "abc", "max_tokens": 25, "stream": True, "n": n}
    chunks = sse_json(_post(eagle_sim, "/v1/completions", {**body, "stream_options": opts}).content)
    *chunks, usage_chunk = chunks
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 25 * n
    for index in range(n):
        mine = [c for c in chunks if c["choices"][0]["index"] == index]
        counts = [c["usage"]["completion_tokens"] for c in mine]
        assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 25
        assert len(set(counts)) == len(counts)  # a chunk per decode step, each with new tokens
        for c in mine:
            u = c["usage"]
            assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert mine[-1]["choices"][0]["finish_reason"] == "length"


def test_non_streamed_bodies(eagle_sim: Sim) -> None:
    r = _post(eagle_sim, "/v1/chat/completions", {"model": "m", "messages": CHAT, "max_tokens": 4})
    body = r.json()
    assert body["model"] == "m"
    r2 = _post(eagle_sim, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})
    assert r2.json()["model"] == "default"
    assert r.headers["content-type"] == "application/json"
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["matched_stop"] is None and choice["finish_reason"] == "length"
    r = _post(eagle_sim, "/v1/completions", {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2})
    body = r.json()
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 2
    # SGLang's completions default is 16 new tokens.
    r = _post(eagle_sim, "/v1/completions", {"model": "m", "prompt": "x", "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 16


# --- the other endpoints ----------------------------------------------------------------------


def test_info_endpoints(eagle_sim: Sim) -> None:
    info = httpx.get(eagle_sim.url + "/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["max_running_requests"] == 48
    assert info["version"] == "0.5.23"
    state = info["internal_states"][0]
    assert state["avg_spec_accept_length"] >= 1
    assert "last_gen_throughput" in state
    model = httpx.get(eagle_sim.url + "/model_info").json()
    assert model["served_model_name"] == "demo-model" and model["is_generation"] is True
    models = httpx.get(eagle_sim.url + "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["max_model_len"] == 32768
    client = openai.OpenAI(base_url=eagle_sim.v1, api_key="none", max_retries=0)
    assert client.models.retrieve("demo-model").id == "demo-model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    assert httpx.get(eagle_sim.url + "/nope").status_code == 404


def test_baseline_server_info_and_metrics(sim_factory: SimFactory) -> None:
    sim = sim_factory("--mode", "baseline", "--served-model-name", "served", "--speed", "20")
    info = httpx.get(sim.url + "/server_info").json()
    assert info["speculative_algorithm"] is None
    assert info["max_running_requests"] == 1024
    assert "avg_spec_accept_length" not in info["internal_states"][0]
    text = sim.metrics()
    assert "sglang:spec_accept_length" not in text
    assert 'model_name="served"' in text
    names = {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
        "sglang:inter_token_latency_seconds_sum",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:num_aborted_requests_total",
    }
    present = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert names <= present
    # Valid Prometheus text: prometheus-client's own parser reads every family with its type.
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["sglang:num_queue_reqs"] == "gauge"
    assert families["sglang:num_aborted_requests"] == "counter"
    assert families["sglang:e2e_request_latency_seconds"] == "histogram"
    assert (
        'sglang:num_running_reqs{model_name="served",engine_type="unified",tp_rank="0",'
        'pp_rank="0",moe_ep_rank="0"}' in text
    )


def test_eagle_metrics_names(eagle_sim: Sim) -> None:
    _post(eagle_sim, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 40})
    text = eagle_sim.metrics()
    assert "# TYPE sglang:spec_accept_length gauge" in text
    assert "# TYPE sglang:num_aborted_requests_total counter" in text
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in text
    assert eagle_sim.metric("sglang:generation_tokens_total", is_streaming="false") >= 40
    # demo EAGLE: 3.0 tokens a step on average (at most 4).
    assert 2.0 <= eagle_sim.metric("sglang:spec_accept_length") <= 4.0
    assert 0.3 <= eagle_sim.metric("sglang:spec_accept_rate") <= 1.0


# --- bad input: SGLang's flat error body ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "needle", "err_type"),
    [
        ("/v1/chat/completions", b"{not json", "JSON decode error", "Bad Request"),
        ("/v1/chat/completions", b"[1, 2]", "valid dictionary", "Bad Request"),
        ("/v1/chat/completions", b'{"model": "m"}', "messages: Field required", "Bad Request"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": []}',
            "Messages cannot be empty.",
            "BadRequestError",
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":40000}',
            "exceeds the model's maximum context length of 32768 tokens",
            "BadRequestError",
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":0}',
            "max_tokens must be positive",
            "Bad Request",
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":"yes"}',
            "stream",
            "Bad Request",
        ),
        ("/v1/completions", b'{"model": "m"}', "prompt: Field required", "Bad Request"),
        (
            "/v1/completions",
            b'{"model": "m", "prompt": "x", "max_tokens": 32768, "stream": true}',
            "exceeds the model's maximum context length",
            "BadRequestError",
        ),
    ],
)
def test_bad_input_gets_sglang_error_body(
    eagle_sim: Sim, path: str, body: bytes, needle: str, err_type: str
) -> None:
    r = httpx.post(eagle_sim.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()
    assert set(err) == {"object", "message", "type", "param", "code"}
    assert err["object"] == "error" and err["code"] == 400 and err["param"] is None
    assert needle in err["message"]
    assert err["type"] == err_type


@pytest.mark.parametrize("content_type", [None, "text/plain"])
def test_generation_needs_json_content_type(eagle_sim: Sim, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    body = b'{"model": "m", "prompt": "x", "max_tokens": 2}'
    r = httpx.post(eagle_sim.url + "/v1/completions", content=body, headers=headers)
    assert r.status_code == 400
    assert "Only 'application/json' is allowed" in r.json()["message"]
    ok = {"content-type": "Application/JSON; charset=utf-8"}
    assert httpx.post(eagle_sim.url + "/v1/completions", content=body, headers=ok).is_success


def test_prompt_longer_than_context(eagle_sim: Sim) -> None:
    r = _post(eagle_sim, "/v1/completions", {"model": "m", "prompt": "word " * 30000})
    assert r.status_code == 400
    assert "longer than the model's context length (32768 tokens)" in r.json()["message"]


def test_openai_client_raises_on_bad_input(eagle_sim: Sim) -> None:
    client = openai.OpenAI(base_url=eagle_sim.v1, api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[])
    assert "Messages cannot be empty." in str(info.value)


def test_wrong_method(eagle_sim: Sim) -> None:
    assert httpx.get(eagle_sim.url + "/v1/chat/completions").status_code == 405


def test_rid_from_body_names_the_request(eagle_sim: Sim) -> None:
    r = _post(
        eagle_sim, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2, "rid": "my-1"}
    )
    assert orjson.loads(r.content)["id"] == "my-1"
