"""What `artstore warm` counts. CI pre-warm compiles are counted apart (issue 38.6):
`warm_compiles`, not misses, so a store freshly warmed by `artstore warm` shows the hit rate
of the programs that read it. And its report is what its processes did (issue 46): loaded,
stored, or compiled but not stored and why, never what the index says exists."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import devstack
import pytest
from conftest import (
    FAKE_AWS,
    PROGRAMS,
    TEAM_SIGNING,
    artstore,
    artstore_warm,
    clean_env,
    run_program,
)


def _stats(env: dict[str, str]) -> dict[str, Any]:
    proc = artstore("stats", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_a_warmed_store_counts_warm_compiles_apart(tmp_path: Path) -> None:
    """Slow: `artstore warm` of a JAX program, then the program itself."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    warm = subprocess.run(
        [sys.executable, "-m", "artifactstore", "warm", "--", sys.executable,
         str(PROGRAMS / "job.py")],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    warmed = _stats(env)
    assert warmed["entries"] > 0 and warmed["warm_compiles"] == warmed["entries"], (
        warmed,
        warm.stderr[-3000:],
    )
    assert warmed["misses"] == 0 and warmed["lookups_missed"] == 0
    run = run_program("job.py", env)
    assert run["xla_compiles"] == [] and run["store"]["hits"] == warmed["entries"]
    after = _stats(env)
    assert after["hits"] == warmed["entries"] and after["misses"] == 0
    assert after["hit_rate"] == 1.0  # was 50%: the warm compiles counted as misses
    assert "warm compiles" in artstore("stats", env=env).stdout


# -- what `artstore warm` reports is what its processes did ---------------------------------
WARM_SCRIPT = str(PROGRAMS / "warm_script.py")


@pytest.fixture
def s3_sqlite_env(moto_endpoint: str, tmp_path: Path) -> dict[str, str]:
    """CI writer settings as docs/operations.md has them: a bucket (moto), an index (SQLite),
    writer credentials and the signing key."""
    bucket = "artstore-" + uuid.uuid4().hex[:12]
    devstack.create_bucket(moto_endpoint, bucket)
    return clean_env(
        ARTSTORE_URL=f"s3://{bucket}/cache",
        ARTSTORE_INDEX=f"sqlite:///{tmp_path / 'index.db'}",
        AWS_ENDPOINT_URL_S3=moto_endpoint,
        **FAKE_AWS,
        **TEAM_SIGNING,
    )


def _warm(env: dict[str, str], tmp_path: Path, *options: str) -> tuple[int, dict[str, Any], str]:
    return artstore_warm(*options, "--", sys.executable, WARM_SCRIPT, env=env, tmp_path=tmp_path)


def test_warm_counts_outcomes_and_min_entries(
    s3_sqlite_env: dict[str, str], tmp_path: Path
) -> None:
    """Slow: three warms of a JAX program. Stored, then loaded: each count is what the
    program's process did (its own counters say the same), and --min-entries holds or not."""
    code, first, output = _warm(s3_sqlite_env, tmp_path)
    assert code == 0, output
    ran = json.loads(output.splitlines()[0])
    entries = _stats(s3_sqlite_env)["entries"]
    assert first["added"] == ran["store"]["stored"] == entries == first["entries"] > 0, output
    assert (first["present"], first["not_stored"], first["problems"]) == (0, {}, [])
    assert first["compile_secs_saved"] == 0.0  # nothing loaded: nothing saved in this run
    assert first["compile_secs_saved_per_process"] == pytest.approx(first["compile_secs_added"])

    code, again, output = _warm(s3_sqlite_env, tmp_path, "--min-entries", str(entries))
    assert code == 0, output
    ran = json.loads(output.splitlines()[0])
    assert ran["xla_compiles"] == [] and ran["store"]["hits"] == entries
    assert (again["added"], again["present"], again["entries"]) == (0, entries, entries)
    assert again["compile_secs_saved"] == pytest.approx(first["compile_secs_added"])
    assert f"{entries} (loaded from the store, not compiled)" in output

    code, short, output = _warm(s3_sqlite_env, tmp_path, "--min-entries", str(entries + 1))
    assert code == 1, output
    [line] = [p for p in short["problems"] if p.startswith("--min-entries")]
    assert line.startswith(f"--min-entries {entries + 1}: only {entries} entries were stored")
    assert f"problem: {line}" in output


def test_warm_on_another_bucket_fails_and_claims_nothing_present(
    s3_sqlite_env: dict[str, str], tmp_path: Path
) -> None:
    """Slow: the issue's measured case. The index is bound to the team's bucket (a warm
    filled it); ARTSTORE_URL then names another bucket that exists. warm asks the write
    gate before it runs anything: one line, exit 1, nothing compiled (measured before:
    the job ran, compiled everything and stored nothing). Where the command itself points
    its program elsewhere, the gate refuses in the run: warm says so, exit 1, claiming
    nothing present."""
    code, first, output = _warm(s3_sqlite_env, tmp_path)
    assert code == 0 and first["added"] > 0, output
    bucket = "artstore-other-" + uuid.uuid4().hex[:8]
    devstack.create_bucket(s3_sqlite_env["AWS_ENDPOINT_URL_S3"], bucket)
    wrong = {**s3_sqlite_env, "ARTSTORE_URL": f"s3://{bucket}/cache"}

    for target in (["--", sys.executable, WARM_SCRIPT], ["warm_specs:specializations"]):
        code, report, output = artstore_warm(*target, env=wrong, tmp_path=tmp_path)
        assert code == 1 and report == {}, output
        [line] = output.strip().splitlines()
        assert "do not belong together" in line and "testing-secret" not in line, line
        assert line.startswith("artstore: error: object store s3://" + bucket), line
    assert _stats(s3_sqlite_env)["entries"] == first["added"]  # nothing changed there

    # The command's own ARTSTORE_URL (env, in the command) wins in its program: warm's
    # store is the team's, the program's the other bucket, and its gate refuses there.
    url = f"ARTSTORE_URL={wrong['ARTSTORE_URL']}"
    command = ("--", "env", url, sys.executable, WARM_SCRIPT)
    code, report, output = artstore_warm(*command, env=s3_sqlite_env, tmp_path=tmp_path)
    assert code == 1, output
    ran = json.loads(output.splitlines()[0])
    assert ran["xla_compiles"] and ran["store"]["store_mismatch"] >= 1  # the gate refused
    assert (report["added"], report["present"], report["entries"]) == (0, 0, 0), output
    assert report["not_stored"] == {"write gate": len(ran["xla_compiles"])}
    assert report["compile_secs_saved"] == 0 and report["compile_secs_saved_per_process"] == 0
    gate = [p for p in report["problems"] if "compiled but not stored" in p]
    assert len(gate) == 1 and "write gate refused them" in gate[0], report["problems"]
    assert "do not belong together" in gate[0]
    assert "0 (loaded from the store, not compiled)" in output
    assert "testing-secret" not in output
    assert _stats(s3_sqlite_env)["entries"] == first["added"]  # nothing changed there


def test_warm_names_what_it_found_but_could_not_load(
    s3_sqlite_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow: an entry signed by the team's key whose executable JAX cannot load here (a
    writer's jaxlib bug, say): the warm process compiles it, and the report counts it as
    found but not loadable and as not stored (`unloadable`: the stored entry stays),
    exit 1, the fix (`artstore rm KEY`) named; never "present"."""
    import dataclasses

    import tamper

    from artifactstore import config
    from artifactstore.formats import codec
    from artifactstore.store import Store

    code, first, output = _warm(s3_sqlite_env, tmp_path)
    assert code == 0 and first["added"] > 0, output
    for name, value in s3_sqlite_env.items():
        monkeypatch.setenv(name, value)
    settings = config.resolve({}, s3_sqlite_env)
    store = Store.open(settings)
    try:
        entry = next(iter(store.parts.index.iter_entries()))
        data = store.parts.blobs.get(entry.digest)
        meta = codec.read_meta(data or b"")
        assert data is not None and meta is not None
        junk = b"no executable of any XLA"
        forged = codec.encode(
            junk,
            entry.fingerprint,
            dataclasses.replace(meta, key=entry.key, raw_size=len(junk)),
            signer=settings.signing_key,
            namespace=settings.namespace,
        )
        store.parts.blobs.put(forged.digest, forged.data)
        tamper.point(
            store, entry.key, forged.digest, size=len(forged.data), raw_size=forged.raw_size
        )
    finally:
        store.close()

    code, report, output = _warm(s3_sqlite_env, tmp_path)
    assert code == 1, output
    assert report["unloadable"] == 1 and report["not_stored"] == {"unloadable": 1}, report
    assert report["present"] == first["added"] - 1 and report["added"] == 0, report
    [line] = [p for p in report["problems"] if "compiled but not stored" in p]
    assert "JAX could not load it here" in line and "artstore rm KEY" in line, line
    assert "1 (found, JAX could not load them)" in output


def test_warm_names_an_upload_that_failed(s3_sqlite_env: dict[str, str], tmp_path: Path) -> None:
    """Slow: the bucket takes no upload (its PUTs go unanswered; lookups answer): what the
    program compiled is not stored for `upload`, said with the failure, exit 1."""
    from faultproxy import FaultProxy

    code, first, output = _warm(s3_sqlite_env, tmp_path)  # binds the pair, fills the store
    assert code == 0 and first["added"] > 0, output
    port = int(s3_sqlite_env["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
    proxy = FaultProxy(("127.0.0.1", port)).start()
    try:
        proxy.set_mode("freeze-writes")
        env = {**s3_sqlite_env, "AWS_ENDPOINT_URL_S3": proxy.endpoint, "ARTSTORE_TIMEOUT": "2"}
        command = ("--", sys.executable, WARM_SCRIPT, "--variant", "2")  # a new key
        code, report, output = artstore_warm(*command, env=env, tmp_path=tmp_path)
    finally:
        proxy.stop()
    assert code == 1, output
    ran = json.loads(output.splitlines()[0])
    compiled = len(ran["xla_compiles"])
    assert compiled >= 1 and report["not_stored"] == {"upload": compiled}, report
    assert report["added"] == 0, report
    [line] = [p for p in report["problems"] if "compiled but not stored" in p]
    assert "their upload failed" in line, line
    assert "testing-secret" not in output
