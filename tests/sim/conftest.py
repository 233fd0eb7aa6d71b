"""Fixtures for dynspec-sim tests (helpers live in ``simkit``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from simkit import Sim, SimFactory, start_sim


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[SimFactory]:
    """``sim_factory(*flags)`` starts a simulator that is stopped when the test ends."""
    with contextlib.ExitStack() as stack:

        def make(*flags: str, ready: bool = True, env: dict[str, str] | None = None) -> Sim:
            return stack.enter_context(start_sim(tmp_path, *flags, ready=ready, env=env))

        yield make


@pytest.fixture(scope="module")
def eagle_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """A shared EAGLE simulator (demo profile, fast clock) for tests that only read answers."""
    with start_sim(
        tmp_path_factory.mktemp("sim"), "--mode", "eagle", "--speed", "20", "--seed", "7"
    ) as sim:
        yield sim
