"""The cheap sampling parameters, as SGLang answers them: ``stop``, ``n`` and ``seed``."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from simkit import Sim, SimFactory, sse_json

CHAT = [{"role": "user", "content": "Tell me more."}]


def post(sim: Sim, path: str, **body: Any) -> httpx.Response:
    return httpx.post(sim.v1 + path, json=body, timeout=30)


def chat_text(sim: Sim, **body: Any) -> dict[str, Any]:
    r = post(sim, "/chat/completions", messages=CHAT, **body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _stop_word(text: str) -> str:
    # A word from the middle of the answer, at its first appearance.
    words = text.split()
    return next(w for w in words[len(words) // 2 :] if w.isalpha())


def test_stop_string_ends_the_answer_before_it(eagle_sim: Sim) -> None:
    base = {"max_tokens": 40, "ignore_eos": True, "seed": 11}
    full = chat_text(eagle_sim, **base)["choices"][0]["message"]["content"]
    word = _stop_word(full)
    cut = full[: full.index(word)]
    body = chat_text(eagle_sim, **base, stop=["never-said", word])
    choice = body["choices"][0]
    assert choice["message"]["content"] == cut
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", word)
    assert body["usage"]["completion_tokens"] < 40
    # A lone string works the same; a stop string never produced changes nothing.
    assert chat_text(eagle_sim, **base, stop=word)["choices"][0]["message"]["content"] == cut
    same = chat_text(eagle_sim, **base, stop="never-said")["choices"][0]
    assert (same["message"]["content"], same["finish_reason"]) == (full, "length")


def test_stop_string_in_streams_and_through_the_openai_client(eagle_sim: Sim) -> None:
    base = {"max_tokens": 40, "ignore_eos": True, "seed": 12}
    full = chat_text(eagle_sim, **base)["choices"][0]["message"]["content"]
    word = _stop_word(full)
    cut = full[: full.index(word)]
    client = openai.OpenAI(base_url=eagle_sim.v1, api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="demo-model", messages=CHAT, max_tokens=40, stop=[word], stream=True,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True, "seed": 12},
    )  # fmt: skip
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
            matched = getattr(c, "matched_stop", None) or (c.model_extra or {}).get("matched_stop")
    assert (text, finish, matched) == (cut, "stop", word)
    # Completions: the last text chunk carries the finish.
    r = post(eagle_sim, "/completions", prompt="Once", max_tokens=40, ignore_eos=True, seed=13)
    full = r.json()["choices"][0]["text"]
    word = _stop_word(full)
    r = post(eagle_sim, "/completions", prompt="Once", max_tokens=40, ignore_eos=True, seed=13,
             stop=word, stream=True)  # fmt: skip
    events = sse_json(r.content)
    assert "".join(e["choices"][0]["text"] for e in events) == full[: full.index(word)]
    assert events[-1]["choices"][0]["matched_stop"] == word


def test_n_choices_answered_and_counted(eagle_sim: Sim) -> None:
    body = chat_text(eagle_sim, max_tokens=8, ignore_eos=True, n=3)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in body["choices"]]
    assert all(texts) and len(set(texts)) == 3
    single = chat_text(eagle_sim, max_tokens=8, ignore_eos=True)
    # As SGLang counts: the prompt once, every choice's tokens.
    assert body["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == 24
    r = post(eagle_sim, "/completions", prompt="Hi", max_tokens=5, ignore_eos=True, n=2)
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]
    assert r.json()["usage"]["completion_tokens"] == 10


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_n_choices_stream_with_their_index(eagle_sim: Sim, path: str) -> None:
    chat = path == "/chat/completions"
    body: dict[str, Any] = {"messages": CHAT} if chat else {"prompt": "Hi"}
    r = post(eagle_sim, path, **body, max_tokens=9, ignore_eos=True, n=3, stream=True,
             stream_options={"include_usage": True})  # fmt: skip
    assert r.status_code == 200, r.text
    events = sse_json(r.content)
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 27
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for e in events[:-1]:
        (c,) = e["choices"]
        i = c["index"]
        texts[i] = texts.get(i, "") + ((c["delta"].get("content") or "") if chat else c["text"])
        if c["finish_reason"]:
            assert i not in finishes
            finishes[i] = c["finish_reason"]
    assert sorted(texts) == [0, 1, 2] and all(texts.values())
    assert finishes == {0: "length", 1: "length", 2: "length"}
    if chat:
        # SGLang sends the finish chunks after every choice has ended.
        tail = [e["choices"][0].get("finish_reason") for e in events[-4:-1]]
        assert tail == ["length"] * 3
    # The same text as the answer given whole.
    whole = post(eagle_sim, path, **body, max_tokens=9, ignore_eos=True, n=3).json()
    key = (lambda c: c["message"]["content"]) if chat else (lambda c: c["text"])
    assert [key(c) for c in whole["choices"]] == [texts[i] for i in range(3)]


def test_same_seed_same_request_same_text_on_any_server(sim_factory: SimFactory) -> None:
    a = sim_factory("--mode", "eagle", "--speed", "20", "--seed", "1")
    b = sim_factory("--mode", "baseline", "--speed", "20", "--seed", "2")
    ask = {"max_tokens": 12, "ignore_eos": True}
    seeded = [chat_text(s, **ask, seed=99)["choices"][0]["message"]["content"] for s in (a, b)]
    assert seeded[0] == seeded[1]
    other = chat_text(a, **ask, seed=100)["choices"][0]["message"]["content"]
    assert other != seeded[0]
    # Without a request seed each server's own --seed decides, as before.
    plain = [chat_text(s, **ask)["choices"][0]["message"]["content"] for s in (a, b)]
    assert plain[0] != plain[1]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stop", 5, "stop: Input should be a valid string"),
        ("stop", ["a", 1], "stop: Input should be a valid string"),
        ("n", 0, "n must be positive"),
        ("n", 129, "n: Input should be less than or equal to 128"),
        ("seed", "x", "seed: Input should be a valid integer"),
    ],
)
def test_bad_sampling_values_are_400(
    eagle_sim: Sim, field: str, value: object, message: str
) -> None:
    r = post(eagle_sim, "/chat/completions", messages=CHAT, max_tokens=4, **{field: value})
    assert r.status_code == 400
    assert message in r.json()["message"]
