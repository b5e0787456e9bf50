"""`artstore doctor`: would the store be used here, and if not, why and what to do.

A program whose store is misconfigured, unreachable or unhookable still runs:
it compiles as usual, logs one line and is silently slower. This gathers every
fact that decides it in one report, without changing anything (no index or
directory is created, no migration applied), each network check bounded by
ARTSTORE_TIMEOUT, and never a secret in any message.

It never aborts: whatever it cannot check (a directory this user may not read, a
server that does not answer) is a row saying so. Each row says what a program here
would do (use the store read-write, read-only, or not at all), and the exit code
whether programs would use it as configured (`doctor_report`: 0 yes, 1 no or degraded).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from artifactstore import config as _config
from artifactstore.cli import doctor_chain, doctor_store
from artifactstore.cli.doctor_report import Check, Report, conclude, scrub
from artifactstore.errors import ConfigError, one_line
from artifactstore.jaxhook.compat import Probe, probe

__all__ = ["Check", "Report", "gather"]


def gather(overrides: dict[str, Any], device: bool | None = None) -> Report:
    """Run every check for the configuration `overrides` (CLI options) resolve to.
    `device`: open JAX's backend for the fingerprint (None: only where that holds no
    accelerator; see `doctor_device`). Never raises: a check that fails unexpectedly
    is a failed row naming what it could not do."""
    found = probe()
    checks: dict[str, Check] = {
        "python": Check(
            "python",
            "ok",
            f"{platform.python_version()} ({sys.executable})",
            blocking=False,
            data={"version": platform.python_version()},
        ),
        "jax": Check(
            "jax",
            "warn" if found.jax_version == "not installed" else "ok",
            f"jax {found.jax_version}, jaxlib {found.jaxlib_version}",
            blocking=False,
            data={"jax": found.jax_version, "jaxlib": found.jaxlib_version},
        ),
        "hook": _guard("jax hook", lambda: _check_hook(found)),
    }

    checks["variables"] = _check_variables()
    settings: _config.Settings | None = None
    try:
        settings = _config.resolve(overrides)
    except ConfigError as exc:
        checks["config"] = Check(
            "configuration", "fail", str(exc), verdict=f"configuration invalid: {exc}"
        )
        for name, label in (
            ("object_store", "object store"),
            ("index", "index"),
            ("local_tier", "local tier"),
        ):
            checks[name] = Check(
                label, "skip", "not checked: configuration invalid", blocking=name != "local_tier"
            )
    # Before the store's rows, shown after them: which tier entries a program here loads.
    accelerator = _guard("accelerator", _check_accelerator, blocking=False)
    fingerprint = _guard("fingerprint", lambda: _check_fingerprint(device), blocking=False)
    if settings is not None:
        _store_checks(settings, checks, fingerprint.data.get("digest"))
    checks["accelerator"] = accelerator
    checks["fingerprint"] = fingerprint
    checks["activation"] = _guard("activation", _check_activation, blocking=False)

    scrub(checks)
    where = ""
    if settings is not None:
        where = f"{checks['object_store'].data.get('url')} + {checks['index'].data.get('url')}"
        if checks["object_store"].data.get("tier_only"):
            tier = checks["local_tier"].data.get("path")
            where = f"this host's tier {tier}, the object store not answering"
    return conclude(checks, settings is not None and settings.read_only, where)


def _store_checks(
    settings: _config.Settings, checks: dict[str, Check], fingerprint: str | None
) -> None:
    """The store's rows, judged as a program here meets them (`doctor_chain`): the tier
    answers before the object store, and loads never need the index (`loads_without`).
    `fingerprint`: this host's digest, where known."""
    mode = "read-only" if settings.read_only else "read-write"
    origin = ", embedded default" if settings.embedded else ""
    checks["config"] = Check(
        "configuration",
        "ok",
        f"namespace {settings.namespace}, {mode}, timeout {settings.timeout_secs:g} s{origin}",
        data={
            "namespace": settings.namespace,
            "read_only": settings.read_only,
            "timeout_secs": settings.timeout_secs,
            "embedded": settings.embedded,
        },
    )
    objects = _guard("object store", lambda: doctor_store.check_objects(settings))
    index = _guard(
        "index", lambda: doctor_store.wrong_database(settings, doctor_store.check_index(settings))
    )
    here = fingerprint if objects.blocks else None  # whether the tier alone serves
    tier = _guard("local tier", lambda: doctor_chain.check_tier(settings, here), blocking=False)
    if objects.blocks and doctor_chain.tier_answers(tier):
        objects = doctor_chain.served_by_tier(settings, objects, tier)
    if index.blocks:
        index = doctor_chain.loads_without(index)
    checks["object_store"], checks["index"] = objects, index
    if not objects.blocks and not index.blocks:
        checks["access"] = _guard(
            "access",
            lambda: doctor_chain.check_access(settings, objects, index, tier),
            blocking=False,
        )
        if settings.read_only:
            checks["binding"] = doctor_chain.binding_not_checked()
        elif objects.status == "ok" and index.status == "ok":
            checks["binding"] = _guard(
                "binding",
                lambda: doctor_store.check_binding(settings, index.data),
                blocking=False,
            )
            if checks["binding"].degraded:  # writers refuse to write there
                checks["access"] = doctor_chain.refused_by(checks["access"], settings.namespace)
    checks["local_tier"] = tier
    checks["signing"] = _guard(
        "signing", lambda: doctor_store.check_signing(settings), blocking=False
    )
    checks["single_flight"] = _guard(
        "single-flight", lambda: _check_single_flight(settings), blocking=False
    )


def _guard(label: str, check: Callable[[], Check], *, blocking: bool = True) -> Check:
    """`check()`, or the row saying it could not be done (doctor never aborts)."""
    try:
        return check()
    except Exception as exc:
        why = one_line(exc)
        if isinstance(exc, PermissionError):
            from artifactstore.index.diagnosis import diagnose

            why = str(diagnose(exc, ""))
        return Check(
            label,
            "fail" if blocking else "warn",
            f"could not be checked: {why}",
            verdict=f"{label}: {why}",
            blocking=blocking,
        )


def _check_hook(found: Probe) -> Check:
    """Whether configure() can wrap this JAX's compiler, naming what does not fit."""
    problems = "; ".join(found.problems)
    if found.hooks is not None:
        return Check("jax hook", "ok", f"yes ({found.hooks.style})", data={"problems": []})
    if found.jax_version == "not installed":
        fix = f"JAX is not importable ({problems}): `pip install jax`"
    else:
        fix = (
            f"JAX {found.jax_version} internals missing ({problems}): upgrade artifactstore "
            "(`pip install -U artifactstore`) or pin jax to a supported release "
            "(README, 'Supported JAX')"
        )
    return Check("jax hook", "fail", f"no: {problems}", fix, data={"problems": found.problems})


def _check_single_flight(settings: _config.Settings) -> Check:
    """Whether processes that miss one key at once wait for one compile (and why)."""
    from artifactstore.store.lease import enabled, wait_bound

    on, why = enabled(settings)
    if on and settings.read_only:
        why += "; read-only: waits for writers' compiles, never holds a lease"
    if on:
        bound = settings.lease_wait_secs
        why += (
            f"; waits at most {bound:g} s"
            if bound is not None
            else (
                "; waits at most 3x the key's last compile time, "
                f"else {wait_bound(settings, None):g} s"
            )
        )
    return Check("single-flight", "ok", why, blocking=False, data={"enabled": on})


def _check_variables() -> Check:
    """Which settings the environment sets (names only: values may hold secrets), and any
    `ARTSTORE_*` name that is none of ours, with the nearest that is: a typo is ignored by
    every program, so it is said here rather than found by its effect."""
    typos = _config.typo_lines()
    named = [row.env for row in _config.SETTINGS if _config.from_environment(row.keyword or "")]
    data: dict[str, Any] = {"set": named, "unknown": typos}
    if typos:
        return Check("variables", "warn", "; ".join(typos), blocking=False, data=data)
    detail = ", ".join(named) + " set" if named else "no ARTSTORE_* setting set"
    return Check("variables", "ok", detail, blocking=False, data=data)


def _check_activation() -> Check:
    """Whether programs that never call configure() use the store here (ARTSTORE_URL,
    ARTSTORE_ACTIVATE), and whether this Python has the .pth hook that makes them. Off
    while an `ARTSTORE_*` typo is set (of ARTSTORE_URL, say) fails: what was probably meant
    does not turn it on, and the verdict says "off"."""
    import site

    from artifactstore.runtime.run import startup_module

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    found = [Path(d) / "artifactstore_startup.pth" for d in dirs]
    hook = next((str(p) for p in found if p.is_file()), None)
    startup = startup_module()
    how = startup.mode(os.environ)
    data = {"hook": hook, "active": how is not None}
    off = _config.off_line() if how is None and startup.unasked(os.environ) else None
    if off is not None:
        return Check("activation", "fail", off, verdict=off, data=data, off=True)
    if hook is None:
        detail = (
            "no startup hook in this Python's site-packages (reinstall artifactstore): "
            "only `artstore run` and `artstore warm` activate the store without code"
        )
        return Check("activation", "warn", detail, blocking=False, data=data)
    if how is None:
        detail = (
            "off: programs use the store only if they call artifactstore.configure() "
            "(ARTSTORE_URL or ARTSTORE_ACTIVATE=1 turns it on for every program)"
        )
    else:
        detail = (
            "on: every Python program here that imports JAX uses this store, "
            "without code (ARTSTORE_ACTIVATE=0 turns it off)"
        )
    return Check("activation", "ok", detail, blocking=False, data=data)


def _check_accelerator() -> Check:
    """Which backend JAX would open here, read without opening it."""
    from artifactstore.cli import doctor_device

    status, detail, data = doctor_device.check_backend()
    return Check("accelerator", status, detail, blocking=False, data=data)


def _check_fingerprint(device: bool | None) -> Check:
    """What this host's executables are keyed by (needs JAX's backend: opened only
    where asked, or where it holds no accelerator)."""
    from artifactstore.cli import doctor_device

    status, detail, data = doctor_device.check_fingerprint(device)
    return Check("fingerprint", status, detail, blocking=False, data=data)
