"""SGLang's native API and the Responses API, as the simulator answers them.

- ``POST /generate``: ``text`` or ``input_ids`` (one prompt), ``sampling_params`` with
  ``max_new_tokens`` (default 128), ``ignore_eos`` and ``stop``, ``stream``. The answer is
  ``{"text", "meta_info"}``; a stream sends that object as ``data:`` events, the text so far in
  each, then ``data: [DONE]``. ``meta_info`` holds ``id``, ``finish_reason`` (null until the
  end, then ``{"type": "length", "length": N}`` or ``{"type": "stop", "matched": ID}``),
  ``prompt_tokens`` and ``completion_tokens``.
- ``POST /v1/responses``: ``input`` (a string or messages), ``max_output_tokens``, ``stream``.
  A response object with one output message and ``usage`` (input/output tokens); a stream sends
  ``response.created``, ``response.output_text.delta`` events and ``response.completed``.
- ``POST /tokenize`` (``prompt``) and ``/detokenize`` (``tokens``): simulated ids, about four
  characters a token as the rest of the simulator counts; the text of ids is a placeholder.
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson

from dynspec.launcher.sim.inputs import (
    GenerationInput,
    InvalidRequest,
    parse_object,
    validation,
)

NATIVE_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default


def _count(text: str) -> int:
    return max(1, (len(text) + 3) // 4) if text else 0


def _max_tokens(obj: dict[str, Any], key: str, default: int | None) -> int | None:
    value = obj.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise validation(f"{key}: Input should be a non-negative integer")
    return value


def _stream(obj: dict[str, Any]) -> bool:
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise validation("stream: Input should be a valid boolean")
    return stream


def _checked(prompt_tokens: int, context_length: int) -> int:
    if prompt_tokens >= context_length:
        raise InvalidRequest(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
    return prompt_tokens


def parse_native(body: bytes, context_length: int) -> GenerationInput:
    obj = parse_object(body)
    text, ids = obj.get("text"), obj.get("input_ids")
    if isinstance(text, str):
        prompt_tokens, key = _count(text), text
    elif isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
        prompt_tokens, key = len(ids), ",".join(map(str, ids))
    elif text is None and ids is None:
        raise InvalidRequest("Either text, input_ids or input_embeds should be provided.")
    else:
        raise InvalidRequest("the simulator takes one prompt: a string 'text' or flat 'input_ids'")
    params = obj.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise validation("sampling_params: Input should be a valid dictionary")
    stop = params.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise validation("sampling_params.stop: Input should be a string or a list of strings")
    rid = obj.get("rid")
    return GenerationInput(
        stop=tuple(stop),
        rid=rid if isinstance(rid, str) and rid else os.urandom(16).hex(),
        model="",
        prompt_tokens=_checked(prompt_tokens, context_length),
        prompt_key=key,
        max_new_tokens=_max_tokens(params, "max_new_tokens", NATIVE_DEFAULT_MAX_NEW_TOKENS),
        stream=_stream(obj),
        include_usage=True,
        ignore_eos=bool(params.get("ignore_eos", False)),
    )


def parse_responses(body: bytes, context_length: int, default_model: str) -> GenerationInput:
    obj = parse_object(body)
    if "input" not in obj:
        raise validation("input: Field required")
    given = obj["input"]
    if isinstance(given, str):
        prompt_tokens, key = _count(given), given
    elif isinstance(given, list):
        parts = [
            m["content"] if isinstance(m, dict) and isinstance(m.get("content"), str) else ""
            for m in given
        ]
        prompt_tokens, key = 3 + sum(4 + _count(p) for p in parts), "\x1e".join(parts)
    else:
        raise validation("input: Input should be a valid string or list")
    model = obj.get("model") or default_model
    return GenerationInput(
        rid="resp_" + os.urandom(16).hex(),
        model=model if isinstance(model, str) else default_model,
        prompt_tokens=_checked(prompt_tokens, context_length),
        prompt_key=key,
        max_new_tokens=_max_tokens(obj, "max_output_tokens", None),
        stream=_stream(obj),
        include_usage=True,
        ignore_eos=bool(obj.get("ignore_eos", False)),
    )


# -- /generate ---------------------------------------------------------------------------------


def native_result(
    rid: str,
    text: str,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    finish: tuple[str, int | str | None] | None,
    started: float,
) -> dict[str, Any]:
    reason: dict[str, Any] | None = None
    if finish is not None:
        kind, matched = finish
        if kind == "length":
            reason = {"type": "length", "length": completion_tokens}
        elif kind == "abort":
            reason = {"type": "abort", "message": "Abort in waiting queue or running batch"}
        else:
            reason = {"type": "stop", "matched": matched}
    return {
        "text": text,
        "meta_info": {
            "id": rid,
            "finish_reason": reason,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - started,
        },
    }


def native_event(result: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(result) + b"\n\n"


# -- /v1/responses -----------------------------------------------------------------------------


def response_object(
    rid: str,
    model: str,
    created: int,
    *,
    text: str | None,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """The response; ``text`` None: still in progress (no output, no usage yet)."""
    done = text is not None
    output = (
        [
            {
                "type": "message",
                "id": "msg_" + rid[5:],
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
        if done
        else []
    )
    usage = (
        {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if done
        else None
    )
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "completed" if done else "in_progress",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def response_event(kind: str, seq: int, data: dict[str, Any]) -> bytes:
    payload = orjson.dumps({"type": kind, "sequence_number": seq, **data})
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


# -- /tokenize, /detokenize --------------------------------------------------------------------


def tokenize(body: bytes, context_length: int) -> bytes:
    obj = parse_object(body)
    prompt = obj.get("prompt")
    if isinstance(prompt, str):
        n = _count(prompt)
        tokens: list[int] | list[list[int]] = list(range(1000, 1000 + n))
        count: int | list[int] = n
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        counts = [_count(p) for p in prompt]
        tokens, count = [list(range(1000, 1000 + n)) for n in counts], counts
    else:
        raise validation("prompt: Input should be a valid string or list of strings")
    return orjson.dumps({"tokens": tokens, "count": count, "max_model_len": context_length})


def detokenize(body: bytes) -> bytes:
    obj = parse_object(body)
    tokens = obj.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise validation("tokens: Input should be a valid list of integers")
    return orjson.dumps({"text": "".join(f"<{t}>" for t in tokens)})
