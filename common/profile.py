"""The speed profile of a server pair: one JSON format, one schema, one reader.

A profile describes how fast one machine serves one model in both modes, as data. It is read by
``dynspec-sim --profile`` (``launcher/sim/profile.py`` finds the file) and by the router's
``--speed-profile`` (``router/speed.py`` turns it into prior curves), and written by
``dynspec-bench profile SWEEP.jsonl``. Unknown keys are errors, at every level. Nothing here does
I/O: the callers read the file and hand over the parsed JSON. The file (schema 1)::

    {
      "schema": 1,
      "name": "seed",                      # what --profile NAME finds (shipped: profiles/NAME.json)
      "illustrative": false,               # true: made up to show an effect, not measured
      "source": "where the numbers come from, and every assumption added to them",
      "model": "org/Model-Name",           # default --served-model-name
      "context_length": 131072,            # tokens; prompt + max_tokens beyond it is a 400
      "max_total_tokens": 1000000,         # KV-cache capacity in tokens (sglang:token_usage)
      "modes": {
        "eagle": {                         # the EAGLE-3 server; "baseline": the plain one
          "throughput": [[1, 77.5], [30, 299.5], [48, 354.0]],
          "accept_length": 2.5,
          "max_accept_length": 4,
          "max_running_requests": null,
          "prefill_tokens_per_s": 20000.0,
          "prefill_overhead_s": 0.005,
          "source": "optional note for this mode"
        },
        "baseline": { ... }
      }
    }

Per mode:

- ``throughput``: ``[batch, tok/s]`` points, batch ascending from 1: the aggregate output tokens per
  second of the whole server while ``batch`` requests decode together (what closed-loop clients at
  concurrency ``batch`` measure). Between points it is interpolated linearly; beyond the last point
  it stays flat (saturation). It fixes the decode step time:
  ``step_time(b) = b * accept_length / throughput(b)``.
- ``accept_length``: mean tokens one request gains per decode step (1 without speculation). An EAGLE
  step gives each running request a sampled count in ``1..max_accept_length`` with this mean (a
  draft chain whose tokens are each accepted with one probability, stopping at the first miss), all
  sent in one stream chunk, as SGLang does.
- ``max_accept_length``: most tokens per step (EAGLE: ``speculative_num_draft_tokens``; 1 baseline).
- ``max_running_requests``: requests decoded at once; more wait in a FIFO queue. ``null`` means
  SGLang's own default: 48 for an EAGLE server (SGLang forces it), 1024 for a baseline one.
- ``prefill_tokens_per_s`` / ``prefill_overhead_s``: a prefill step for newly admitted requests
  takes ``overhead + prompt_tokens / tokens_per_s``; decoding pauses meanwhile, and the step ends
  with each new request's first token.

Optional ``calibration`` (a profile that ``dynspec-launch --calibrate`` measured): an object with
what the measurement was keyed by (``key``: model, draft, the servers' flags, SGLang version, GPU
name), when it was made (``measured_at``) and each server's own levels (``servers``); the
launcher reuses the file only while its key still matches. Readers other than the launcher
keep it as data and do not interpret it.

Optional ``sharing`` (``dynspec-sim --pair``: both servers of a pair on one GPU): one entry per way
of sharing, ``timeslice`` (CUDA time-slicing) and ``mps`` (CUDA MPS)::

    "sharing": {
      "timeslice": {
        "eagle": 0.56, "baseline": 0.58,        # each mode's share while both servers run
        "points": [[4, 16, 0.56, 0.53], ...],   # optional: [e, b, eagle share, baseline share]
        "source": "where the shares come from"
      },
      "mps": { ... }
    }

While both servers are busy (requests running or in a prefill), each one's work goes at its
share of its alone speed (0 < share <= 1; the simulator reads it again as a step goes on). With
``points`` the share is that of the measured point nearest to the current counts ``(e, b)``
(distance in log2 of each count), else the mode's constant. A
profile without ``sharing`` (or without one of the entries) gets ``DEFAULT_SHARING``.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 1
MODES = ("eagle", "baseline")
Mode = Literal["eagle", "baseline"]
EAGLE_DEFAULT_MAX_RUNNING = 48
BASELINE_DEFAULT_MAX_RUNNING = 1024
# What SGLang runs at once when max_running_requests is null (SGLang forces 48 with EAGLE).
DEFAULT_RUNNING_LIMIT = {
    "eagle": EAGLE_DEFAULT_MAX_RUNNING,
    "baseline": BASELINE_DEFAULT_MAX_RUNNING,
}


class ProfileError(ValueError):
    """A profile that cannot be found or does not follow the schema."""


@dataclass(frozen=True)
class ModeProfile:
    throughput: tuple[tuple[int, float], ...]
    accept_length: float = 1.0
    max_accept_length: int = 1
    max_running_requests: int | None = None
    prefill_tokens_per_s: float = 20000.0
    prefill_overhead_s: float = 0.005
    source: str = ""

    def __post_init__(self) -> None:
        if not self.throughput:
            raise ProfileError("throughput needs at least one [batch, tok/s] point")
        batches = [b for b, _ in self.throughput]
        if batches[0] != 1:
            raise ProfileError("throughput must start at batch 1")
        if any(batches[i + 1] <= batches[i] for i in range(len(batches) - 1)):
            raise ProfileError("throughput batches must be strictly ascending")
        if any(not (t > 0 and math.isfinite(t)) for _, t in self.throughput):
            raise ProfileError("throughput values must be positive numbers")
        if self.max_accept_length < 1:
            raise ProfileError("max_accept_length must be >= 1")
        if not 1.0 <= self.accept_length <= self.max_accept_length:
            raise ProfileError("accept_length must lie in [1, max_accept_length]")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ProfileError("max_running_requests must be >= 1 or null")
        if self.prefill_tokens_per_s <= 0 or self.prefill_overhead_s < 0:
            raise ProfileError("prefill_tokens_per_s must be > 0 and prefill_overhead_s >= 0")

    def throughput_at(self, batch: int) -> float:
        """Aggregate output tok/s with ``batch`` requests decoding (linear, flat past the end)."""
        pts = self.throughput
        if batch <= pts[0][0]:
            return pts[0][1]
        if batch >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right([b for b, _ in pts], batch)
        (b0, t0), (b1, t1) = pts[i - 1], pts[i]
        return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)

    def step_time(self, batch: int) -> float:
        """Seconds one decode step takes with ``batch`` running requests."""
        return max(1, batch) * self.accept_length / self.throughput_at(max(1, batch))

    def prefill_time(self, prompt_tokens: int) -> float:
        return self.prefill_overhead_s + prompt_tokens / self.prefill_tokens_per_s

    def accept_cdf(self) -> list[float]:
        """Cumulative probabilities of gaining 1..max_accept_length tokens in one step."""
        k = self.max_accept_length
        if k == 1:
            return [1.0]
        p = _chain_probability(self.accept_length, k)
        probs = [(p**j) * (1 - p) for j in range(k - 1)] + [p ** (k - 1)]
        cdf: list[float] = []
        total = 0.0
        for q in probs:
            total += q
            cdf.append(total)
        cdf[-1] = 1.0
        return cdf

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "throughput": [[b, t] for b, t in self.throughput],
            "accept_length": self.accept_length,
            "max_accept_length": self.max_accept_length,
            "max_running_requests": self.max_running_requests,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "prefill_overhead_s": self.prefill_overhead_s,
        }
        if self.source:
            out["source"] = self.source
        return out


SHARING_WAYS = ("timeslice", "mps")


@dataclass(frozen=True)
class ShareModel:
    """Each mode's share of its alone speed while both servers of a pair run at once."""

    eagle: float
    baseline: float
    # (e, b, eagle share, baseline share): measured mixed points; the nearest one applies.
    points: tuple[tuple[int, int, float, float], ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        shares = [self.eagle, self.baseline]
        for e, b, se, sb in self.points:
            if e < 1 or b < 1:
                raise ProfileError("sharing points need running counts >= 1")
            shares += [se, sb]
        if not all(0 < x <= 1 and math.isfinite(x) for x in shares):
            raise ProfileError("a share must lie in (0, 1]")

    def share(self, mode: str, eagle_running: int, baseline_running: int) -> float:
        if not self.points:
            return self.eagle if mode == "eagle" else self.baseline
        le, lb = math.log2(max(1, eagle_running)), math.log2(max(1, baseline_running))
        best = min(
            self.points, key=lambda p: (math.log2(p[0]) - le) ** 2 + (math.log2(p[1]) - lb) ** 2
        )
        return best[2] if mode == "eagle" else best[3]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"eagle": self.eagle, "baseline": self.baseline}
        if self.points:
            out["points"] = [list(p) for p in self.points]
        if self.source:
            out["source"] = self.source
        return out


# Measured on one H200 (the project's `dynspec-launch --gpus 0` layout, real SGLang 0.5.17, an
# 8B-shaped model, 256 words in / 128 out): `shared/data/h200-real/pair-sharing.md` section 1.
_PAIR_SHARING = "pair-sharing.md section 1 (one H200, SGLang 0.5.17, 8B, 256 in / 128 out)"
DEFAULT_SHARING: dict[str, ShareModel] = {
    "timeslice": ShareModel(
        eagle=0.56,
        baseline=0.58,
        points=(
            (4, 16, 0.56, 0.53),
            (4, 64, 0.55, 0.53),
            (16, 16, 0.59, 0.53),
            (16, 64, 0.61, 0.67),
            (32, 32, 0.50, 0.59),
        ),
        source=f"measured, CUDA time-slicing: {_PAIR_SHARING}",
    ),
    "mps": ShareModel(
        eagle=0.77,
        baseline=0.60,
        points=(
            (4, 64, 0.58, 0.69),
            (16, 16, 0.84, 0.56),
            (16, 64, 0.84, 0.73),
            (32, 32, 0.82, 0.43),
        ),
        source=f"measured, CUDA MPS: {_PAIR_SHARING}",
    ),
}


def _share_from_dict(way: str, raw: object) -> ShareModel:
    if not isinstance(raw, dict):
        raise ProfileError(f"sharing {way!r} must be an object")
    unknown = sorted(set(raw) - {"eagle", "baseline", "points", "source"})
    if unknown:
        raise ProfileError(f"sharing {way!r}: unknown key {unknown[0]!r}")
    pts = raw.get("points", [])
    if not isinstance(pts, list) or not all(isinstance(p, list) and len(p) == 4 for p in pts):
        raise ProfileError(f"sharing {way!r}: points must be [e, b, eagle share, baseline share]")
    try:
        return ShareModel(
            eagle=float(raw["eagle"]),
            baseline=float(raw["baseline"]),
            points=tuple((int(e), int(b), float(se), float(sb)) for e, b, se, sb in pts),
            source=str(raw.get("source", "")),
        )
    except KeyError as exc:
        raise ProfileError(f"sharing {way!r} lacks {exc.args[0]!r}") from None
    except ProfileError as exc:
        raise ProfileError(f"sharing {way!r}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"sharing {way!r}: {exc}") from None


def sharing_from_dict(raw: object) -> dict[str, ShareModel]:
    if not isinstance(raw, dict):
        raise ProfileError("sharing must be an object")
    unknown = sorted(set(raw) - set(SHARING_WAYS))
    if unknown:
        raise ProfileError(f"unknown sharing {unknown[0]!r} (known: timeslice, mps)")
    return {way: _share_from_dict(way, v) for way, v in raw.items()}


def _chain_probability(mean: float, k: int) -> float:
    """The per-draft-token acceptance p with sum(p**j for j in range(k)) == mean."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(k)) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    modes: dict[str, ModeProfile]
    illustrative: bool = False
    model: str = "simulated-model"
    context_length: int = 131072
    max_total_tokens: int = 1_000_000
    extra: dict[str, Any] = field(default_factory=dict)
    # The profile's own sharing entries (only those it has; see ``share_model``).
    sharing: dict[str, ShareModel] = field(default_factory=dict)
    # What a launcher's calibration recorded (its cache key, time, per-server levels), as JSON.
    calibration: dict[str, Any] | None = None

    def share_model(self, way: str) -> ShareModel:
        """The profile's entry for ``way`` (timeslice or mps), else the measured default."""
        if way not in SHARING_WAYS:
            raise ProfileError(f"unknown sharing {way!r} (known: timeslice, mps)")
        return self.sharing.get(way) or DEFAULT_SHARING[way]

    def mode(self, mode: str) -> ModeProfile:
        try:
            return self.modes[mode]
        except KeyError:
            raise ProfileError(f"profile {self.name!r} has no {mode!r} mode") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "illustrative": self.illustrative,
            "source": self.source,
            "model": self.model,
            "context_length": self.context_length,
            "max_total_tokens": self.max_total_tokens,
            "modes": {m: p.to_dict() for m, p in self.modes.items()},
            **(
                {"sharing": {w: m.to_dict() for w, m in self.sharing.items()}}
                if self.sharing
                else {}
            ),
            **({"calibration": self.calibration} if self.calibration is not None else {}),
            **self.extra,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def mode_from_dict(name: str, raw: object) -> ModeProfile:
    if not isinstance(raw, dict):
        raise ProfileError(f"mode {name!r} must be an object")
    known = {
        "throughput",
        "accept_length",
        "max_accept_length",
        "max_running_requests",
        "prefill_tokens_per_s",
        "prefill_overhead_s",
        "source",
    }
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProfileError(f"mode {name!r}: unknown key {unknown[0]!r}")
    pts = raw.get("throughput")
    pairs = "throughput must be a list of [batch, tok/s] pairs"
    if not isinstance(pts, list) or not all(isinstance(p, list) and len(p) == 2 for p in pts):
        raise ProfileError(f"mode {name!r}: {pairs}")
    try:
        throughput = []
        for b, t in pts:
            batch = _number(b, "a throughput batch")
            if batch != int(batch):
                raise ProfileError("throughput batches must be whole numbers")
            throughput.append((int(batch), _number(t, "a throughput value")))
        limit = raw.get("max_running_requests")
        return ModeProfile(
            throughput=tuple(throughput),
            accept_length=_number(raw.get("accept_length", 1.0), "accept_length"),
            max_accept_length=int(_number(raw.get("max_accept_length", 1), "max_accept_length")),
            max_running_requests=(
                None if limit is None else int(_number(limit, "max_running_requests"))
            ),
            prefill_tokens_per_s=_number(
                raw.get("prefill_tokens_per_s", 20000.0), "prefill_tokens_per_s"
            ),
            prefill_overhead_s=_number(raw.get("prefill_overhead_s", 0.005), "prefill_overhead_s"),
            source=str(raw.get("source", "")),
        )
    except ProfileError as exc:
        raise ProfileError(f"mode {name!r}: {exc}") from None


def _number(value: object, what: str) -> float:
    """A JSON number (not a bool, not a string), finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileError(f"{what} must be a number")
    return float(value)


def profile_from_dict(raw: object, *, require_meta: bool = True) -> Profile:
    """The profile in ``raw`` (parsed JSON). ``require_meta``: a file must say its ``name`` and
    ``source`` (the simulator's profiles); the router's ``--speed-profile`` needs only ``modes``.
    Unknown keys are errors; so is anything the schema does not allow."""
    if not isinstance(raw, dict):
        raise ProfileError("a profile must be a JSON object")
    if raw.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ProfileError(f"unsupported profile schema {raw.get('schema')!r}")
    for key in ("name", "source") if require_meta else ():
        if key not in raw:
            raise ProfileError(f"profile lacks {key!r}")
    modes_raw = raw.get("modes")
    if not isinstance(modes_raw, dict) or not modes_raw:
        raise ProfileError("a profile needs a non-empty 'modes' object")
    unknown = sorted(set(modes_raw) - set(MODES))
    if unknown:
        raise ProfileError(f"unknown mode {unknown[0]!r} (known: eagle, baseline)")
    top = {
        "schema",
        "name",
        "illustrative",
        "source",
        "model",
        "context_length",
        "max_total_tokens",
        "sharing",
        "calibration",
        "modes",
    }
    extra = sorted(set(raw) - top)
    if extra:
        raise ProfileError(f"unknown profile key {extra[0]!r}")
    calibration = raw.get("calibration")
    if calibration is not None and not isinstance(calibration, dict):
        raise ProfileError("calibration must be an object")
    try:
        return Profile(
            name=str(raw.get("name", "")),
            source=str(raw.get("source", "")),
            modes={m: mode_from_dict(m, v) for m, v in modes_raw.items()},
            illustrative=bool(raw.get("illustrative", False)),
            model=str(raw.get("model", "simulated-model")),
            context_length=int(raw.get("context_length", 131072)),
            max_total_tokens=int(raw.get("max_total_tokens", 1_000_000)),
            sharing=sharing_from_dict(raw["sharing"]) if "sharing" in raw else {},
            calibration=calibration,
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(str(exc)) from None
