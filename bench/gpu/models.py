"""Test models built offline: a random Llama-3.1-8B-shaped target and EAGLE-3 drafts whose
acceptance is set by construction (how: docs/benchmarks.md, "Flags of dynspec-bench gpu models").
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynspec.common import words

# Llama-3.1-8B shapes.
VOCAB = 128256
HIDDEN = 4096
INTERMEDIATE = 14336
LAYERS = 32
HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
AUX_LAYERS = (1, 15, 28)  # the target layers an EAGLE-3 draft reads (as the released drafts do)
DRAFT_VOCAB = 1024  # draft ids of the pNN drafts
STEPS = 3  # speculative steps the drafts are meant for (topk 1, 4 draft tokens)
INIT_STD = 0.02

# The random prompts (the bench's and the calibration's) are made of these words (each one token),
# then the chat template's pieces and the special tokens. Id 0 is "the".
WORDS = tuple(dict.fromkeys(["the", *words.WORDS]))
TEMPLATE_PIECES = ("user", "assistant", "system", ":", ".", ",", "?", "!", "'", "-")
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def tokenizer_vocab() -> dict[str, int]:
    tokens = [*WORDS, *TEMPLATE_PIECES, *SPECIALS]
    if len(set(tokens)) != len(tokens):
        raise ValueError("the test tokenizer's tokens must be distinct")
    return {t: i for i, t in enumerate(tokens)}


def special_ids() -> dict[str, int]:
    vocab = tokenizer_vocab()
    return {"unk": vocab["<unk>"], "bos": vocab["<s>"], "eos": vocab["</s>"], "pad": vocab["<pad>"]}


def target_config() -> dict[str, Any]:
    ids = special_ids()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 8192,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }


def draft_config(draft_vocab: int = VOCAB) -> dict[str, Any]:
    cfg = target_config()
    eagle = {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS), "use_aux_hidden_state": True}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
    cfg.update(draft_vocab_size=draft_vocab, target_hidden_size=HIDDEN, eagle_config=eagle)
    return cfg


def accept_length(p: float, steps: int = STEPS) -> float:
    """Mean tokens per verify step when each proposal is accepted independently with p."""
    return sum(p**i for i in range(steps + 1))


def p_for_accept_length(length: float, steps: int = STEPS) -> float:
    """The per-proposal acceptance that gives ``length`` (1 .. steps + 1), by bisection."""
    if not 1.0 <= length <= steps + 1:
        raise ValueError(f"accept length {length} is outside 1..{steps + 1}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if accept_length(mid, steps) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def d2t_offsets(draft_vocab: int, accepted_ids: int, target_vocab: int = VOCAB) -> list[int]:
    """SGLang's ``d2t``: target id of draft id i is ``i + d2t[i]``.

    The first ``accepted_ids`` draft ids map to target token 0 (the target's only answer); the
    others map to distinct target tokens 1, 2, ... (never 0: a rejected proposal).
    """
    if not 0 <= accepted_ids <= draft_vocab:
        raise ValueError("accepted_ids must be within 0..draft_vocab")
    if draft_vocab - accepted_ids >= target_vocab:
        raise ValueError("not enough target tokens for the rejected draft ids")
    targets = [0] * accepted_ids + list(range(1, draft_vocab - accepted_ids + 1))
    return [t - i for i, t in enumerate(targets)]


# name -> (draft vocabulary, draft ids mapping to token 0, final norm zero)
def draft_specs() -> dict[str, tuple[int, int, bool]]:
    specs: dict[str, tuple[int, int, bool]] = {
        "hi": (VOCAB, VOCAB, True),  # id 0 always proposed; d2t all zero maps it to token 0
    }
    for target in (2.0, 3.0):
        p = p_for_accept_length(target)
        specs[f"p{round(p * 100)}"] = (DRAFT_VOCAB, round(p * DRAFT_VOCAB), False)
    return specs


def draft_d2t(name: str) -> list[int]:
    vocab, accepted, zero_norm = draft_specs()[name]
    if zero_norm:
        return [-i for i in range(vocab)]  # every draft id -> target token 0
    return d2t_offsets(vocab, accepted)


TARGET_NORMS = ("input_layernorm", "post_attention_layernorm")
DRAFT_NORMS = ("input_layernorm", "hidden_norm", "post_attention_layernorm")


def layer_shapes(attn_in: int) -> dict[str, tuple[int, int]]:
    """A decoder layer's matrices, name -> shape; its attention reads ``attn_in`` features (an
    EAGLE-3 draft's: the token's embedding and the target's hidden state, side by side)."""
    return {
        "self_attn.q_proj.weight": (HEADS * HEAD_DIM, attn_in),
        "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, attn_in),
        "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, attn_in),
        "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


# -- building (torch) -----------------------------------------------------------------------


def _write_tokenizer(dest: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=tokenizer_vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(dest))


def build_models(root: Path, drafts: Sequence[str] | None = None, seed: int = 0) -> dict[str, Path]:
    """Write ``root/llama8b`` and ``root/eagle3-NAME`` for each draft; returns name -> path.

    Random bf16 weights made on the GPU when there is one. A model already complete on disk (its
    ``.done`` marker) is kept.
    """
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> Any:
        t = torch.randn(*shape, device=device, generator=gen, dtype=torch.bfloat16)
        return (t * INIT_STD).cpu()

    def norm(value: float) -> Any:  # a norm's weights: 1 (the identity) or 0 (all-zero output)
        return torch.full((HIDDEN,), value, dtype=torch.bfloat16)

    def layer(prefix: str, attn_in: int, norms: Sequence[str]) -> dict[str, Any]:
        w = {f"{prefix}{n}.weight": norm(1.0) for n in norms}
        w.update({prefix + name: rnd(*shape) for name, shape in layer_shapes(attn_in).items()})
        return w

    target = root / "llama8b"
    out = {"target": target}
    if not (target / ".done").exists():
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text(json.dumps(target_config(), indent=1))
        (target / "generation_config.json").write_text(json.dumps({"do_sample": False}))
        _write_tokenizer(target)
        index: dict[str, str] = {}
        shard: dict[str, Any] = {"model.embed_tokens.weight": rnd(VOCAB, HIDDEN)}
        n = 0

        def flush() -> None:
            nonlocal shard, n
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(target / name))
            index.update(dict.fromkeys(shard, name))
            shard = {}
            n += 1

        for i in range(LAYERS):
            shard.update(layer(f"model.layers.{i}.", HIDDEN, TARGET_NORMS))
            if i % 8 == 7:
                flush()
        # Zero final norm: all-zero logits, greedy always emits token 0.
        shard["model.norm.weight"] = norm(0.0)
        shard["lm_head.weight"] = rnd(VOCAB, HIDDEN)
        flush()
        index_doc = {"metadata": {}, "weight_map": index}
        (target / "model.safetensors.index.json").write_text(json.dumps(index_doc))
        (target / ".done").write_text("")

    for name in drafts if drafts is not None else list(draft_specs()):
        vocab, _, zero_norm = draft_specs()[name]
        d = root / f"eagle3-{name}"
        out[name] = d
        if (d / ".done").exists():
            continue
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(draft_config(vocab), indent=1))
        w = {
            "fc.weight": rnd(HIDDEN, 3 * HIDDEN),
            "norm.weight": norm(0.0 if zero_norm else 1.0),
            "lm_head.weight": rnd(vocab, HIDDEN),
            **layer("midlayer.", 2 * HIDDEN, DRAFT_NORMS),
            "d2t": torch.tensor(draft_d2t(name), dtype=torch.int64),
            "t2d": torch.ones(VOCAB, dtype=torch.bool),
        }
        save_file(w, str(d / "model.safetensors"))
        (d / ".done").write_text("")
    os.sync()
    return out
