"""This host's platform fingerprint for torch-xla's executables, read without the devices.

Why without them: the adapter activates when the program imports torch_xla, and opening
the PJRT client there would take the TPU from the worker processes that `xmp.spawn`
starts next (and fix device settings the program has yet to make). So the facts are read
where torch-xla reads them before its client starts: torch's and torch-xla's versions
and XLA revision, the PJRT device type (`PJRT_DEVICE`, as torch-xla chose it on import)
and its plugin's version, the accelerators attached (TPU chips by their PCI ids, NVIDIA
GPUs by the driver's model names, `CPU_NUM_DEVICES` CPU devices), the topology and
compiler variables that change what XLA builds, and this host's CPU instruction set (as
the JAX path's fingerprint: config.host). An executable built under any other such
facts has another fingerprint, and is never placed here.
"""

from __future__ import annotations

import glob
import hashlib
import os
from importlib import metadata
from pathlib import Path

from artifactstore.config import host
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.torchxla import PLATFORM

_GOOGLE_PCI_VENDOR = "0x1ae0"
# Variables that change what XLA compiles or for which topology: their values are part of
# the fingerprint (as a digest). Per-process ids (TPU_VISIBLE_CHIPS, CUDA_VISIBLE_DEVICES)
# are counted, not kept: every worker of one job has its own, and all build the same.
_COMPILER_VARS = (
    "XLA_FLAGS",
    "LIBTPU_INIT_ARGS",
    "XLA_USE_SPMD",
    "XLA_USE_BF16",
    "XLA_DOWNCAST_BF16",
    "TPU_ACCELERATOR_TYPE",
    "TPU_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_HOST_BOUNDS",
    "CPU_NUM_DEVICES",
    "GPU_NUM_DEVICES",
)
_COUNTED_VARS = ("TPU_VISIBLE_CHIPS", "CUDA_VISIBLE_DEVICES")


def fingerprint() -> Fingerprint:
    """The fingerprint of executables torch-xla builds in this process (torch_xla imported)."""
    import torch
    import torch_xla
    from torch_xla import version

    device = (os.environ.get("PJRT_DEVICE") or "CPU").split("_")[0].upper()
    kind, count = devices(device)
    revision = str(getattr(version, "__xla_gitrev__", ""))[:12]
    described = f"{device}; pjrt {plugin_version(device)}; xla {revision}; env {_env_digest()}"
    return host.compute(
        platform_name=PLATFORM,
        platform_version=described[:255],
        device_kind=kind[:255],
        device_count=count,
        jax_version=str(torch.__version__)[:32],
        jaxlib_version=str(torch_xla.__version__)[:32],
    )


def devices(device: str) -> tuple[str, int]:
    """(device kind, device count) of the accelerators `device` names, from the host."""
    if device == "CPU":
        return "cpu", _int(os.environ.get("CPU_NUM_DEVICES"), 1)
    if device == "TPU":
        ids = sorted(_tpu_chip_ids())
        return f"tpu {'+'.join(sorted(set(ids))) or 'unknown'}", len(ids)
    if device in ("CUDA", "GPU"):
        models = _nvidia_models()
        return f"cuda {'+'.join(sorted(set(models))) or 'unknown'}", len(models)
    return device.lower(), 0


def plugin_version(device: str) -> str:
    """The version of the PJRT plugin torch-xla loads for `device` (CPU: its own)."""
    if device == "TPU":
        path = os.environ.get("TPU_LIBRARY_PATH")
        if path:
            return f"libtpu at {path}"
        return _dist_version("libtpu", "libtpu-nightly")
    if device in ("CUDA", "GPU"):
        return _dist_version("torch_xla_cuda_plugin", "torch-xla-cuda-plugin")
    return "builtin"


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _tpu_chip_ids() -> list[str]:
    """The PCI device ids of the Google accelerators on this host, one per chip."""
    found = []
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() != _GOOGLE_PCI_VENDOR:
                continue
            found.append((Path(vendor).parent / "device").read_text().strip()[:16])
        except OSError:
            continue
    return found


def _nvidia_models() -> list[str]:
    """The model of each NVIDIA GPU the driver lists, without initializing CUDA."""
    models = []
    for info in glob.glob("/proc/driver/nvidia/gpus/*/information"):
        try:
            for line in Path(info).read_text().splitlines():
                name, _, value = line.partition(":")
                if name.strip() == "Model":
                    models.append(value.strip()[:64])
                    break
        except OSError:
            continue
    return models


def _env_digest() -> str:
    """A digest of the compiler and topology variables set for this process."""
    facts = [f"{name}={os.environ[name]}" for name in _COMPILER_VARS if name in os.environ]
    for name in _COUNTED_VARS:
        if name in os.environ:
            facts.append(f"{name}#{len([p for p in os.environ[name].split(',') if p])}")
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value else default
    except ValueError:
        return default
