"""Measured levels into a profile's mode: the one home the bench's export and the launcher's
calibration share (``common/levels.py``)."""

from __future__ import annotations

import pytest

from dynspec.common.levels import (
    DEFAULT_PREFILL_OVERHEAD_S,
    DEFAULT_PREFILL_TOKENS_PER_S,
    measured_mode,
    prefill_rate,
)
from dynspec.common.profile import mode_from_dict


def test_a_mode_from_points_is_rounded_labelled_and_loadable() -> None:
    mode = measured_mode(
        [(16, 1000.04), (1, 100.01), (4, 399.96)],
        what="calibration of 'eagle gpu0'",
        accept_length=2.71828,
        max_accept_length=4,
        max_running=16,
        prefill_tokens_per_s=12345.67,
    )
    assert mode.throughput == ((1, 100.0), (4, 400.0), (16, 1000.0))
    assert (mode.accept_length, mode.max_accept_length) == (2.718, 4)
    assert mode.max_running_requests == 16
    assert mode.prefill_tokens_per_s == 12345.7
    assert mode.prefill_overhead_s == DEFAULT_PREFILL_OVERHEAD_S
    assert mode.source == (
        "calibration of 'eagle gpu0', measured C=1,4,16; flat beyond C=16 (no data); "
        "max_running_requests 16 (as the measured server ran)"
    )
    # What it writes, the one reader takes back unchanged.
    assert mode_from_dict("eagle", mode.to_dict()) == mode


def test_interpolated_levels_are_named_and_no_prefill_means_the_default() -> None:
    mode = measured_mode([(1, 100.0), (4, 400.0), (64, 1600.0)], what="x", interpolate=True)
    assert [c for c, _ in mode.throughput] == [1, 2, 4, 8, 16, 32, 64]
    assert "measured C=1,4,64; estimated C=2,8,16,32" in mode.source
    assert mode.prefill_tokens_per_s == DEFAULT_PREFILL_TOKENS_PER_S


def test_levels_without_c1_are_refused() -> None:
    with pytest.raises(ValueError, match="C=1"):
        measured_mode([(4, 400.0), (16, 900.0)], what="x")
    with pytest.raises(ValueError, match="C=1"):
        measured_mode([], what="x")


@pytest.mark.parametrize(
    ("ttft", "tpot", "prompt", "rate"),
    [
        # 1000 tokens in what is left of 0.115 s after 5 ms overhead and a 10 ms step: 10k/s.
        (0.115, 0.010, 1000.0, 10000.0),
        # Nothing left after the overhead and one step: unknown, not a made-up figure.
        (0.012, 0.010, 1000.0, None),
        (0.115, 0.010, 0.0, None),
        # Bounded to what a server can plausibly do.
        (0.016, 0.010, 1e6, 1e6),
        (10.0, 0.010, 10.0, 100.0),
    ],
)
def test_prefill_rate(ttft: float, tpot: float, prompt: float, rate: float | None) -> None:
    got = prefill_rate(ttft, tpot, prompt)
    assert got == (None if rate is None else pytest.approx(rate))
