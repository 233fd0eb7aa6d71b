"""GPU sets: parse ``0-7`` / ``0,1,2,3`` / ``0-3,6,7``, split them into the two pools, name them."""

from __future__ import annotations

from collections.abc import Sequence

from dynspec.common.cli import UsageError

GpuIds = tuple[int, ...]


def parse_gpus(text: str, flag: str = "--gpus") -> GpuIds:
    """Parse a GPU list of ranges and single ids, in the order given; duplicates are an error."""
    gpus: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise UsageError(f"{flag}: {part!r} is not a GPU id or range like 0-3") from None
        if lo < 0 or hi < lo:
            raise UsageError(f"{flag}: {part!r} is not a valid range (want low-high, low <= high)")
        gpus.extend(range(lo, hi + 1))
    if not gpus:
        raise UsageError(f"{flag}: no GPUs given (e.g. {flag} 0-7)")
    seen: set[int] = set()
    for gpu in gpus:
        if gpu in seen:
            raise UsageError(f"{flag}: GPU {gpu} is listed twice")
        seen.add(gpu)
    return tuple(gpus)


def split_halves(gpus: Sequence[int]) -> tuple[GpuIds, GpuIds]:
    """First half for the EAGLE server, second half for the baseline server; one GPU: both."""
    if not gpus:
        raise UsageError("--gpus: no GPUs given")
    if len(gpus) == 1:
        # Both servers on the one GPU, each with its share of its memory (see sharing.py).
        return tuple(gpus), tuple(gpus)
    if len(gpus) % 2:
        raise UsageError(
            f"--gpus: {len(gpus)} GPUs cannot be split into two equal halves "
            "(give an even count, one GPU for both, or --eagle-gpus and --baseline-gpus)"
        )
    half = len(gpus) // 2
    return tuple(gpus[:half]), tuple(gpus[half:])


def format_gpus(gpus: Sequence[int]) -> str:
    """Compact form: ``0-3``, ``0,2,5``, ``0-3,6,7`` (ranges of three or more are folded)."""
    parts: list[str] = []
    i = 0
    while i < len(gpus):
        j = i
        while j + 1 < len(gpus) and gpus[j + 1] == gpus[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{gpus[i]}-{gpus[j]}")
        else:
            parts.extend(str(g) for g in gpus[i : j + 1])
        i = j + 1
    return ",".join(parts)


def parse_visible(value: str | None) -> tuple[str, ...] | None:
    """The launcher's own ``CUDA_VISIBLE_DEVICES`` (ids, UUIDs or MIG names); None when unset."""
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


def check_visible(gpus: Sequence[int], visible: Sequence[str] | None) -> None:
    """Every index must name a GPU of the visible set, when the launcher was given one."""
    if visible is None:
        return
    outside = [g for g in gpus if g >= len(visible)]
    if outside:
        shown = ",".join(visible)
        raise UsageError(
            f"GPU {outside[0]} is not visible: CUDA_VISIBLE_DEVICES={shown} shows "
            f"{len(visible)} GPU(s), which --gpus counts from 0"
            + (f" to {len(visible) - 1}" if visible else "")
        )


def visible_devices(gpus: Sequence[int], visible: Sequence[str] | None = None) -> str:
    """The value of ``CUDA_VISIBLE_DEVICES`` for these GPUs.

    Where the launcher itself runs with ``CUDA_VISIBLE_DEVICES`` set (Slurm, containers), GPU
    indices count within that set, as CUDA counts them: with ``4,5`` visible, GPU 0 is GPU 4.
    """
    if visible is None:
        return ",".join(str(g) for g in gpus)
    return ",".join(visible[g] for g in gpus)


def split_gpu_sets(gpus: GpuIds, tp: int, simulate: bool = False) -> tuple[GpuIds, ...]:
    """GPU sets of ``tp`` GPUs, in the order given; none known yet: none (or one simulated)."""
    if not gpus:
        return ((),) if simulate else ()
    if len(gpus) % tp:
        raise UsageError(
            f"--tp {tp} does not divide the {len(gpus)} GPU(s) given: each pair needs {tp} "
            f"(e.g. --tp {_divisor_hint(len(gpus), tp)})"
        )
    return tuple(tuple(gpus[i : i + tp]) for i in range(0, len(gpus), tp))


def _divisor_hint(count: int, tp: int) -> int:
    return max(d for d in range(1, count + 1) if count % d == 0 and d <= tp)
