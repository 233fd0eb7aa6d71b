"""What a launch finds out, apart from what its flags say: one record, made once.

``LaunchConfig`` (config.py) is the flags; ``LaunchFacts`` is what the launch discovers: the GPUs
when no ``--gpus`` names them (every visible GPU, else every one ``nvidia-smi`` lists) and the
layout and GPU sets they make, for GPUs both servers share their memory and the models' shapes
and sizes, the MPS control binary, and for a calibration the SGLang version and GPU name. The
builders, the checks, the calibration and the supervisor read both records and change neither.

``discover`` asks the machine (``probe.py``) and the model folders (``sharing.py``);
``flag_facts`` is what the flags alone tell, asking nothing (for the pure builders' tests).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass

from dynspec.common.cli import UsageError
from dynspec.launcher.config import LaunchConfig
from dynspec.launcher.gpus import GpuIds, split_gpu_sets, split_halves, visible_devices
from dynspec.launcher.layout import GpuSet, gpu_sets_of
from dynspec.launcher.probe import (
    find_mps_control,
    gpu_memory_gib,
    gpu_names,
    installed_sglang,
    list_gpus,
    sglang_version,
)
from dynspec.launcher.sharing import ModelShape, read_model_shape, weights_on_disk
from dynspec.launcher.sim.profile import ProfileError, load_profile


@dataclass(frozen=True)
class LaunchFacts:
    layout: str  # the launch's: "paired" when the one GPU found holds both servers
    gpu_sets: tuple[GpuSet, ...]
    # GPUs both servers share: the smallest GPU's memory, the models' shapes and weights' bytes
    # on disk (safetensors), to size each server's share; None where unknown.
    gpu_memory_gib: float | None = None
    target_shape: ModelShape | None = None
    draft_shape: ModelShape | None = None
    target_weight_bytes: int | None = None
    draft_weight_bytes: int | None = None
    mps_control: str | None = None  # --mps on real GPUs: the control binary
    # What a calibration is keyed by (None when the launch does not calibrate).
    sglang_version: str | None = None
    gpu_name: str | None = None

    @property
    def shares_gpu(self) -> bool:
        """Both servers of each GPU set on the same GPUs (the paired layout on real GPUs): they
        start one after the other, each with half of the memory."""
        return self.layout == "paired" and any(s.shared for s in self.gpu_sets)


def flag_facts(config: LaunchConfig) -> LaunchFacts:
    """What the flags alone say: their layout and GPU sets, nothing read from the machine."""
    sets = gpu_sets_of(
        config, config.layout, config.eagle_gpus, config.baseline_gpus, config.paired_gpus
    )
    return LaunchFacts(config.layout, sets)


def _placement(config: LaunchConfig) -> tuple[str, GpuIds, GpuIds, tuple[GpuIds, ...]]:
    """(layout, EAGLE GPUs, baseline GPUs, GPU sets' GPUs): the flags', or with no --gpus every
    visible GPU (else every GPU nvidia-smi lists), split in halves (or in sets of --tp GPUs
    with --layout paired; one GPU found holds both servers)."""
    if config.simulate or (config.eagle_gpus and config.baseline_gpus):
        return config.layout, config.eagle_gpus, config.baseline_gpus, config.paired_gpus
    visible = config.visible_gpus
    try:
        found = list_gpus() if visible is None else tuple(range(len(visible)))
        if config.layout == "paired":
            return "paired", found, found, split_gpu_sets(found, config.tp)
        eagle, baseline = split_halves(found)
    except UsageError as exc:
        raise UsageError(f"no --gpus given, and {exc}") from None
    if eagle == baseline:  # one GPU found: a one-set paired layout
        return "paired", eagle, baseline, (eagle,)
    return "split", eagle, baseline, ()


def _calibration_key_facts(config: LaunchConfig, gpu_sets: tuple[GpuSet, ...]) -> tuple[str, str]:
    """The SGLang version and the GPU name a calibration is keyed by (simulated: dynspec-sim's
    version and its profile's name and content stand in)."""
    if config.simulate:
        try:
            content = load_profile(config.sim_profile).dumps().encode()
            digest = hashlib.sha256(content).hexdigest()[:12]
        except ProfileError:
            digest = "unreadable"
        version = importlib.metadata.version("dynspec")
        return f"dynspec-sim {version}", f"simulated (profile {config.sim_profile}, {digest})"
    installed = installed_sglang()
    sglang = (
        f"SGLang {installed}"
        if installed
        else f"SGLang (not installed here; pinned {sglang_version()})"
    )
    gpus = sorted({g for s in gpu_sets for g in (*s.eagle_gpus, *s.baseline_gpus)})
    names = gpu_names([visible_devices((g,), config.visible_gpus) for g in gpus])
    return sglang, " + ".join(names) or "an unknown GPU (nvidia-smi named none)"


def discover(config: LaunchConfig) -> LaunchFacts:
    """Everything the launch needs to know beyond its flags, asked once (what a calibration's
    cache key names only when the launch calibrates)."""
    layout, eagle, baseline, paired = _placement(config)
    gpu_sets = gpu_sets_of(config, layout, eagle, baseline, paired)
    shared = layout == "paired" and not config.simulate
    memory: float | None = None
    if shared:
        devices = [visible_devices((g,), config.visible_gpus) for g in eagle]
        sizes = [gpu_memory_gib(d) for d in devices]
        known = [m for m in sizes if m is not None]
        memory = min(known) if known and len(known) == len(sizes) else None
    calibrating = config.calibration_off() is None
    sglang, gpu = _calibration_key_facts(config, gpu_sets) if calibrating else (None, None)
    return LaunchFacts(
        layout,
        gpu_sets,
        gpu_memory_gib=memory,
        target_shape=read_model_shape(config.model_path) if shared else None,
        draft_shape=read_model_shape(config.draft_model_path, draft=True) if shared else None,
        target_weight_bytes=weights_on_disk(config.model_path) if shared else None,
        draft_weight_bytes=weights_on_disk(config.draft_model_path) if shared else None,
        mps_control=find_mps_control() if config.mps and not config.simulate else None,
        sglang_version=sglang,
        gpu_name=gpu,
    )
