"""The profile's optional ``calibration`` record: kept as data, written back, and checked."""

from __future__ import annotations

import json

import pytest

from dynspec.common.profile import ProfileError, profile_from_dict

MODES = {"eagle": {"throughput": [[1, 100.0]]}, "baseline": {"throughput": [[1, 50.0]]}}


def test_a_calibration_record_round_trips() -> None:
    record = {"key": {"gpu": "NVIDIA H200", "servers": [["--tp-size", "1"]]}, "measured_at": "t"}
    profile = profile_from_dict({"name": "c", "source": "s", "modes": MODES, "calibration": record})
    assert profile.calibration == record
    again = profile_from_dict(json.loads(profile.dumps()))
    assert again == profile
    plain = profile_from_dict({"name": "p", "source": "s", "modes": MODES})
    assert plain.calibration is None and "calibration" not in plain.to_dict()


def test_a_calibration_record_must_be_an_object() -> None:
    with pytest.raises(ProfileError, match="calibration must be an object"):
        profile_from_dict({"name": "c", "source": "s", "modes": MODES, "calibration": [1]})
