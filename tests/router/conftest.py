"""Router test fixtures.

The autouse ``no_leak`` fixture checks, after each test, that every live router reads zero in
flight (``dynspec_load`` and per-server counts): a lease that leaks fails the test that leaked it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from routerkit import LIVE_ROUTERS, sim


@pytest.fixture(autouse=True)
def no_leak() -> Iterator[None]:
    yield
    for rp in list(LIVE_ROUTERS):
        if rp.proc.poll() is not None:
            continue
        st = rp.wait_load(0, timeout=5.0)
        assert st["load"] == 0, f"router {rp.url} still has {st['load']} in flight: {st}"
        assert all(s["in_flight"] == 0 for s in st["servers"]), st
        assert rp.metric("dynspec_load") == 0


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """An eagle and a baseline simulator shared by a test module (tests reset their faults)."""
    log_dir = tmp_path_factory.mktemp("sims")
    with sim(log_dir, "eagle") as eagle, sim(log_dir, "baseline") as baseline:
        yield eagle, baseline
