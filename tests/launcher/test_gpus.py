from __future__ import annotations

import pytest

from dynspec.common.cli import UsageError
from dynspec.launcher.gpus import (
    format_gpus,
    parse_gpus,
    split_halves,
    visible_devices,
)
from dynspec.launcher.preflight import tp_problems


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("0-7", (0, 1, 2, 3, 4, 5, 6, 7)),
        ("0,1,2,3", (0, 1, 2, 3)),
        ("0-3,6,7", (0, 1, 2, 3, 6, 7)),
        (" 4-5 , 0 ", (4, 5, 0)),
        ("3", (3,)),
    ],
)
def test_parse(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpus(text) == gpus


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no GPUs"),
        (",", "no GPUs"),
        ("a", "not a GPU id"),
        ("0-", "not a GPU id"),
        ("3-1", "not a valid range"),
        ("-1", "not a GPU id"),
        ("0-3,2", "listed twice"),
    ],
)
def test_parse_errors(text: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        parse_gpus(text)


@pytest.mark.parametrize(
    ("gpus", "halves"),
    [
        ((0, 1, 2, 3, 4, 5, 6, 7), ((0, 1, 2, 3), (4, 5, 6, 7))),
        ((0, 1), ((0,), (1,))),
        ((0, 1, 2, 3, 6, 7), ((0, 1, 2), (3, 6, 7))),
        ((3,), ((3,), (3,))),  # one GPU holds both servers
    ],
)
def test_split(gpus: tuple[int, ...], halves: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    assert split_halves(gpus) == halves


@pytest.mark.parametrize("gpus", [(), (0, 1, 2)])
def test_split_odd_or_empty(gpus: tuple[int, ...]) -> None:
    with pytest.raises(UsageError):
        split_halves(gpus)


@pytest.mark.parametrize(
    ("gpus", "text"),
    [
        ((0, 1, 2, 3), "0-3"),
        ((4, 5, 6, 7), "4-7"),
        ((0, 1, 2, 3, 6, 7), "0-3,6,7"),
        ((0, 2), "0,2"),
    ],
)
def test_format_round_trips(gpus: tuple[int, ...], text: str) -> None:
    assert format_gpus(gpus) == text
    assert parse_gpus(format_gpus(gpus)) == gpus
    assert visible_devices(gpus) == ",".join(map(str, gpus))


@pytest.mark.parametrize(
    ("tp", "heads", "kv_heads", "problems"),
    [
        (4, 32, 8, []),
        (8, 32, 8, []),
        (8, 64, 4, []),  # fewer key-value heads than ranks: replicated, 4 divides 8
        (1, 40, 8, []),
        (3, None, None, ["power of two"]),
        (3, 24, 3, ["power of two"]),
        (3, 32, 8, ["power of two", "32 attention heads", "8 key-value heads"]),
        (6, 48, 8, ["power of two", "8 key-value heads"]),
        (4, 40, 10, ["10 key-value heads"]),
        (8, 12, None, ["12 attention heads"]),
    ],
)
def test_tp_problems(tp: int, heads: int | None, kv_heads: int | None, problems: list[str]) -> None:
    found = tp_problems(tp, heads, kv_heads)
    assert len(found) == len(problems), found
    for text, want in zip(found, problems, strict=True):
        assert want in text
