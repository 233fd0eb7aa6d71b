"""The simulated server's information endpoints: models, model and server info, metrics, loads,
stats.

Each is ``async (app, scope, receive, send)``; ``app.py`` puts them in its route table.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from dynspec.launcher.sim.asgi import METRICS, Receive, Scope, Send, respond

if TYPE_CHECKING:
    from dynspec.launcher.sim.app import SimApp

SGLANG_VERSION = "0.5.23"


def card(app: SimApp) -> dict[str, Any]:
    return {
        "id": app.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": app.model,
        "parent": None,
        "max_model_len": app.config.profile.context_length,
    }


async def models(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    await respond(send, 200, orjson.dumps({"object": "list", "data": [card(app)]}))


async def model_card(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    name = scope["path"][len("/v1/models/") :]
    if name == app.model:
        await respond(send, 200, orjson.dumps(card(app)))
        return
    err = {
        "message": f"The model '{name}' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    await respond(send, 404, orjson.dumps({"error": err}))


async def model_info(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    info = {
        "model_path": app.model,
        "served_model_name": app.model,
        "tokenizer_path": app.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
    }
    await respond(send, 200, orjson.dumps(info))


def server_args(app: SimApp) -> dict[str, Any]:
    cfg = app.config
    mp = app.mode_profile
    spec = app.speculative
    return {
        "model_path": app.model,
        "tokenizer_path": app.model,
        "served_model_name": app.model,
        "host": cfg.host,
        "port": cfg.port,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "context_length": cfg.profile.context_length,
        "max_running_requests": cfg.max_running,
        "max_total_tokens": cfg.profile.max_total_tokens,
        "enable_metrics": True,
        "speculative_algorithm": "EAGLE3" if spec else None,
        "speculative_num_steps": mp.max_accept_length - 1 if spec else None,
        "speculative_eagle_topk": 1 if spec else None,
        "speculative_num_draft_tokens": mp.max_accept_length if spec else None,
        "random_seed": app.seed,
        "simulated": {
            "profile": cfg.profile.name,
            "illustrative": cfg.profile.illustrative,
            "mode": cfg.mode,
            "speed": cfg.speed,
            "sharing": cfg.shared.way if cfg.shared is not None else None,
        },
    }


async def server_info(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    engine = app.running_engine()
    args = server_args(app)
    state: dict[str, Any] = {
        **args,
        "world_size": 1,
        "effective_max_running_requests_per_dp": app.config.max_running,
        "last_gen_throughput": engine.gen_throughput(),
    }
    if app.speculative:
        state["avg_spec_accept_length"] = engine.accept_length() or (app.mode_profile.accept_length)
    info = {
        **args,
        "startup_time": app.started_at,
        "internal_states": [state],
        "version": SGLANG_VERSION,
        "frontend": "python",
    }
    await respond(send, 200, orjson.dumps(info))


async def metrics(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    engine = app.running_engine()
    used = engine.used_tokens()
    body = app.metrics.render(
        running=len(engine.running),
        queued=engine.queued(),
        gen_throughput=engine.gen_throughput(),
        token_usage=used / app.config.profile.max_total_tokens,
        used_tokens=used,
        accept_length=engine.accept_length(),
    )
    await respond(send, 200, body, METRICS)


async def loads(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    """SGLang's ``GET /v1/loads``: the engine's last published snapshot (one DP rank), not the
    live counts (``/metrics`` and ``/sim/stats`` show those)."""
    engine = app.running_engine()
    running, waiting = engine.load_snapshot
    used = engine.used_tokens()
    total = app.config.profile.max_total_tokens
    rank = {
        "dp_rank": 0,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_total_reqs": running + waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": total,
        "token_usage": used / total if total else 0.0,
    }
    body = {"timestamp": time.time(), "dp_rank_count": 1, "loads": [rank]}
    await respond(send, 200, orjson.dumps(body))


async def stats(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    engine = app.running_engine()
    s = engine.stats
    body = {
        "running": len(engine.running),
        "queued": engine.queued(),
        "steps": s.steps,
        "prefill_steps": s.prefill_steps,
        "late_steps": s.late_steps,
        "max_lag_s": s.max_lag_s,
        "total_lag_s": s.total_lag_s,
        "dropped_s": s.dropped_s,
        "sim_time_s": engine.now(),
    }
    await respond(send, 200, orjson.dumps(body))


async def flush_cache(app: SimApp, scope: Scope, receive: Receive, send: Send) -> None:
    # SGLang flushes only when no request runs or waits, and answers 400 otherwise.
    engine = app.running_engine()
    text = (
        b"Cache flushed.\nPlease check backend logs for more details. (When there are "
        b"running or waiting requests, the operation will not be performed.)\n"
    )
    status = 200 if not engine.running and not engine.queued() else 400
    await respond(send, status, text, [(b"content-type", b"text/plain; charset=utf-8")])
