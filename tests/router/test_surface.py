"""SGLang's endpoints besides chat and completions, through the router against dynspec-sim:
the native /generate and /v1/responses (routed and accounted like chat), the read-only ones
(one server of the active pool), /flush_cache and /abort_request (every server),
/health_generate (for the router), and the shape of what the router itself refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from routerkit import RouterProc, clear_faults, metric_value, router, set_faults, wait_for
from utils import free_port

KEY = "surface-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "demo-model"  # the demo profile's served model name


@pytest.fixture(scope="module")
def rp(sims: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    eagle, baseline = sims
    with router(
        tmp_path_factory.mktemp("surface"), "--eagle-url", eagle, "--baseline-url", baseline,
        api_key=KEY,
    ) as proc:  # fmt: skip
        yield proc


def client(rp: RouterProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=rp.url + "/v1", api_key=KEY, max_retries=0)


def assert_openai_error(r: httpx.Response, status: int, err_type: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == err_type, err
    return err  # type: ignore[no-any-return]


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


# -- models --------------------------------------------------------------------------------------


async def test_models_retrieve(rp: RouterProc) -> None:
    async with client(rp) as c:
        model = await c.models.retrieve(MODEL)
        assert model.id == MODEL
        with pytest.raises(openai.NotFoundError) as caught:
            await c.models.retrieve("no-such-model")
    body = caught.value.response.json()
    assert body["error"]["code"] == "model_not_found"


# -- read-only and one-server endpoints ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/get_server_info", "/server_info", "/get_model_info"])
def test_read_only_endpoints_relayed(rp: RouterProc, path: str) -> None:
    r = httpx.get(rp.url + path, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["model_path"] == MODEL
    # Idle: new requests go to the eagle pool, so the eagle server answers.
    assert r.headers["x-dynspec-backend"] == "eagle"
    assert httpx.get(rp.url + path, timeout=10).status_code == 401


def test_tokenize_and_detokenize(rp: RouterProc) -> None:
    r = httpx.post(rp.url + "/tokenize", json={"prompt": "hello world"}, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    tokens = r.json()["tokens"]
    assert r.json()["count"] == len(tokens) > 0
    r = httpx.post(rp.url + "/detokenize", json={"tokens": tokens}, headers=AUTH, timeout=10)
    assert r.status_code == 200 and isinstance(r.json()["text"], str)
    # The server's own 400 passes through unchanged.
    r = httpx.post(rp.url + "/detokenize", json={"tokens": "x"}, headers=AUTH, timeout=10)
    assert r.status_code == 400 and r.json()["object"] == "error"
    # The router's own checks: a JSON object, labelled as JSON.
    bad = httpx.post(rp.url + "/tokenize", content=b"[1]", headers=AUTH, timeout=10)
    assert_openai_error(bad, 400, "invalid_request_error")
    form = httpx.post(rp.url + "/tokenize", data={"prompt": "x"}, headers=AUTH, timeout=10)
    assert_openai_error(form, 415, "invalid_request_error")


# -- /generate: routed and accounted like chat ---------------------------------------------------


async def test_generate_accounted_like_chat(rp: RouterProc) -> None:
    before = rp.metrics()
    async with httpx.AsyncClient(base_url=rp.url, headers=AUTH, timeout=30) as hc:
        r = await hc.post(
            "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 5,
                                                                    "ignore_eos": True}}
        )  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.headers["x-dynspec-backend"] == "eagle"
        meta = r.json()["meta_info"]
        assert meta["completion_tokens"] == 5
        prompt = meta["prompt_tokens"]
        body = {"text": "Hello", "stream": True,
                "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}}  # fmt: skip
        async with hc.stream("POST", "/generate", json=body) as s:
            assert s.status_code == 200
            assert s.headers["content-type"].startswith("text/event-stream")
            raw = b"".join([chunk async for chunk in s.aiter_bytes()])
    got = events(raw)
    assert got[-1] == b"data: [DONE]"
    last = orjson.loads(got[-2][len(b"data: ") :])
    assert last["meta_info"]["completion_tokens"] == 7
    after = rp.metrics()

    def grew(name: str, **labels: str) -> float:
        return metric_value(after, name, **labels) - metric_value(before, name, **labels)

    assert grew("dynspec_requests_total", pool="eagle", code="200") == 2
    assert grew("dynspec_output_tokens_total", pool="eagle") == 5 + 7
    assert grew("dynspec_prompt_tokens_total", pool="eagle") == 2 * prompt
    assert grew("dynspec_time_to_first_token_seconds_count", pool="eagle") == 1
    assert grew("dynspec_request_duration_seconds_count", pool="eagle") == 2


async def test_generate_stream_holds_a_lease_until_it_ends(rp: RouterProc) -> None:
    body = {"input_ids": [1, 2, 3], "stream": True,
            "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True}}  # fmt: skip
    async with (
        httpx.AsyncClient(base_url=rp.url, headers=AUTH, timeout=30) as hc,
        hc.stream("POST", "/generate", json=body) as s,
    ):
        assert s.status_code == 200
        chunks = s.aiter_bytes()  # kept: a dropped iterator would close the response
        await chunks.__anext__()
        st = await asyncio.to_thread(rp.status)
        assert st["load"] == 1 and st["pools"]["eagle"]["in_flight"] == 1
    # Leaving mid-stream is a client disconnect; the count goes back to 0 (the autouse check).
    assert await asyncio.to_thread(rp.wait_load, 0)
    assert wait_for(lambda: rp.metric("dynspec_client_disconnects_total", pool="eagle") >= 1)


@pytest.mark.parametrize(
    ("body", "param"),
    [(b'{"sampling_params": {}}', "text"), (b"[]", None), (b"{nope", None)],
)
def test_generate_validated(rp: RouterProc, body: bytes, param: str | None) -> None:
    headers = {**AUTH, "content-type": "application/json"}
    r = httpx.post(rp.url + "/generate", content=body, headers=headers, timeout=10)
    err = assert_openai_error(r, 400, "invalid_request_error")
    assert err["param"] == param
    assert "x-dynspec-backend" not in r.headers


# -- /v1/responses: a generation endpoint, routed and accounted like chat ------------------------


async def test_responses_through_the_openai_client(rp: RouterProc) -> None:
    before = rp.metric("dynspec_output_tokens_total", pool="eagle")
    async with client(rp) as c:
        raw = await c.responses.with_raw_response.create(
            model=MODEL, input="Hello", max_output_tokens=6, extra_body={"ignore_eos": True}
        )
        assert raw.headers["x-dynspec-backend"] == "eagle"
        reply = raw.parse()
        assert reply.output_text and reply.usage is not None
        assert reply.usage.output_tokens == 6
        stream = await c.responses.create(
            model=MODEL, input="Hello", max_output_tokens=4, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert wait_for(lambda: rp.metric("dynspec_output_tokens_total", pool="eagle") == before + 10)


def test_responses_need_input(rp: RouterProc) -> None:
    r = httpx.post(rp.url + "/v1/responses", json={"model": MODEL}, headers=AUTH, timeout=10)
    assert assert_openai_error(r, 400, "invalid_request_error")["param"] == "input"


# -- every server --------------------------------------------------------------------------------


def test_flush_cache_reaches_every_server(rp: RouterProc, sims: tuple[str, str]) -> None:
    r = httpx.post(rp.url + "/flush_cache", headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    servers = r.json()["servers"]
    assert {s["url"] for s in servers} == set(sims)
    assert all(s["status"] == 200 and "Cache flushed" in s["body"] for s in servers)


def test_flush_cache_reports_each_failure(sims: tuple[str, str], tmp_path: Path) -> None:
    eagle, _ = sims
    dead = f"http://127.0.0.1:{free_port()}"
    with router(tmp_path, "--eagle-url", eagle, "--baseline-url", dead) as proc:
        r = httpx.post(proc.url + "/flush_cache", timeout=10)
        err = assert_openai_error(r, 502, "server_error")
        assert "1 of 2" in err["message"]
        by_url = {s["url"]: s for s in r.json()["servers"]}
        assert by_url[eagle]["status"] == 200
        assert by_url[dead]["status"] is None and "refused" in by_url[dead]["error"]


async def test_abort_request_reaches_the_server_that_holds_it(rp: RouterProc) -> None:
    rid = "abort-me-1"
    body = {"text": "Hello", "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": 20000, "ignore_eos": True}}  # fmt: skip
    async with httpx.AsyncClient(base_url=rp.url, headers=AUTH, timeout=30) as hc:
        async with hc.stream("POST", "/generate", json=body) as s:
            chunks = s.aiter_bytes()
            await chunks.__anext__()
            r = await hc.post("/abort_request", json={"rid": rid})
            assert r.status_code == 200, r.text
            assert len(r.json()["servers"]) == 2
            rest = b"".join([c async for c in chunks])  # the stream ends: aborted
        got = events(rest)
        assert got[-1] == b"data: [DONE]"
        assert b'"type":"abort"' in got[-2]
        bad = await hc.post(
            "/abort_request", content=b"rid", headers={"content-type": "text/plain"}
        )
        assert_openai_error(bad, 415, "invalid_request_error")


# -- /health_generate ----------------------------------------------------------------------------


def test_health_generate_answers_for_the_active_pool(rp: RouterProc, sims: tuple[str, str]) -> None:
    r = httpx.get(rp.url + "/health_generate", timeout=30)  # no key, like /health
    assert r.status_code == 200 and r.json()["pool"] == "eagle"
    eagle, baseline = sims
    try:
        for url in sims:
            set_faults(url, health_status=503)
        assert wait_for(lambda: not any(s["healthy"] for s in rp.status()["servers"]))
        r = httpx.get(rp.url + "/health_generate", timeout=30)
        assert_openai_error(r, 503, "server_error")
    finally:
        for url in (eagle, baseline):
            clear_faults(url)
    assert wait_for(lambda: all(s["healthy"] for s in rp.status()["servers"]))


# -- what the router refuses itself --------------------------------------------------------------


def test_unknown_path_and_wrong_method_typed(rp: RouterProc) -> None:
    r = httpx.get(rp.url + "/v2/nothing", headers=AUTH, timeout=5)
    assert assert_openai_error(r, 404, "not_found_error")["code"] == "not_found"
    r = httpx.get(rp.url + "/tokenize", headers=AUTH, timeout=5)
    assert_openai_error(r, 405, "invalid_request_error")
    assert r.headers["allow"] == "POST"
    r = httpx.get(rp.url + "/generate", headers=AUTH, timeout=5)
    assert_openai_error(r, 405, "invalid_request_error")


def test_head_health(rp: RouterProc) -> None:
    r = httpx.head(rp.url + "/health", timeout=5)
    assert r.status_code == 200 and r.content == b""


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 200),
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),  # what curl -d sends
        ("multipart/form-data; boundary=x", 415),
    ],
)
def test_body_media_type(rp: RouterProc, content_type: str | None, status: int) -> None:
    body = orjson.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    headers = dict(AUTH)
    if content_type is not None:
        headers["content-type"] = content_type
    r = httpx.post(rp.url + "/v1/chat/completions", content=body, headers=headers, timeout=10)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        err = assert_openai_error(r, status, "invalid_request_error")
        assert err["code"] == "unsupported_media_type" and "content-type" in err["message"]


# -- listening beyond loopback -------------------------------------------------------------------


@pytest.mark.parametrize(("host", "key", "warned"), [
    ("0.0.0.0", None, True), ("0.0.0.0", "k", False), ("127.0.0.1", None, False),
])  # fmt: skip
def test_open_listener_without_key_warns(
    sims: tuple[str, str], tmp_path: Path, host: str, key: str | None, warned: bool
) -> None:
    eagle, _ = sims
    with router(tmp_path, "--eagle-url", eagle, "--host", host, api_key=key) as proc:
        log = proc.log.read_text()
    assert ("without --api-key" in log) is warned


def test_read_only_endpoint_skips_a_failing_server(sims: tuple[str, str], tmp_path: Path) -> None:
    """A 5xx from the first server is not the answer while another server answers."""
    eagle, baseline = sims
    with router(tmp_path, "--eagle-url", eagle, "--baseline-url", baseline) as proc:
        set_faults(eagle, fail_status=500)
        try:
            r = httpx.post(proc.url + "/tokenize", json={"prompt": "hi"}, timeout=10)
        finally:
            clear_faults(eagle)
        assert r.status_code == 200 and r.headers["x-dynspec-backend"] == "baseline"


def test_read_only_endpoint_without_any_server_is_503(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with router(tmp_path, "--eagle-url", dead, ready="/metrics") as proc:
        r = httpx.get(proc.url + "/get_server_info", timeout=10)
        assert assert_openai_error(r, 503, "server_error")["code"] == "no_healthy_server"
        assert int(r.headers["retry-after"]) >= 1
