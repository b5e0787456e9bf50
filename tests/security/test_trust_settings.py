"""Issue 38, point 8: a secret key pasted where a public key belongs is refused, never trusted.

Measured before: `ARTSTORE_TRUSTED_KEYS=NAME:<the text of NAME.key>` (a 32-byte Ed25519
seed, the same format as a public key) was accepted as a public key. Three defences:
(a) the seed of this process's own ARTSTORE_SIGNING_KEY is refused when listed; (b) 32
bytes that are no point of the curve (about half of all seeds) are no public key; (c) a
signature that fails against the listed bytes but verifies against the key derived from
them as a seed is refused, said once. Each is tested with `artstore keygen`'s own files,
in the CLI and in a real JAX program; no output ever shows key material.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from conftest import artstore, clean_env, run_program

from artifactstore import config
from artifactstore.config import keyfiles
from artifactstore.errors import ConfigError
from artifactstore.formats import signing

SLOW = {"ARTSTORE_MIN_COMPILE_SECS": "0.5", "JOB_SLOW_COMPILE_SECS": "0.6"}


def keygen(where: Path, *, on_curve: bool) -> tuple[Path, Path]:
    """A key pair from `artstore keygen`'s code whose seed is (not) a curve point."""
    for n in range(64):
        secret, public = keyfiles.generate(f"ci-{n}", where)
        seed = base64.b64decode(secret.read_text().split(":", 1)[1])
        if signing.is_curve_point(seed) == on_curve:
            return secret, public
    raise AssertionError("64 seeds all on one side of the curve")


def pasted(secret: Path) -> str:
    """What a user pastes into ARTSTORE_TRUSTED_KEYS: the .key file's text."""
    return secret.read_text().strip()


def material(secret: Path) -> str:
    return pasted(secret).split(":", 1)[1]


def one_line_without(out: Any, secret: Path) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert material(secret) not in out.stdout + out.stderr
    return str(lines[0])


def test_curve_points_are_public_keys_and_most_seeds_are_not(tmp_path: Path) -> None:
    publics = [keyfiles.generate(f"k{n}", tmp_path)[1] for n in range(40)]
    for public in publics:  # every real public key decodes
        assert signing.is_curve_point(base64.b64decode(public.read_text().split(":")[1]))
    # The encoding of y = p (not reduced) and a non-square x^2 are refused.
    assert not signing.is_curve_point((2**255 - 19).to_bytes(32, "little"))
    assert not signing.is_curve_point((2).to_bytes(32, "little"))
    assert signing.is_curve_point((1).to_bytes(32, "little"))  # the neutral point


def test_a_pasted_seed_that_is_no_point_is_refused_in_one_line(tmp_path: Path) -> None:
    """(b), the measured case without a signing key: `artstore ls` and config.resolve."""
    secret, _ = keygen(tmp_path, on_curve=False)
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"), ARTSTORE_TRUSTED_KEYS=pasted(secret))
    with pytest.raises(ConfigError) as err:
        config.resolve({}, environ=env)
    assert "is it the .key file's contents?" in str(err.value)
    assert material(secret) not in str(err.value)
    out = artstore("ls", env=env)
    assert out.returncode != 0
    line = one_line_without(out, secret)
    assert "entry 1 of ARTSTORE_TRUSTED_KEYS is not a public key" in line
    assert "Traceback" not in out.stderr


def test_the_own_signing_keys_seed_listed_as_trusted_is_refused(tmp_path: Path) -> None:
    """(a): a CI job that pasted its own .key text beside ARTSTORE_SIGNING_KEY; the seed is
    chosen on the curve, so only this defence can find it."""
    secret, _ = keygen(tmp_path, on_curve=True)
    keys = {"ARTSTORE_SIGNING_KEY": str(secret), "ARTSTORE_TRUSTED_KEYS": pasted(secret)}
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"), **keys)
    out = artstore("ls", env=env)
    assert out.returncode != 0
    line = one_line_without(out, secret)
    assert "the secret key of ARTSTORE_SIGNING_KEY" in line


def test_a_program_with_a_pasted_seed_refuses_what_that_key_signed_and_says_it_once(
    tmp_path: Path,
) -> None:
    """(c) in a real JAX program: entries signed by the key, a reader that lists the key's
    .key text (a curve point, so it parses) loads none of them, compiles, and says once
    that the listed value is a secret key."""
    secret, _ = keygen(tmp_path, on_curve=True)
    store = tmp_path / "store"
    writer = run_program(
        "job.py", clean_env(**SLOW, ARTSTORE_URL=str(store), ARTSTORE_SIGNING_KEY=str(secret))
    )
    assert writer["store"]["stored"] == 2
    trusting = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_TRUSTED_KEYS": pasted(secret)}
    reader = run_program("job.py", clean_env(**SLOW, ARTSTORE_URL=str(store), **trusting))
    assert reader["store"].get("hits", 0) == 0  # nothing it signed was accepted
    said = [ln for ln in reader["_stderr"].splitlines() if "as its secret key" in ln]
    assert len(said) == 1, reader["_stderr"]  # once, though both entries were refused
    assert "list ci-" in said[0] and ".pub instead" in said[0]
    assert material(secret) not in reader["_stderr"] + str(reader)


def test_a_program_with_a_pasted_seed_that_is_no_point_compiles_with_one_line(
    tmp_path: Path,
) -> None:
    """(b) in a program: the setting is refused (one line), the program runs as usual."""
    secret, _ = keygen(tmp_path, on_curve=False)
    trusting = {"ARTSTORE_TRUSTED_KEYS": pasted(secret)}
    out = run_program("job.py", clean_env(**SLOW, ARTSTORE_URL=str(tmp_path / "store"), **trusting))
    said = [ln for ln in out["_stderr"].splitlines() if "is not a public key" in ln]
    assert len(said) == 1, out["_stderr"]
    assert material(secret) not in out["_stderr"] + str(out)
    assert out["store"].get("hits", 0) == 0
