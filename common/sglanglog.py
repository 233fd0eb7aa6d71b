"""SGLang's decode-log lines, read back from a run's logs: the one parser of them.

Every ``decode_log_interval`` (40) decode batches an SGLang 0.5 scheduler logs
``[YYYY-MM-DD HH:MM:SS] Decode batch, #running-req: N, ..., gen throughput (token/s): X,
#queue-req: Q``: the counts its ``/metrics`` gauges hold at that moment. The router's replay
(``dynspec.router.replay``) feeds them to the speed learner again. Pure but for ``read_logs``;
times are POSIX seconds (the logs' clock is UTC on the machines the runs used).
"""

from __future__ import annotations

import datetime as dt
import re
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] Decode batch, #running-req: (\d+),.*"
    r"gen throughput \(token/s\): ([0-9.]+), #queue-req: (\d+)"
)
# The servers' log files in a run's logs folder (``dynspec-launch --gpus 0``'s names).
SERVERS = {"eagle": "eagle.log", "baseline": "baseline.log"}


@dataclass(frozen=True, slots=True)
class Decode:
    """One decode-log line."""

    second: int  # POSIX seconds, UTC
    running: int
    gen_throughput: float
    queued: int


def seconds(text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS`` (or ISO 8601 without a zone), read as UTC, in POSIX seconds."""
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp())


def decodes(lines: Iterable[str]) -> Iterator[Decode]:
    """The decode-log lines among ``lines``, in order."""
    for ln in lines:
        m = LINE.match(ln)
        if m:
            yield Decode(seconds(m[1]), int(m[2]), float(m[3]), int(m[4]))


def read_logs(path: Path, names: Sequence[str]) -> dict[str, list[str]]:
    """The files ``names`` (those there are) from a logs folder or a tarball of one, as lines."""
    if path.is_dir():
        return {n: (path / n).read_text(errors="replace").splitlines() for n in names
                if (path / n).is_file()}  # fmt: skip
    out: dict[str, list[str]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            f = tar.extractfile(member) if name in names else None
            if f is not None:
                out[name] = f.read().decode(errors="replace").splitlines()
    return out
