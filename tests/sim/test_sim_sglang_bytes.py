"""Byte-for-byte against SGLang 0.5.23's own serializers, run in SGLang's parser venv.

``.ci/install-sglang-parser`` installs SGLang 0.5.23 without its GPU stack into ``.venv-sglang``
(or ``DYNSPEC_SGLANG_PYTHON`` names that python). A script run there builds the chunks and bodies
with SGLang's code (``sse_utils.build_sse_content``, the pydantic models of ``protocol.py``,
``UsageProcessor``) for the same inputs ``dynspec.launcher.sim.wire`` gets, and the bytes must
match. ``protocol.py`` imports ``openai``; that venv lacks it, so the script borrows ``openai`` and
its pure dependencies from this venv through a folder of symlinks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from dynspec.launcher.sim import wire

ROOT = Path(__file__).resolve().parents[2]


def _closure(dist: str) -> dict[str, list[str]]:
    """``dist`` and everything it requires (markers ignored: a superset), with their modules."""
    by_dist: dict[str, list[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for d in dists:
            by_dist.setdefault(d.lower().replace("_", "-"), []).append(module)
    seen: dict[str, list[str]] = {}
    todo = [dist]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen or name not in by_dist:
            continue
        seen[name] = [m for m in by_dist[name] if not m.startswith("_")]
        for req in importlib.metadata.requires(name) or []:
            todo.append(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0])
    return seen


SCRIPT = r"""
import json, sys
from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionStreamResponse, ChatMessage,
    CompletionResponse, CompletionResponseChoice, CompletionResponseStreamChoice,
    CompletionStreamResponse, ErrorResponse, ModelCard, ModelList,
)
from sglang.srt.entrypoints.openai.usage_processor import UsageProcessor

a = json.load(sys.stdin)
rid, created, model, text, p, c = a["rid"], a["created"], a["model"], a["text"], a["p"], a["c"]
usage = UsageProcessor.calculate_streaming_usage(
    {0: p}, {0: 0}, {0: c}, cached_tokens={0: 0}, n_choices=1)
out = {
    "role": build_sse_content(chunk_id=rid, created=created, model=model, index=0,
                              role="assistant", content=""),
    "content": build_sse_content(chunk_id=rid, created=created, model=model, index=0, content=text),
    "finish_length": build_sse_content(chunk_id=rid, created=created, model=model, index=0,
                                       finish_reason="length", matched_stop=None),
    "finish_stop": build_sse_content(chunk_id=rid, created=created, model=model, index=0,
                                     finish_reason="stop", matched_stop=128009),
    "role_2": build_sse_content(chunk_id=rid, created=created, model=model, index=2,
                                role="assistant", content=""),
    "content_2": build_sse_content(chunk_id=rid, created=created, model=model, index=2,
                                   content=text),
    "finish_str_2": build_sse_content(chunk_id=rid, created=created, model=model, index=2,
                                      finish_reason="stop", matched_stop=a["stop"]),
    "chat_usage": "data: " + ChatCompletionStreamResponse(
        id=rid, created=created, choices=[], model=model, usage=usage).model_dump_json() + "\n\n",
    "comp_text": "data: " + CompletionStreamResponse(
        id=rid, created=created, object="text_completion", model=model,
        choices=[CompletionResponseStreamChoice(index=0, text=text, logprobs=None,
                                                finish_reason=None, matched_stop=None)],
    ).model_dump_json() + "\n\n",
    "comp_last": "data: " + CompletionStreamResponse(
        id=rid, created=created, object="text_completion", model=model,
        choices=[CompletionResponseStreamChoice(index=0, text=text, logprobs=None,
                                                finish_reason="stop", matched_stop=128009)],
    ).model_dump_json() + "\n\n",
    "comp_last_str_2": "data: " + CompletionStreamResponse(
        id=rid, created=created, object="text_completion", model=model,
        choices=[CompletionResponseStreamChoice(index=2, text=text, logprobs=None,
                                                finish_reason="stop", matched_stop=a["stop"])],
    ).model_dump_json() + "\n\n",
    # serving_completions with stream_options.continuous_usage_stats: each chunk's usage so far.
    "comp_text_usage": "data: " + CompletionStreamResponse(
        id=rid, created=created, object="text_completion", model=model,
        choices=[CompletionResponseStreamChoice(index=0, text=text, logprobs=None,
                                                finish_reason=None, matched_stop=None)],
        usage=UsageProcessor.calculate_token_usage(prompt_tokens=p, completion_tokens=c),
    ).model_dump_json() + "\n\n",
    "comp_last_usage": "data: " + CompletionStreamResponse(
        id=rid, created=created, object="text_completion", model=model,
        choices=[CompletionResponseStreamChoice(index=0, text=text, logprobs=None,
                                                finish_reason="stop", matched_stop=128009)],
        usage=UsageProcessor.calculate_token_usage(prompt_tokens=p, completion_tokens=c),
    ).model_dump_json() + "\n\n",
    "comp_usage": "data: " + CompletionStreamResponse(
        id=rid, created=created, choices=[], model=model, usage=usage,
    ).model_dump_json(exclude_none=True) + "\n\n",
    "chat_body": ChatCompletionResponse(
        id=rid, created=created, model=model, usage=UsageProcessor.calculate_token_usage(
            prompt_tokens=p, completion_tokens=c),
        choices=[ChatCompletionResponseChoice(
            index=0, message=ChatMessage(role="assistant", content=text), finish_reason="length",
            matched_stop=None)],
        metadata={"weight_version": "default"},
    ).model_dump(),
    "comp_body": CompletionResponse(
        id=rid, created=created, model=model, usage=UsageProcessor.calculate_token_usage(
            prompt_tokens=p, completion_tokens=c),
        choices=[CompletionResponseChoice(index=0, text=text, finish_reason="stop",
                                          matched_stop=128009)],
        metadata={"weight_version": "default"},
    ).model_dump(),
    "chat_body_n": ChatCompletionResponse(
        id=rid, created=created, model=model, usage=UsageProcessor.calculate_token_usage(
            prompt_tokens=p, completion_tokens=c),
        choices=[
            ChatCompletionResponseChoice(
                index=0, message=ChatMessage(role="assistant", content=text),
                finish_reason="length", matched_stop=None),
            ChatCompletionResponseChoice(
                index=1, message=ChatMessage(role="assistant", content=""),
                finish_reason="stop", matched_stop=a["stop"]),
        ],
        metadata={"weight_version": "default"},
    ).model_dump(),
    "comp_body_n": CompletionResponse(
        id=rid, created=created, model=model, usage=UsageProcessor.calculate_token_usage(
            prompt_tokens=p, completion_tokens=c),
        choices=[
            CompletionResponseChoice(index=0, text=text, finish_reason="stop",
                                     matched_stop=128009),
            CompletionResponseChoice(index=1, text="", finish_reason="stop",
                                     matched_stop=a["stop"]),
        ],
        metadata={"weight_version": "default"},
    ).model_dump(),
    "error": ErrorResponse(message="Messages cannot be empty.", type="BadRequestError",
                           code=400).model_dump(),
}
json.dump(out, sys.stdout)
"""


def sglang_python() -> Path:
    explicit = os.environ.get("DYNSPEC_SGLANG_PYTHON")
    path = Path(explicit) if explicit else ROOT / ".venv-sglang" / "bin" / "python"
    if not path.exists():
        reason = "SGLang's venv is not installed: run `bash .ci/install-sglang-parser`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must install it)")
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def sglang_bytes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = sglang_python()
    borrowed = tmp_path_factory.mktemp("borrowed")
    # Borrow only what SGLang's venv lacks, so its own pydantic and friends stay in charge.
    closure = _closure("openai")
    probe = "import importlib.util, json, sys; names = json.load(sys.stdin); "
    probe += "print(json.dumps([n for n in names if importlib.util.find_spec(n) is None]))"
    missing = subprocess.run(
        [str(python), "-c", probe],
        input=json.dumps(sorted({m for ms in closure.values() for m in ms})),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lacking = set(json.loads(missing.stdout))
    for dist, modules in closure.items():
        if not lacking.intersection(modules):
            continue
        meta = importlib.metadata.distribution(dist)
        info = Path(str(meta.locate_file(""))) / next(
            p.parts[0] for p in meta.files or [] if p.parts[0].endswith(".dist-info")
        )
        (borrowed / info.name).symlink_to(info)
        for name in modules:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                (borrowed / name).symlink_to(next(iter(spec.submodule_search_locations)))
            elif spec is not None and spec.origin:
                (borrowed / Path(spec.origin).name).symlink_to(spec.origin)
    args = {
        "rid": "chatcmpl-0123456789abcdef0123456789abcdef",
        "created": 1767225600,
        "model": 'm/"odd" name é',
        "text": ' tokens with "quotes", a \\ backslash\nand é',
        "p": 17,
        "c": 42,
        "stop": '\n"end"',
    }
    env = {**os.environ, "PYTHONPATH": str(borrowed)}
    done = subprocess.run(
        [str(python), "-c", SCRIPT],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"args": args, **json.loads(done.stdout)}


def test_chat_stream_chunks_match_sglang(sglang_bytes: dict[str, Any]) -> None:
    a = sglang_bytes["args"]
    chunks = wire.ChatChunks(a["rid"], a["created"], a["model"])
    assert chunks.role().decode() == sglang_bytes["role"]
    assert chunks.content(a["text"]).decode() == sglang_bytes["content"]
    assert chunks.finish("length", None).decode() == sglang_bytes["finish_length"]
    assert chunks.finish("stop", 128009).decode() == sglang_bytes["finish_stop"]
    assert chunks.usage(a["p"], a["c"]).decode() == sglang_bytes["chat_usage"]
    third = wire.ChatChunks(a["rid"], a["created"], a["model"], index=2)
    assert third.role().decode() == sglang_bytes["role_2"]
    assert third.content(a["text"]).decode() == sglang_bytes["content_2"]
    assert third.finish("stop", a["stop"]).decode() == sglang_bytes["finish_str_2"]


def test_completion_stream_chunks_match_sglang(sglang_bytes: dict[str, Any]) -> None:
    a = sglang_bytes["args"]
    chunks = wire.CompletionChunks(a["rid"], a["created"], a["model"])
    assert chunks.text(a["text"]).decode() == sglang_bytes["comp_text"]
    assert chunks.last(a["text"], "stop", 128009).decode() == sglang_bytes["comp_last"]
    assert chunks.usage(a["p"], a["c"]).decode() == sglang_bytes["comp_usage"]
    third = wire.CompletionChunks(a["rid"], a["created"], a["model"], index=2)
    assert third.last(a["text"], "stop", a["stop"]).decode() == sglang_bytes["comp_last_str_2"]
    usage = wire.usage_json(a["p"], a["c"])
    assert chunks.text(a["text"], usage).decode() == sglang_bytes["comp_text_usage"]
    assert chunks.last(a["text"], "stop", 128009, usage).decode() == sglang_bytes["comp_last_usage"]


def test_bodies_match_sglang(sglang_bytes: dict[str, Any]) -> None:
    a = sglang_bytes["args"]
    common = {
        "rid": a["rid"],
        "created": a["created"],
        "model": a["model"],
        "prompt_tokens": a["p"],
        "completion_tokens": a["c"],
    }
    length = wire.Choice(a["text"], "length", None)
    chat = orjson.loads(wire.chat_response(choices=[length], **common))
    assert chat == sglang_bytes["chat_body"]
    assert list(chat) == list(sglang_bytes["chat_body"])
    eos = wire.Choice(a["text"], "stop", 128009)
    comp = orjson.loads(wire.completion_response(choices=[eos], **common))
    assert comp == sglang_bytes["comp_body"]
    assert list(comp) == list(sglang_bytes["comp_body"])
    # n choices, one ended by a stop string (SGLang reports the string as matched_stop).
    at_stop = wire.Choice("", "stop", a["stop"])
    chat_n = orjson.loads(wire.chat_response(choices=[length, at_stop], **common))
    assert chat_n == sglang_bytes["chat_body_n"]
    comp_n = orjson.loads(wire.completion_response(choices=[eos, at_stop], **common))
    assert comp_n == sglang_bytes["comp_body_n"]
    err = orjson.loads(wire.error_body("Messages cannot be empty."))
    assert err == sglang_bytes["error"]
