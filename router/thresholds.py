"""The threshold policy's two numbers and the one check of them, for the config (flags, TOML),
``PUT /admin/threshold`` and the pool state alike (so the config does not import the state)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Thresholds:
    threshold: int
    hysteresis: int


def validate_settings(threshold: int, hysteresis: int) -> str | None:
    """Why a threshold/hysteresis pair is unusable, or None."""
    if threshold < 1:
        return "threshold must be at least 1"
    if hysteresis < 0:
        return "hysteresis must not be negative"
    if hysteresis >= threshold:
        # Switching back needs load <= threshold - hysteresis, and load counts the new request.
        return "hysteresis must be smaller than threshold"
    return None


__all__ = ["Thresholds", "validate_settings"]
