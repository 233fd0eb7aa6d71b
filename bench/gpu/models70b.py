"""A random Llama-3.1-70B-shaped target and its EAGLE-3 drafts, built on the GPU machine.

Acceptance is set by construction as for the 8B models (``models.py``): the target's final norm
is zero (greedy always answers token 0), draft ``hi`` always proposes token 0 (every draft
accepted), ``p54`` maps 557 of its 1024 draft ids to token 0 (accept length about 2.4 on the 8B).
bf16, about 141 GB for the target: never downloaded, written shard by shard (one decoder layer a
shard) from a generator seeded per tensor, so several processes (one per GPU) can write disjoint
layers and the bytes do not depend on how many did. The tokenizer is the 8B models' one.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynspec.bench.gpu import models as m8

VOCAB = m8.VOCAB
HIDDEN = 8192
INTERMEDIATE = 28672
LAYERS = 80
HEADS = 64
KV_HEADS = 8
HEAD_DIM = 128
AUX_LAYERS = (2, 40, 77)  # SGLang's default for EAGLE-3: 2, layers // 2, layers - 3
DRAFTS = ("hi", "p54")
TARGET = "llama70b"


def target_config() -> dict[str, Any]:
    cfg = m8.target_config()
    cfg.update(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
    )
    return cfg


def draft_config(draft_vocab: int = VOCAB) -> dict[str, Any]:
    return m8.draft_config(draft_vocab, target_config(), AUX_LAYERS)


def layer_shapes(i: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (HIDDEN,),
        p + "post_attention_layernorm.weight": (HIDDEN,),
        p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def shard_names() -> dict[str, str]:
    """tensor name -> shard file: embeddings, one file per layer, the head."""
    index = {"model.embed_tokens.weight": "model-embed.safetensors"}
    for i in range(LAYERS):
        index.update(dict.fromkeys(layer_shapes(i), f"model-layer{i:03d}.safetensors"))
    index["model.norm.weight"] = "model-head.safetensors"
    index["lm_head.weight"] = "model-head.safetensors"
    return index


def target_bytes() -> int:
    params = VOCAB * HIDDEN * 2 + HIDDEN
    for shape in layer_shapes(0).values():
        n = 1
        for d in shape:
            n *= d
        params += n * LAYERS
    return params * 2


def shards_of(worker: int, workers: int) -> list[str]:
    files = sorted(set(shard_names().values()))
    return [f for i, f in enumerate(files) if i % workers == worker]


def _tensor(name: str, shape: tuple[int, ...], device: str, seed: int) -> Any:
    import torch

    if name.endswith("norm.weight"):
        # Zero final norm: all-zero logits, greedy always emits token 0.
        fill = 0.0 if name == "model.norm.weight" else 1.0
        return torch.full(shape, fill, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
    t = torch.randn(*shape, device=device, generator=gen, dtype=torch.bfloat16)
    return (t * m8.INIT_STD).cpu()


def build_shards(root: Path, worker: int, workers: int, seed: int = 0) -> None:
    """Write this worker's shards of ``root/llama70b`` (each one skipped if it is complete)."""
    import torch
    from safetensors.torch import save_file

    device = f"cuda:{worker % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu"
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        shapes.update(layer_shapes(i))
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    index = shard_names()
    target = root / TARGET
    for file in shards_of(worker, workers):
        if (target / f"{file}.done").exists():
            continue
        tensors = {n: _tensor(n, shapes[n], device, seed) for n, f in index.items() if f == file}
        save_file(tensors, str(target / file))
        (target / f"{file}.done").write_text("")


def build_draft(root: Path, name: str, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import save_file

    vocab, _, zero_norm = m8.draft_specs()[name]
    d = root / f"eagle3-{name}"
    if (d / ".done").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(draft_config(vocab), indent=1))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    two = 2 * HIDDEN
    shapes = {
        "fc.weight": (HIDDEN, 3 * HIDDEN),
        "lm_head.weight": (vocab, HIDDEN),
        "midlayer.self_attn.q_proj.weight": (HEADS * HEAD_DIM, two),
        "midlayer.self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, two),
        "midlayer.self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, two),
        "midlayer.self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        "midlayer.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        "midlayer.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        "midlayer.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }
    w = {n: _tensor(n, s, device, seed + 1) for n, s in shapes.items()}
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        w[f"midlayer.{norm}.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    w["norm.weight"] = (torch.zeros if zero_norm else torch.ones)(HIDDEN, dtype=torch.bfloat16)
    w["d2t"] = torch.tensor(m8.draft_d2t(name), dtype=torch.int64)
    w["t2d"] = torch.ones(VOCAB, dtype=torch.bool)
    save_file(w, str(d / "model.safetensors"))
    (d / ".done").write_text("")
    return d


def write_target_files(root: Path) -> Path:
    """Config, tokenizer and index of ``root/llama70b`` (the shards come from the workers)."""
    target = root / TARGET
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(target_config(), indent=1))
    (target / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    m8._write_tokenizer(target)
    doc = {"metadata": {"total_size": target_bytes()}, "weight_map": shard_names()}
    (target / "model.safetensors.index.json").write_text(json.dumps(doc))
    return target


def finish(root: Path, drafts: Sequence[str]) -> None:
    target = root / TARGET
    missing = [
        f for f in sorted(set(shard_names().values())) if not (target / f"{f}.done").exists()
    ]
    if missing:
        raise RuntimeError(f"{len(missing)} shards of {target} missing, first {missing[0]}")
    for name in drafts:
        if not (root / f"eagle3-{name}" / ".done").exists():
            raise RuntimeError(f"draft eagle3-{name} missing")
    os.sync()
    (target / ".done").write_text("")
