"""The fault switches other tests flip through ``/sim/faults``.

- ``health_status``: what ``/health`` and ``/health_generate`` answer (200 clears it).
- ``fail_status``: every generation request gets this status and SGLang's error body (null clears).
- ``stall``: streams stop sending after their first content chunk, without closing.
- ``exit_after_chunks``: the process exits abruptly (``os._exit``) after this many more stream
  chunks in total (null clears).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dynspec.launcher.sim.inputs import InvalidRequest

KEYS = ("health_status", "fail_status", "stall", "exit_after_chunks")


@dataclass(frozen=True)
class Faults:
    health_status: int | None = None
    fail_status: int | None = None
    stall: bool = False
    exit_after_chunks: int | None = None

    def view(self) -> dict[str, Any]:
        return {
            "health_status": self.health_status or 200,
            "fail_status": self.fail_status,
            "stall": self.stall,
            "exit_after_chunks": self.exit_after_chunks,
        }

    def updated(self, switches: dict[str, Any]) -> Faults:
        """These faults with ``switches`` applied; ``InvalidRequest`` for an unknown or bad one."""
        unknown = sorted(set(switches) - set(KEYS))
        if unknown:
            raise InvalidRequest(f"unknown fault switch {unknown[0]!r}")
        new = self
        if "health_status" in switches:
            status = _status(switches, "health_status")
            new = replace(new, health_status=None if status == 200 else status)
        if "fail_status" in switches:
            new = replace(new, fail_status=_status(switches, "fail_status"))
        if "stall" in switches:
            if not isinstance(switches["stall"], bool):
                raise InvalidRequest("stall must be true or false")
            new = replace(new, stall=switches["stall"])
        if "exit_after_chunks" in switches:
            v = switches["exit_after_chunks"]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidRequest("exit_after_chunks must be a non-negative integer or null")
            new = replace(new, exit_after_chunks=v)
        return new


def _status(switches: dict[str, Any], key: str) -> int | None:
    v = switches[key]
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 100 <= v <= 599:
        raise InvalidRequest(f"{key} must be an HTTP status code")
    return v
