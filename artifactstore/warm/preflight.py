"""Before `artstore warm` runs anything: the children's environment, the store, the target.

Shared by both ways in (`command`, `specs`). Each check fails in seconds with one
line, instead of after a CI job that warmed nothing usable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from artifactstore import config as _config
from artifactstore.errors import one_line
from artifactstore.formats.fingerprint import FIELDS, Fingerprint
from artifactstore.runtime import summary
from artifactstore.runtime.run import store_env
from artifactstore.warm import ENV_VAR, WarmError


def child_env(overrides: dict[str, Any]) -> dict[str, str]:
    """Our environment with the store settings of the command line and the startup hook
    (`run.store_env`), in write mode."""
    env = store_env({**overrides, "read_only": False})
    env.pop(ENV_VAR, None)
    env.pop(summary.ENV_VAR, None)
    # Warming stores everything it compiles, and asks the shared store itself, not this
    # host's local copies: an entry gone from the store (gc) must be uploaded again.
    env.update(_config.to_environment({"min_compile_secs": 0, "local_tier": "off"}))
    return env


def check_store(settings: _config.Settings) -> str:
    """Open the store once before running anything, and ask whether its object store and
    index are one store (binding a pristine pair, as warm's first write would): a job
    whose every write the gate would refuse fails in seconds with the gate's one line
    (StoreMismatch), not after compiling everything for nothing."""
    from artifactstore.store import Store

    store = Store.open(settings)
    try:
        store.parts.writes.gate.require()
        return store.parts.describe()
    finally:
        store.close()


# -- the expected target ----------------------------------------------------
def load_expected(text: str) -> dict[str, Any]:
    """`--expect-fingerprint`: a file or inline JSON as `artstore fingerprint --json` prints."""
    source = text.strip()
    if not source.startswith("{"):
        path = Path(source).expanduser()
        try:
            source = path.read_text()
        except OSError as exc:
            raise WarmError(
                f"cannot read --expect-fingerprint file {text!r}: {exc.strerror or one_line(exc)}"
            ) from None
    hint = "use the output of `artstore fingerprint --json` on a target node"
    try:
        data = json.loads(source)
    except json.JSONDecodeError as exc:
        raise WarmError(f"--expect-fingerprint is not valid JSON ({exc.msg}): {hint}") from None
    if not isinstance(data, dict):
        raise WarmError(f"--expect-fingerprint is not a JSON object: {hint}")
    try:
        fp = Fingerprint.from_dict(data)
    except TypeError as exc:
        raise WarmError(f"--expect-fingerprint is not a fingerprint ({exc}): {hint}") from None
    return {**fp.to_dict(), "digest": fp.digest}


def fingerprint_differences(here: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """One phrase per field that differs, e.g. `device_kind: 'cpu' here, 'H200' expected`."""
    out = []
    for name in FIELDS:
        a, b = here.get(name), expected.get(name)
        if a == b:
            continue
        if name == "cpu_features":
            missing = sorted(set(b or ()) - set(a or ()))
            extra = sorted(set(a or ()) - set(b or ()))
            parts = ([f"missing here {' '.join(missing)}"] if missing else []) + (
                [f"extra here {' '.join(extra)}"] if extra else []
            )
            if parts:  # the same set in another order or with repeats is no difference
                out.append(f"cpu_features: {'; '.join(parts)}")
        else:
            out.append(f"{name}: {a!r} here, {b!r} expected")
    return out


def check_expected(here: dict[str, Any], expected: dict[str, Any]) -> None:
    diffs = fingerprint_differences(here, expected)
    if diffs:
        raise WarmError(
            "this host does not match the expected target, so what it compiles "
            f"would never be used there: {'; '.join(diffs)}"
        )


def host_fingerprint_via_subprocess(env: dict[str, str]) -> dict[str, Any]:
    """This host's fingerprint from a short-lived process, so no GPU client stays open here."""
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "fingerprint", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WarmError(f"cannot compute this host's fingerprint: {tail}")
    data: dict[str, Any] = json.loads(proc.stdout)
    return data
