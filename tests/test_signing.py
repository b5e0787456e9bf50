"""Signed entries (issue 15 item 1): with trusted keys, only what a trusted key signed runs.

Writers sign each object with ARTSTORE_SIGNING_KEY (Ed25519, Nix-style key files);
readers with ARTSTORE_TRUSTED_KEYS refuse (a counted miss, one log line, never
deserialized, never quarantined) anything unsigned, signed by another key, or whose
signature does not cover what it is now used as. Every tamper case runs real programs
in fresh processes and checks that each still returns its own result.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tamper
from conftest import REPO, JobResults, artstore, artstore_warm, clean_env, old_client, run_program

import artifactstore
from artifactstore import config
from artifactstore.blobstores import LocalBlobStore
from artifactstore.config import host, keyfiles
from artifactstore.errors import ConfigError
from artifactstore.formats import codec, frames
from artifactstore.formats.put import Put
from artifactstore.index import db
from artifactstore.store import Store

# The last commit of the 0002 schema (before signed entries): its client writes the
# data the migration test upgrades.
SCHEMA_0002_COMMIT = "c658fe2"


# -- helpers ------------------------------------------------------------------
# Only job.py's two main functions are stored (its small jits compile quicker than the
# threshold): each program run stores, loads or refuses exactly these two.
SLOW = {"ARTSTORE_MIN_COMPILE_SECS": "0.5", "JOB_SLOW_COMPILE_SECS": "0.6"}


def _env(**extra: str) -> dict[str, str]:
    return clean_env(**{**SLOW, **extra})


def _entry_hits(out: dict[str, Any]) -> int:
    """The stored entries that run loaded (from the store or the tier), not the quick
    compiles this host kept (`quick_loads`, also hits)."""
    return int(out["store"].get("hits", 0)) - int(out["store"].get("quick_loads", 0))


def _big(out: dict[str, Any]) -> list[str]:
    """Which of job.py's two main functions XLA compiled in that run."""
    names = [n for n in ("mlp", "loss_and_grad") for c in out["xla_compiles"] if n in c]
    return sorted(names)


def _keygen(name: str, where: Path) -> tuple[Path, Path]:
    out = artstore("keygen", name, "--dir", str(where), env=clean_env())
    assert out.returncode == 0, out.stderr
    return where / f"{name}.key", where / f"{name}.pub"


def _secret(key_file: Path) -> str:
    return key_file.read_text().strip().split(":", 1)[1]


def _entries(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """key -> entry (as `artstore ls --json` shows it)."""
    out = artstore("ls", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return {e["key"]: e for e in json.loads(out.stdout)}


def _mlp(store: Path, variant: str = "0") -> dict[str, Any]:
    """The entry of job.py's `mlp` for this variant (the signed store notes their keys)."""
    key = json.loads((store / "test-keys.json").read_text())[f"mlp{variant}"]
    return _entries(_env(ARTSTORE_URL=str(store)))[key]


def _mlp_key(store: Path) -> str:
    (key,) = [e["key"] for e in _entries(_env(ARTSTORE_URL=str(store))).values()
              if "mlp" in e["module_name"]]  # fmt: skip
    return key


def _point(store: Path, key: str, digest: str, size: int | None = None) -> None:
    """Make `key` resolve to `digest` everywhere a lookup may look (tests/tamper.py)."""
    tamper.point_in(store, key, digest, **({} if size is None else {"size": size}))


def _put_object(store: Path, data: bytes) -> str:
    digest = codec.digest_of(data)
    LocalBlobStore(store, "default").put(digest, data)
    return digest


def _read_object(store: Path, digest: str) -> bytes:
    data = LocalBlobStore(store, "default").get(digest)
    assert data is not None
    return data


def _log_lines(stderr: str, text: str) -> int:
    return sum(1 for line in stderr.splitlines() if text in line)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    where = tmp_path_factory.mktemp("keys")
    return {name: _keygen(name, where) for name in ("ci-1", "ci-2", "evil")}


@pytest.fixture(scope="module")
def references(job_results: JobResults) -> dict[str, list[str]]:
    """What job.py returns without any store, per variant."""
    return {v: job_results(v) for v in ("0", "1")}


@pytest.fixture(scope="module")
def signed_store(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, tuple[Path, Path]]
) -> Path:
    """An embedded store holding both variants of job.py, signed by ci-1."""
    store = tmp_path_factory.mktemp("signed") / "store"
    env = _env(ARTSTORE_URL=str(store), ARTSTORE_SIGNING_KEY=str(keys["ci-1"][0]))
    first = run_program("job.py", env)
    assert first["store"]["stored"] == len(_big(first)) == 2
    mlp0 = _mlp_key(store)
    second = run_program("job.py", {**env, "JOB_VARIANT": "1"})  # loss_and_grad: the same key
    assert second["store"]["stored"] == 1 and _big(second) == ["mlp"]
    (mlp1,) = [k for k, e in _entries(env).items() if "mlp" in e["module_name"] and k != mlp0]
    (store / "test-keys.json").write_text(json.dumps({"mlp0": mlp0, "mlp1": mlp1}))
    return store


@pytest.fixture
def tampered(signed_store: Path, tmp_path: Path) -> Path:
    """A private copy of the signed store for one test to tamper with."""
    copy = tmp_path / "store"
    shutil.copytree(signed_store, copy)
    return copy


def _reader(store: Path, trusted: str, **extra: str) -> dict[str, str]:
    return _env(ARTSTORE_URL=str(store), ARTSTORE_TRUSTED_KEYS=trusted, **extra)


# -- key files and settings -----------------------------------------------------
def test_keygen_writes_a_private_key_and_a_public_key(tmp_path: Path) -> None:
    out = artstore("keygen", "team-1", "--dir", str(tmp_path), env=clean_env())
    assert out.returncode == 0, out.stderr
    secret, public = tmp_path / "team-1.key", tmp_path / "team-1.pub"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    name, b64 = secret.read_text().strip().split(":")
    assert name == "team-1" and len(__import__("base64").b64decode(b64)) == 32
    assert public.read_text().startswith("team-1:")
    assert b64 not in out.stdout + out.stderr  # the secret is never printed
    again = artstore("keygen", "team-1", "--dir", str(tmp_path), env=clean_env())
    assert again.returncode != 0 and "refusing to overwrite" in again.stderr
    assert secret.read_text().split(":")[1].strip() == b64  # untouched
    bad = artstore("keygen", "bad name/..", "--dir", str(tmp_path), env=clean_env())
    assert bad.returncode != 0 and "invalid key name" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_keygen_writes_into_the_current_directory_by_default(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "artifactstore", "keygen", "here"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "here.key").is_file() and (tmp_path / "here.pub").is_file()


def test_trusted_keys_parse_files_and_inline_keys(keys: dict[str, tuple[Path, Path]]) -> None:
    inline = keys["ci-2"][1].read_text().strip()
    trusted = keyfiles.load_trusted_keys(f"{keys['ci-1'][1]}, {inline}")
    assert trusted.names == ["ci-1", "ci-2"]
    settings = config.resolve(
        {"url": "/tmp/x"},
        {"ARTSTORE_SIGNING_KEY": str(keys["ci-1"][0]), "ARTSTORE_TRUSTED_KEYS": inline},
    )
    assert settings.signing_key is not None and settings.signing_key.name == "ci-1"
    # The listed key, and its own (a process trusts what it signs).
    assert settings.trusted_keys is not None and settings.trusted_keys.names == ["ci-1", "ci-2"]
    assert _secret(keys["ci-1"][0]) not in repr(settings)


@pytest.mark.parametrize(
    "variable,value,says",
    [
        ("ARTSTORE_TRUSTED_KEYS", "missing.pub", "cannot read public key file"),
        ("ARTSTORE_TRUSTED_KEYS", "ci:not-base64!", "cannot read public key file"),
        ("ARTSTORE_TRUSTED_KEYS", "ci:AAAA", "is not a public key"),
        ("ARTSTORE_TRUSTED_KEYS", " , ", "is empty"),
        ("ARTSTORE_TRUSTED_KEYS", "SECRET_FILE", "looks like a secret key"),
        ("ARTSTORE_SIGNING_KEY", "SECRET_INLINE", "not the key itself"),
        ("ARTSTORE_SIGNING_KEY", "PUBLIC_FILE", "is a public key"),
        ("ARTSTORE_SIGNING_KEY", "/nonexistent/k.key", "cannot read signing key file"),
        ("ARTSTORE_SIGNING_KEY", "GARBAGE_FILE", "is not an artifactstore/Nix secret key"),
    ],
)
def test_bad_key_settings_are_one_line_errors_without_key_material(
    variable: str, value: str, says: str, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    secret_file, public_file = keys["ci-1"]
    secret = _secret(secret_file)
    garbage = tmp_path / "garbage.key"
    garbage.write_text("ci-1:" + secret + "xx\n")  # almost a key: still never echoed
    value = {
        "SECRET_FILE": str(secret_file),
        "SECRET_INLINE": secret_file.read_text().strip(),
        "PUBLIC_FILE": str(public_file),
        "GARBAGE_FILE": str(garbage),
    }.get(value, value)
    with pytest.raises(ConfigError) as err:
        config.resolve({"url": str(tmp_path / "s")}, {variable: value})
    message = str(err.value)
    assert says in message and "\n" not in message
    assert secret not in message
    out = artstore("--url", str(tmp_path / "s"), "ls", env=clean_env(**{variable: value}))
    assert out.returncode != 0 and says in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert secret not in out.stdout + out.stderr


def test_codec_verifies_before_inflating_and_binds_namespace_and_key(
    keys: dict[str, tuple[Path, Path]],
) -> None:
    fp = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                      device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    key_a, key_b = "a1" * 32, "b2" * 32
    signer = keyfiles.load_signing_key(keys["ci-1"][0])
    trusted = keyfiles.load_trusted_keys(str(keys["ci-1"][1]))

    def meta(key: str, size: int) -> codec.ObjectMeta:
        return codec.ObjectMeta(key=key, module_name="m", compile_secs=1.0, raw_size=size,
                                producer_host="h", fingerprint=fp.to_dict(),
                                callbacks=0)  # fmt: skip

    def decode(data: bytes, key: str = key_a, namespace: str = "ns") -> bytes:
        return codec.decode(data, digest=codec.digest_of(data),
                            fingerprint=fp.digest, key=key, callbacks=0,
                            trusted=trusted, namespace=namespace)  # fmt: skip

    signed = codec.encode(b"payload", fp.digest, meta(key_a, 7), signer=signer, namespace="ns")
    assert signed.signer == "ci-1" and decode(signed.data) == b"payload"
    assert codec.read_meta(signed.data) == meta(key_a, 7)  # metadata still found
    # A reader without trusted keys ignores the signature; one from 0.1 decompresses the
    # first frame and ignores every skippable frame after it.
    assert codec.decode(signed.data, digest=signed.digest,
                        fingerprint=fp.digest) == b"payload"  # fmt: skip
    with pytest.raises(codec.BadSignature):
        decode(signed.data, namespace="other")  # signed for another namespace
    # An unsigned object with a payload that would not even decompress: refused for its
    # signature, so nothing was inflated first.
    unsigned = codec.encode(b"payload", fp.digest, meta(key_a, 7)).data
    broken = bytearray(unsigned)
    broken[frames.HEADER_LEN + 6] ^= 0xFF
    with pytest.raises(codec.Unsigned):
        decode(bytes(broken))
    # Another key's signature frame grafted onto this object.
    other = codec.encode(b"other", fp.digest, meta(key_b, 5), signer=signer, namespace="ns")
    _, frame = codec.split_signature(other.data)
    assert frame is not None
    grafted = unsigned + other.data[len(codec.split_signature(other.data)[0]) :]
    with pytest.raises(codec.BadSignature):
        decode(grafted)
    untrusted = codec.sign(unsigned, keyfiles.load_signing_key(keys["evil"][0]), "ns")
    with pytest.raises(codec.UntrustedKey):
        decode(untrusted.data)
    # Re-signing replaces the signature; the same key signs to the same bytes.
    assert codec.sign(untrusted.data, signer, "ns").data == signed.data


def test_unsigned_store_works_as_today_and_signed_entries_load_without_trusted_keys(
    signed_store: Path, tmp_path: Path, references: dict[str, list[str]]
) -> None:
    copy = tmp_path / "store"
    shutil.copytree(signed_store, copy)
    out = run_program("job.py", _env(ARTSTORE_URL=str(copy)))
    assert _big(out) == [] and _entry_hits(out) == 2
    assert out["results"] == references["0"]
    ls = artstore("ls", env=_env(ARTSTORE_URL=str(copy)))
    assert "SIGNER" in ls.stdout and "ci-1" in ls.stdout


# -- the tamper suite: trusted keys configured ----------------------------------
def test_signed_entries_load_where_their_key_is_trusted(
    tampered: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    trusted = f"{keys['ci-2'][1]},{keys['ci-1'][1]}"
    out = run_program("job.py", _reader(tampered, trusted))
    assert _big(out) == [], out["_stderr"]
    assert _entry_hits(out) == 2
    assert out["results"] == references["0"]
    verify = artstore("verify", "--json", env=_reader(tampered, trusted))
    report = json.loads(verify.stdout)
    assert verify.returncode == 0 and report["ok"], verify.stdout
    assert report["signers"] == {"ci-1": 3} and report["unsigned"] == []


def test_swapped_digests_between_two_signed_entries_are_not_loaded(
    tampered: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    first, second = _mlp(tampered, "0"), _mlp(tampered, "1")
    _point(tampered, first["key"], second["digest"])
    _point(tampered, second["key"], first["digest"])
    for variant in ("0", "1"):
        out = run_program("job.py", {**_reader(tampered, str(keys["ci-1"][1])),
                                     "JOB_VARIANT": variant})  # fmt: skip
        assert out["results"] == references[variant]  # its own result, not the other's
        assert len(_big(out)) == 1, out["_stderr"]
        assert out["store"]["wrong_entry"] == 1 and _entry_hits(out) == 1
        assert _log_lines(out["_stderr"], "another entry") == 1


def test_forged_object_signed_by_an_untrusted_key_is_not_loaded(
    tampered: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    victim, other = _mlp(tampered, "0"), _mlp(tampered, "1")
    # The other variant's executable, relabelled as the victim's entry and signed by a key
    # the attacker holds: a perfectly formed object, except for who signed it.
    source = _read_object(tampered, other["digest"])
    meta = codec.read_meta(source)
    assert meta is not None
    payload = codec.decode(source, digest=other["digest"],
                           fingerprint=other["fingerprint"])  # fmt: skip
    forged_meta = codec.ObjectMeta(**{**meta.__dict__, "key": victim["key"]})
    forged = codec.encode(payload, other["fingerprint"], forged_meta,
                          signer=keyfiles.load_signing_key(keys["evil"][0]),
                          namespace="default")  # fmt: skip
    _point(tampered, victim["key"], _put_object(tampered, forged.data), len(forged.data))
    out = run_program("job.py", _reader(tampered, str(keys["ci-1"][1])))
    assert out["results"] == references["0"]
    assert _big(out) == ["mlp"], out["_stderr"]
    assert out["store"]["untrusted_key"] == 1
    assert _log_lines(out["_stderr"], "which is not trusted") == 1
    assert (tampered / "default" / "objects" / forged.digest[:2] / forged.digest).exists()
    verify = json.loads(artstore("verify", "--json",
                                 env=_reader(tampered, str(keys["ci-1"][1]))).stdout)  # fmt: skip
    assert verify["untrusted_key"] == [victim["key"]] and not verify["ok"]


@pytest.mark.parametrize("how", ["removed", "altered", "resigned_metadata"])
def test_removed_or_altered_signature_is_not_loaded(
    how: str,
    tampered: Path,
    keys: dict[str, tuple[Path, Path]],
    references: dict[str, list[str]],
) -> None:
    entry = _mlp(tampered)
    data = _read_object(tampered, entry["digest"])
    unsigned, body = codec.split_signature(data)
    assert body is not None
    if how == "removed":
        changed, counter, says = unsigned, "unsigned", "is unsigned"
    elif how == "altered":
        sig = json.loads(body)
        raw = bytearray(__import__("base64").b64decode(sig["s"]))
        raw[0] ^= 1
        sig["s"] = __import__("base64").b64encode(bytes(raw)).decode()
        new_body = json.dumps(sig, sort_keys=True).encode()
        changed = data.replace(body, new_body)
        counter, says = "bad_signature", "bad signature"
    else:  # the metadata changed (a byte of its compile time), the signature kept
        meta_start = unsigned.rindex(b'"compile_secs":')
        text = bytearray(data)
        text[meta_start + 15] = ord("9") if text[meta_start + 15] != ord("9") else ord("8")
        changed, counter, says = bytes(text), "bad_signature", "bad signature"
    _point(tampered, entry["key"], _put_object(tampered, changed), len(changed))
    out = run_program("job.py", _reader(tampered, str(keys["ci-1"][1])))
    assert out["results"] == references["0"]
    assert _big(out) == ["mlp"], out["_stderr"]
    assert out["store"][counter] == 1 and _entry_hits(out) == 1
    assert out["store"].get("corrupt", 0) == 0  # refused, never quarantined
    assert _log_lines(out["_stderr"], says) == 1
    assert (tampered / "default" / "objects" / codec.digest_of(changed)[:2]).is_dir()


def test_unsigned_entries_are_not_loaded_where_keys_are_trusted(
    tmp_path: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    store = tmp_path / "store"
    writer = run_program("job.py", _env(ARTSTORE_URL=str(store)))  # no signing key
    assert writer["store"]["stored"] == 2
    out = run_program("job.py", _reader(store, str(keys["ci-1"][1])))
    assert out["results"] == references["0"]
    assert _big(out) == ["loss_and_grad", "mlp"]
    assert out["store"]["unsigned"] == 2 and out["store"].get("hits", 0) == 0
    assert out["store"]["refused_present"] == 2  # left as it was: it cannot sign
    assert _log_lines(out["_stderr"], "is unsigned") == 1
    verify = artstore("verify", env=_reader(store, str(keys["ci-1"][1])))
    assert verify.returncode == 1 and "unsigned entries: 2" in verify.stdout
    plain = artstore("verify", env=_env(ARTSTORE_URL=str(store)))
    assert plain.returncode == 0 and "unsigned entries: 2" in plain.stdout
    assert "signatures not checked" in plain.stdout


def test_tier_key_file_pointing_at_another_signed_object_is_not_loaded(
    tampered: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    victim, other = _mlp(tampered, "0"), _mlp(tampered, "1")
    key_file = tampered / "default" / "keys" / victim["key"][:2] / victim["key"]
    body = json.loads(key_file.read_text())
    body["d"] = other["digest"]
    key_file.write_text(json.dumps(body))  # the index still says the truth
    out = run_program("job.py", _reader(tampered, str(keys["ci-1"][1])))
    assert out["results"] == references["0"]
    assert _big(out) == [], out["_stderr"]  # the store's path loads the real one
    assert out["store"]["tier_wrong_entry"] == 1
    assert _log_lines(out["_stderr"], "tier key file") == 1


def test_private_tier_copy_replaced_is_not_loaded(
    tampered: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    """A read-only reader's private tier: a copy replaced by an unsigned one (same key,
    its digest written into the key file) is refused there and loaded from the store."""
    env = _reader(tampered, str(keys["ci-1"][1]), ARTSTORE_READ_ONLY="1",
                  ARTSTORE_LOCAL_TIER=str(tampered.parent / "tier"))  # fmt: skip
    first = run_program("job.py", env)
    assert _big(first) == [] and _entry_hits(first) == 2
    victim = _mlp(tampered)
    (key_file,) = (tampered.parent / "tier").rglob(victim["key"])
    tier_base = key_file.parents[2]
    copy = LocalBlobStore(tier_base.parent, tier_base.name)
    unsigned, _ = codec.split_signature(_read_object(tampered, victim["digest"]))
    digest = codec.digest_of(unsigned)
    copy.put(digest, unsigned)
    body = json.loads(key_file.read_text())
    body["d"] = digest
    key_file.write_text(json.dumps(body))
    out = run_program("job.py", env)
    assert out["results"] == references["0"]
    assert _big(out) == [], out["_stderr"]
    assert out["store"]["tier_unsigned"] == 1
    assert _log_lines(out["_stderr"], "is unsigned") == 1


# -- key rotation, on the team store (moto S3 + PostgreSQL) ---------------------
def test_key_rotation_and_artstore_sign(
    team_env: dict[str, str], keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    """Slow: a JAX program per key of the rotation, then `artstore sign` over the store."""
    team_env = {**team_env, **SLOW}
    old_key, old_pub = keys["ci-1"]
    new_key, new_pub = keys["ci-2"]
    secrets = [_secret(old_key), _secret(new_key)]
    writer = run_program("job.py", {**team_env, "ARTSTORE_SIGNING_KEY": str(old_key)})
    assert writer["store"]["stored"] == 2
    ls = artstore("ls", "--json", env=team_env)
    assert {e["signer"] for e in json.loads(ls.stdout)} == {"ci-1"}

    both = {**team_env, "ARTSTORE_TRUSTED_KEYS": f"{old_pub},{new_pub}"}
    out = run_program("job.py", both)
    assert _big(out) == [] and _entry_hits(out) == 2

    only_new = {**team_env, "ARTSTORE_TRUSTED_KEYS": str(new_pub), "ARTSTORE_READ_ONLY": "1"}
    out = run_program("job.py", only_new)
    assert out["results"] == references["0"]
    assert len(_big(out)) == 2 and out["store"]["untrusted_key"] == 2
    assert _log_lines(out["_stderr"], "which is not trusted") == 1

    verify = artstore("verify", "--json", env=only_new)
    assert verify.returncode == 1
    assert len(json.loads(verify.stdout)["untrusted_key"]) == 2

    # Re-signs only what a trusted key signed: the old key is listed while rotating.
    rotating = {**team_env, "ARTSTORE_SIGNING_KEY": str(new_key),
                "ARTSTORE_TRUSTED_KEYS": f"{old_pub},{new_pub}"}  # fmt: skip
    sign = artstore("sign", env=rotating)
    assert sign.returncode == 0, sign.stderr
    assert "signed 2 of 2 entries with key 'ci-2'" in sign.stdout
    assert "2 old objects removed" in sign.stdout
    rows = json.loads(artstore("ls", "--json", env=team_env).stdout)
    assert {e["signer"] for e in rows} == {"ci-2"}

    out = run_program("job.py", only_new)
    assert _big(out) == [], out["_stderr"]
    assert _entry_hits(out) == 2 and out["results"] == references["0"]
    out = run_program("job.py", {**team_env, "ARTSTORE_TRUSTED_KEYS": str(old_pub),
                                 "ARTSTORE_READ_ONLY": "1"})  # fmt: skip
    assert out["store"]["untrusted_key"] == 2  # the retired key no longer vouches
    again = artstore("sign", "--json", env={**rotating, "ARTSTORE_TRUSTED_KEYS": str(new_pub)})
    assert json.loads(again.stdout)["already_signed"] == 2
    verify = artstore("verify", env=only_new)
    assert verify.returncode == 0, verify.stdout
    for proc in (ls, sign, again, verify):
        for secret in secrets:
            assert secret not in proc.stdout + proc.stderr


def test_a_writer_replaces_an_entry_it_refused_with_its_own_signed_one(
    tmp_path: Path, keys: dict[str, tuple[Path, Path]], references: dict[str, list[str]]
) -> None:
    store = tmp_path / "store"
    run_program("job.py", _env(ARTSTORE_URL=str(store)))  # unsigned
    env = _reader(store, str(keys["ci-1"][1]), ARTSTORE_SIGNING_KEY=str(keys["ci-1"][0]))
    out = run_program("job.py", env)
    assert out["store"]["unsigned"] == 2 and out["store"]["replaced_refused"] == 2
    assert {e["signer"] for e in _entries(_env(ARTSTORE_URL=str(store))).values()} == {"ci-1"}
    out = run_program("job.py", env)
    assert _big(out) == [] and _entry_hits(out) == 2
    assert out["results"] == references["0"]
    objects = [p for p in (store / "default" / "objects").rglob("*") if p.is_file()]
    assert len(objects) == 2  # the refused ones were removed: no orphans


# -- index: signer column, rebuild, migration 0002 -> 0003 ----------------------
def test_rebuild_carries_the_signer(tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    settings = config.resolve(
        {"url": str(tmp_path / "s")}, {"ARTSTORE_SIGNING_KEY": str(keys["ci-1"][0])}
    )
    store = Store.open(settings)
    fp = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                      device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    try:
        assert store.put(Put("c3" * 32, b"x" * 100, fp, "m", 1.0))
        before = store.parts.index.lookup("c3" * 32)
        assert before is not None and before.signer == "ci-1" and before.signature
    finally:
        store.close()
    os.unlink(tmp_path / "s" / "index.db")
    out = artstore("db", "rebuild", env=_env(ARTSTORE_URL=str(tmp_path / "s")))
    assert out.returncode == 0, out.stderr
    store = Store.open(settings)
    try:
        after = store.parts.index.lookup("c3" * 32)
        assert after is not None
        assert (after.signer, after.signature) == (before.signer, before.signature)
    finally:
        store.close()


@pytest.fixture(scope="module")
def schema_0002_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("artifactstore-0002")
    return old_client(SCHEMA_0002_COMMIT, root, "artifactstore", "migrations", "pyproject.toml")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0003_keeps_entries_written_at_0002(
    backend: str,
    schema_0002_client: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    keys: dict[str, tuple[Path, Path]],
    references: dict[str, list[str]],
) -> None:
    """The 0.2 client (schema 0002) writes entries; `artstore db upgrade` adds the signer
    columns; this version loads every one of them, and signs what it writes next."""
    env = _env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_LOCAL_TIER="off")
    if backend == "postgresql":
        env["ARTSTORE_INDEX"] = request.getfixturevalue("pg_url")
    (tmp_path / "store").mkdir()
    old = {**env, "PYTHONPATH": str(schema_0002_client)}
    up = artstore("db", "upgrade", "0002", env=old)
    assert up.returncode == 0 and "0002" in up.stdout, up.stderr
    written = run_program("job.py", old)  # the 0.2 client writes at schema 0002
    assert written["version"] != artifactstore.__version__ or written["store"]["stored"] == 2
    assert written["store"]["stored"] == 2
    assert "0002" in artstore("db", "current", env=old).stdout
    up = artstore("db", "upgrade", env=env)
    assert up.returncode == 0 and db.SCHEMA_HEAD in up.stdout, up.stderr
    rows = json.loads(artstore("ls", "--json", env=env).stdout)
    assert len(rows) == 2 and {r["signer"] for r in rows} == {None}
    assert "unsigned" in artstore("ls", env=env).stdout
    if backend == "postgresql":
        # 0.2 published no manifests and readers never ask a database server: the
        # rollout step after upgrading the writers publishes them (README).
        repaired = artstore("verify", "--repair", env=env)
        assert "entries without manifest: 2" in repaired.stdout, repaired.stdout
    out = run_program("job.py", env)
    assert _big(out) == [], out["_stderr"]
    assert _entry_hits(out) == 2 and out["results"] == references["0"]
    # And the signed entries of this version from then on.
    signed = run_program("job.py", {**env, "JOB_VARIANT": "1",
                                    "ARTSTORE_SIGNING_KEY": str(keys["ci-1"][0])})  # fmt: skip
    assert signed["store"]["stored"] == 1  # its mlp; loss_and_grad is the same key
    signers = sorted(str(r["signer"]) for r in json.loads(artstore("ls", "--json", env=env).stdout))
    assert signers == ["None", "None", "ci-1"]


# -- artstore warm: its presence check is a load ----------------------------------


def test_warm_does_not_call_a_refused_entry_present(
    tmp_path: Path, keys: dict[str, tuple[Path, Path]]
) -> None:
    plain = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    code, report, output = artstore_warm("warm_specs:specializations", env=plain, tmp_path=tmp_path)
    assert code == 0 and report["added"] == 5, output  # unsigned
    trusting = {**plain, "ARTSTORE_TRUSTED_KEYS": str(keys["ci-1"][1])}
    code, again, output = artstore_warm(
        "warm_specs:specializations", env=trusting, tmp_path=tmp_path
    )
    assert code != 0 and again["present"] == 0, output
    assert "present but refused here (unsigned" in output
    signing_env = {**trusting, "ARTSTORE_SIGNING_KEY": str(keys["ci-1"][0])}
    code, third, output = artstore_warm(
        "warm_specs:specializations", env=signing_env, tmp_path=tmp_path
    )
    assert code == 0 and third["added"] == 5, output  # replaced by signed entries
    code, fourth, output = artstore_warm(
        "warm_specs:specializations", env=trusting, tmp_path=tmp_path
    )
    assert code == 0 and fourth["present"] == 5, output
    assert _secret(keys["ci-1"][0]) not in output
