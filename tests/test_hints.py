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
from sqlalchemy.engine import make_url
from test_doctor_truth import POLICIES, _as, _psql, login  # noqa: F401 (login: a fixture)

from artifactstore.config import host
from artifactstore.formats.put import Put

FP = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu-hints",
                  device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip
INSTALL = "pip install 'artifactstore[postgres]'"
POLICIES_REL = "infra/policies/grant-namespace.sql"


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


def _fenced(page: str, after: str) -> list[str]:
    """The lines of the first ``` block after the text `after` on docs page `page`."""
    text = (REPO / "docs" / page).read_text()
    block = re.search(r"```\w*\n(.*?)```", text[text.index(after) :], re.S)
    assert block is not None, after
    return block.group(1).splitlines()


def test_team_setup_doctor_reads_the_fingerprint_it_says_it_checks(tmp_path: Path) -> None:
    """team-setup.md says the writer's doctor checks this host's fingerprint; measured
    before: its `artstore doctor` printed "not read" there (JAX's backend is opened only
    with --device). The page's command, run as written, reads it."""
    [command] = [c for c in _fenced("team-setup.md", "## 4. Writers") if "artstore doctor" in c]
    args = command.split()[1:]
    env = clean_env(ARTSTORE_URL=str(tmp_path / "s"))
    del env["JAX_PLATFORMS"]  # JAX's default backend, as on the writer's host
    proc = artstore(*args, "--json", env=env)
    assert proc.returncode in (0, 1), proc.stderr
    row = json.loads(proc.stdout)["checks"]["fingerprint"]
    assert row["status"] == "ok" and row["opened"] is True, row
    plain = artstore(*args[:1], "--json", env=env)  # without --device: it says how
    row = json.loads(plain.stdout)["checks"]["fingerprint"]
    assert row["status"] == "skip" and "`artstore doctor --device`" in row["detail"], row


def test_a_reader_without_the_postgres_extra_is_told_what_to_install(
    tmp_path: Path, team_env: dict[str, str]
) -> None:
    """team-setup.md said readers need only the base package; `ls --named` (as `ls` and
    `stats`) reads the index and needs the extra: the page says so, and without it the
    command exits 1 with one line naming the install."""
    page = (REPO / "docs" / "team-setup.md").read_text()
    assert "Readers need only the base package" not in page
    reader = page[page.index("Readers' programs need only the base package") :][:400]
    assert "`ls --named`" in reader and INSTALL in reader, reader

    blocked = tmp_path / "no_driver" / "psycopg"  # the base install: no psycopg
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n"
    )
    env = dict(team_env, ARTSTORE_READ_ONLY="1", PYTHONPATH=str(blocked.parent))
    for args in (["ls", "--named"], ["stats"]):
        proc = _cli(env, *args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        [line] = proc.stderr.splitlines()
        assert "driver is not installed" in line and line.endswith(INSTALL), line


def test_an_ungranted_namespace_is_said_once_with_its_name_and_the_whole_fix(
    pg_url: str,
    login: str,  # noqa: F811 (the fixture of test_doctor_truth, imported above)
    tmp_path: Path,
) -> None:
    """A writer program whose login was never granted its namespace; measured before:
    the lease, each upload and the hit flush each said it (a literal NAMESPACE in the
    fix, the upload's line cut off at 300 characters). Now one line, doctor's words."""
    admin = clean_env(ARTSTORE_URL=str(tmp_path / "s"), ARTSTORE_INDEX=pg_url)
    assert artstore("db", "upgrade", env=admin).returncode == 0
    database = str(make_url(pg_url).database)
    _psql(database, "-f", str(POLICIES / "postgres-roles.sql"))
    _psql(database, "-c", f'GRANT artstore_writer TO "{login}"')
    ns = login
    env = dict(admin, ARTSTORE_INDEX=_as(pg_url, login), ARTSTORE_NAMESPACE=ns)
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "ten_lines.py")],
        env=env, capture_output=True, text=True, check=False, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in proc.stderr.splitlines() if "not granted namespace" in ln]
    assert len(said) == 1, proc.stderr
    fix = f"`psql -d {database} -v namespace={ns} -v role={login} -f {POLICIES_REL}`"
    assert f"role {login} is not granted namespace {ns}:" in said[0] and fix in said[0], said
    assert "NAMESPACE" not in proc.stderr
