"""The test models' pure parts: shapes, the d2t maps that set acceptance, the tokenizer."""

from __future__ import annotations

import pytest

from dynspec.bench.gpu import models
from dynspec.launcher.sharing import shape_from_config


def targets_of(d2t: list[int]) -> list[int]:
    return [i + off for i, off in enumerate(d2t)]


def test_target_has_llama_3_1_8b_shapes() -> None:
    assert shape_from_config(models.target_config()).params == 8_030_261_248


def test_accept_length_and_its_inverse() -> None:
    assert models.accept_length(1.0) == 4.0
    assert models.accept_length(0.0) == 1.0
    assert models.accept_length(0.5) == 1.875
    for length in (1.0, 2.0, 3.0, 4.0):
        p = models.p_for_accept_length(length)
        assert models.accept_length(p) == pytest.approx(length, abs=1e-9)
    with pytest.raises(ValueError):
        models.p_for_accept_length(4.5)


def test_d2t_maps_the_first_k_draft_ids_to_token_0_and_the_rest_elsewhere() -> None:
    got = targets_of(models.d2t_offsets(10, 4, target_vocab=100))
    assert got[:4] == [0, 0, 0, 0]
    assert got[4:] == [1, 2, 3, 4, 5, 6]  # distinct, never 0
    with pytest.raises(ValueError):
        models.d2t_offsets(10, 11)
    with pytest.raises(ValueError):
        models.d2t_offsets(10, 0, target_vocab=5)


@pytest.mark.parametrize(("name", "length"), [("p54", 2.0), ("p81", 3.0)])
def test_intermediate_drafts_aim_at_accept_length_2_and_3(name: str, length: float) -> None:
    vocab, accepted, zero_norm = models.draft_specs()[name]
    assert not zero_norm and vocab == models.DRAFT_VOCAB
    assert sum(1 for t in targets_of(models.draft_d2t(name)) if t == 0) == accepted
    assert models.accept_length(accepted / vocab) == pytest.approx(length, abs=0.01)
    cfg = models.draft_config(vocab)
    assert cfg["draft_vocab_size"] == vocab == len(models.draft_d2t(name))


def test_hi_always_maps_to_token_0() -> None:
    assert set(targets_of(models.draft_d2t("hi"))) == {0}
    assert models.draft_specs()["hi"][2]  # final norm zero: always its id 0


def test_tokenizer_token_0_is_a_word_and_specials_match_the_config() -> None:
    vocab = models.tokenizer_vocab()
    inverse = {i: t for t, i in vocab.items()}
    assert inverse[0].isalpha()  # the forced answer decodes to text, not a special token
    assert sorted(vocab.values()) == list(range(len(vocab)))
    ids = models.special_ids()
    cfg = models.target_config()
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (
        ids["bos"],
        ids["eos"],
        ids["pad"],
    )
    assert 0 not in ids.values()


def test_the_sweeps_random_prompt_words_are_single_tokens() -> None:
    from dynspec.bench.load import random_prompts

    vocab = models.tokenizer_vocab()
    words = random_prompts(4, 64, 8, seed=1)[0].text.split()
    assert len(words) == 64 and all(w in vocab for w in words)
