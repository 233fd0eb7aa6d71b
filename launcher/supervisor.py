"""The supervisor decides: start the servers, wait for them, start the router, watch, shut down.

Signal handlers only record the signal; the main loop acts on it. Shutdown order: the router first
(SIGTERM: it stops accepting and drains requests in flight, up to --drain-timeout), then each
server's process group (SIGTERM, SIGKILL after --kill-grace). A second Ctrl-C kills at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shlex
import signal
import time
from dataclasses import dataclass, field

import httpx

from dynspec.launcher.calibration import calibrate
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.facts import LaunchFacts, flag_facts
from dynspec.launcher.loadgen import CalibrationError
from dynspec.launcher.mps import MpsDaemon, start_daemon, stop_daemon
from dynspec.launcher.plan import LaunchPlan
from dynspec.launcher.printer import Printer
from dynspec.launcher.process import Child, describe_exit, tail
from dynspec.launcher.spec import ProcessSpec

log = logging.getLogger(__name__)

TICK = 0.25
STATUS_POLL = 0.25  # how often the router's /status is read to report pool switches
ROUTER_START_TIMEOUT = 60.0
RESTART_BACKOFF_MAX = 30.0
# SIGHUP too: the children run in their own sessions, so a closed terminal reaches only us, and
# dying of it would leave them running.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LaunchError(Exception):
    """A runtime failure that stops everything (exit 1, one line)."""


@dataclass
class ServerState:
    child: Child
    healthy: bool = False
    healthy_at: float = 0.0
    probe_note: str = "starting"
    announced: bool = False  # its "healthy after" line is printed
    failures: int = 0
    restart_at: float | None = None
    probe: asyncio.Task[None] | None = field(default=None, repr=False)


def _describe(spec: ProcessSpec) -> str:
    return f"{spec.name} server {spec.prefix}" if spec.is_server else spec.name


class Supervisor:
    def __init__(
        self,
        config: LaunchConfig,
        plan: LaunchPlan,
        printer: Printer,
        *,
        facts: LaunchFacts | None = None,
    ) -> None:
        """``plan``: what to start (``plan.plan``); ``facts``: what the launch found (None:
        what the flags alone say)."""
        self.config = config
        self.facts = facts or flag_facts(config)
        self.calibration = plan.calibration
        self.printer = printer
        self._started = False  # start-up done: server output is echoed on a terminal too
        # The launcher's own DYNSPEC_* variables are not its children's.
        drop_env = config.own_env
        self.servers = [
            ServerState(Child(s, printer, self._echo_servers, drop_env)) for s in plan.servers
        ]
        self._by_key = {st.child.spec.key: st for st in self.servers}
        # None with --no-router: the servers alone are supervised.
        router = plan.router
        self.router = Child(router, printer, lambda: True, drop_env) if router else None
        self.daemons = plan.daemons
        self._daemons_up: list[MpsDaemon] = []
        self.signals: list[int] = []
        self._wake = asyncio.Event()
        self._force = asyncio.Event()
        self._http: httpx.AsyncClient | None = None
        self._active_pool: str | None = None

    # -- signals -------------------------------------------------------------------------------

    def _on_signal(self, sig: int) -> None:
        # Only record: the main loop (or the shutdown in progress) acts on it.
        self.signals.append(sig)
        self._wake.set()
        if len(self.signals) >= 2:
            self._force.set()

    def _signal_code(self) -> int:
        return 128 + self.signals[0]

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up at once on a signal."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    # -- output --------------------------------------------------------------------------------

    def _echo_servers(self) -> bool:
        # On a terminal, start-up shows a live status block instead of the servers' log lines.
        return self._started or not self.printer.tty

    def say(self, text: str) -> None:
        self.printer.line("[dynspec]", text, "dynspec")

    # -- main ----------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, int(sig))
        # trust_env=False: a proxy from the environment must never see loopback health checks.
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(5.0), trust_env=False)
        try:
            for daemon in self.daemons:
                await self._start_daemon(daemon)
            if self.signals:  # stopped while the daemons started: no server was started
                return self._signal_code()
            return await self._run()
        finally:
            try:
                await self._stop_all()
            finally:
                try:
                    await self._stop_daemons()
                finally:
                    await self._http.aclose()
                for sig in SIGNALS:
                    loop.remove_signal_handler(sig)

    async def _start_daemon(self, daemon: MpsDaemon) -> None:
        if self.signals:
            return
        try:
            await start_daemon(daemon)
        except (OSError, RuntimeError) as exc:
            raise LaunchError(str(exc)) from None
        self._daemons_up.append(daemon)
        self.say(f"MPS control daemon for pair {daemon.gpu_set} started ({daemon.pipe_dir})")

    async def _stop_daemons(self) -> None:
        """After every server is gone: quit each MPS daemon started (even on a failure)."""
        while self._daemons_up:
            daemon = self._daemons_up.pop()
            try:
                why = await stop_daemon(daemon)
            except OSError as exc:
                why = str(exc)
            if why is None:
                self.say(f"MPS control daemon for pair {daemon.gpu_set} stopped")
            else:
                self.say(f"MPS control daemon for pair {daemon.gpu_set} did not quit ({why})")

    def _ready_to_start(self, st: ServerState) -> bool:
        """Not started yet, and the server it waits for (same GPUs) is healthy."""
        if st.child.starts:
            return False
        after = st.child.spec.after
        return after is None or (after in self._by_key and self._by_key[after].healthy)

    async def _run(self) -> int:
        plan = self.calibration
        if plan is not None and plan.action == "reuse":
            self.say(plan.note() or "")
        # Servers that share GPUs start one after the other: two SGLang servers profiling the
        # same GPU's free memory at once each count the other's allocation and one fails.
        for st in self.servers:
            if self._ready_to_start(st):
                await self._start_server(st)
        code = await self._startup()
        if code is not None:
            return code
        code = await self._calibrate()
        if code is not None:
            return code
        self._started = True
        if self.router is not None:
            await self.router.start()
            code = await self._router_ready()
            if code is not None:
                return code
        self._banner()
        return await self._serve()

    # -- start-up ------------------------------------------------------------------------------

    async def _start_server(self, st: ServerState) -> None:
        await st.child.start()
        st.probe = asyncio.create_task(self._probe(st))

    async def _probe(self, st: ServerState) -> None:
        """Poll the server's /health_generate (each of its URLs) until they answer 200."""
        assert self._http is not None
        pending = list(st.child.spec.health_urls)
        while st.child.running:
            try:
                while pending:
                    r = await self._http.get(pending[0], timeout=10.0)
                    if r.status_code != 200:
                        break
                    pending.pop(0)
                if not pending:
                    st.healthy = True
                    st.healthy_at = time.monotonic()
                    return
                st.probe_note = f"warming up (HTTP {r.status_code})"
            except httpx.ConnectError:
                st.probe_note = "loading (port not open yet)"
            except httpx.HTTPError as exc:
                st.probe_note = f"no answer yet ({type(exc).__name__})"
            await asyncio.sleep(0.5)

    def _fail(self, spec: ProcessSpec, what: str) -> LaunchError:
        self.printer.clear_status()
        if self.printer.tty and spec.is_server and not self._started:
            # Its output was hidden behind the status block: show how it ended.
            for line in tail(spec.log_file):
                self.printer.line(spec.prefix, line, spec.name)
        return LaunchError(f"{_describe(spec)} {what}; see its log: {spec.log_file}")

    async def _startup(self) -> int | None:
        next_plain = time.monotonic() + self.config.progress_every
        while True:
            if self.signals:
                return self._signal_code()
            for st in self.servers:
                code = st.child.returncode
                if code is not None:
                    raise self._fail(st.child.spec, f"{describe_exit(code)} during start-up")
            for waiting in [st for st in self.servers if self._ready_to_start(st)]:
                self.printer.clear_status()
                self._announce_healthy()
                self.printer.line(
                    waiting.child.spec.prefix,
                    "starting now (shares its GPUs: waited for the EAGLE server)",
                    waiting.child.spec.name,
                )
                await self._start_server(waiting)
            now = time.monotonic()
            if all(st.healthy for st in self.servers):
                self.printer.clear_status()
                self._announce_healthy()
                return None
            late = [
                st.child.spec
                for st in self.servers
                if st.child.starts
                and not st.healthy
                and now - st.child.started_at > self.config.startup_timeout
            ]
            if late:
                raise self._fail(
                    late[0],
                    f"did not answer /health_generate within {self.config.startup_timeout:g}s "
                    "(--startup-timeout)",
                )
            if self.printer.tty:
                self.printer.status([self._progress(st, now) for st in self.servers])
            elif now >= next_plain:
                next_plain = now + self.config.progress_every
                for st in self.servers:
                    if st.child.starts and not st.healthy:
                        self.printer.line(
                            st.child.spec.prefix,
                            f"waiting {now - st.child.started_at:.0f}s: {st.probe_note}",
                            st.child.spec.name,
                        )
            await self._sleep(TICK)

    def _announce_healthy(self) -> None:
        for st in self.servers:
            if st.healthy and not st.announced:
                st.announced = True
                spent = st.healthy_at - st.child.started_at
                self.printer.line(
                    st.child.spec.prefix, f"healthy after {spent:.0f}s", st.child.spec.name
                )

    def _progress(self, st: ServerState, now: float) -> str:
        spec = st.child.spec
        if st.healthy:
            return f"{spec.prefix} healthy after {st.healthy_at - st.child.started_at:.0f}s"
        if not st.child.starts:
            return f"{spec.prefix} waits for the EAGLE server (shared GPUs)"
        elapsed = now - st.child.started_at
        return f"{spec.prefix} {elapsed:4.0f}s {st.probe_note} | {st.child.latest_line}"

    # -- calibration ---------------------------------------------------------------------------

    async def _calibrate(self) -> int | None:
        """Measure each server before the router starts (``--calibrate``); on success the router
        gets the profile. A failure is one line and the launch goes on without a profile."""
        plan = self.calibration
        if plan is None or plan.action != "measure":
            return None
        levels = ",".join(map(str, plan.levels))
        self.say(
            f"calibration: measuring each server alone at C={levels} before the router starts "
            f"({plan.why}); Ctrl-C stops everything"
        )
        key = self.config.backend_api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        began = time.monotonic()
        task = asyncio.create_task(calibrate(plan, headers, self.say))
        why: str | None = None
        try:
            while not task.done():
                if self.signals:
                    return self._signal_code()
                for st in self.servers:
                    code = st.child.returncode
                    if code is not None and why is None:
                        why = f"{_describe(st.child.spec)} {describe_exit(code)}"
                if why is not None:
                    break
                await asyncio.wait({task}, timeout=TICK)
        finally:
            # Cancelled, its streams close: nothing it sent is left waiting for an answer.
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if why is None:
            try:
                path = task.result()
            except CalibrationError as exc:
                why = str(exc)
            except Exception:
                log.exception("calibration failed")
                why = "an internal error, logged above"
        if why is not None:
            self.say(f"calibration failed ({why}); the router starts without a speed profile")
            return None
        took = f"in {time.monotonic() - began:.0f}s"
        if self.router is None:
            self.say(f"calibration: wrote {path} {took} (--no-router: give it to your router)")
        else:
            self.router.spec = self.router.spec.with_speed_profile(str(path))
            self.say(
                f"calibration: wrote {path} {took}; the router starts with it as --speed-profile"
            )
        return None

    async def _router_ready(self) -> int | None:
        assert self._http is not None and self.router is not None
        deadline = time.monotonic() + ROUTER_START_TIMEOUT
        while True:
            if self.signals:
                return self._signal_code()
            for st in self.servers:
                # A server that died meanwhile (during calibration, say) restarts as in service.
                await self._supervise(st)
            if self.router.returncode is not None:
                raise self._fail(
                    self.router.spec, f"{describe_exit(self.router.returncode)} at start-up"
                )
            try:
                r = await self._http.get(self.router.spec.health_url, timeout=2.0)
                if r.status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise self._fail(
                    self.router.spec, f"did not answer /health within {ROUTER_START_TIMEOUT:g}s"
                )
            await self._sleep(TICK)

    def _banner(self) -> None:
        c = self.config
        if self.router is None:
            for st in self.servers:
                urls = " and ".join(u.rsplit("/", 1)[0] for u in st.child.spec.health_urls)
                self.printer.line(st.child.spec.prefix, f"serving at {urls}", st.child.spec.name)
            self.say("ready: servers only (--no-router); Ctrl-C stops them")
            return
        base = c.router_url
        body = json.dumps(
            {
                "model": c.served_model_name,
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 32,
            }
        )
        curl = f"curl -s {base}/v1/chat/completions -H 'Content-Type: application/json'"
        if c.api_key:
            curl += ' -H "Authorization: Bearer $DYNSPEC_API_KEY"'
        burst = body.replace('"max_tokens": 32', '"max_tokens": 300')
        burst = f"{curl} -d {shlex.quote(burst)} -o /dev/null"
        curl += f" -d {shlex.quote(body)}"
        self.say(f"ready: OpenAI-compatible API at {base}/v1 (model {c.served_model_name!r})")
        self.say(f"metrics: {base}/metrics   status: {base}/status")
        self.say(f"try: {curl}")
        if c.policy == "balance":
            # No mode and no threshold to cross: each request picks its server, so there is no
            # switch to show (the status poll reports none: /status gives no active pool).
            self.say(
                "policy balance: each request goes to the server with the lowest predicted time "
                "per output token (both pools serve at every load; see /status and /metrics); "
                "Ctrl-C stops everything"
            )
            return
        if c.threshold_auto:
            self.say(
                "threshold auto: the router learns each pair's threshold (see /status); "
                "Ctrl-C stops everything"
            )
            return
        if c.simulate:
            # The point of the demo: enough requests at once to cross the threshold.
            n = c.threshold + 4
            self.say(f"see the switch: for i in $(seq {n}); do {burst} & done; wait")
        sets = len(self.facts.gpu_sets)
        each = f"in each of {sets} pairs, " if sets > 1 else ""
        self.say(
            f"policy {c.policy}: {each}EAGLE up to load {c.threshold}, baseline above it "
            f"(back to EAGLE at load <= {c.threshold - c.hysteresis}); Ctrl-C stops everything"
        )

    # -- running -------------------------------------------------------------------------------

    async def _serve(self) -> int:
        next_poll = 0.0
        while True:
            if self.signals:
                return self._signal_code()
            if self.router is not None and self.router.returncode is not None:
                raise self._fail(self.router.spec, describe_exit(self.router.returncode))
            for st in self.servers:
                await self._supervise(st)
            now = time.monotonic()
            if now >= next_poll and self.router is not None:
                next_poll = now + STATUS_POLL
                await self._poll_status()
            await self._sleep(TICK)

    async def _supervise(self, st: ServerState) -> None:
        child = st.child
        spec = child.spec
        now = time.monotonic()
        if st.restart_at is None and child.returncode is not None:
            what = describe_exit(child.returncode)
            # Its workers may still hold GPU memory: clear the whole group before a restart.
            await child.stop(self.config.kill_grace, self._wake)
            if self.config.restart == "never":
                raise self._fail(spec, f"{what} (--restart never: stopping everything)")
            st.healthy = False
            st.failures += 1
            delay = min(RESTART_BACKOFF_MAX, 2.0 ** (st.failures - 1))
            st.restart_at = now + delay
            self.printer.line(
                spec.prefix,
                f"{what}; restarting in {delay:g}s (log: {spec.log_file}); "
                "the router serves from the other pool meanwhile",
                spec.name,
            )
        elif st.restart_at is not None and now >= st.restart_at:
            st.restart_at = None
            st.probe_note = "starting"
            partner = self._by_key.get(spec.partner) if spec.partner else None
            beside = partner is not None and partner.child.running and spec.second_argv
            # Beside its running partner it sees only the partner's leftover as free memory.
            await child.start(spec.second_argv if beside else None)
            st.probe = asyncio.create_task(self._probe(st))
            self.printer.line(spec.prefix, f"restarted (start {child.starts})", spec.name)
        elif child.running and not st.healthy:
            if now - child.started_at > self.config.startup_timeout:
                self.printer.line(
                    spec.prefix,
                    f"not healthy within {self.config.startup_timeout:g}s after restart; "
                    "stopping it",
                    spec.name,
                )
                await child.stop(self.config.kill_grace, self._wake)
        elif child.running and st.healthy and st.failures and st.probe is not None:
            spent = st.healthy_at - child.started_at
            self.printer.line(spec.prefix, f"healthy again after {spent:.0f}s", spec.name)
            st.failures = 0
            st.probe = None

    async def _poll_status(self) -> None:
        """Report the router's active pool when it changes (the switch, made visible). Under
        ``balance`` /status gives none (null), so nothing is reported."""
        assert self._http is not None and self.router is not None
        # /status takes the admin key when one is set, else the API key.
        key = self.config.admin_api_key or self.config.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        url = self.router.spec.health_url.rsplit("/", 1)[0] + "/status"
        try:
            r = await self._http.get(url, headers=headers, timeout=2.0)
            data = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return
        if not isinstance(data, dict):
            return
        pool = data.get("active_pool")
        if not isinstance(pool, str) or pool == self._active_pool:
            return
        previous, self._active_pool = self._active_pool, pool
        if previous is None:
            return
        # The router logs the switch itself (with the load that caused it); this line tells a
        # newcomer what it means, from the contract's /status alone.
        threshold = data.get("threshold", self.config.threshold)
        hysteresis = data.get("hysteresis", self.config.hysteresis)
        if (previous, pool) == ("eagle", "baseline"):
            text = (
                f"switch: new requests go to the baseline pool (load went above the threshold, "
                f"{threshold}); the EAGLE pool finishes the requests it holds"
            )
        elif (previous, pool) == ("baseline", "eagle"):
            back = threshold - hysteresis if isinstance(threshold, int) else "?"
            text = f"switch: new requests go to the EAGLE pool again (load fell to {back} or less)"
        else:
            text = f"switch: active pool {previous} -> {pool}"
        self.say(text)

    # -- shutdown ------------------------------------------------------------------------------

    async def _stop_all(self) -> None:
        self.printer.clear_status()
        for st in self.servers:
            if st.probe is not None:
                st.probe.cancel()
        if self.signals:
            how = "killing everything now" if self._force.is_set() else "stopping"
            name = signal.Signals(self.signals[0]).name
            self.say(f"{name}: {how} (Ctrl-C again to kill at once)")
        if self.router is None:
            pass
        elif self.router.pid is not None and not self.router.gone():
            if self._force.is_set():
                self.router.signal_group(signal.SIGKILL)
            else:
                drain = self.config.drain_timeout
                self.say(f"router: draining requests in flight (up to {drain:g}s)")
            # The router exits by itself once drained; the margin covers its own shutdown.
            await self.router.stop(self.config.drain_timeout + 5.0, self._force)
        else:
            await self.router.close()
        live = [st.child for st in self.servers if st.child.pid is not None]
        if any(not c.gone() for c in live):
            self.say("servers: SIGTERM to each process group")
        await asyncio.gather(*(c.stop(self.config.kill_grace, self._force) for c in live))
        for c in live:
            if not c.gone():  # pragma: no cover - needs a process that survives SIGKILL
                self.say(f"{c.spec.prefix} process group {c.pid} survived SIGKILL")
        self.say("all processes stopped")
