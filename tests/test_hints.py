"""The next step a user is given (issue 46, item 8): each hint names the real value and
the whole fix, and what the docs say a command does is what it does. The CLI runs in
fresh processes, as a person runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, OpenStore, artstore, clean_env

from artifactstore.config import host
from artifactstore.formats.put import Put

FP = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu-hints",
                  device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
INSTALL = "pip install 'artifactstore[postgres]'"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter (not the tests' fork server), as installed."""
    return subprocess.run(
        [sys.executable, "-m", "artifactstore", *args],
        env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip


def test_an_unsigned_bundle_under_trusted_keys_names_the_next_step(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """Measured before: "entry ... refused: Unsigned: object ... is unsigned", and no word
    of what to do; the step it names now works (sign where exported, export again)."""
    source = clean_env(ARTSTORE_URL=str(tmp_path / "src"))
    assert open_store(source).put(Put("ab" * 32, b"x" * 2000, FP, "jit_x", 1.0))
    bundle = tmp_path / "b.tar"
    assert artstore("export", str(bundle), "--all", env=source).returncode == 0
    assert artstore("keygen", "k", env=source, cwd=tmp_path).returncode == 0
    key, pub = str(tmp_path / "k.key"), str(tmp_path / "k.pub")
    target = clean_env(ARTSTORE_URL=str(tmp_path / "dst"), ARTSTORE_TRUSTED_KEYS=pub)

    refused = artstore("import", str(bundle), env=target)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    [line] = refused.stderr.splitlines()
    assert "is unsigned" in line and "`artstore sign --adopt-unsigned`" in line, line
    assert "then `artstore export` again" in line, line

    signer = dict(source, ARTSTORE_SIGNING_KEY=key, ARTSTORE_TRUSTED_KEYS=pub)
    signed = artstore("sign", "--adopt-unsigned", "--yes", env=signer)
    assert signed.returncode == 0, signed.stderr
    again = tmp_path / "signed.tar"
    assert artstore("export", str(again), "--all", env=signer).returncode == 0
    imported = artstore("import", str(again), env=target)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("imported 1 entry"), imported.stdout
