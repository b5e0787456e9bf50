"""Issue 29 point 2: `artstore sign` never launders.

Key rotation re-signs with the new key only what a trusted key signed, as a reader
verifies it (object signature, entry key, namespace), never by the index's signer
column, which anyone who writes the index sets. Unsigned entries, entries signed by
an untrusted key and badly signed ones are skipped and counted; readers that trust
only the new key still refuse them. Adopting unsigned entries is explicit
(`--adopt-unsigned`), lists them, and needs a terminal's yes or `--yes`.

Entries are written by real stores (moto S3 over HTTP + PostgreSQL, and embedded);
`artstore sign` runs as a user runs it, in a fresh process without a terminal.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import OpenStore, artstore, clean_env

from artifactstore import config
from artifactstore.config import host
from artifactstore.formats import codec
from artifactstore.formats.put import Put

FP = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                  device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
# What these tests set themselves (the team fixture may carry a key and trusted keys).
OURS = ("ARTSTORE_SIGNING_KEY", "ARTSTORE_TRUSTED_KEYS", "ARTSTORE_REQUIRE_SIGNATURES")


def _keygen(name: str, where: Path) -> tuple[Path, Path]:
    where.mkdir(parents=True, exist_ok=True)
    out = artstore("keygen", name, "--dir", str(where), env=clean_env())
    assert out.returncode == 0, out.stderr
    return where / f"{name}.key", where / f"{name}.pub"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """old: the key being retired (trusted); new: its successor; evil: a key nobody
    trusts; impostor: another key that calls itself "old"."""
    where = tmp_path_factory.mktemp("keys")
    found = {name: _keygen(name, where) for name in ("old", "new", "evil")}
    found["impostor"] = _keygen("old", where / "impostor")
    return found


def _env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in OURS}
    env["ARTSTORE_LOCAL_TIER"] = "off"  # every load goes to the store itself
    env["ARTSTORE_REQUIRE_SIGNATURES"] = "0"  # writers here sign (or not) as each test says
    return {**env, **extra}


def _write(open_store: OpenStore, env: dict[str, str], key_file: Path | None) -> str:
    """A new entry (a key, an executable's bytes), signed by `key_file` or unsigned."""
    extra = {} if key_file is None else {"ARTSTORE_SIGNING_KEY": str(key_file)}
    store = open_store(_env(env, **extra))
    key = secrets.token_hex(32)
    payload = b"executable " + key.encode() * 50
    assert store.put(Put(key, payload, FP, "jit_f", 2.0))
    return key


def _sign(
    env: dict[str, str], new_key: Path, trusted: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """`artstore sign ARGS` as an operator runs it, without a terminal."""
    run_env = _env(env, ARTSTORE_SIGNING_KEY=str(new_key), ARTSTORE_TRUSTED_KEYS=trusted)
    return artstore("sign", *args, env=run_env)


def _load(open_store: OpenStore, env: dict[str, str], trusted: Path, key: str) -> str:
    """What a reader trusting only `trusted` does with `key`: "hit" or why it refused."""
    reader = open_store(_env(env, ARTSTORE_TRUSTED_KEYS=str(trusted), ARTSTORE_READ_ONLY="1"))
    hit = reader.get(key, FP.digest)
    if hit is not None:
        return "hit"
    return reader.parts.reads.refused.get(key) or "miss"


def _row(open_store: OpenStore, env: dict[str, str], key: str) -> tuple[str, str | None]:
    entry = open_store(_env(env)).parts.index.lookup(key)
    assert entry is not None
    return entry.digest, entry.signer


def _signer_of_object(open_store: OpenStore, env: dict[str, str], key: str) -> str | None:
    store = open_store(_env(env))
    entry = store.parts.index.lookup(key)
    assert entry is not None
    data = store.parts.blobs.get(entry.digest)
    assert data is not None
    sig = codec.read_signature(data)
    return None if sig is None else sig.signer


# -- what no trusted key signed is never re-signed ------------------------------
def test_unsigned_and_untrusted_entries_are_not_resigned(
    any_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    unsigned = _write(open_store, any_env, None)
    untrusted = _write(open_store, any_env, keys["evil"][0])
    impostor = _write(open_store, any_env, keys["impostor"][0])  # a key named "old"
    trusted = _write(open_store, any_env, keys["old"][0])
    before = {k: _row(open_store, any_env, k) for k in (unsigned, untrusted, impostor)}

    out = _sign(any_env, keys["new"][0], str(keys["old"][1]), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["signed"] == 1 and report["entries"] == 4
    assert report["skipped"] == {
        "unsigned": [unsigned],
        "untrusted_key": [untrusted],
        "bad_signature": [impostor],
    }
    for key in (unsigned, untrusted, impostor):
        assert _row(open_store, any_env, key) == before[key]  # same object, same row
    new_pub = keys["new"][1]
    assert _load(open_store, any_env, new_pub, unsigned) == "unsigned"
    assert _load(open_store, any_env, new_pub, untrusted) == "untrusted_key"
    assert _load(open_store, any_env, new_pub, impostor) == "untrusted_key"
    assert _load(open_store, any_env, new_pub, trusted) == "hit"

    text = _sign(any_env, keys["new"][0], str(keys["old"][1]))
    assert text.returncode == 0, text.stderr
    assert "skipped, never signed (unsigned; --adopt-unsigned to sign them): 1" in text.stdout
    assert "untrusted_key" in text.stdout and "bad_signature" in text.stdout


def test_forged_signer_column_does_not_select_an_unsigned_object(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    """An index writer (a real PostgreSQL login) sets the signer column of an unsigned
    entry to the trusted key's name: `--signed-by old` still does not sign it."""
    key = _write(open_store, team_env, None)
    engine = sa.create_engine(config.resolve({}, environ=_env(team_env)).index_url)
    try:
        with engine.begin() as conn:
            done = conn.execute(
                sa.text("UPDATE entries SET signer = 'old', signature = :sig WHERE key = :key"),
                {"sig": "A" * 86 + "==", "key": key},
            )
            assert done.rowcount == 1
    finally:
        engine.dispose()
    digest, signer = _row(open_store, team_env, key)
    assert signer == "old"

    out = _sign(team_env, keys["new"][0], str(keys["old"][1]), "--signed-by", "old", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["signed"] == 0 and report["skipped"]["unsigned"] == [key]
    assert _row(open_store, team_env, key) == (digest, "old")  # untouched
    assert _signer_of_object(open_store, team_env, key) is None
    assert _load(open_store, team_env, keys["new"][1], key) == "unsigned"


def test_object_signed_for_another_namespace_is_not_resigned(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    """The trusted key signed this object for namespace "other"; a bucket and index
    writer stores those very bytes under the same key in "default". Its signature does
    not verify there, so it is skipped, not re-signed for "default"."""
    other = open_store(_env(team_env, ARTSTORE_SIGNING_KEY=str(keys["old"][0]),
                            ARTSTORE_NAMESPACE="other"))  # fmt: skip
    key = secrets.token_hex(32)
    assert other.put(Put(key, b"x" * 500, FP, "jit_f", 2.0))
    entry = other.parts.index.lookup(key)
    assert entry is not None
    data = other.parts.blobs.get(entry.digest)
    assert data is not None
    moved = codec.Encoded(data, entry.digest, 500, signer="old", signature=entry.signature)
    default = open_store(_env(team_env))
    assert default.put(Put(key, moved, FP, "jit_f", 2.0, producer_host="elsewhere"))

    out = _sign(team_env, keys["new"][0], str(keys["old"][1]), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["signed"] == 0 and report["skipped"]["bad_signature"] == [key]
    assert _row(open_store, team_env, key) == (entry.digest, "old")
    assert _load(open_store, team_env, keys["new"][1], key) == "untrusted_key"


def test_signed_by_names_only_trusted_keys(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    key = _write(open_store, team_env, None)
    for name, says in (("unsigned", "--adopt-unsigned"), ("evil", "is not trusted here")):
        out = _sign(team_env, keys["new"][0], str(keys["old"][1]), "--signed-by", name)
        assert out.returncode != 0 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert _signer_of_object(open_store, team_env, key) is None


def test_sign_without_trusted_keys_refuses_in_one_line(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    key = _write(open_store, team_env, None)
    signed = _write(open_store, team_env, keys["old"][0])
    env = _env(team_env, ARTSTORE_SIGNING_KEY=str(keys["new"][0]))
    out = artstore("sign", env=env)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "ARTSTORE_TRUSTED_KEYS" in lines[0], out.stderr
    assert _signer_of_object(open_store, team_env, key) is None
    assert _signer_of_object(open_store, team_env, signed) == "old"


# -- rotation: what the old key signed moves to the new key ----------------------
def test_trusted_entry_is_resigned_and_loads_under_the_new_key_only(
    any_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    key = _write(open_store, any_env, keys["old"][0])
    old_digest, _ = _row(open_store, any_env, key)
    assert _load(open_store, any_env, keys["new"][1], key) == "untrusted_key"

    both = f"{keys['old'][1]},{keys['new'][1]}"
    out = _sign(any_env, keys["new"][0], both, "--signed-by", "old")
    assert out.returncode == 0, out.stderr
    assert "signed 1 of 1 entry with key 'new'" in out.stdout
    assert "1 old object removed" in out.stdout
    digest, signer = _row(open_store, any_env, key)
    assert digest != old_digest and signer == "new"
    assert _signer_of_object(open_store, any_env, key) == "new"
    assert _load(open_store, any_env, keys["new"][1], key) == "hit"
    assert _load(open_store, any_env, keys["old"][1], key) == "untrusted_key"

    again = _sign(any_env, keys["new"][0], str(keys["new"][1]), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["already_signed"] == 1
    for proc in (out, again):
        for name in ("old", "new"):
            secret = keys[name][0].read_text().strip().split(":", 1)[1]
            assert secret not in proc.stdout + proc.stderr


# -- adopting unsigned entries is explicit ---------------------------------------
def test_adopt_unsigned_without_a_terminal_needs_yes(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    unsigned = _write(open_store, team_env, None)
    trusted = _write(open_store, team_env, keys["old"][0])
    old = str(keys["old"][1])

    refused = _sign(team_env, keys["new"][0], old, "--adopt-unsigned")
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "--yes" in lines[0], refused.stderr
    assert _signer_of_object(open_store, team_env, unsigned) is None
    assert _signer_of_object(open_store, team_env, trusted) == "old"  # nothing signed

    out = _sign(team_env, keys["new"][0], old, "--adopt-unsigned", "--yes")
    assert out.returncode == 0, out.stderr
    listed = [line for line in out.stdout.splitlines() if unsigned in line]
    assert len(listed) == 1
    assert "namespace default" in listed[0] and "jit_f" in listed[0]
    assert "producer " in listed[0] and "B" in listed[0]  # its size
    assert "adopted (were unsigned): 1" in out.stdout
    assert "signed 2 of 2 entries with key 'new'" in out.stdout
    assert _load(open_store, team_env, keys["new"][1], unsigned) == "hit"
    assert _load(open_store, team_env, keys["new"][1], trusted) == "hit"


def test_adopt_unsigned_never_signs_a_damaged_object(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    """Adopting still checks the object as a load does: one stored for another key
    (its row repointed by an index writer) is refused, not signed for this key."""
    victim = _write(open_store, team_env, None)
    other = _write(open_store, team_env, None)
    other_digest, _ = _row(open_store, team_env, other)
    engine = sa.create_engine(config.resolve({}, environ=_env(team_env)).index_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE entries SET digest = :d WHERE key = :key"),
                {"d": other_digest, "key": victim},
            )
    finally:
        engine.dispose()
    out = _sign(team_env, keys["new"][0], str(keys["old"][1]), "--adopt-unsigned", "--yes",
                "--json")  # fmt: skip
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["refused"] == {"wrong_entry": [victim]}
    assert [c["key"] for c in report["adopted"]] == [other]


def test_adopt_unsigned_asks_on_a_terminal(
    team_env: dict[str, str], open_store: OpenStore, keys: dict[str, tuple[Path, Path]]
) -> None:
    unsigned = _write(open_store, team_env, None)
    for answer, adopted in (("n", False), ("y", True)):
        primary, secondary = pty.openpty()
        env = _env(team_env, ARTSTORE_SIGNING_KEY=str(keys["new"][0]),
                   ARTSTORE_TRUSTED_KEYS=str(keys["old"][1]))  # fmt: skip
        try:
            os.write(primary, f"{answer}\n".encode())
            proc = subprocess.run(
                [sys.executable, "-m", "artifactstore", "sign", "--adopt-unsigned"],
                env=env,
                stdin=secondary,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
        finally:
            os.close(primary)
            os.close(secondary)
        assert proc.returncode == 0, proc.stderr
        assert "sign these 1 unsigned entries?" in proc.stderr
        assert unsigned in proc.stdout  # listed before the question
        signer = _signer_of_object(open_store, team_env, unsigned)
        assert signer == ("new" if adopted else None), proc.stdout
