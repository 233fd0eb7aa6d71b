"""The open-loop arrival process: schedules, the gamma renewal process on them, synthetic lengths
and recorded traces. Statistical checks use fixed seeds and tolerances of several standard
errors, so each is deterministic and still fails when the process is wrong."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from pathlib import Path

import pytest

from dynspec.bench.arrivals import (
    DAY,
    Arrival,
    Schedule,
    Segment,
    arrival_times,
    constant,
    parse_schedule,
    read_trace,
    synthetic,
)
from dynspec.bench.traffic import TrafficConfig


def rate_at(schedule: Schedule, t: float) -> float:
    """The schedule's rate at ``t`` (0 outside it), read off its segments."""
    if not 0 <= t < schedule.duration:
        return 0.0
    s = next(s for s in reversed(schedule.segments) if s.start <= t)
    return s.rate_from + (s.rate_to - s.rate_from) * (t - s.start) / s.seconds


def times(schedule: Schedule, burstiness: float = 1.0, seed: int = 1) -> list[float]:
    return arrival_times(schedule, burstiness, random.Random(seed))


def test_constant_rate_is_met() -> None:
    t = times(constant(20.0, 500.0))
    # 10,000 expected; a Poisson count's standard deviation is 100.
    assert abs(len(t) - 10_000) < 300
    assert t == sorted(t)
    assert t[0] > 0 and t[-1] < 500.0


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_interval_cv_is_one_over_root_burstiness(burstiness: float) -> None:
    t = times(constant(50.0, 400.0), burstiness)
    gaps = [b - a for a, b in itertools.pairwise(t)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.06)
    assert statistics.fmean(gaps) == pytest.approx(1 / 50.0, rel=0.05)


def test_burstiness_must_be_positive() -> None:
    for b in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="burstiness"):
            times(constant(1.0, 10.0), b)


@pytest.mark.parametrize("text", ["0-200@100", "200-0@100"])
def test_ramp_arrivals_follow_its_rate(text: str) -> None:
    schedule = parse_schedule(text)
    t = times(schedule)
    for k in range(10):
        lo, hi = 10.0 * k, 10.0 * (k + 1)
        want = schedule.expected(hi) - schedule.expected(lo)
        got = sum(lo <= x < hi for x in t)
        assert abs(got - want) < 4 * math.sqrt(want), (lo, got, want)
    # The window counts rise (or fall) with the rate, as 100, 300, ..., 1900.
    assert schedule.expected(10.0) == pytest.approx(100.0 if text[0] == "0" else 1900.0)


def test_zero_rate_segments_get_no_arrivals() -> None:
    schedule = parse_schedule("0@10,5@10,0@10,5-0@10,0@5")
    t = times(schedule, burstiness=0.1, seed=3)  # bursty: many intervals underflow to 0
    assert t and all(10 <= x < 20 or 30 <= x < 40 for x in t)
    assert any(x < 20 for x in t) and any(x >= 30 for x in t)
    assert [rate_at(schedule, t) for t in (15, 25, 35)] == [5, 0, 2.5]
    assert schedule.expected(10) == 0 and schedule.expected(30) == 50 == schedule.expected(29.9) + 0
    assert schedule.duration == 45 and schedule.expected(45) == 75
    assert schedule.time_at(50) == 20  # the smallest t: where the zero stretch starts
    assert schedule.time_at(50.000001) == pytest.approx(30.0)


def test_time_at_inverts_expected() -> None:
    schedule = parse_schedule("1@10,1-9@20,0@5,9-0.5@30,3@10")
    total = schedule.expected(schedule.duration)
    assert total == pytest.approx(10 + 100 + 0 + 142.5 + 30)
    for i in range(1, 400):
        n = total * i / 400
        assert schedule.expected(schedule.time_at(n)) == pytest.approx(n, rel=1e-9, abs=1e-9)
    for t in (0.5, 9.9, 12.0, 29.99, 36.0, 50.0, 70.0, 74.9):
        assert schedule.time_at(schedule.expected(t)) == pytest.approx(t, rel=1e-9)
    assert schedule.time_at(0) == 0
    assert schedule.time_at(total * (1 + 1e-9)) == math.inf
    assert schedule.expected(-1) == 0 and schedule.expected(1e9) == total
    assert rate_at(schedule, -0.1) == 0 and rate_at(schedule, schedule.duration) == 0
    assert rate_at(schedule, 20.0) == pytest.approx(5.0)  # half-way up the 1-9 ramp
    assert schedule.peak == 9 and total / schedule.duration == pytest.approx(total / 75)


def test_the_day() -> None:
    assert math.fsum(share for share, _, _ in DAY) == pytest.approx(1.0)
    schedule = parse_schedule("day", rate=8.0)
    assert schedule.text == "day:240 peak 8"
    assert schedule.duration == pytest.approx(240.0) and schedule.peak == 8.0
    assert rate_at(schedule, 0.0) == pytest.approx(0.4)  # night: 0.05 of the peak
    assert rate_at(schedule, 0.99 * 240) == pytest.approx(0.4)
    assert rate_at(schedule, 0.5 * 240) == 8.0  # the peak
    assert rate_at(schedule, 0.6 * 240) == pytest.approx(0.35 * 8)  # the dip
    assert rate_at(schedule, 0.635 * 240) == 8.0 == rate_at(schedule, 0.74 * 240)  # bursts
    assert rate_at(schedule, 0.225 * 240) == pytest.approx((0.05 + 0.6) / 2 * 8)  # morning ramp
    assert parse_schedule("Day:600", rate=2).duration == pytest.approx(600.0)
    t = times(schedule)
    night = sum(x < 0.15 * 240 for x in t)
    peak = sum(0.40 * 240 <= x < 0.55 * 240 for x in t)
    assert night < 5 * 0.4 * 36 and peak > 0.5 * 8 * 36
    with pytest.raises(ValueError, match="rate"):
        parse_schedule("day")


def test_parse_schedule() -> None:
    s = parse_schedule(" 2@30, 2-20@60 ,20@30,0@10 ")
    assert s.text == "2@30, 2-20@60 ,20@30,0@10"
    assert s.segments == (
        Segment(0, 30, 2, 2),
        Segment(30, 60, 2, 20),
        Segment(90, 30, 20, 20),
        Segment(120, 10, 0, 0),
    )
    assert parse_schedule("4@60") == constant(4, 60)
    assert parse_schedule("1.5e1@.5").segments == (Segment(0, 0.5, 15, 15),)


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("2@", "'2@'"),
        ("@30", "'@30'"),
        ("abc", "'abc'"),
        ("2@0", "'2@0'"),
        ("-2@30", "'-2@30'"),
        ("2-@30", "'2-@30'"),
        ("2@30,,3@5", "''"),
        ("2@30;3@5", "'2@30;3@5'"),
        ("2@30,x@5", "'x@5'"),
        ("1e999@5", "'1e999@5'"),
        ("0@10,0-0@5", "'0@10,0-0@5'"),
        ("day:0", "'day:0'"),
        ("day:x", "'day:x'"),
        ("constant", "'constant'"),
        ("", "''"),
    ],
)
def test_parse_errors_quote_the_bad_segment(text: str, quoted: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_schedule(text, rate=1.0 if text.startswith("day") else None)
    assert quoted in str(e.value) and "\n" not in str(e.value)


def test_schedule_checks_its_segments() -> None:
    with pytest.raises(ValueError, match="bad segment"):
        Schedule((Segment(0, 10, 1, 1), Segment(11, 10, 1, 1)), "gap")
    with pytest.raises(ValueError, match="no positive rate"):
        Schedule((), "none")
    with pytest.raises(ValueError, match="> 0"):
        constant(0.0, 10.0)


def test_synthetic_lengths() -> None:
    a = synthetic(constant(10, 100), input_len=100, output_len=50, range_ratio=0.5, seed=7)
    assert len(a) > 500
    assert all(50 <= x.input_tokens <= 100 and 25 <= x.output_tokens <= 50 for x in a)
    assert {x.input_tokens for x in a} >= {50, 100}  # both ends reached
    # Same seed, another schedule and burstiness: other times, the same k-th lengths.
    b = synthetic(parse_schedule("1-30@50"), burstiness=0.3, input_len=100, output_len=50,
                  range_ratio=0.5, seed=7)  # fmt: skip
    n = min(len(a), len(b))
    assert [x.at for x in a[:n]] != [x.at for x in b[:n]]
    assert [(x.input_tokens, x.output_tokens) for x in a[:n]] == [
        (x.input_tokens, x.output_tokens) for x in b[:n]
    ]
    lengths = random.Random("7:lengths")  # the generator the spec names, apart from the times'
    assert (a[0].input_tokens, a[0].output_tokens) == (
        lengths.randint(50, 100),
        lengths.randint(25, 50),
    )
    assert a == synthetic(constant(10, 100), input_len=100, output_len=50, range_ratio=0.5, seed=7)
    c = synthetic(constant(10, 100), input_len=100, output_len=50, range_ratio=0.5, seed=8)
    assert [x.input_tokens for x in c[:50]] != [x.input_tokens for x in a[:50]]
    fixed = synthetic(constant(10, 10), input_len=3, output_len=2)
    assert {(x.input_tokens, x.output_tokens) for x in fixed} == {(3, 2)}
    tiny = synthetic(constant(10, 10), input_len=3, output_len=1, range_ratio=0.0)
    assert {x.input_tokens for x in tiny} == {1, 2, 3}
    with pytest.raises(ValueError, match="range ratio"):
        synthetic(constant(1, 1), range_ratio=1.5)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000001,0,20

2023-11-16 18:16:00.6805900,879,4
"""


def test_azure_csv(tmp_path: Path) -> None:
    trace = read_trace(write(tmp_path, "azure.csv", AZURE))
    assert trace.skipped == 0 and trace.source.endswith("azure.csv")
    at = [a.at for a in trace.arrivals]
    assert at == pytest.approx([0.0, 4.314579, 4.3194101, 14.0], abs=1e-6)
    assert trace.arrivals[0] == Arrival(0.0, 374, 44)
    assert trace.arrivals[2].input_tokens == 1  # input 0 counts as 1
    fast = read_trace(write(tmp_path, "azure.csv", AZURE), speedup=2.0)
    assert [a.at for a in fast.arrivals] == pytest.approx(
        [0.0, 2.1572895, 2.15970505, 7.0], abs=1e-6
    )


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
"""


def test_burstgpt_csv_skips_failures(tmp_path: Path) -> None:
    trace = read_trace(write(tmp_path, "burst.csv", BURSTGPT))
    assert trace.arrivals == (Arrival(0.0, 472, 18), Arrival(113.0, 417, 276))
    assert trace.skipped == 1
    assert TrafficConfig((), trace=trace).meta()["trace_skipped"] == 1  # every record says so


def test_jsonl(tmp_path: Path) -> None:
    text = (
        '{"arrival_time": 10.5, "prompt_tokens": 12, "completion_tokens": 3}\n'
        "\n"
        '{" Arrival_Time ": "11.5", "prompt_tokens": 7, "completion_tokens": 1, "x": null}\n'
        '{"arrival_time": 13, "input_len": 0, "output_len": 9}\n'
    )
    trace = read_trace(write(tmp_path, "t.jsonl", text), speedup=0.5)
    assert trace.arrivals == (Arrival(0.0, 12, 3), Arrival(2.0, 7, 1), Arrival(5.0, 1, 9))
    zoned = (
        '{"time": "2024-05-10T23:59:59.9999999Z", "input_tokens": 1, "output_tokens": 1}\n'
        '{"time": "2024-05-11T02:00:00+02:00", "input_tokens": 1, "output_tokens": 1}\n'
    )
    assert [a.at for a in read_trace(write(tmp_path, "z.json", zoned)).arrivals] == pytest.approx(
        [0.0, 1e-7], abs=1e-9
    )


HEADER = "timestamp,input_tokens,output_tokens\n"


@pytest.mark.parametrize(
    ("name", "text", "where", "what"),
    [
        ("a.csv", HEADER + "0,1,1\n\n1,x,1\n", ":4:", "input tokens 'x' is not a number"),
        ("a.csv", HEADER + "0,1,1\n1,1\n", ":3:", "missing output (a trace needs"),
        ("a.csv", HEADER + "0,1,1\n1,1,-2\n", ":3:", "negative"),
        ("a.csv", HEADER + "0,1,1\n1,1.5,2\n", ":3:", "not a whole number"),
        ("a.csv", HEADER + "5,1,1\n4,1,1\n", ":3:", "earlier than the row before"),
        ("a.csv", HEADER + "5,1,1\n2023-11-16 18:15:46,1,1\n", ":3:", "as the first row's"),
        ("a.csv", HEADER + "2023-13-16 18:15:46,1,1\n", ":2:", "not a valid datetime"),
        ("a.csv", "\nwhen,in,out\n0,1,1\n", ":2:", "unknown header"),
        ("a.csv", "", ": ", "empty"),
        ("a.csv", HEADER, ": ", "empty"),
        ("a.csv", HEADER + "0,1,0\n1,1,0\n", ": ", "no usable row (2 read, 2 with 0 output"),
        ("a.jsonl", '{"time": 0, "input_len": 1, "output_len": 1}\n[1]\n', ":2:", "JSON object"),
        ("a.jsonl", '\n\n{"time": 0, "input_len": 1, "output_len": 1}\n{', ":4:", "not JSON"),
        ("a.jsonl", '{"time": true, "input_len": 1, "output_len": 1}\n', ":1:", "not a number"),
        ("a.jsonl", '{"time": 0, "prompt_tokens": 1}\n', ":1:", "missing output (a trace needs"),
    ],
)
def test_bad_traces_name_the_line(
    tmp_path: Path, name: str, text: str, where: str, what: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ValueError) as e:
        read_trace(path)
    message = str(e.value)
    assert message.startswith(f"{path}{where}") and what in message, message
