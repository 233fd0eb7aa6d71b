"""The names of the experiments' ways and variants, in one place that loads nothing heavy: the
CLI validates ``--ways`` and ``--variants`` with them before the load modules are imported, and
``fourway.py`` and ``ramp.py`` run them.
"""

from __future__ import annotations

import argparse

# Eight GPUs, seven ways (bench/fourway.py). Each simulated server stands for four GPUs; a pair
# simulator stands for four GPUs holding both an EAGLE and a baseline server.
EIGHT_WAYS = (
    "split-threshold",  # one EAGLE + one baseline server on GPUs of their own, --threshold N
    "split-balance",  # the same two, --policy balance --speed-profile
    "paired-threshold",  # two shared-GPU pairs, router --pair ... --threshold N
    "paired-auto",  # the same two pairs, --threshold auto, no profile
    "2x-eagle",  # two EAGLE servers, one pool
    "2x-baseline",  # two baseline servers, one pool
    "2x-adaptive",  # two adaptive-EAGLE servers, where the profile has an adaptive counterpart
)
HOMOGENEOUS = ("2x-eagle", "2x-baseline", "2x-adaptive")
PAIRED = ("paired-threshold", "paired-auto")
# The four-way run's names before the pairs came: still accepted, and read back as the new ones.
OLD_NAMES = {"routed-threshold": "split-threshold", "routed-balance": "split-balance"}
SHARING = ("timeslice", "mps")

# The ramp's routers (bench/ramp.py), and which is held against which (learning, seeded, within).
RAMP_VARIANTS = ("balance-learning", "balance-profile", "paired-auto", "paired-auto-seeded")
RAMP_PAIRS = (
    ("balance-learning", "balance-profile", 0.10),
    ("paired-auto", "paired-auto-seeded", 0.05),
)

# Several routers in front of the same servers (bench/replicas.py): the layouts, each run as the
# eight-GPU way of that layout with a set threshold, and the variants: how many router replicas
# and which load each compares with the threshold (``--load-signal``).
REPLICA_LAYOUTS = {"split": "split-threshold", "paired": "paired-threshold"}
REPLICA_VARIANTS = {"1-router": (1, "local"), "3-local": (3, "local"), "3-servers": (3, "servers")}
REPLICA_REFERENCE = "1-router"


def _names(text: str) -> list[str]:
    return [w for w in text.replace(" ", "").split(",") if w]


def parse_ways(text: str) -> list[str]:
    """``--ways``: some of EIGHT_WAYS (or their old names), run in EIGHT_WAYS' order."""
    ways = [OLD_NAMES.get(w, w) for w in _names(text)]
    if not ways or any(w not in EIGHT_WAYS for w in ways):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(EIGHT_WAYS)}, got {text!r}")
    return [w for w in EIGHT_WAYS if w in ways]


def parse_variants(text: str) -> list[str]:
    """``--variants``: some of RAMP_VARIANTS, each once, run in the order given."""
    names = _names(text)
    if not names or any(v not in RAMP_VARIANTS for v in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"expected some of {','.join(RAMP_VARIANTS)}, each once, got {text!r}"
        )
    return names


def _some_of(text: str, known: tuple[str, ...]) -> list[str]:
    names = _names(text)
    if not names or any(n not in known for n in names):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(known)}, got {text!r}")
    return [n for n in known if n in names]


def parse_layouts(text: str) -> list[str]:
    """``--layouts``: some of REPLICA_LAYOUTS, run in its order."""
    return _some_of(text, tuple(REPLICA_LAYOUTS))


def parse_replica_variants(text: str) -> list[str]:
    """``replicas --variants``: some of REPLICA_VARIANTS, run in its order (the reference
    first)."""
    return _some_of(text, tuple(REPLICA_VARIANTS))
