"""What a launch finds out, apart from what its flags say: one record, made once.

``LaunchConfig`` (config.py) is the flags; ``LaunchFacts`` is what the launch discovers: the GPUs
when no ``--gpus`` names them (every visible GPU, else every one ``nvidia-smi`` lists) and the
layout and GPU sets they make (``layout.py``), for GPUs both servers share their memory and the
models' ``config.json`` and sizes, the MPS control binary, for a calibration the SGLang version,
the GPU name, the simulator's profile and the profiles cached under ``LOG_DIR/calibration/``,
and for the checks before a start what they look at (the GPUs listed, SGLang, the model folders,
the ports). The plan (``plan.py``) and the supervisor read it and change nothing in it.

``discover`` is the one step of a launch that asks the machine (``probe.py``, and the profile
files), and it asks only what this launch needs; ``flag_facts`` is what the flags alone tell,
asking nothing (for the pure builders' tests and the bench's routers).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynspec.common.cli import UsageError
from dynspec.launcher import probe
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.layout import GpuSet, place
from dynspec.launcher.sharing import ModelShape, SharedGpuPlan, plan_shared_gpu, shape_of
from dynspec.launcher.sim.profile import Profile, ProfileError, load_profile


@dataclass(frozen=True)
class LaunchFacts:
    layout: str  # the launch's: "paired" when the one GPU found holds both servers
    gpu_sets: tuple[GpuSet, ...]
    # GPUs both servers share: the smallest GPU's memory, the models' config.json and weights'
    # bytes on disk (safetensors), to size each server's share; None where unknown. The
    # target's config.json also gives its heads (the tp check) on real GPUs.
    gpu_memory_gib: float | None = None
    target_config: Mapping[str, Any] | None = None
    draft_config: Mapping[str, Any] | None = None
    target_weight_bytes: int | None = None
    draft_weight_bytes: int | None = None
    mps_control: str | None = None  # --mps on real GPUs: the control binary
    # What a calibration is keyed by (None when the launch does not calibrate), the simulator's
    # profile it reads the running limits of, and the cached profiles by file name (a profile,
    # or why it could not be read).
    sglang_version: str | None = None
    gpu_name: str | None = None
    sim_profile: Profile | str | None = None  # str: why it could not be read
    cached: tuple[tuple[str, Profile | str], ...] = ()
    # What the checks before a start look at (a launch that starts, not --dry-run nor
    # --no-preflight): the GPUs nvidia-smi lists (or why none), SGLang, the model folders
    # ("dir", "file" or "none"), and every port that is taken, in the order they are checked.
    checked: bool = False
    listed_gpus: tuple[int, ...] | str = ()
    sglang_importable: bool = True
    sglang_installed: str | None = None
    sglang_pin: str = ""
    path_kinds: tuple[str, str] = ("", "")
    ports_taken: tuple[str, ...] = ()

    @property
    def shares_gpu(self) -> bool:
        """Both servers of each GPU set on the same GPUs (the paired layout on real GPUs): they
        start one after the other, each with half of the memory."""
        return self.layout == "paired" and any(s.shared for s in self.gpu_sets)

    @property
    def target_shape(self) -> ModelShape | None:
        return shape_of(self.target_config)

    @property
    def draft_shape(self) -> ModelShape | None:
        return shape_of(self.draft_config, draft=True)

    def shared_gpu_plan(self) -> SharedGpuPlan | None:
        """Each server's share of GPUs both hold (None: no GPU is shared)."""
        if not self.shares_gpu:
            return None
        return plan_shared_gpu(
            self.gpu_memory_gib,
            self.target_shape,
            self.draft_shape,
            tp=len(self.gpu_sets[0].eagle_gpus),
            target_bytes=self.target_weight_bytes,
            draft_bytes=self.draft_weight_bytes,
        )


def flag_facts(config: LaunchConfig) -> LaunchFacts:
    """What the flags alone say: their layout and GPU sets, nothing read from the machine."""
    return LaunchFacts(*place(config))


def _found_gpus(config: LaunchConfig) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(the GPUs to place with no --gpus: every visible one, else every one nvidia-smi lists;
    None: the flags'), and what nvidia-smi listed if it was asked."""
    if config.simulate or (config.eagle_gpus and config.baseline_gpus):
        return None, None
    if config.visible_gpus is not None:
        return tuple(range(len(config.visible_gpus))), None
    try:
        listed = probe.list_gpus()
    except UsageError as exc:
        raise UsageError(f"no --gpus given, and {exc}") from None
    return listed, listed


def _devices(gpu_sets: tuple[GpuSet, ...]) -> dict[int, str]:
    """Each GPU of the launch by its CUDA_VISIBLE_DEVICES name, in GPU order."""
    named: dict[int, str] = {}
    for s in gpu_sets:
        for pool in ("eagle", "baseline"):
            named.update(zip(s.gpus(pool), s.devices_of(pool).split(","), strict=True))
    return dict(sorted(named.items()))


Cached = tuple[tuple[str, Profile | str], ...]


def cached_profiles(log_dir: Path) -> Cached:
    """Every profile cached under LOG_DIR/calibration/ by file name (or why it is unreadable)."""
    cached: list[tuple[str, Profile | str]] = []
    folder = log_dir.resolve() / "calibration"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            cached.append((path.name, load_profile(str(path))))
        except ProfileError as exc:
            cached.append((path.name, str(exc)))
    return tuple(cached)


def _profiles(config: LaunchConfig) -> tuple[Profile | str | None, str, Cached]:
    """For a calibration: the simulator's profile (simulated; why not when unreadable) and its
    digest, and the cached profiles."""
    sim: Profile | str | None = None
    digest = ""
    if config.simulate:
        try:
            profile = load_profile(config.sim_profile)
            sim, digest = profile, hashlib.sha256(profile.dumps().encode()).hexdigest()[:12]
        except ProfileError as exc:
            sim, digest = str(exc), "unreadable"
    return sim, digest, cached_profiles(config.log_dir)


def discover(config: LaunchConfig) -> LaunchFacts:
    """Everything the launch needs to know beyond its flags, asked once (what a calibration's
    cache key names only when the launch calibrates; what the checks look at only when they
    run)."""
    found, listed = _found_gpus(config)
    layout, gpu_sets = place(config, found)
    real = not config.simulate
    shared = layout == "paired" and real
    calibrating = config.calibration_off() is None
    checking = config.preflight and not config.dry_run
    devices = _devices(gpu_sets) if real else {}
    # Every question to the machine in one go: GPUs, SGLang, MPS, model folders, ports.
    memory: float | None = None
    if shared:
        sizes = [probe.gpu_memory_gib(d) for d in devices.values()]
        known = [m for m in sizes if m is not None]
        memory = min(known) if known and len(known) == len(sizes) else None
    installed = probe.installed_sglang() if real and (calibrating or checking) else None
    pin = probe.sglang_version() if real and (calibrating or checking) else ""
    sglang = gpu = None
    if calibrating and real:
        sglang = (
            f"SGLang {installed}" if installed else f"SGLang (not installed here; pinned {pin})"
        )
        names = probe.gpu_names(list(devices.values()))
        gpu = " + ".join(names) or "an unknown GPU (nvidia-smi named none)"
    importable, kinds = True, ("", "")
    checked_gpus: tuple[int, ...] | str = listed or ()
    if checking and real:
        importable = probe.sglang_importable()
        if listed is None:  # the GPUs were named, not found: the check asks nvidia-smi
            try:
                checked_gpus = probe.list_gpus()
            except UsageError as exc:
                checked_gpus = str(exc)
        kinds = (probe.path_kind(config.model_path), probe.path_kind(config.draft_model_path))
    taken = _ports_taken(config, gpu_sets) if checking else ()
    target = probe.model_config(config.model_path) if real else None
    draft = probe.model_config(config.draft_model_path) if shared else None
    target_bytes = probe.weights_on_disk(config.model_path) if shared else None
    draft_bytes = probe.weights_on_disk(config.draft_model_path) if shared else None
    mps = probe.find_mps_control() if config.mps and real else None
    sim: Profile | str | None = None
    cached: Cached = ()
    if calibrating:
        sim, digest, cached = _profiles(config)
        if not real:
            sglang = f"dynspec-sim {importlib.metadata.version('dynspec')}"
            gpu = f"simulated (profile {config.sim_profile}, {digest})"
    return LaunchFacts(
        layout,
        gpu_sets,
        gpu_memory_gib=memory,
        target_config=target,
        draft_config=draft,
        target_weight_bytes=target_bytes,
        draft_weight_bytes=draft_bytes,
        mps_control=mps,
        sglang_version=sglang,
        gpu_name=gpu,
        sim_profile=sim,
        cached=cached,
        checked=checking,
        listed_gpus=checked_gpus,
        sglang_importable=importable,
        sglang_installed=installed,
        sglang_pin=pin,
        path_kinds=kinds,
        ports_taken=taken,
    )


def _ports_taken(config: LaunchConfig, gpu_sets: tuple[GpuSet, ...]) -> tuple[str, ...]:
    """Every port the launch listens on that is taken now: the router's, then each server's."""
    wanted: list[tuple[str, int, str]] = []
    if not config.no_router:
        wanted.append((config.host, config.port, "router"))
    for gpu_set in gpu_sets:
        for pool, what in (("eagle", "EAGLE"), ("baseline", "baseline")):
            tag = f" of pair {gpu_set.index}" if gpu_set.count > 1 else ""
            wanted.append((config.backend_host, gpu_set.port(pool), f"{what} server{tag}"))
    problems = (probe.port_problem(host, port, what) for host, port, what in wanted)
    return tuple(p for p in problems if p is not None)
