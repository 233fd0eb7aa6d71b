"""The ``traffic`` plan: its flags, the day's peak from a calibration, the targets from a launch's
ports, the commands it takes, and its body over two commands on a fake launch and a fake
``run_live`` (the first keeping the launch for the second)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from utils import free_port, rerendered

from dynspec.bench.gpu import cli, toolkit, trafficplan
from dynspec.bench.gpu import launch as launching
from dynspec.bench.gpu.launch import kept_session
from dynspec.bench.gpu.toolkit import Run, RunFailed, Steady
from dynspec.bench.gpu.trafficplan import TARGETS, TrafficPlan, capacity
from dynspec.bench.procs import alive, http_status, proc_stat
from dynspec.bench.traffic import TrafficConfig, runs_left
from dynspec.launcher.sim.profile import Profile, profile_from_dict


def profile(eagle: float, baseline: float) -> dict[str, Any]:
    """A calibration profile's curves (the launcher's format), topping out at these tok/s."""
    return {"name": "calibration-test", "source": "a test", "modes": {
        "eagle": {"throughput": [[1, 507.2], [64, eagle * 0.7], [128, eagle]]},
        "baseline": {"throughput": [[1, 192.4], [64, baseline * 0.6], [128, baseline]]},
    }}  # fmt: skip


def calibrated(eagle: float, baseline: float) -> Profile:
    return profile_from_dict(profile(eagle, baseline))


def test_the_peak_lies_between_eagles_capacity_and_the_baselines() -> None:
    # pair-b-interval4's calibration (the H200, MPS): EAGLE 9,456.7 tok/s, the baseline 9,722.0.
    cap = capacity(calibrated(9456.7, 9722.0), 128)
    assert (cap.eagle_rps, cap.baseline_rps, cap.peak_rps) == (55.4, 71.0, 62.7)
    assert cap.separated and "peak 62.7 req/s" in cap.line()
    # Longer answers: fewer requests a second, the same ratios.
    assert capacity(calibrated(9456.7, 9722.0), 256).peak_rps == 31.4


def test_a_baseline_calibrated_low_still_gets_eagle_overloaded() -> None:
    """pair-a-learner's calibration read the baseline at 6,469 tok/s, below EAGLE's 9,585; the
    steady runs put it 1.28x above. The peak stays 1.1x EAGLE's, and says so."""
    cap = capacity(calibrated(9584.6, 6468.7), 128)
    assert cap.peak_rps == round(cap.eagle_rps * 1.1, 1) == 61.8
    assert not cap.separated and "may overload it too" in cap.line()


def test_a_calibration_without_a_curve_is_refused(tmp_path: Path) -> None:
    eagle_only = {"name": "c", "source": "", "modes": {"eagle": {"throughput": [[1, 500.0]]}}}
    with pytest.raises(RunFailed, match="no 'baseline' mode"):
        capacity(profile_from_dict(eagle_only), 128)
    with pytest.raises(RunFailed, match="give --traffic-peak"):
        trafficplan.read_profile(tmp_path / "calibration")


def test_targets_are_the_router_and_each_servers_own_port() -> None:
    targets = trafficplan.build_targets(toolkit.pair_urls((8000, 30001, 30002)), TARGETS)
    assert [(t.label, t.base_url, t.endpoint) for t in targets] == [
        ("routed", "http://127.0.0.1:8000", "chat"),
        ("eagle", "http://127.0.0.1:30001", "chat"),
        ("baseline", "http://127.0.0.1:30002", "chat"),
    ]


def test_schedules_the_day_then_each_constant_rate() -> None:
    plan = TrafficPlan(day_seconds=90, rates=(2.0, 8.0, 0.5), rate_seconds=20)
    got = trafficplan.schedules(plan, 62.7)
    assert [name for name, _ in got] == ["day", "rate-2", "rate-8", "rate-0.5"]
    day, slow = got[0][1], got[3][1]
    assert (day.text, day.duration, day.peak) == ("day:90 peak 62.7", 90.0, 62.7)
    assert (slow.text, slow.duration, slow.peak) == ("0.5@20", 20.0, 0.5)
    assert plan.schedule_seconds() == [("day", 90), ("rate-2", 20), ("rate-8", 20),
                                       ("rate-0.5", 20)]  # fmt: skip


def test_runs_left(tmp_path: Path) -> None:
    out = tmp_path / "traffic.jsonl"
    plan = TrafficPlan(day_seconds=10)
    three = TrafficConfig(schedules=trafficplan.schedules(plan, 5.0), repeats=3)
    assert len(runs_left(three, trafficplan.TARGETS, out)) == 9
    rows = [rec("day", 1, t) for t in ("routed", "eagle", "baseline")]
    rows += [rec("day", 1, "routed", scope="window"), rec("day", 2, "eagle"), rec("other", 1, "x")]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    left = runs_left(three, trafficplan.TARGETS, out)
    assert [(r.repeat, r.target) for r in left] == [
        (2, "baseline"),
        (2, "routed"),
        (3, "baseline"),
        (3, "routed"),
        (3, "eagle"),
    ]
    assert runs_left(replace(three, repeats=1), trafficplan.TARGETS, out) == []


def test_commands_needed_from_the_h200s_times() -> None:
    """Set-up 55 s, an MPS launch with its calibration 350 s, the warm pass 26 s; a run is started
    only when its schedule, the whole drain (30 s) and 15 s fit before the budget less 20 s."""
    plan = TrafficPlan()
    typical = trafficplan.commands_needed(plan, 3, 565, drain=5)
    # The 120-s day does not fit beside the launch in the first command.
    assert [n for n, _ in typical] == [0, 4, 4, 1]
    worst = trafficplan.commands_needed(plan, 3, 565, drain=30)
    assert [n for n, _ in worst] == [0, 3, 3, 3]
    assert worst[0][1] == 55 + 350 + 26 and worst[-1][1] == 3 * 150 + 25
    with_rates = TrafficPlan(rates=(2, 8, 32, 64))
    assert sum(n for n, _ in trafficplan.commands_needed(with_rates, 3, 565, drain=5)) == 45
    with pytest.raises(RunFailed, match="longer than one command"):
        trafficplan.commands_needed(TrafficPlan(day_seconds=600), 1, 565, drain=5)
    # A variant is one more target, --traffic-targets fewer: runs of each repeat and schedule.
    four = TrafficPlan(variant="lead0", variant_flags=("--switch-lead", "0"))
    assert four.labels() == ("routed", "eagle", "baseline", "lead0")
    assert sum(n for n, _ in trafficplan.commands_needed(four, 3, 565, drain=30)) == 12
    two = replace(four, targets=("routed", "baseline"), variant="")
    assert sum(n for n, _ in trafficplan.commands_needed(two, 3, 565, drain=30)) == 6


def usage_error(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.cmd_run([*argv, "--out", "/nonexistent/o"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err, err
    return err[-1]


def test_bad_flags_are_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cases = [
        (["--plan", "pair-a", "--traffic-peak", "60"], "--traffic-peak: only the traffic plan"),
        (["--plan", "traffic", "--traffic-peak", "many"], "want req/s > 0 or auto"),
        (["--plan", "traffic", "--traffic-rates", "2,2"], "want different req/s > 0"),
        (["--plan", "traffic", "--traffic-rates", "2,-1"], "want different req/s > 0"),
        (["--plan", "traffic", "--traffic-rate-seconds", "10"], "only with --traffic-rates"),
        (["--plan", "traffic", "--levels", "1,16"], "--levels: not for the traffic plan"),
        (["--plan", "traffic", "--router-cost"], "--router-cost: not for the traffic plan"),
        (["--plan", "traffic", "--baseline-from", "64"], "--baseline-from: not for the traffic"),
        (["--plan", "traffic", "--traffic-day-seconds", "600", "--budget", "565"],
         "a run takes up to 645 s, more than --budget 565 holds"),
        (["--plan", "traffic", "--resume-from", str(tmp_path)], "unrecognized arguments"),
        (["--plan", "pair-b", "--traffic-return-delay", "5"], "only the traffic plan"),
        (["--plan", "pair-a", "--traffic-mps", "off"], "--traffic-mps: only the traffic plan"),
        (["--plan", "traffic", "--traffic-mps", "no"], "invalid choice: 'no'"),
        (["--plan", "router-cost", "--baseline-limit", "128"],
         "only the pair-a, pair-b and traffic plans"),
        (["--plan", "pair-a", "--traffic-variant", "a=--switch-lead 1"],
         "--traffic-variant: only the traffic plan"),
        (["--plan", "pair-b", "--traffic-targets", "routed"], "--traffic-targets: only the"),
        (["--plan", "traffic", "--traffic-targets", "routed,routed"],
         "--traffic-targets: some of routed,eagle,baseline, each once"),
        (["--plan", "traffic", "--traffic-targets", "routed,lead"], "--traffic-targets: some of"),
        (["--plan", "traffic", "--traffic-variant", "lead"], "--traffic-variant lead: NAME=FLAGS"),
        (["--plan", "traffic", "--traffic-variant", "Lead=--switch-lead 1"], "NAME=FLAGS"),
        (["--plan", "traffic", "--traffic-variant", "eagle=--switch-lead 1"],
         "--traffic-variant eagle: NAME=FLAGS, NAME a new label"),
        (["--plan", "traffic", "--traffic-variant", "q=--hysteresis '1"],
         "--traffic-variant q: No closing quotation"),
        # The router's own reading of the flags after the plan's (python -m dynspec.router --check).
        (["--plan", "traffic", "--traffic-variant", "lead=--switch-lead x"],
         "--traffic-variant lead: argument --switch-lead: invalid"),
        (["--plan", "traffic", "--traffic-variant", "lead=--no-such 1"],
         "--traffic-variant lead: unrecognized arguments: --no-such 1"),
    ]  # fmt: skip
    for argv, needle in cases:
        assert needle in usage_error(argv, capsys), argv


def test_dry_run_prints_the_launch_the_schedules_and_the_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--plan", "traffic", "--dry-run", "--out", "/nonexistent/o", "--draft", "p54",
            "--traffic-rates", "2,8", "--budget", "565", "--work", "/w"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        cli.cmd_run(argv)
    text = capsys.readouterr().out
    assert exc.value.code == 0, text
    notes = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert "draft p54" in notes[0] and "3 repeats" in notes[0]
    assert notes[1].startswith("# day: the compressed day over 120 s (day:120), peak auto:")
    assert "EAGLE serves ~55.4 req/s" in notes[1]  # the committed pair-b-interval4 calibration
    assert notes[2:4] == ["# rate-2: 2 req/s for 30 s", "# rate-8: 8 req/s for 30 s"]
    assert notes[4].startswith("# 27 runs; device commands of --budget 565")
    (launch,) = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert "--draft-model-path /w/models/eagle3-p54" in launch
    assert launch.endswith("--mps --log-level info")  # no return delay unless asked for
    assert "--max-running-requests 128' --log-dir" in launch  # the baseline capped, as pair-b's
    with pytest.raises(SystemExit):
        cli.cmd_run([*argv, "--traffic-return-delay", "5", "--traffic-log-level", "debug"])
    text = capsys.readouterr().out
    assert "return delay 5 s, log level debug" in text
    assert text.rstrip().endswith("--mps --return-delay 5 --log-level debug")
    given = ["--plan", "traffic", "--traffic-peak", "40"]
    assert cli.drafts(cli.run_parser().parse_args([*given, "--out", "o", "--draft", "p54"])) == (
        "p54",
    )
    with pytest.raises(SystemExit):
        cli.cmd_run([*given, "--dry-run", "--out", "o"])
    assert "peak 40 req/s (--traffic-peak)" in capsys.readouterr().out


def test_dry_run_shows_the_variants_router(capsys: pytest.CaptureFixture[str]) -> None:
    """The variant's router: the launch's router command as the launcher builds it, on a free
    port, then the variant's flags; the targets it runs with and the runs they make."""
    argv = ["--plan", "traffic", "--dry-run", "--out", "o", "--work", "/w", "--traffic-peak", "40",
            "--traffic-switch-lead", "1", "--traffic-targets", "routed,baseline",
            "--traffic-variant", "lead0=--switch-lead 0"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        cli.cmd_run(argv)
    lines = capsys.readouterr().out.splitlines()
    assert exc.value.code == 0, lines
    assert "3 repeats x each schedule x routed, baseline, lead0 (order" in lines[0]
    assert lines[2].startswith("# 9 runs;")
    launch, router = [ln.split() for ln in lines if not ln.startswith("#")]
    assert lines[-2] == ("# lead0: a second router on a free PORT, the launch's calibration its "
                         "--speed-profile, its log /w/logs/router-lead0.log")  # fmt: skip
    assert router[:3] == ["python3", "-m", "dynspec.router"] and "--threshold" in router
    assert router[router.index("--log-level") + 1] == "info" and router.count("--port") == 1
    assert router[-4:] == ["--port", "PORT", "--switch-lead", "0"]
    assert router[-6:-4] == ["--switch-lead", "1"]  # the launch's, then the variant's
    assert launch[launch.index("--port") + 1] == "8000"


def test_traffic_mps_off_launches_the_pair_without_mps(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--traffic-mps off (or $DYNSPEC_TRAFFIC_MPS): pair-a's launch, no MPS; the dry run's first
    line says which, and the plan's settings (meta.json) and records keep it."""
    argv = ["--plan", "traffic", "--dry-run", "--out", "o", "--traffic-peak", "40"]
    for extra, env in ((["--traffic-mps", "off"], None), ([], "off"), ([], None)):
        if env is None:
            monkeypatch.delenv("DYNSPEC_TRAFFIC_MPS", raising=False)
        else:
            monkeypatch.setenv("DYNSPEC_TRAFFIC_MPS", env)
        with pytest.raises(SystemExit) as exc:
            cli.cmd_run([*argv, *extra])
        assert exc.value.code == 0
        lines = capsys.readouterr().out.splitlines()
        mps = not extra and env is None
        want = "MPS" if mps else "no MPS"
        assert lines[0].startswith(f"# traffic plan: one launch ({want}, "), lines[0]
        assert lines[-1].split().count("--mps") == int(mps), lines[-1]
    plan = trafficplan.plan_of(cli.run_parser().parse_args([*argv, "--traffic-mps", "off"]))
    assert not plan.mps and plan.settings()["mps"] is False
    assert TrafficPlan().settings()["mps"] is True


# -- the plan's body on a fake launch and a fake run_live ----------------------------------------


@dataclass
class FakeLive:
    """``run_live`` as the interface says, running at most ``per_call[i]`` runs in call i."""

    per_call: list[int]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def run_live(
        self,
        targets: Sequence[Any],
        cfg: TrafficConfig,
        out: Path,
        *,
        watch: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        deadline: float | None = None,
        fields: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        self.calls.append({"targets": targets, "cfg": cfg, "watch": watch, "extra": extra,
                           "deadline": deadline, "fields": fields})  # fmt: skip
        budget = self.per_call[len(self.calls) - 1]
        left = runs_left(cfg, [t.label for t in targets], out)
        labels = [t.label for t in targets]
        made = []
        for r in range(1, cfg.repeats + 1):
            order = [labels[(i + r - 1) % len(labels)] for i in range(len(labels))]
            for name, _ in cfg.schedules:
                for label in order:
                    if (r, name, label) not in left:
                        continue
                    if len(made) == budget:
                        return made
                    row = {**rec(name, r, label), **(extra or {}), **(fields or {}).get(label, {})}
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    made.append(row)
        return made


@pytest.fixture
def fake_launch(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``start_launcher`` as a sleeping process in its own session that writes a calibration,
    ``warm`` and ``nvidia-smi`` recorded; returns what was launched and warmed."""
    seen: list[Any] = []

    def start(run: Run, launch: Sequence[str]) -> Any:
        folder = run.logs / "calibration"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "llama8b-random-x.json").write_text(json.dumps(profile(9456.7, 9722.0)))
        run.meta.update(launch_argv=list(launch[1:]), commands=[])
        seen.append(("launch", list(launch)))
        return run.spawn("launcher", ["sleep", "120"], run.logs / "launcher.log")

    monkeypatch.setattr(launching, "start_launcher", start)

    def warm(run: Run, urls: Mapping[str, str], levels: Sequence[int]) -> None:
        seen.append(("warm", dict(urls), tuple(levels)))
        seen.append(("variant up at the warm pass", "variant_router_argv" in run.meta))

    monkeypatch.setattr(toolkit, "warm", warm)
    monkeypatch.setattr(launching, "compute_apps", lambda **kw: (True, ""))
    return seen


def make_run(tmp: Path, meta: dict[str, Any] | None = None, *, repeats: int = 2) -> Run:
    run = Run(
        out=tmp / "out", work=tmp / "work", deadline=time.monotonic() + 300, env=dict(os.environ)
    )
    run.steady = Steady(repeats=repeats)
    run.tag = "traffic-test"
    run.meta = meta if meta is not None else {"plan": "traffic", "commit": "abc1234"}
    run.results.mkdir(parents=True, exist_ok=True)
    return run


def models(tmp: Path, *drafts: str) -> Path:
    for name in ("llama8b", *(f"eagle3-{d}" for d in drafts)):
        (tmp / "models" / name).mkdir(parents=True, exist_ok=True)
        (tmp / "models" / name / "config.json").write_text("{}")
    return tmp / "models"


def test_two_commands_keep_the_launch_and_the_second_finishes(
    tmp_path: Path, fake_launch: list[Any]
) -> None:
    live = FakeLive(per_call=[1, 100])
    run = make_run(tmp_path)
    m = models(tmp_path, "hi")
    assert trafficplan.plan_traffic(run, m, plan=TrafficPlan(), session=None, keep=True,
                                    run_live=live.run_live) == 0  # fmt: skip
    (launch, warmed, _) = fake_launch
    assert launch[1][launch[1].index("--draft-model-path") + 1] == str(m / "eagle3-hi")
    assert "--mps" in launch[1] and launch[1][launch[1].index("--threshold") + 1] == "auto"
    servers = {"eagle": "http://127.0.0.1:30001", "baseline": "http://127.0.0.1:30002"}
    assert warmed == ("warm", servers, (1, 16, 64, 128, 256))
    call = live.calls[0]
    assert [t.label for t in call["targets"]] == ["routed", "eagle", "baseline"]
    assert call["watch"] == {"routed": "http://127.0.0.1:8000"}
    cfg = call["cfg"]
    assert [(n, x.text) for n, x in cfg.schedules] == [("day", "day:120 peak 62.7")]
    assert (cfg.repeats, cfg.output_len, cfg.input_len, cfg.drain_s) == (2, 128, 256, 30.0)
    assert call["extra"]["peak_rps"] == 62.7
    assert call["extra"]["commit"] == "abc1234" and call["extra"]["plan"] == "traffic"
    assert abs(call["deadline"] - (run.deadline - run.reserve)) < 1e-6
    assert run.meta["traffic"]["capacity"] == {"eagle_rps": 55.4, "baseline_rps": 71.0,
                                               "peak_rps": 62.7}  # fmt: skip
    assert run.meta["traffic_runs_left"] == 5 and run.keep
    assert run.meta["calibration"] == ["llama8b-random-x.json"]
    session = kept_session(run, "traffic")
    assert session is not None
    pid, start = session["procs"]["launcher"]
    assert alive(pid, start)

    # The next command: the kept launch, its meta; no launch, no warm pass, the same peak.
    again = make_run(tmp_path, json.loads(json.dumps(run.meta)))
    again.tag = session["tag"]
    assert trafficplan.plan_traffic(again, m, plan=TrafficPlan(), session=session, keep=True,
                                    run_live=live.run_live) == 0  # fmt: skip
    assert len(fake_launch) == 3 and len(live.calls) == 2
    assert live.calls[1]["cfg"] == cfg
    rows = [json.loads(ln) for ln in (run.results / "traffic.jsonl").read_text().splitlines()]
    assert [(r["repeat"], r["target"]) for r in rows] == [
        (1, "routed"), (1, "eagle"), (1, "baseline"), (2, "eagle"), (2, "baseline"), (2, "routed"),
    ]  # fmt: skip
    assert again.meta["traffic_runs_left"] == 0 and not again.keep
    assert again.meta["launcher_exit"] == "stopped" and not alive(pid, start)


def test_a_refused_later_command_keeps_the_kept_launch(
    tmp_path: Path, fake_launch: list[Any]
) -> None:
    """A later --keep command whose plan differs is refused and leaves the launch up, so a
    corrected command resumes it instead of launching again."""
    live = FakeLive(per_call=[1, 100])
    run = make_run(tmp_path)
    m = models(tmp_path, "hi")
    assert trafficplan.plan_traffic(run, m, plan=TrafficPlan(), session=None, keep=True,
                                    run_live=live.run_live) == 0  # fmt: skip
    session = kept_session(run, "traffic")
    assert session is not None
    again = make_run(tmp_path, json.loads(json.dumps(run.meta)))
    again.tag = session["tag"]
    with pytest.raises(RunFailed, match="another traffic plan"):
        trafficplan.plan_traffic(again, m, plan=TrafficPlan(day_seconds=90), session=session,
                                 keep=True, run_live=live.run_live)  # fmt: skip
    assert again.keep and len(live.calls) == 1
    pid, start = session["procs"]["launcher"]
    assert alive(pid, start)
    os.killpg(pid, signal.SIGKILL)


def test_a_later_command_of_another_plan_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.meta["traffic"] = {"settings": TrafficPlan().settings(), "peak_rps": 62.7}
    assert trafficplan.settle_peak(run, TrafficPlan()) == 62.7
    assert trafficplan.settle_peak(run, TrafficPlan(peak=62.7)) == 62.7
    with pytest.raises(RunFailed, match=r"day_seconds 120.0 there, 90 here; peak 62.7 there, 50"):
        trafficplan.settle_peak(run, TrafficPlan(day_seconds=90, peak=50))


def test_the_real_runner_on_a_simulator_ends_the_plan_and_stops_the_launch(
    tmp_path: Path, fake_launch: list[Any], eagle_sim: str
) -> None:
    """``run_live`` itself, each target a dynspec-sim (speed 10): its records name the runs as
    ``runs_left`` reads them, with the plan's fields; every run done, the launch is stopped."""
    port = int(eagle_sim.rsplit(":", 1)[-1])
    run = make_run(tmp_path, repeats=1)
    run.ports = (port, port, port)
    plan = TrafficPlan(day_seconds=1, peak=12, drain_s=5)
    assert trafficplan.plan_traffic(run, models(tmp_path, "hi"), plan=plan, session=None,
                                    keep=True) == 0  # fmt: skip
    rows = [json.loads(ln) for ln in (run.results / "traffic.jsonl").read_text().splitlines()]
    whole = [r for r in rows if r["scope"] == "run"]
    assert [r["target"] for r in whole] == ["routed", "eagle", "baseline"]
    assert all(r["peak_rps"] == 12 and r["plan"] == "traffic" for r in rows)
    assert all(r["schedule_text"] == "day:1 peak 12" and r["requests"] > 0 for r in whole)
    assert run.meta["traffic_runs_left"] == 0 and not run.keep
    assert run.meta["traffic"] == {"settings": plan.settings(), "peak_rps": 12}
    assert "launcher_exit" in run.meta


# -- a variant: a second router in the same launch ------------------------------------------------

LEAD0 = TrafficPlan(switch_lead=1, variant="lead0", variant_flags=("--switch-lead", "0"))


@pytest.fixture
def variant_launch(
    fake_launch: list[Any], monkeypatch: pytest.MonkeyPatch, eagle_sim: str
) -> list[Any]:
    """``fake_launch`` whose launcher's --dry-run printed a real router command: a dynspec-sim
    its EAGLE server, a port nobody serves its baseline (one healthy: its /health answers)."""
    started = launching.start_launcher
    router = [sys.executable, "-m", "dynspec.router", "--eagle-url", eagle_sim, "--baseline-url",
              f"http://127.0.0.1:{free_port()}", "--host", "127.0.0.1", "--port", "8000",
              "--threshold", "auto", "--log-level", "debug", "--switch-lead", "1"]  # fmt: skip

    def start(run: Run, launch: Sequence[str]) -> Any:
        proc = started(run, launch)
        run.meta["commands"] = ["CUDA_VISIBLE_DEVICES=0 py -m sglang.launch_server --port 30001",
                                f"DYNSPEC_X=1 {shlex.join(router)}"]  # fmt: skip
        return proc

    monkeypatch.setattr(launching, "start_launcher", start)
    return fake_launch


def test_the_variants_router_is_kept_with_the_launch_and_stopped_with_it(
    tmp_path: Path, variant_launch: list[Any]
) -> None:
    """The launch's router command on a port of its own, the launch's calibration its speed
    profile, then the variant's flags; its own log; a target after the others, sampled, its
    records naming its flags; kept with the launch for the next command, which stops both."""
    live = FakeLive(per_call=[1, 100])
    run = make_run(tmp_path)
    m = models(tmp_path, "hi")
    assert trafficplan.plan_traffic(run, m, plan=LEAD0, session=None, keep=True,
                                    run_live=live.run_live) == 0  # fmt: skip
    session = kept_session(run, "traffic")
    assert session is not None and set(session["procs"]) == {"launcher", "variant_router"}
    port = session["variant_port"]
    url = f"http://127.0.0.1:{port}"
    argv = run.meta["variant_router_argv"]
    assert argv[:4] == [sys.executable, "-m", "dynspec.router", "--eagle-url"]
    profile_path = str(run.logs / "calibration" / "llama8b-random-x.json")
    assert argv[-6:] == ["--port", str(port), "--speed-profile", profile_path, "--switch-lead", "0"]
    assert argv.count("--port") == 1 and argv[argv.index("--log-level") + 1] == "debug"
    assert "==> " + shlex.join(argv) in (run.logs / "router-lead0.log").read_text()
    call = live.calls[0]
    assert [t.label for t in call["targets"]] == ["routed", "eagle", "baseline", "lead0"]
    assert call["targets"][3].base_url == url
    assert call["watch"] == {"routed": "http://127.0.0.1:8000", "lead0": url}
    assert call["fields"]["lead0"] == {"router": "--threshold auto --switch-lead 1 --switch-lead 0"}
    pid, start = session["procs"]["variant_router"]
    assert alive(pid, start) and http_status(url + "/health") == 200

    again = make_run(tmp_path, json.loads(json.dumps(run.meta)))
    again.tag = session["tag"]
    assert trafficplan.plan_traffic(again, m, plan=LEAD0, session=session, keep=True,
                                    run_live=live.run_live) == 0  # fmt: skip
    assert ("variant up at the warm pass", True) in variant_launch  # as the launch's router
    assert len(variant_launch) == 3 and live.calls[1]["watch"] == call["watch"]
    rows = [json.loads(ln) for ln in (run.results / "traffic.jsonl").read_text().splitlines()]
    assert [(r["repeat"], r["target"]) for r in rows][:4] == [
        (1, "routed"), (1, "eagle"), (1, "baseline"), (1, "lead0"),
    ]  # fmt: skip
    lead0 = {r.get("router") for r in rows if r["target"] == "lead0"}
    assert lead0 == {"--threshold auto --switch-lead 1 --switch-lead 0"}
    assert again.meta["traffic_runs_left"] == 0 and not again.keep
    assert not alive(pid, start) and not alive(*session["procs"]["launcher"])


def test_the_variants_router_is_stopped_when_the_plan_fails(
    tmp_path: Path, variant_launch: list[Any]
) -> None:
    def broken(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        raise RuntimeError("the runner broke")

    run = make_run(tmp_path)
    with pytest.raises(RuntimeError, match="the runner broke"):
        trafficplan.plan_traffic(run, models(tmp_path, "hi"), plan=LEAD0, session=None,
                                 keep=True, run_live=broken)  # fmt: skip
    (pid,) = [p for p, log in run.children.logs.items() if log and log.name == "router-lead0.log"]
    assert proc_stat(pid) is None  # stopped and reaped; the launcher is attempt's to stop
    run.stop_all()


def test_variant_flags_the_router_refuses_stop_the_plan_before_its_launch(
    tmp_path: Path, fake_launch: list[Any]
) -> None:
    """The GPU machine's own Python has the router's packages only from the bundle: the plan
    checks the flags with the launch's."""
    bad = replace(LEAD0, variant_flags=("--no-such", "1"))
    with pytest.raises(RunFailed, match="--traffic-variant lead0: unrecognized arguments"):
        trafficplan.plan_traffic(make_run(tmp_path), models(tmp_path, "hi"), plan=bad, keep=True,
                                 session=None, run_live=FakeLive([1]).run_live)  # fmt: skip
    assert fake_launch == []


def test_a_later_command_with_another_variant_or_targets_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.meta["traffic"] = json.loads(json.dumps({"settings": LEAD0.settings(), "peak_rps": 62.7}))
    assert trafficplan.settle_peak(run, LEAD0) == 62.7
    for other, why in (
        (replace(LEAD0, variant="", variant_flags=()), "variant lead0 there,  here"),
        (replace(LEAD0, variant_flags=("--switch-lead", "2")),
         "variant_flags ['--switch-lead', '0'] there, ['--switch-lead', '2'] here"),
        (replace(LEAD0, targets=("routed", "baseline")),
         "targets ['routed', 'eagle', 'baseline'] there, ['routed', 'baseline'] here"),
    ):  # fmt: skip
        with pytest.raises(RunFailed, match="another traffic plan") as exc:
            trafficplan.settle_peak(run, other)
        assert why in str(exc.value) and "\n" not in str(exc.value)


def test_traffic_targets_are_what_run_live_runs(tmp_path: Path, fake_launch: list[Any]) -> None:
    live = FakeLive(per_call=[100])
    run = make_run(tmp_path, repeats=1)
    plan = TrafficPlan(targets=("routed", "baseline"))
    assert trafficplan.plan_traffic(run, models(tmp_path, "hi"), plan=plan, session=None,
                                    keep=True, run_live=live.run_live) == 0  # fmt: skip
    assert [t.label for t in live.calls[0]["targets"]] == ["routed", "baseline"]
    assert run.meta["traffic_runs_left"] == 0 and not run.keep


def test_the_real_runner_runs_the_variant_and_the_report_judges_it(
    tmp_path: Path, variant_launch: list[Any], eagle_sim: str
) -> None:
    """``run_live`` itself with the variant's router in front of a dynspec-sim: its records as
    the simulated variant's, so ``traffic --from-jsonl`` judges it under its own goals."""
    port = int(eagle_sim.rsplit(":", 1)[-1])
    run = make_run(tmp_path, repeats=1)
    run.ports = (port, port, port)
    plan = replace(LEAD0, day_seconds=1, peak=12, drain_s=5)
    assert trafficplan.plan_traffic(run, models(tmp_path, "hi"), plan=plan, session=None,
                                    keep=False) == 0  # fmt: skip
    out = run.results / "traffic.jsonl"
    whole = [json.loads(ln) for ln in out.read_text().splitlines()]
    whole = [r for r in whole if r["scope"] == "run"]
    assert [r["target"] for r in whole] == ["routed", "eagle", "baseline", "lead0"]
    (lead0,) = [r for r in whole if r["target"] == "lead0"]
    assert lead0["requests"] > 0 and lead0["url"].endswith(run.meta["variant_router_argv"][-5])
    md, _ = rerendered("traffic", out)
    assert "## Goals: `lead0` (router `--threshold auto --switch-lead 1 --switch-lead 0`)" in md


def rec(schedule: str, repeat: int, target: str, **kw: object) -> dict[str, object]:
    return {"schedule": schedule, "repeat": repeat, "target": target, "scope": "run", **kw}


def test_the_gpu_run_imports_what_the_traffic_plan_needs_without_orjson() -> None:
    """The GPU machine's own Python (the bench's process, not the bundle's) has no orjson: a
    run at 9f0d527 stopped at ``import dynspec.bench.traffic`` after the bench took its prompt
    words from the launcher's load generator, which imports it. The words live in
    ``common/words.py`` now."""
    code = (
        "import sys; sys.modules['orjson'] = None\n"
        "import dynspec.bench.traffic, dynspec.bench.gpu.trafficplan, dynspec.bench.gpu.models\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
