"""The engine model: one continuous-batching scheduler loop, as an SGLang server runs it.

Requests wait in a FIFO queue; at most ``max_running`` decode together. Each loop turn is one
forward step of the modelled GPU: a prefill step when requests can be admitted (it pauses decoding,
takes ``overhead + prompt_tokens / rate`` and gives each new request its first token), else a decode
step whose length depends on the running batch size and which gives every running request one token
(baseline) or a sampled accept length (EAGLE). Steps are scheduled on an absolute clock, so timer
jitter does not accumulate; simulated time runs ``speed`` times faster than real time.

Text is drawn from a fixed token list at an offset chosen by ``seed`` and the prompt, and accept
lengths from a per-request generator seeded the same way: one seed and one prompt give the same
text and the same chunks whatever else the server is doing. Stop strings are found in that text
when the request arrives: the answer then ends with the token that completes the first one, and
its text just before it, as SGLang trims it.

``load_snapshot`` is what ``GET /v1/loads`` answers: (running, waiting), written as SGLang's
``Scheduler.publish_load_snapshot`` writes it: after every prefill batch, every
``LOAD_PUBLISH_EVERY`` decode batches, and when the loop goes idle; so it is as stale as SGLang's.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import random
import time
from collections import deque
from dataclasses import dataclass

from dynspec.launcher.sim.metrics import Metrics
from dynspec.launcher.sim.profile import ModeProfile
from dynspec.launcher.sim.shared_gpu import SHARE_SLICE_S, SharedGpu

logger = logging.getLogger(__name__)

EOS_TOKEN_ID = 128009  # Llama-3's <|eot_id|>: what SGLang reports as matched_stop on a natural end
NATURAL_LENGTH = (64, 768)  # output tokens of an answer that ends by itself (without max_tokens)
LATE_S = 0.002  # real seconds behind schedule after which a step counts as late
MAX_DEBT_S = 0.05  # real seconds of lag written off rather than caught up (timer jitter is less)
GEN_WINDOW_S = 1.0  # simulated seconds over which gen_throughput and accept length are averaged
# SGLang's --load-snapshot-publish-interval default: decode batches between two load snapshots.
LOAD_PUBLISH_EVERY = 15

_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "more can about said into time some could them other than then now only its also may these "
    "two first any new like our over such most after made many before must through back years "
    "where much your way well down should because each just those people how too state good "
    "very make world still see own men work long here get both between life being under never "
    "day same another know while last might us great old year off come since against go came "
    "right used take three model token batch server request stream draft accept decode prefill "
    "router queue speed eagle baseline latency throughput kernel memory cache layer weight"
)
_WORDS = tuple(_WORD_TEXT.split())


def _make_tokens(n: int = 8192) -> tuple[str, ...]:
    rng = random.Random(20250301)
    out: list[str] = []
    for i in range(n):
        word = rng.choice(_WORDS)
        if i % 17 == 16:
            word += "."
        elif i % 11 == 10:
            word += ","
        out.append(" " + word)
    return tuple(out)


TOKENS = _make_tokens()
_NTOK = len(TOKENS)


class SimRequest:
    """One generation request as the engine and its HTTP handler share it."""

    __slots__ = (
        "aborted",
        "arrived",
        "bounds",
        "cdf",
        "done",
        "finish_reason",
        "finished_at",
        "first_token_at",
        "generated",
        "last_token_at",
        "matched_stop",
        "offset",
        "prompt_tokens",
        "released",
        "rid",
        "rng",
        "stream",
        "target",
        "visible",
        "waiter",
    )

    def __init__(
        self,
        *,
        rid: str,
        prompt_tokens: int,
        max_new_tokens: int | None,
        limit: int,
        stream: bool,
        seed: int,
        prompt_key: str,
        ignore_eos: bool = False,
        stop: tuple[str, ...] = (),
    ) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.stream = stream
        self.rng = random.Random(f"{seed}\x00{prompt_key}")
        self.offset = self.rng.randrange(_NTOK)
        natural = limit if ignore_eos else self.rng.randint(*NATURAL_LENGTH)
        cap = limit if max_new_tokens is None else min(max_new_tokens, limit)
        if natural < cap:
            self.target = natural
            self.finish_reason = "stop"
            self.matched_stop: int | str | None = EOS_TOKEN_ID
        else:
            self.target = max(cap, 0)
            self.finish_reason = "length"
            self.matched_stop = None
        self.visible: str | None = None  # with a stop string: the whole answer, trimmed
        self.bounds: list[int] = []  # with a stop string: where each token's text ends in it
        if stop:
            self._apply_stop(stop)
        self.cdf: list[float] = [1.0]
        self.generated = 0
        # What the server has output to its HTTP side (SGLang's output streamer): a streamed
        # chunk carries the tokens released since the one before; all of them once it ends.
        self.released = 0
        self.done = False
        self.aborted = False
        self.waiter: asyncio.Future[None] | None = None
        self.arrived = 0.0
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.finished_at = 0.0

    def _apply_stop(self, stop: tuple[str, ...]) -> None:
        full = self.text(0, self.target)
        best: tuple[int, int, str] | None = None  # (end, start, string) of the first completed
        for s in stop:
            at = full.find(s)
            if at >= 0 and (best is None or at + len(s) < best[0]):
                best = (at + len(s), at, s)
        if best is None:
            return
        end, at, s = best
        bounds = list(
            itertools.accumulate(len(TOKENS[(self.offset + i) % _NTOK]) for i in range(self.target))
        )
        self.target = bisect.bisect_left(bounds, end) + 1  # the token that completes the stop
        self.bounds = [min(b, at) for b in bounds[: self.target]]
        self.visible = full[:at]
        self.finish_reason = "stop"
        self.matched_stop = s

    def text(self, start: int, end: int) -> str:
        """The text of output tokens ``start..end`` (end excluded)."""
        if self.visible is not None:
            ends = self.bounds
            return self.visible[ends[start - 1] if start else 0 : ends[end - 1] if end else 0]
        a = (self.offset + start) % _NTOK
        b = a + (end - start)
        if b <= _NTOK:
            return "".join(TOKENS[a:b])
        return "".join(TOKENS[a:]) + "".join(TOKENS[i % _NTOK] for i in range(_NTOK, b))

    async def wait(self, sent: int) -> None:
        """Return once more than ``sent`` tokens are released or the request has ended."""
        if self.released > sent or self.done:
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiter = fut
        await fut

    def notify(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)


@dataclass
class EngineStats:
    steps: int = 0
    prefill_steps: int = 0
    late_steps: int = 0  # steps that began over max(one step, LATE_S) behind schedule
    max_lag_s: float = 0.0  # real seconds behind schedule, worst seen
    total_lag_s: float = 0.0
    dropped_s: float = 0.0  # lag written off (the simulated server ran slow by this much)


class Engine:
    def __init__(
        self,
        *,
        mode_profile: ModeProfile,
        speculative: bool,
        max_running: int,
        speed: float,
        seed: int,
        metrics: Metrics,
        max_total_tokens: int,
        shared: SharedGpu | None = None,
        stream_interval: int = 1,
    ) -> None:
        self.profile = mode_profile
        # SGLang's --stream-interval: a streamed request's tokens go out after a step that leaves
        # it 1 past a multiple of this many (every step at 1), and when it ends.
        self.stream_interval = max(1, stream_interval)
        # --pair: the other server of the pair runs on the same (simulated) GPU.
        self.shared = shared
        self.mode = "eagle" if speculative else "baseline"
        self.speculative = speculative
        self.max_running = max_running
        self.speed = speed
        self.seed = seed
        self.metrics = metrics
        self.max_total_tokens = max_total_tokens
        self.cdf = mode_profile.accept_cdf() if speculative else [1.0]
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.by_rid: dict[str, SimRequest] = {}
        self.stats = EngineStats()
        self._t0 = time.monotonic()
        self._wake = asyncio.Event()
        self._open = asyncio.Event()
        self._win_start = 0.0
        self._win_tokens = 0
        self._win_req_steps = 0
        self._win_prefill_tokens = 0
        self.last_gen_throughput = 0.0
        self.last_accept_length = 0.0
        # The requests in the prefill step under way (0 between steps and in a decode step).
        self.prefilling = 0
        # (running, waiting) as last published for /v1/loads, and decode steps since then.
        self.load_snapshot = (0, 0)
        self._decodes_unpublished = 0

    # -- clock -------------------------------------------------------------------------------
    def now(self) -> float:
        """Simulated seconds since the engine was made."""
        return (time.monotonic() - self._t0) * self.speed

    def open(self) -> None:
        """Start scheduling (after the startup delay)."""
        self._open.set()

    # -- requests ----------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        req.arrived = self.now()
        req.cdf = self.cdf
        self.by_rid[req.rid] = req
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: SimRequest) -> bool:
        """End ``req`` as aborted; it leaves the batch before the next step. False if ended."""
        if req.done:
            return False
        req.aborted = True
        req.finish_reason = "abort"
        req.matched_stop = None
        with contextlib.suppress(ValueError):
            self.waiting.remove(req)
        self.metrics.aborted += 1
        self._finish(req, self.now())
        return True

    def abort_rid(self, rid: str) -> int:
        if not rid:
            return 0  # SGLang ignores an empty rid (it would prefix-match everything)
        if rid in self.by_rid:
            return int(self.abort(self.by_rid[rid]))
        # SGLang matches an rid prefix too (a parallel-sampling request's rids share one).
        return sum(self.abort(r) for r in list(self.by_rid.values()) if r.rid.startswith(rid))

    def abort_all(self) -> int:
        return sum(self.abort(r) for r in list(self.by_rid.values()))

    def _release(self, req: SimRequest) -> None:
        """SGLang's rule (``output_streamer.py``): the first token at once, then every
        ``stream_interval`` tokens (a speculative step may pass the mark: it waits for the next)."""
        n, every = req.generated, self.stream_interval
        if every == 1 or n % every == 1:
            req.released = n
            req.notify()

    def _finish(self, req: SimRequest, now: float) -> None:
        req.released = req.generated
        req.done = True
        req.finished_at = now
        self.by_rid.pop(req.rid, None)
        m = self.metrics
        m.num_requests[req.stream] += 1
        m.e2e[req.stream].observe(max(0.0, now - req.arrived))
        req.notify()

    # -- gauges ------------------------------------------------------------------------------
    def queued(self) -> int:
        return len(self.waiting)

    def busy(self) -> int:
        """What it runs on the GPU now, as its pair-mate's share counts it: its running requests
        and those in its prefill step (a wave's first prefill runs none yet)."""
        return len(self.running) + self.prefilling

    def used_tokens(self) -> int:
        return sum(r.prompt_tokens + r.generated for r in self.running)

    def gen_throughput(self) -> float:
        """Output tok/s (simulated) over the last full window, or the current one before that."""
        # SGLang decays the figure to 0 once decode stats stop arriving.
        if self.now() - self._win_start > 3 * GEN_WINDOW_S and not self.running:
            return 0.0
        if self.last_gen_throughput == 0.0 and self._win_tokens:
            elapsed = self.now() - self._win_start
            return self._win_tokens / elapsed if elapsed > 0 else 0.0
        return self.last_gen_throughput

    def accept_length(self) -> float:
        """Mean tokens per request per decode step, as sglang:spec_accept_length reports it."""
        if self.last_accept_length == 0.0 and self._win_req_steps:
            return (self._win_tokens - self._win_prefill_tokens) / self._win_req_steps
        return self.last_accept_length

    def publish_load(self) -> None:
        """Write the /v1/loads snapshot from the batch and the queue as they are now."""
        running = sum(1 for r in self.running if not r.done)
        self.load_snapshot = (running, len(self.waiting))
        self._decodes_unpublished = 0

    # -- the scheduler loop -----------------------------------------------------------------
    async def run(self) -> None:
        await self._open.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        self._win_start = self.now()
        while True:
            if not self.running and not self.waiting:
                self.publish_load()  # SGLang's on_idle
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                # Throughput is averaged over busy time only, as SGLang's decode log interval is.
                self._win_start = self.now()
                self._win_tokens = self._win_req_steps = self._win_prefill_tokens = 0
                continue
            admit: list[SimRequest] = []
            room = self.max_running - len(self.running)
            while room > 0 and self.waiting:
                admit.append(self.waiting.popleft())
                room -= 1
            if admit:
                duration = self.profile.prefill_time(sum(r.prompt_tokens for r in admit))
                self.prefilling = len(admit)
            else:
                duration = self.profile.step_time(len(self.running))
            if self.shared is not None:
                # On a shared GPU the step's work goes at the share of the moment, read again
                # every SHARE_SLICE_S of it (``shared_gpu``): the mate's load changes within a
                # long step. The last slice is the step's own end (its lateness counted below).
                while duration > SHARE_SLICE_S:
                    deadline += SHARE_SLICE_S * self.shared.slowdown(self.mode) / self.speed
                    duration -= SHARE_SLICE_S
                    delay = deadline - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                duration *= self.shared.slowdown(self.mode)
            deadline += duration / self.speed
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                # Behind schedule (timers have ~1 ms resolution; a step may be shorter; or the CPU
                # is busy): run this step at once so the average rate holds. A debt too large to
                # pay back without a burst of tokens is written off and counted instead.
                lag = -delay
                st = self.stats
                st.total_lag_s += lag
                st.max_lag_s = max(st.max_lag_s, lag)
                if lag > max(duration / self.speed, LATE_S):
                    st.late_steps += 1
                if lag > MAX_DEBT_S:
                    st.dropped_s += lag
                    deadline = loop.time()
                await asyncio.sleep(0)
            self.stats.steps += 1
            self.prefilling = 0
            if admit:
                self.stats.prefill_steps += 1
                self._prefilled([r for r in admit if not r.done])
                self.publish_load()
            else:
                self._decoded()
                self._decodes_unpublished += 1
                if self._decodes_unpublished >= LOAD_PUBLISH_EVERY:
                    self.publish_load()

    def _prefilled(self, admit: list[SimRequest]) -> None:
        now = self.now()
        m = self.metrics
        for r in admit:
            m.prompt_tokens[r.stream] += r.prompt_tokens
            m.ttft[r.stream].observe(max(0.0, now - r.arrived))
            r.first_token_at = r.last_token_at = now
            if r.target <= 0:
                self._finish(r, now)
                continue
            r.generated = 1
            m.generation_tokens[r.stream] += 1
            self._win_tokens += 1
            self._win_prefill_tokens += 1
            if r.target <= 1:
                self._finish(r, now)
            else:
                self.running.append(r)
                self._release(r)

    def _decoded(self) -> None:
        now = self.now()
        m = self.metrics
        itl = m.itl
        cdf = self.cdf
        spec = self.speculative
        still: list[SimRequest] = []
        tokens = 0
        stepped = 0
        for r in self.running:
            if r.done:
                continue
            stepped += 1
            k = bisect.bisect_left(cdf, r.rng.random()) + 1 if spec else 1
            left = r.target - r.generated
            k = min(k, left)
            r.generated += k
            tokens += k
            m.generation_tokens[r.stream] += k
            itl.observe((now - r.last_token_at) / k)
            r.last_token_at = now
            if r.generated >= r.target:
                self._finish(r, now)
            else:
                still.append(r)
                if r.stream:  # a non-streamed answer only needs waking at the end
                    self._release(r)
        self._win_req_steps += stepped
        self.running = still
        self._win_tokens += tokens
        elapsed = now - self._win_start
        if elapsed >= GEN_WINDOW_S:
            self.last_gen_throughput = self._win_tokens / elapsed
            if self._win_req_steps:
                decoded = self._win_tokens - self._win_prefill_tokens
                self.last_accept_length = decoded / self._win_req_steps
            self._win_start = now
            self._win_tokens = 0
            self._win_req_steps = 0
            self._win_prefill_tokens = 0
