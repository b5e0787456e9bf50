"""Hit-journal folding is bounded per run (issue 38.7): count and bytes; the rest is left
for the next run and said in the summary of `artstore fold` and of gc.

Journals are records anyone who may write the bucket can put there, so they are made
here directly in the bucket through boto3, as such a writer would."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import OpenStore, artstore, bucket_of, s3_client

from artifactstore.cli.app import cli as main
from artifactstore.formats.journal import Journal, new_name
from artifactstore.gc import journals as fold_module
from artifactstore.gc.journals import fold_journals

K1 = "ab" * 32


def _put_journals(env: dict[str, str], count: int, *, pad: int = 0) -> list[str]:
    """`count` one-row hit journals (each a hit on K1 and a miss), PUT into the bucket."""
    bucket, prefix = bucket_of(env)
    s3 = s3_client(env)
    names = []
    for _ in range(count):
        name = new_name()
        body = _journal(pad)
        s3.put_object(Bucket=bucket, Key=f"{prefix}/default/journals/{name}", Body=body)
        names.append(name)
    return names


def _journal(pad: int) -> bytes:
    """A hit on K1 and `pad` other keys, and a miss. Whole seconds: every such journal
    is the same size (a float's shortest repr varies by a few digits: three journals
    then fitted, once, in a bound made for two)."""
    now = float(int(time.time()))
    accesses = {K1: (1, now)} | {f"{i:064x}": (1, now) for i in range(pad)}
    return Journal(accesses, {"misses": 1}).encode()


def _fold(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = artstore("fold", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_fold_takes_at_most_its_bound_and_the_next_run_the_rest(
    team_env: dict[str, str],
) -> None:
    _put_journals(team_env, 25)
    first = _fold(team_env, "--max-journals", "10")
    assert (first["journals_folded"], first["journals_left"], first["hits"]) == (10, 15, 10)
    text = artstore("fold", "--max-journals", "6", env=team_env)
    assert text.returncode == 0, text.stderr
    assert "folded 6 hit journals into the index; 9 left for the next run" in text.stdout
    assert "at most 500 journals or 8.0 MiB" in text.stdout, text.stdout
    rest = _fold(team_env)  # the default bound (500) takes the rest
    assert (rest["journals_folded"], rest["journals_left"], rest["hits"]) == (9, 0, 9)
    assert _fold(team_env)["journals_folded"] == 0
    stats = json.loads(artstore("stats", "--json", env=team_env).stdout)
    assert stats["lookups_missed"] == 25  # each journal's miss counted once


def test_fold_bounds_the_bytes_it_reads(team_env: dict[str, str], open_store: OpenStore) -> None:
    """Journals of ~6.7 KB each (100 rows) under a 20,000-byte bound: two per run."""
    _put_journals(team_env, 5, pad=99)
    store = open_store(team_env)
    bound = 3 * len(_journal(99)) - 1
    runs = []
    while True:
        fold = fold_journals(store.parts, max_bytes=bound)
        runs.append((fold.journals, fold.left))
        if not fold.left:
            break
    assert runs == [(2, 3), (2, 1), (1, 0)]


def test_gc_says_what_its_fold_left(
    team_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc's fold has the same bound (here lowered to 4) and says what it left."""
    _put_journals(team_env, 7)
    monkeypatch.setattr(fold_module, "FOLD_MAX_JOURNALS", 4)
    for name, value in team_env.items():
        if name.startswith("AWS_") or name == "NO_PROXY":
            monkeypatch.setenv(name, value)
    runner = CliRunner()
    first = runner.invoke(main, ["gc", "--max-size", "1G"], env=team_env, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "folded 4 hit journals into the index; 3 left for the next run" in first.output
    again = runner.invoke(main, ["gc", "--json", "--max-size", "1G"], env=team_env)
    assert again.exit_code == 0, (again.output, again.exception)
    report = json.loads(again.stdout)["summary"]
    assert (report["journals_folded"], report["journals_left"]) == (3, 0)
