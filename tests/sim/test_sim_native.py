"""The simulator's native /generate, /v1/responses, /tokenize, /detokenize and /flush_cache, in
the shapes SGLang answers them (the router relays them; its own tests go through it)."""

from __future__ import annotations

import itertools

import httpx
import openai
import orjson
import pytest
from simkit import Sim, sse_json


def test_generate_plain_and_streamed(eagle_sim: Sim) -> None:
    params = {"max_new_tokens": 6, "ignore_eos": True}
    r = httpx.post(eagle_sim.url + "/generate", json={"text": "Hi", "sampling_params": params},
                   timeout=10)  # fmt: skip
    assert r.status_code == 200, r.text
    answer = r.json()
    meta = answer["meta_info"]
    assert meta["completion_tokens"] == 6 and meta["prompt_tokens"] > 0
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    body = {"input_ids": [5, 6, 7], "sampling_params": params, "stream": True}
    r = httpx.post(eagle_sim.url + "/generate", json=body, timeout=10)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_json(r.content)
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 6
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    # Each event holds the text so far, as SGLang's stream does by default.
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert events[-1]["meta_info"]["prompt_tokens"] == 3


@pytest.mark.parametrize("body", [{}, {"text": ["a", "b"]}, {"text": "x", "stream": "yes"}])
def test_generate_refuses(eagle_sim: Sim, body: dict[str, object]) -> None:
    r = httpx.post(eagle_sim.url + "/generate", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["object"] == "error"


async def test_responses_through_the_openai_client(eagle_sim: Sim) -> None:
    async with openai.AsyncOpenAI(base_url=eagle_sim.v1, api_key="x", max_retries=0) as c:
        reply = await c.responses.create(
            model="m", input="Hello", max_output_tokens=5, extra_body={"ignore_eos": True}
        )
        assert reply.status == "completed" and reply.output_text
        assert reply.usage is not None and reply.usage.output_tokens == 5
        stream = await c.responses.create(
            model="m", input=[{"role": "user", "content": "Hello"}], max_output_tokens=3,
            stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        seen = [event async for event in stream]
    deltas = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert seen[-1].type == "response.completed"
    assert seen[-1].response.output_text == deltas  # type: ignore[union-attr]


def test_tokenize_detokenize_and_flush_cache(eagle_sim: Sim) -> None:
    r = httpx.post(eagle_sim.url + "/tokenize", json={"prompt": "a" * 40}, timeout=10)
    assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) == 10
    r = httpx.post(eagle_sim.url + "/detokenize", json={"tokens": [1, 2]}, timeout=10)
    assert r.status_code == 200 and isinstance(r.json()["text"], str)
    r = httpx.post(eagle_sim.url + "/detokenize", content=orjson.dumps({"tokens": 1}), timeout=10)
    assert r.status_code == 400
    r = httpx.post(eagle_sim.url + "/flush_cache", timeout=10)
    assert r.status_code == 200 and r.text.startswith("Cache flushed")


def test_generate_stops_at_a_stop_string(eagle_sim: Sim) -> None:
    params = {"max_new_tokens": 200, "ignore_eos": True, "stop": ["e"]}
    r = httpx.post(eagle_sim.url + "/generate", json={"text": "Hi", "sampling_params": params},
                   timeout=10)  # fmt: skip
    answer = r.json()
    assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": "e"}
    assert "e" not in answer["text"]


@pytest.mark.parametrize("label", [None, b"text/plain", b"application/x-www-form-urlencoded"])
def test_generate_body_not_labelled_json_is_400_as_sglangs_fastapi(
    eagle_sim: Sim, label: bytes | None
) -> None:
    # SGLang 0.5.17's FastAPI reads an unlabelled body as bytes (strict_content_type): 400. The
    # launcher's calibration first met this on the real H200, where the simulator had said 200.
    body = orjson.dumps({"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    headers = {} if label is None else {"content-type": label.decode()}
    for path in ("/generate", "/v1/responses"):
        r = httpx.post(eagle_sim.url + path, content=body, headers=headers, timeout=10)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["object"] == "error" and r.json()["code"] == 400
    labelled = {"content-type": "application/vnd.api+json"}
    r = httpx.post(eagle_sim.url + "/generate", content=body, headers=labelled, timeout=10)
    assert r.status_code == 200, r.text
