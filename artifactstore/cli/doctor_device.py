"""`artstore doctor`'s rows about the accelerator, read without holding it.

Opening JAX's backend on a TPU takes 10-15 s and holds the chip while the process
lives: on the host of a running training job it fails (or JAX falls back to the CPU
and reports the wrong fingerprint), and anywhere it makes doctor slow. So what can be
read without a backend (JAX_PLATFORMS, installed PJRT plugins and libtpu, device
nodes) is, and the backend is opened only for the fingerprint (device kind, count,
platform version): with `--device`, or by itself where JAX_PLATFORMS names cpu alone
(nothing to hold). The row says when it was opened and what that cost.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any, Literal

from artifactstore.errors import one_line

Row = tuple[Literal["ok", "warn", "skip"], str, dict[str, Any]]  # status, detail, data

# Device nodes that show an accelerator is attached, without opening it.
_NODES = {
    "tpu": ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*"),
    "cuda": ("/dev/nvidia[0-9]*",),
    "rocm": ("/dev/kfd",),
}
_OPEN_COST = {"tpu": "10-15 s, and holds the chip meanwhile", "cpu": "under a second"}


def _plugins() -> dict[str, str]:
    """Installed PJRT plugins as JAX discovers them (entry points and the `jax_plugins`
    namespace), and libtpu: name -> where from. Nothing is imported."""
    import importlib.metadata
    import importlib.util
    import pkgutil

    found: dict[str, str] = {}
    try:
        for ep in importlib.metadata.entry_points(group="jax_plugins"):
            found[ep.name] = ep.value
    except Exception:
        pass
    try:
        spec = importlib.util.find_spec("jax_plugins")
        paths = list(spec.submodule_search_locations or []) if spec is not None else []
        for info in pkgutil.iter_modules(paths):
            found.setdefault(info.name, f"jax_plugins.{info.name}")
    except Exception:
        pass
    for dist in ("libtpu", "libtpu-nightly"):
        try:
            found.setdefault("libtpu", f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _platform_of(plugin: str) -> str | None:
    name = plugin.lower()
    for platform in ("tpu", "cuda", "rocm"):
        if platform in name:
            return platform
    return None


def _nodes() -> dict[str, list[str]]:
    return {p: sorted(n for g in globs for n in glob.glob(g)) for p, globs in _NODES.items()}


def expected_backend() -> tuple[str, str, dict[str, Any]]:
    """(the platform JAX would open by default, why, the facts), without opening it."""
    chosen = [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    plugins = _plugins()
    nodes = _nodes()
    data: dict[str, Any] = {
        "jax_platforms": ",".join(chosen) or None,
        "plugins": plugins,
        "device_nodes": [n for ns in nodes.values() for n in ns],
    }
    if chosen:
        return chosen[0], f"JAX_PLATFORMS={','.join(chosen)}", data
    for platform in ("tpu", "cuda", "rocm"):  # JAX's priority among what is installed
        names = [n for n in plugins if _platform_of(n) == platform]
        if names and nodes[platform]:
            return platform, f"{', '.join(names)} installed, {nodes[platform][0]} present", data
    installed = [n for n in plugins if _platform_of(n)]
    why = (
        f"{', '.join(installed)} installed, but no device seen"
        if installed
        else ("no accelerator plugin installed")
    )
    return "cpu", why, data


def check_backend() -> Row:
    """The `accelerator` row: (status, detail, data). Never opens the backend."""
    platform, why, data = expected_backend()
    data["expected"] = platform
    plugins = data["plugins"]
    have = ", ".join(f"{k} ({v})" for k, v in sorted(plugins.items())) or "none"
    return "ok", f"JAX would open {platform} ({why}); plugins: {have}; not opened", data


def opens_by_itself() -> bool:
    """Whether doctor opens the backend without `--device`: only where JAX_PLATFORMS
    limits JAX to the CPU, which opens in well under a second and holds nothing."""
    chosen = {p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()}
    return chosen == {"cpu"}


def check_fingerprint(device: bool | None) -> Row:
    """The `fingerprint` row: (status, detail, data). Opens JAX's default backend only
    with `device` True, or (None: not said) where `opens_by_itself`."""
    expected, _, _ = expected_backend()
    if not (device or (device is None and opens_by_itself())):
        cost = _OPEN_COST.get(expected, "seconds, and holds the device meanwhile")
        return (
            "skip",
            (
                f"not read: it needs JAX's {expected} backend opened ({cost}); "
                "`artstore doctor --device` opens it"
            ),
            {"opened": False},
        )
    try:
        from artifactstore.jaxhook import host_fingerprint

        started = time.monotonic()
        fp = host_fingerprint()
        secs = time.monotonic() - started
    except Exception as exc:
        return "warn", f"opened JAX's backend: failed ({one_line(exc)})", {"opened": True}
    took = f"{secs:.1f} s" if secs >= 1 else f"{secs * 1000:.0f} ms"
    detail = (
        f"opened the {fp.platform.upper()} backend to read it ({took}): "
        f"{fp.platform}, {fp.device_count} x {fp.device_kind}, jax {fp.jax_version}, "
        f"jaxlib {fp.jaxlib_version}, {fp.cpu_arch}, digest {fp.digest[:16]}"
    )
    status: Literal["ok", "warn"] = "ok"
    if expected != "cpu" and fp.platform == "cpu":
        status = "warn"
        detail += (
            f"; JAX fell back to the CPU: the {expected} did not open (held by another process?)"
        )
    data = {**fp.to_dict(), "digest": fp.digest, "opened": True, "open_secs": round(secs, 3)}
    return status, detail, data
