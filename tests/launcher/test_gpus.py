from __future__ import annotations

import pytest

from dynspec.common.cli import UsageError
from dynspec.launcher.gpus import format_gpus, parse_gpus, split_halves, visible_devices


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
    ],
)
def test_split(gpus: tuple[int, ...], halves: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    assert split_halves(gpus) == halves


@pytest.mark.parametrize("gpus", [(), (0,), (0, 1, 2)])
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
