"""Issue 29.1: a team store's readers run only what a trusted key signed, by default.

Measured before: with the default team set-up, one S3 PutObject (no index access, no key)
re-pointed a manifest at a forged object and every reader ran it. Each test here failed
before signatures were required by default on stores that are not a local directory.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TEAM_KEY, TEAM_PUB, OpenStore, artstore, bucket_of, run_program, s3_client

from artifactstore import config
from artifactstore.config import host, keyfiles
from artifactstore.errors import ConfigError
from artifactstore.formats import codec
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put

SLOW = {"ARTSTORE_MIN_COMPILE_SECS": "0.5", "JOB_SLOW_COMPILE_SECS": "0.6"}
NO_KEYS_LINE = "requires signatures and no key is trusted"


def _big(out: dict[str, Any]) -> list[str]:
    """Which of job.py's two main functions XLA compiled in that run."""
    return sorted(n for n in ("mlp", "loss_and_grad") for c in out["xla_compiles"] if n in c)


def _without_keys(env: dict[str, str], **extra: str) -> dict[str, str]:
    """`env` as a process with no key of its own (the reader of a default set-up)."""
    out = {k: v for k, v in env.items() if k != "ARTSTORE_SIGNING_KEY"}
    return {**out, **extra}


def _bucket_and_base(env: dict[str, str], namespace: str = "default") -> tuple[str, str]:
    bucket, prefix = bucket_of(env)
    return bucket, f"{prefix}/{namespace}"


def _manifests(env: dict[str, str]) -> dict[str, Manifest]:
    """Every published manifest, read as an attacker would: straight from the bucket."""
    s3 = s3_client(env)
    bucket, base = _bucket_and_base(env)
    found = {}
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"{base}/keys/")
    for item in listing.get("Contents", []):
        key = item["Key"].rsplit("/", 1)[1]
        body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        found[key] = Manifest.decode(body, key)
    return found


def _forge(env: dict[str, str], victim: Manifest, source: Manifest) -> str:
    """With S3 PutObject alone: `source`'s executable relabelled as `victim`'s entry
    (unsigned: the attacker holds no key), and `victim`'s manifest pointed at it."""
    s3 = s3_client(env)
    bucket, base = _bucket_and_base(env)
    obj = f"{base}/objects/{source.digest[:2]}/{source.digest}"
    data = s3.get_object(Bucket=bucket, Key=obj)["Body"].read()
    meta = codec.read_meta(data)
    assert meta is not None
    payload = codec.decode(data, digest=source.digest,
                           fingerprint=source.fingerprint)  # fmt: skip
    forged = codec.encode(payload, source.fingerprint,
                          codec.ObjectMeta(**{**meta.__dict__, "key": victim.key}))  # fmt: skip
    digest = forged.digest
    s3.put_object(Bucket=bucket, Key=f"{base}/objects/{digest[:2]}/{digest}", Body=forged.data)
    record = dataclasses.replace(victim, digest=digest, size=len(forged.data),
                                 raw_size=source.raw_size)  # fmt: skip
    s3.put_object(Bucket=bucket, Key=f"{base}/keys/{victim.key}", Body=record.encode())
    return digest


@pytest.fixture
def forged_team(team_env: dict[str, str]) -> dict[str, Any]:
    """A team store (writers sign) holding both variants of job.py, then the measured
    attack: variant 0's `mlp` manifest re-pointed at variant 1's executable."""
    writer = {**team_env, **SLOW}
    first = run_program("job.py", writer)
    assert first["store"]["stored"] == 2, first["_stderr"]
    before = _manifests(team_env)
    second = run_program("job.py", {**writer, "JOB_VARIANT": "1"})
    assert second["store"]["stored"] == 1, second["_stderr"]
    after = _manifests(team_env)
    (new,) = set(after) - set(before)
    (victim,) = [m for m in before.values() if "mlp" in m.module_name]
    _forge(team_env, victim, after[new])
    return {"env": writer, "first": first["results"], "second": second["results"]}


def test_a_bucket_writer_alone_cannot_choose_what_a_default_reader_runs(
    forged_team: dict[str, Any],
) -> None:
    """The measured attack, against a reader set up as the docs say: it trusts the
    writers' public key. And against one with no key at all: it loads nothing."""
    env = forged_team["env"]
    reader = _without_keys(env, ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB), ARTSTORE_READ_ONLY="1",
                           ARTSTORE_LOCAL_TIER="off")  # fmt: skip
    out = run_program("job.py", reader)
    assert out["results"] == forged_team["first"]
    assert _big(out) == ["mlp"], out["_stderr"]
    assert out["store"]["hits"] == 1 and out["store"]["unsigned"] == 1

    bare = _without_keys(env, ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER="off")
    out = run_program("job.py", bare)
    assert out["results"] == forged_team["first"]
    assert _big(out) == ["loss_and_grad", "mlp"], out["_stderr"]
    lines = [line for line in out["_stderr"].splitlines() if NO_KEYS_LINE in line]
    assert len(lines) == 1, out["_stderr"]
    # Never advice to turn signatures off: the bucket's other writers would decide what runs.
    assert "ARTSTORE_TRUSTED_KEYS" in lines[0] and "REQUIRE_SIGNATURES" not in lines[0]


def test_the_attack_fails_with_the_index_unreachable_too(forged_team: dict[str, Any]) -> None:
    bare = _without_keys(forged_team["env"], ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER="off",
                         ARTSTORE_INDEX="postgresql+psycopg://nobody@127.0.0.1:9/none")  # fmt: skip
    out = run_program("job.py", bare)
    assert out["results"] == forged_team["first"]
    assert _big(out) == ["loss_and_grad", "mlp"], out["_stderr"]


def test_signatures_off_is_an_explicit_choice_that_trusts_every_bucket_writer(
    forged_team: dict[str, Any],
) -> None:
    """What ARTSTORE_REQUIRE_SIGNATURES=0 means, as the security model says: write access
    to the bucket alone decides what runs (the forged executable is loaded)."""
    reader = _without_keys(forged_team["env"], ARTSTORE_REQUIRE_SIGNATURES="0",
                           ARTSTORE_READ_ONLY="1", ARTSTORE_LOCAL_TIER="off")  # fmt: skip
    out = run_program("job.py", reader)
    assert _big(out) == [], out["_stderr"]
    assert out["results"] != forged_team["first"]


def test_required_by_default_on_team_stores_and_off_for_a_local_directory(
    tmp_path: Path,
) -> None:
    team = {"url": "s3://team-jax/cache", "index": "postgresql://u@h/db"}
    assert config.resolve(team, environ={}).require_signatures
    assert config.resolve(team, environ={}).trusted_keys is not None  # empty: loads nothing
    off = config.resolve(team, environ={"ARTSTORE_REQUIRE_SIGNATURES": "0"})
    assert not off.require_signatures and off.trusted_keys is None
    assert not config.resolve({"require_signatures": False, **team}, environ={}).require_signatures
    local = config.resolve({"url": str(tmp_path / "store")}, environ={})
    assert not local.require_signatures and local.trusted_keys is None
    assert config.resolve({"url": str(tmp_path)}, environ={
        "ARTSTORE_REQUIRE_SIGNATURES": "1"}).require_signatures  # fmt: skip
    with pytest.raises(ConfigError, match="ARTSTORE_REQUIRE_SIGNATURES: use 1/0"):
        config.resolve(team, environ={"ARTSTORE_REQUIRE_SIGNATURES": "maybe"})


def test_a_process_trusts_its_own_key(tmp_path: Path) -> None:
    team = {"url": "s3://team-jax/cache", "index": "postgresql://u@h/db"}
    own = config.resolve({**team, "signing_key": str(TEAM_KEY)}, environ={})
    assert own.trusted_keys is not None and own.trusted_keys.names == ["team-tests"]
    key, _pub = keyfiles.generate("other", tmp_path)
    both = config.resolve({**team, "signing_key": str(key), "trusted_keys": str(TEAM_PUB)}, {})
    assert both.trusted_keys is not None and both.trusted_keys.names == ["other", "team-tests"]


def test_a_writer_without_a_key_stores_nothing_says_so_once_and_a_keyless_reader_fetches_nothing(
    team_env: dict[str, str], open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Where signatures are required, an unsigned entry is loaded by no reader, and its row
    would hold the key: a writer without ARTSTORE_SIGNING_KEY (a typo in its name) stores
    nothing, says so once, and compiles as usual."""
    writer = open_store(_without_keys(team_env))
    fp = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                      device_count=1, jax_version="0", jaxlib_version="0")  # fmt: skip
    for n in range(3):
        put = Put(f"{n:02d}" * 32, b"x" * 100, fingerprint=fp, module_name="m", compile_secs=1.0)
        assert writer.put(put) is False
    warned = [r for r in caplog.records if "stores nothing" in r.getMessage()]
    assert len(warned) == 1 and "ARTSTORE_SIGNING_KEY" in warned[0].getMessage()
    counts = writer.parts.counters.snapshot()
    assert counts.get("skipped_unsigned") == 3 and counts.get("stored", 0) == 0
    assert writer.get("00" * 32, fp.digest) is None
    assert counts.get("bytes_downloaded", 0) == 0 and counts.get("bytes_uploaded", 0) == 0
    signer = open_store(team_env)
    assert not signer.parts.index.lookup("00" * 32)  # no row holds the key
    signer.put(Put("aa" * 32, b"y" * 100, fingerprint=fp, module_name="m", compile_secs=1.0))
    hit = signer.get("aa" * 32, fp.digest)
    assert hit is not None and hit.payload == b"y" * 100
    assert len([r for r in caplog.records if "stores nothing" in r.getMessage()]) == 1


def test_doctor_shows_the_trust_mode(team_env: dict[str, str]) -> None:
    def signing_row(env: dict[str, str]) -> dict[str, Any]:
        out = artstore("doctor", "--json", env=env)
        return dict(json.loads(out.stdout)["checks"]["signing"])

    bare = signing_row(_without_keys(team_env))
    assert bare["require_signatures"] is True and bare["status"] == "warn"
    assert "LOADS NOTHING" in bare["detail"] and "stores nothing" in bare["detail"]
    ok = signing_row(team_env)
    assert ok["status"] == "ok" and "loads only entries signed by team-tests" in ok["detail"]
    off = signing_row(_without_keys(team_env, ARTSTORE_REQUIRE_SIGNATURES="0"))
    assert "write access to the bucket decides what runs" in off["detail"]
