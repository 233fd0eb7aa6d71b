"""Finding a simulator profile: a shipped one by name (``profiles/NAME.json``) or any file.

The format and its one reader live in ``dynspec.common.profile`` (the router reads the same
files); this module re-exports them for the simulator's modules and adds the file look-up.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from dynspec.common.profile import (
    BASELINE_DEFAULT_MAX_RUNNING,
    DEFAULT_RUNNING_LIMIT,
    DEFAULT_SHARING,
    EAGLE_DEFAULT_MAX_RUNNING,
    MODES,
    SCHEMA_VERSION,
    SHARING_WAYS,
    Mode,
    ModeProfile,
    Profile,
    ProfileError,
    ShareModel,
    profile_from_dict,
    sharing_from_dict,
)

__all__ = [
    "BASELINE_DEFAULT_MAX_RUNNING",
    "DEFAULT_RUNNING_LIMIT",
    "DEFAULT_SHARING",
    "EAGLE_DEFAULT_MAX_RUNNING",
    "MODES",
    "SCHEMA_VERSION",
    "SHARING_WAYS",
    "Mode",
    "ModeProfile",
    "Profile",
    "ProfileError",
    "ShareModel",
    "load_profile",
    "profile_from_dict",
    "sharing_from_dict",
    "shipped_profiles",
]


def shipped_profiles() -> list[str]:
    folder = resources.files("dynspec.launcher.sim").joinpath("profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name_or_path: str) -> Profile:
    """Load a shipped profile by name, or any profile file by path (``*.json``)."""
    if name_or_path.endswith(".json") or "/" in name_or_path:
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"cannot read profile {name_or_path}: {exc.strerror}") from None
    else:
        res = resources.files("dynspec.launcher.sim") / "profiles" / (name_or_path + ".json")
        if not res.is_file():
            names = ", ".join(shipped_profiles())
            raise ProfileError(f"unknown profile {name_or_path!r} (shipped: {names})")
        text = res.read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {name_or_path}: invalid JSON ({exc})") from None
    return profile_from_dict(raw)
