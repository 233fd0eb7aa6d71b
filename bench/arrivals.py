"""The open-loop arrivals of ``dynspec-bench traffic``: when each request is sent and how long it
is, as ``bench_serving`` makes them under a rate that may change (a :class:`Schedule`), or as a
recorded trace has them. Pure but for reading a trace; the process: docs/benchmarks.md.
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import functools
import itertools
import json
import math
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# The named day: (share of the day, rate at its start, rate at its end), rates as fractions of
# the peak. The shares add up to 1.
DAY: tuple[tuple[float, float, float], ...] = (
    (0.15, 0.05, 0.05),  # night
    (0.15, 0.05, 0.6),  # morning ramp
    (0.10, 0.6, 1.0),  # ramp to the peak
    (0.15, 1.0, 1.0),  # peak
    (0.07, 0.35, 0.35),  # dip
    (0.03, 1.0, 1.0),  # burst
    (0.07, 0.35, 0.35),
    (0.03, 1.0, 1.0),  # burst
    (0.13, 0.35, 0.05),  # evening ramp
    (0.12, 0.05, 0.05),  # night
)
DAY_SECONDS = 240.0


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the run's start
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start
    seconds: float
    rate_from: float  # requests/s at its start
    rate_to: float  # requests/s at its end (linear in between; equal = constant)

    def expected(self, u: float) -> float:
        """Expected arrivals in the first ``u`` seconds of the segment (0 <= u <= seconds)."""
        return self.rate_from * u + (self.rate_to - self.rate_from) * u * u / (2 * self.seconds)


@dataclass(frozen=True)
class Schedule:
    """Contiguous segments from 0; the rate is 0 outside ``[0, duration)``."""

    segments: tuple[Segment, ...]
    text: str  # what it was parsed from, for reports ("day:240 peak 8", "2@30,2-20@60")

    def __post_init__(self) -> None:
        end = 0.0
        for s in self.segments:
            ok = s.seconds > 0 and min(s.rate_from, s.rate_to) >= 0
            if not ok or abs(s.start - end) > 1e-9 * max(1.0, end):
                raise ValueError(f"schedule {self.text!r}: bad segment {s} (next at {end})")
            end = s.start + s.seconds
        if not math.isfinite(end + sum(self._totals)) or not self.segments or self.peak <= 0:
            raise ValueError(f"bad schedule {self.text!r}: no positive rate, or not finite")

    @property
    def duration(self) -> float:
        last = self.segments[-1]
        return last.start + last.seconds

    @functools.cached_property
    def _totals(self) -> list[float]:
        """Expected arrivals from 0 to each segment's end."""
        return list(itertools.accumulate(s.expected(s.seconds) for s in self.segments))

    def expected(self, t: float) -> float:
        """The integral of the rate from 0 to ``t``."""
        if t <= 0:
            return 0.0
        if t >= self.duration:
            return self._totals[-1]
        i = max(0, bisect.bisect_right(self.segments, t, key=lambda s: s.start) - 1)
        s = self.segments[i]
        before = self._totals[i - 1] if i else 0.0
        return before + s.expected(min(t - s.start, s.seconds))

    def time_at(self, n: float) -> float:
        """The inverse of :meth:`expected`: the smallest ``t`` with ``expected(t) >= n``, inf
        past the end. Zero-rate stretches are skipped: ``n`` > 0 never lands inside one."""
        if n <= 0:
            return 0.0
        # The first segment whose end reaches n (a zero-rate one never is: the one before it
        # ends on the same total and comes first).
        i = bisect.bisect_left(self._totals, n)
        if i == len(self.segments):
            return math.inf
        s = self.segments[i]
        m = n - (self._totals[i - 1] if i else 0.0)
        r0, slope = s.rate_from, (s.rate_to - s.rate_from) / s.seconds
        # r0 u + slope u^2 / 2 = m, solved in the form that stays exact as slope -> 0.
        u = 2 * m / (r0 + math.sqrt(max(0.0, r0 * r0 + 2 * slope * m)))
        return s.start + min(max(u, 0.0), s.seconds)

    @property
    def peak(self) -> float:
        return max(max(s.rate_from, s.rate_to) for s in self.segments)


def _positive(value: float, what: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite number > 0, not {value!r}")
    return value


def constant(rate: float, duration: float) -> Schedule:
    _positive(rate, "the request rate")
    _positive(duration, "the duration")
    return Schedule((Segment(0.0, duration, rate, rate),), f"{rate:g}@{duration:g}")


def day(peak: float, seconds: float = DAY_SECONDS) -> Schedule:
    """The named day (:data:`DAY`) over ``seconds``, its fractions of ``peak`` req/s."""
    _positive(peak, "the day's peak rate")
    _positive(seconds, "the day's seconds")
    segments, share = [], 0.0
    for i, (part, r0, r1) in enumerate(DAY):
        start = seconds * share
        share += part
        end = seconds if i == len(DAY) - 1 else seconds * share
        segments.append(Segment(start, end - start, r0 * peak, r1 * peak))
    return Schedule(tuple(segments), f"day:{seconds:g} peak {peak:g}")


_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_SEGMENT = re.compile(rf"({_NUMBER})\s*(?:-\s*({_NUMBER}))?\s*@\s*({_NUMBER})")
_DAY = re.compile(r"day(?::(.*))?")


def parse_schedule(text: str, *, rate: float | None = None) -> Schedule:
    """A schedule from its text: ``day[:SECONDS]`` (its peak ``rate``, required there) or
    segments ``R@SECONDS`` and ``R1-R2@SECONDS``, comma-separated (``rate`` ignored)."""
    spec = text.strip()
    if m := _DAY.fullmatch(spec.lower()):
        if rate is None:
            raise ValueError(f"schedule {text!r} needs a request rate: the day's peak")
        seconds = str(DAY_SECONDS) if m[1] is None else m[1].strip()
        if not (re.fullmatch(_NUMBER, seconds) and 0 < float(seconds) < math.inf):
            raise ValueError(f"bad schedule {text!r}: expected day or day:SECONDS, SECONDS > 0")
        return day(rate, float(seconds))
    segments, start = [], 0.0
    for part in (p.strip() for p in spec.split(",")):
        m = _SEGMENT.fullmatch(part)
        r0, r1, seconds = (float(m[1]), float(m[2] or m[1]), float(m[3])) if m else (0, 0, 0)
        if not (m and math.isfinite(r0 + r1 + seconds) and seconds > 0):
            raise ValueError(
                f"bad schedule segment {part!r} in {text!r}: expected R@SECONDS or R1-R2@SECONDS "
                "(R in requests/s >= 0, SECONDS > 0)"
            )
        segments.append(Segment(start, seconds, r0, r1))
        start += seconds
    return Schedule(tuple(segments), spec)


def arrival_times(schedule: Schedule, burstiness: float, rng: random.Random) -> list[float]:
    """Send times in seconds, ascending: unit-mean gamma gaps (shape ``burstiness``) counted in
    expected arrivals, mapped to seconds by the schedule."""
    _positive(burstiness, "burstiness")
    times: list[float] = []
    n = 0.0
    while True:
        n += rng.gammavariate(burstiness, 1.0 / burstiness)
        # A zero draw (small shapes underflow) at the very start would map to 0 even when the
        # schedule opens with zero rate: take the first moment that has rate instead.
        t = schedule.time_at(n if n > 0 else math.ulp(0.0))
        if t >= schedule.duration:
            return times
        times.append(t)


def synthetic(
    schedule: Schedule,
    *,
    burstiness: float = 1.0,
    input_len: int = 256,
    output_len: int = 128,
    range_ratio: float = 1.0,
    seed: int = 0,
) -> list[Arrival]:
    """Arrivals with bench_serving's random-dataset lengths. The lengths come from their own
    generator, so one seed gives the same k-th lengths whatever the schedule and burstiness."""
    if input_len < 1 or output_len < 1:
        raise ValueError(f"lengths must be >= 1, not {input_len} and {output_len}")
    if not 0 <= range_ratio <= 1:
        raise ValueError(f"the range ratio must be in [0, 1], not {range_ratio!r}")
    times = arrival_times(schedule, burstiness, random.Random(seed))
    lengths = random.Random(f"{seed}:lengths")
    low_in, low_out = max(1, int(input_len * range_ratio)), max(1, int(output_len * range_ratio))
    return [
        Arrival(t, lengths.randint(low_in, input_len), lengths.randint(low_out, output_len))
        for t in times
    ]


@dataclass(frozen=True)
class Trace:
    arrivals: tuple[Arrival, ...]
    source: str  # the path as given
    skipped: int  # rows dropped for 0 output tokens (BurstGPT's failures)


# What each column may be called (matched case-insensitively, spaces around stripped), first
# match wins: generic names, then Azure's (2023/2024) and BurstGPT's.
_COLUMNS = {
    "time": ("timestamp", "arrival_time", "time"),
    "input": ("input_tokens", "prompt_tokens", "input_len", "contexttokens", "request tokens"),
    "output": ("output_tokens", "completion_tokens", "output_len", "generatedtokens",
               "response tokens"),
}  # fmt: skip
_NEEDS = "; ".join(f"{c}: {'|'.join(a)}" for c, a in _COLUMNS.items())
# Azure's TIMESTAMP has 7 fractional digits, more than Python 3.10's fromisoformat takes.
_DATETIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}(?::\d{2})?)(?:[.,](\d+))?\s*(Z|[+-]\d{2}(?::?\d{2})?)?",
    re.IGNORECASE,
)


class _BadRow(ValueError):
    pass


def _time(value: object) -> tuple[bool, int, float]:
    """(is a datetime, whole seconds, the rest), apart so that a 7-digit fraction survives next
    to 1.7e9 seconds since the epoch. A datetime without a zone is taken as UTC."""
    if isinstance(value, str) and (m := _DATETIME.fullmatch(value.strip())):
        zone = (m[4] or "").upper().replace(":", "")
        zone = "+00:00" if zone in ("", "Z") else f"{zone[:3]}:{zone[3:5] or '00'}"
        try:
            when = dt.datetime.fromisoformat(f"{m[1]}T{m[2]}{zone}")
        except ValueError:
            raise _BadRow(f"time {value!r} is not a valid datetime") from None
        return True, int(when.timestamp()), int(m[3] or 0) / 10 ** len(m[3] or "")
    return False, 0, _number(value, "time")


def _number(value: object, what: str, whole: bool = False) -> float:
    try:
        x = math.nan if isinstance(value, bool) else float(str(value))
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or (whole and not x.is_integer()):
        raise _BadRow(f"{what} {value!r} is not a {'whole ' if math.isfinite(x) else ''}number")
    if x < 0:
        raise _BadRow(f"{what} {value!r} is negative")
    return x


def _columns(names: Iterable[str]) -> dict[str, str]:
    """Our column -> the name it has among ``names`` (normalised); _BadRow names what lacks."""
    have = set(names)
    picked = {c: next((a for a in aliases if a in have), "") for c, aliases in _COLUMNS.items()}
    if missing := [c for c, name in picked.items() if not name]:
        raise _BadRow(f"missing {' and '.join(missing)} (a trace needs {_NEEDS})")
    return picked


def _rows(path: Path, jsonl: bool) -> Iterator[tuple[int, dict[str, object]]]:
    """(line, the row by normalised column name), blank lines left out."""
    with path.open(encoding="utf-8-sig", newline=None if jsonl else "") as f:
        if jsonl:
            for line_num, line in enumerate(f, 1):
                try:
                    row = json.loads(line) if line.strip() else {}
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_num}: not JSON: {e.msg}") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{line_num}: not a JSON object")
                if row:
                    yield line_num, {str(k).strip().lower(): v for k, v in row.items()}
            return
        reader = csv.reader(f)
        header: list[str] = []
        try:
            for cells in (c for c in reader if any(x.strip() for x in c)):
                if header:
                    pairs = zip(header, cells, strict=False)
                    yield reader.line_num, {n: c for n, c in pairs if c.strip()}
                    continue
                header = [c.strip().lower() for c in cells]
                try:
                    _columns(header)
                except _BadRow:
                    raise ValueError(
                        f"{path}:{reader.line_num}: unknown header {cells}: a trace needs {_NEEDS}"
                    ) from None
        except csv.Error as e:
            raise ValueError(f"{path}:{reader.line_num}: not CSV: {e}") from None


def read_trace(path: Path, *, speedup: float = 1.0) -> Trace:
    """A recorded trace's arrivals: times relative to the first row and divided by ``speedup``,
    rows with 0 output tokens skipped (input 0 counts as 1). ``ValueError`` names the file and
    line of what is wrong. CSV, or JSONL for ``.jsonl`` and ``.json``."""
    _positive(speedup, "the speedup")
    arrivals: list[Arrival] = []
    read = skipped = 0
    first: tuple[bool, int, float] | None = None
    before = -math.inf
    try:
        for line_num, row in _rows(path, path.suffix.lower() in (".jsonl", ".json")):
            try:
                names = _columns(row)
                stamp = row[names["time"]]
                is_datetime, whole, rest = _time(stamp)
                first = first or (is_datetime, whole, rest)
                if is_datetime != first[0]:
                    kind = "a datetime" if first[0] else "a number of seconds"
                    raise _BadRow(f"time {stamp!r} is not {kind} as the first row's")
                at = ((whole - first[1]) + (rest - first[2])) / speedup
                if at < before:
                    raise _BadRow(f"time {stamp!r} is earlier than the row before")
                input_tokens = int(_number(row[names["input"]], "input tokens", whole=True))
                output_tokens = int(_number(row[names["output"]], "output tokens", whole=True))
            except _BadRow as e:
                raise ValueError(f"{path}:{line_num}: {e}") from None
            before, read = at, read + 1
            if output_tokens == 0:
                skipped += 1
            else:
                arrivals.append(Arrival(at, max(1, input_tokens), output_tokens))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if first is None:
        raise ValueError(f"{path}: empty: no data row (a trace needs {_NEEDS})")
    if not arrivals:
        raise ValueError(f"{path}: no usable row ({read} read, {skipped} with 0 output tokens)")
    return Trace(tuple(arrivals), str(path), skipped)
