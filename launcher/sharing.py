"""Both servers on one GPU: each one's share of its memory, from the GPU's size and the model's.

SGLang sizes its static memory (weights, KV cache, CUDA graphs) as ``--mem-fraction-static`` of
the memory that is FREE when the server starts (0.5.17 and 0.5.23 alike: the headroom it keeps is
``free_before_load x (1 - fraction)``). So on a shared GPU the servers start one after the other,
and the second one's fraction is of what the first one left. Each server gets half of the GPU:
its static part plus an activation reserve. ``--max-total-tokens`` caps both KV caches at the
same size (the EAGLE server also holds the draft model), when the GPU's memory and the model's
``config.json`` are known; otherwise only the fractions are set (they hold on any GPU size).

Pure arithmetic: the files are read by ``probe.py`` (``model_config``, ``weights_on_disk``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
# Per server, for activations, sampling buffers and the CUDA context: outside its static part.
RESERVE_FRACTION = 0.06
RESERVE_MIN_GIB = 4.0
# CUDA graphs (decode, up to a few hundred requests) and other static buffers beside the KV.
GRAPHS_GIB = 3.0
# The first server's CUDA context and allocator slack, gone from what the second one sees free.
CONTEXT_GIB = 1.0
DTYPE_BYTES = 2  # bf16 / fp16 weights and KV cache


@dataclass(frozen=True)
class ModelShape:
    """What a model's ``config.json`` says about its memory: parameters and KV bytes per token."""

    params: int
    kv_bytes_per_token: int

    @property
    def weight_bytes(self) -> int:
        return self.params * DTYPE_BYTES


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"config.json: {key} is {value!r}, expected a whole number")
    return value


def shape_from_config(cfg: dict[str, Any], draft: bool = False) -> ModelShape:
    """Parameters and KV bytes per token of a Llama-style decoder (or an EAGLE-3 draft of one).

    An EAGLE-3 draft has one decoder layer whose attention reads twice the hidden size, an ``fc``
    from three target layers, and its own lm_head over ``draft_vocab_size`` ids; it borrows the
    target's embedding.
    """
    hidden = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    inter = _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    head_dim = _int(cfg, "head_dim", hidden // max(heads, 1))
    attn_in = 2 * hidden if draft else hidden
    attn = attn_in * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    mlp = 3 * hidden * inter
    per_layer = attn + mlp + 2 * hidden
    if draft:
        head_vocab = _int(cfg, "draft_vocab_size", vocab)
        params = layers * per_layer + 3 * hidden * hidden + head_vocab * hidden + 2 * hidden
    else:
        tied = bool(cfg.get("tie_word_embeddings", False))
        params = layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden
    kv = 2 * layers * kv_heads * head_dim * DTYPE_BYTES
    return ModelShape(params=params, kv_bytes_per_token=kv)


def shape_of(cfg: Mapping[str, Any] | None, draft: bool = False) -> ModelShape | None:
    """The shape a model's ``config.json`` (``probe.model_config``) says; None when unknown."""
    if cfg is None:
        return None
    try:
        return shape_from_config(dict(cfg), draft=draft)
    except ValueError:
        return None


@dataclass(frozen=True)
class SharedGpuPlan:
    """Flags for each server on a shared GPU; ``max_total_tokens`` is None when not sizable."""

    eagle_fraction: float
    baseline_fraction: float
    max_total_tokens: int | None
    note: str


def _reserve_gib(gpu_gib: float | None) -> float:
    if gpu_gib is None:
        return RESERVE_MIN_GIB
    return max(RESERVE_MIN_GIB, RESERVE_FRACTION * gpu_gib)


def plan_shared_gpu(
    gpu_gib: float | None,
    target: ModelShape | None,
    draft: ModelShape | None,
    *,
    tp: int = 1,
    target_bytes: int | None = None,
    draft_bytes: int | None = None,
) -> SharedGpuPlan:
    """Half the GPU for each server; the EAGLE server starts first.

    With the GPU's memory M: each server's static part is S = M/2 - reserve. The first sees about
    M free (fraction S/M), the second about M - S - context (fraction S/that). Without M the same
    split is taken as fractions of an 80 GiB GPU, whose ratios differ little from other sizes.
    The KV cap is what is left of S after the weights and graphs, over the KV bytes per token
    (the EAGLE server's tokens also hold the draft layer's KV), the same for both servers.
    With ``tp`` GPUs per server each GPU holds 1/tp of the weights and of every token's KV.
    The weights' sizes on disk (``target_bytes``, ``draft_bytes``) replace the estimate from
    ``config.json`` where known.
    """
    m = gpu_gib if gpu_gib is not None else 80.0
    static = m / 2 - _reserve_gib(m)
    first = static / m
    second = min(0.95, static / (m - static - CONTEXT_GIB))
    tokens: int | None = None
    note = "fractions of the memory free at each server's start"
    if gpu_gib is not None and target is not None:
        weights = (target_bytes or target.weight_bytes) / tp
        draft_weights = (draft_bytes or (draft.weight_bytes if draft is not None else 0)) / tp
        draft_kv = draft.kv_bytes_per_token if draft is not None else 0
        eagle_kv_bytes = (static - GRAPHS_GIB) * GIB - weights - draft_weights
        base_kv_bytes = (static - GRAPHS_GIB) * GIB - weights
        per_eagle = (target.kv_bytes_per_token + draft_kv) / tp
        fit = min(eagle_kv_bytes / per_eagle, base_kv_bytes * tp / target.kv_bytes_per_token)
        if fit > 0:
            # Whole thousands: a readable flag, and a little slack below the estimate.
            tokens = max(1000, math.floor(fit / 1000.0) * 1000)
            note = f"{m:.0f} GiB GPU, KV for {tokens} tokens each"
        else:
            note = f"the model does not fit twice on a {m:.0f} GiB GPU; fractions only"
    return SharedGpuPlan(
        eagle_fraction=round(first, 3),
        baseline_fraction=round(second, 3),
        max_total_tokens=tokens,
        note=note,
    )


# The least KV cache per server worth starting a pair for (a few thousand tokens of an 8B model).
MIN_KV_GIB = 1.0


def pair_shortfall_gib(
    gpu_gib: float, tp: int, target_bytes: int, draft_bytes: int
) -> tuple[float, str]:
    """How many GiB each GPU of a pair lacks for two copies of the target, the draft and some
    KV for each server (<= 0: it fits), and the sum spelled out for the error line."""
    per_server = _reserve_gib(gpu_gib) + GRAPHS_GIB + MIN_KV_GIB
    target = target_bytes / GIB / tp
    draft = draft_bytes / GIB / tp
    need = 2 * target + draft + 2 * per_server + CONTEXT_GIB
    spelled = (
        f"2 x {target:.1f} GiB of target weights + {draft:.1f} GiB of draft (per GPU at tp {tp}) "
        f"+ 2 x {per_server:.1f} GiB of reserve, graphs and least KV = {need:.1f} GiB"
    )
    return need - gpu_gib, spelled
