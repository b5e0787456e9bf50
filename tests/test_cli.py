"""The CLI on an empty and on a populated embedded store, and on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import artstore, clean_env, run_program

from artifactstore.formats.put import Put
from artifactstore.index import db


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = clean_env(ARTSTORE_URL=str(tmp_path_factory.mktemp("populated") / "store"))
    run_program("job.py", env)
    run_program("job.py", env)  # hits, so stats and ls show them
    return env


def _ok(*args: str, env: dict[str, str]) -> str:
    proc = artstore(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


@pytest.mark.parametrize("which", ["empty", "populated"])
def test_every_command(which: str, tmp_path: Path, populated: dict[str, str]) -> None:
    env = populated if which == "populated" else clean_env(ARTSTORE_URL=str(tmp_path / "s"))
    entries = json.loads(_ok("ls", "--json", env=env))
    stats = json.loads(_ok("stats", "--json", env=env))
    verify = json.loads(_ok("verify", "--json", env=env))
    assert verify["ok"] is True
    assert stats["entries"] == len(entries)
    assert "default" in _ok("stats", env=env)
    table = _ok("ls", env=env)
    if which == "empty":
        assert entries == [] and stats["hits"] == 0
        assert table.strip() == "no entries"
        assert "OK" in _ok("verify", env=env)
    else:
        assert len(entries) >= 2 and stats["hits"] == len(entries)
        assert stats["misses"] == len(entries) and stats["compile_secs_saved"] > 0
        assert {e["platform"] for e in entries} == {"cpu"}
        assert all(e["hits"] == 1 for e in entries)
        assert "jit_mlp" in table and "MODULE" in table
        assert verify["objects_checked"] == len(entries)
        assert json.loads(_ok("ls", "--json", "--platform", "gpu", env=env)) == []
        assert len(json.loads(_ok("ls", "--json", "--limit", "1", env=env))) == 1
    assert _ok("db", "current", env=env).count("current") == 1
    assert f"revision {db.SCHEMA_HEAD}" in _ok("db", "upgrade", env=env)


def test_fingerprint() -> None:
    data = json.loads(_ok("fingerprint", "--json", env=clean_env()))
    assert data["platform"] == "cpu" and data["device_count"] >= 1
    assert len(data["digest"]) == 64 and isinstance(data["cpu_features"], list)
    text = _ok("fingerprint", env=clean_env())
    assert data["digest"] in text and "cpu_features:" in text


def test_rm_by_prefix_and_all(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"))
    run_program("job.py", env)
    entries = json.loads(_ok("ls", "--json", env=env))
    victim = entries[0]["key"]
    out = _ok("rm", victim[:12], env=env)
    assert out.startswith("removed 1 entry, ")  # measured before: "removed 1 entries"
    left = json.loads(_ok("ls", "--json", env=env))
    assert victim not in {e["key"] for e in left} and len(left) == len(entries) - 1
    assert json.loads(_ok("verify", "--json", env=env))["ok"] is True
    noun = "entry" if len(left) == 1 else "entries"
    assert _ok("rm", "--all", "--yes", env=env).startswith(f"removed {len(left)} {noun}")
    assert json.loads(_ok("ls", "--json", env=env)) == []
    assert not any((tmp_path / "s" / "default" / "objects").rglob("*.*"))


@pytest.mark.parametrize(
    ("args", "env_extra", "needle"),
    [
        (["frobnicate"], {}, "No such command"),
        (["ls", "--bogus"], {}, "No such option"),
        (["--url", "gs://bucket/x", "ls"], {}, "unsupported store URL scheme 'gs'"),
        (["--url", "s3://B_ad/x", "ls"], {}, "invalid S3 bucket name"),
        (["--url", "s3://bucket/x", "ls"], {}, "needs a shared index"),
        (["--url", "file://host/x", "ls"], {}, "use file:///absolute/path"),
        (["--index", "mysql://u@h/db", "ls"], {}, "unsupported index database 'mysql'"),
        (["--index", "postgresql+psycopg://u:hunter2@h:bad/db", "ls"], {}, "malformed index URL"),
        (["--namespace", "bad ns!", "ls"], {}, "invalid namespace"),
        (["ls"], {"ARTSTORE_READ_ONLY": "maybe"}, "invalid boolean 'maybe'"),
        (["ls"], {"ARTSTORE_TIMEOUT": "soon"}, "invalid number 'soon'"),
        (["rm"], {}, "give KEY... or --all"),
        (["rm", "xyz"], {}, "invalid key 'xyz'"),
        (["rm", "0123456789ab"], {}, "no entry matches '0123456789ab'"),
        (["ls", "--limit", "0"], {}, "Invalid value for '--limit'"),
    ],
)
def test_bad_input_gives_one_clear_line(
    args: list[str], env_extra: dict[str, str], needle: str, tmp_path: Path
) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"), **env_extra)
    proc = artstore(*args, env=env)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("artstore: error: ")
    assert needle in lines[0]
    assert "hunter2" not in proc.stderr


def test_unreachable_index_is_one_line(tmp_path: Path) -> None:
    env = clean_env(
        ARTSTORE_URL=str(tmp_path / "s"),
        ARTSTORE_INDEX="postgresql+psycopg://postgres:s3cret@127.0.0.1:1/nope",
        ARTSTORE_TIMEOUT="2",
    )
    proc = artstore("stats", env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "index database error" in lines[0]
    assert "s3cret" not in proc.stderr


def test_schema_newer_than_known_is_refused(tmp_path: Path) -> None:
    import sqlite3

    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"))
    _ok("stats", env=env)  # creates the embedded index
    con = sqlite3.connect(tmp_path / "s" / "index.db")
    con.execute("UPDATE alembic_version SET version_num='9999'")
    con.commit()
    con.close()
    proc = artstore("ls", env=env)
    assert proc.returncode == 1
    assert "newer than this artifactstore understands" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_postgres_driver_names_the_extra(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psycopg'] = None; "  # as if artifactstore[postgres] were absent
        "sys.argv = ['artstore', 'stats']; from artifactstore.cli import main; main()"
    )
    env = clean_env(ARTSTORE_URL=str(tmp_path), ARTSTORE_INDEX="postgresql://u@127.0.0.1:1/x")
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "pip install 'artifactstore[postgres]'" in proc.stderr


def test_index_fields_cannot_drive_the_terminal(store_env: dict[str, str]) -> None:
    """Anyone who may write the index chooses module and host names: `ls` and a gc
    dry run print their control characters escaped."""
    from artifactstore import config
    from artifactstore.config.host import compute
    from artifactstore.store import Store

    evil = "f\x1b]0;owned\x07\x1b[2J\nnext"
    fp = compute(platform_name="cpu", platform_version="v", device_kind="cpu",
                 device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
    store = Store.open(config.resolve(environ=store_env))
    store.put(Put("e" * 64, b"x", fp, evil, 1))
    store.close()
    for args in (["ls"], ["gc", "--dry-run", "--max-size", "0"]):
        out = _ok(*args, env=store_env)
        assert "\x1b" not in out and "\x07" not in out, (args, out)
        assert "\\x1b" in out, (args, out)  # shown, escaped
