"""Old and new clients share one store during a rollout, loading nothing wrong.

The previous release's package is taken from this repository's history (`git
archive`) and put ahead of the installed one on PYTHONPATH, so the same test
program runs as a 0.1 client and as this version, against one store.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import JobResults, artstore, clean_env, old_client, run_program

import artifactstore
from artifactstore.index import db

# The last commit of the previous release (0.1.0): objects without metadata frames.
PREVIOUS_RELEASE = "033a5c2"


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = old_client(
        PREVIOUS_RELEASE,
        tmp_path_factory.mktemp("artifactstore-0.1.0"),
        "artifactstore",
        "migrations",
    )
    # Where an installed wheel has them: else `artifactstore.migrations` would be
    # found through this checkout's editable install, with this version's scripts.
    shutil.copytree(root / "migrations", root / "artifactstore" / "migrations")
    return root


# The schema the previous release's client requires (it refuses any other).
OLD_SCHEMA = "0002"


def _env(tmp_path: Path, old: Path | None) -> dict[str, str]:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_LOCAL_TIER="off")
    if old is not None:
        env["PYTHONPATH"] = str(old)
    else:  # this version signs what it writes (readers that trust no key ignore that)
        key = tmp_path / "rollout.key"
        if not key.exists():
            from artifactstore.config.keyfiles import generate

            generate("rollout", tmp_path)
        env["ARTSTORE_SIGNING_KEY"] = str(key)
    return env


def _downgrade(index: Path, revision: str) -> None:
    from alembic import command

    from artifactstore.index import db

    engine = db.open_engine(f"sqlite:///{index}")
    try:
        with engine.begin() as conn:
            command.downgrade(db._alembic_config(conn), revision)
    finally:
        engine.dispose()


@pytest.mark.parametrize("writer", ["old", "new"])
def test_each_version_loads_what_the_other_stored(
    writer: str, previous_release: Path, tmp_path: Path, job_results: JobResults
) -> None:
    """Slow: installs the previous release into a venv; real JAX programs with each version."""
    old, new = _env(tmp_path, previous_release), _env(tmp_path, None)
    write_env, read_env = (old, new) if writer == "old" else (new, old)
    reference = job_results("0")
    first = run_program("job.py", write_env)
    if writer == "new":
        # This version's index schema (0003: entries' signers; 0004: usage) is newer than the old
        # client understands, and it refuses such an index (it compiles, loading
        # nothing: asserted below). Objects must still be readable across versions:
        # step the index back to the old schema, then the old client reads the objects
        # this version wrote, signed ones included (two skippable frames after the
        # payload).
        refused = run_program("job.py", read_env)
        assert refused["results"] == reference
        # (The old client names the head as newer, or as not its own where its
        # migrations directory resolves to a checkout that has it.)
        assert "index schema" in refused["_stderr"] and db.SCHEMA_HEAD in refused["_stderr"]
        _downgrade(tmp_path / "store" / "index.db", OLD_SCHEMA)
    second = run_program("job.py", read_env)
    assert first["xla_compiles"]
    versions = {"old": "0.1.0", "new": artifactstore.__version__}
    assert first["version"] == versions[writer]  # really the two versions
    assert second["version"] == versions["new" if writer == "old" else "old"]
    assert second["results"] == reference
    assert second["xla_compiles"] == [], second["_stderr"]  # everything loaded
    assert "artifactstore" not in second["_stderr"], second["_stderr"]
    # The new version's tools see a consistent store, whoever wrote it. The old client
    # publishes no manifests: `verify` names its entries, and `--repair` (the documented
    # step after upgrading writers) publishes them.
    assert artstore("db", "upgrade", env=new).returncode == 0
    if writer == "new":
        # Stepping the schema back to 0002 dropped the index's side of the store identity:
        # an index bound to nothing before a bound object store is refused (one bucket, one
        # index) until a person binds them; `db bind` says what that orphans (nothing here).
        before = json.loads(artstore("db", "check", "--json", env=new).stdout)
        assert before["binding"] == "MISMATCH" and "db bind" in before["problems"][0], before
        bound = artstore("db", "bind", env=new)
        assert bound.returncode == 0, bound.stdout + bound.stderr
    if writer == "old":
        found = json.loads(artstore("verify", "--json", env=new).stdout)
        assert len(found["manifests_missing"]) == len(first["xla_compiles"]), found
        assert artstore("verify", "--repair", env=new).returncode == 0
    assert artstore("verify", env=new).returncode == 0
    check = artstore("db", "check", "--json", env=new)
    assert json.loads(check.stdout)["ok"] is True, check.stdout
