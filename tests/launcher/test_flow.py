"""The launch is a pipeline: flags, facts, plan, supervisor, each stage entered once, in order, and
each helper module entered by one stage only (measured by ``flow.py``, with ``sys.setprofile``)."""

from __future__ import annotations

import pytest
from flow import LINES, measure, with_ports

STAGES = ["cli", "config", "facts", "plan", "supervisor"]
# The one module two stages enter: GPU id lists, parsed with the flags (config.py) and named with
# the GPU sets (layout.py, in the facts). Its only return on the way.
SHARED = {"gpus": ("config", "facts")}


def stages_of(way: list[str]) -> dict[str, list[str]]:
    """Each module on the way: the stages it was stopped at in (in order, once each)."""
    found: dict[str, list[str]] = {}
    stage = STAGES[0]
    for module in way:
        if module in STAGES:
            stage = module
        seen = found.setdefault(module, [])
        if stage not in seen:
            seen.append(stage)
    return found


@pytest.mark.parametrize("name", list(LINES))
def test_the_way_is_a_pipeline(name: str) -> None:
    flow = measure(with_ports(LINES[name]))
    assert flow.code == 0, flow.err
    way = flow.way
    # Each stage once, in order; the machine asked by the facts' stage alone.
    assert [m for m in way if m in STAGES] == STAGES, way
    assert stages_of(way).get("probe", ["facts"]) == ["facts"]
    # No stage calls back into an earlier one: every helper belongs to one stage (the shared
    # GPU id lists to the two first ones), and no module is entered twice on the way but them.
    for module, stages in stages_of(way).items():
        allowed = SHARED.get(module, (stages[0],))
        assert all(s in allowed for s in stages), (module, stages, way)
    assert all(m in SHARED for m in flow.returns), (flow.returns, way)
    assert len(flow.returns) <= len(SHARED), (flow.returns, way)


def test_the_measure_sees_a_return() -> None:
    """The counts themselves: a module entered again after another one is a return."""
    flow = measure(with_ports(LINES["paired tp4"]))
    assert flow.returns == ["gpus"]
    assert flow.stops == len(flow.way) and flow.way[0] == "cli"
    assert len(flow.flat) >= flow.stops  # methods and every call counted, repeats folded
