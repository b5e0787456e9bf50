"""Activation without code: ARTSTORE_URL alone, `artstore run -- CMD`, and what they cost.

Real processes throughout: the .pth file that the (editable) install put in
site-packages, JAX compiles in fresh interpreters, the CLI as users run it.
"""

from __future__ import annotations

import json
import re
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PROGRAMS, clean_env, run_program

from artifactstore.runtime.run import STARTUP_DIR

pytestmark = pytest.mark.slow

SUMMARY = re.compile(
    r"artstore run: hits (\d+), misses (\d+) \((\d+) stored\), "
    r"~[\d.]+ s of compiling saved, (\d+) process(?:es)?"
    r"(?:; \d+ quick compiles not stored \(ARTSTORE_MIN_COMPILE_SECS\)"
    r"(?:, \d+ kept on this host)?)?"
    r"(?:; \d+ of the hits quick compiles kept on this host)?"
    r"(?:; compiling took [\d.]+ s)?$"
)


def activated_env(base: dict[str, str], **extra: str) -> dict[str, str]:
    """`base` as a user's environment: ARTSTORE_* settings and no ARTSTORE_ACTIVATE=0."""
    env = {k: v for k, v in base.items() if k != "ARTSTORE_ACTIVATE"}
    env.update(extra)
    return env


def python(code: str, env: dict[str, str], cwd: Path | None = None) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc


def summary_of(stderr: str) -> tuple[int, int, int, int]:
    found = SUMMARY.search(stderr.rstrip())
    assert found, stderr
    loaded, compiled, stored, processes = map(int, found.groups())
    return loaded, compiled, stored, processes


def test_the_install_ships_the_pth_file_at_the_top_of_site_packages() -> None:
    pth = [Path(d) / "artifactstore_startup.pth" for d in site.getsitepackages()]
    [found] = [p for p in pth if p.is_file()]
    assert found.read_text().count("\n") == 1  # one line: site.py executes it
    installed = (found.parent / "artifactstore_startup.py").read_text()
    source = (STARTUP_DIR / "artifactstore_startup.py").read_text()
    assert installed == source, "a stale copy: reinstall (pip install -e .)"


def test_a_program_that_never_heard_of_us_hits_on_its_second_run(
    any_env: dict[str, str],
) -> None:
    env = activated_env(any_env)
    cold = run_program("plain_jax.py", env)
    assert cold["activated"] and cold["xla_compiles"] >= 1 and cold["cache_hits"] == 0
    warm = run_program("plain_jax.py", env)
    assert warm["activated"] and warm["result"] == cold["result"]
    assert warm["xla_compiles"] == 0 and warm["cache_hits"] == cold["xla_compiles"]


def test_activate_zero_turns_it_off_for_one_process(tmp_path: Path) -> None:
    env = activated_env(clean_env(ARTSTORE_URL=str(tmp_path / "store")), ARTSTORE_ACTIVATE="0")
    out = run_program("plain_jax.py", env)
    assert not out["activated"] and out["xla_compiles"] >= 1
    assert not (tmp_path / "store").exists()
    # ARTSTORE_ACTIVATE=1 alone: the embedded default (here under XDG_CACHE_HOME).
    env = activated_env(clean_env(XDG_CACHE_HOME=str(tmp_path / "xdg")), ARTSTORE_ACTIVATE="1")
    assert run_program("plain_jax.py", env)["activated"]
    assert list((tmp_path / "xdg" / "artifactstore").iterdir())
    # Read again when JAX is imported: a program (a conftest.py) can turn it off first.
    code = "import os; os.environ['ARTSTORE_ACTIVATE'] = '0'; import jax, sys; "
    code += "print('artifactstore.jaxhook.api' in sys.modules)"
    assert python(code, env).stdout.strip() == "False"
    assert python(code.replace("'0'", "'1'"), env).stdout.strip() == "True"
    bad = run_program("plain_jax.py", {**env, "ARTSTORE_ACTIVATE": "maybe"})
    assert not bad["activated"]
    assert "ARTSTORE_ACTIVATE='maybe' is neither 1 nor 0" in bad["_stderr"]


def _modules_at_startup(env: dict[str, str]) -> list[str]:
    """Modules `python -X importtime -c pass` imported that are ours or JAX's."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    names = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()]
    # An editable install's own finder (setuptools') is not ours to account for.
    return [n for n in names if re.match(r"(artifactstore|jax)", n)]


def test_unset_the_hook_imports_nothing_and_a_process_without_jax_pays_nothing(
    tmp_path: Path,
) -> None:
    unset = {k: v for k, v in clean_env().items() if not k.startswith("ARTSTORE_")}
    assert _modules_at_startup(unset) == []
    # Set, a process that never imports JAX loads only the stdlib-only hook ...
    env = activated_env(clean_env(ARTSTORE_URL=str(tmp_path / "store")))
    assert _modules_at_startup(env) == ["artifactstore_startup"]
    code = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(python(code, env).stdout)
    assert [m for m in loaded if m.startswith(("artifactstore", "jax"))] == [
        "artifactstore_startup"
    ]
    assert not (tmp_path / "store").exists()  # ... and opens no store


def test_an_explicit_configure_wins_before_or_after_importing_jax(tmp_path: Path) -> None:
    env = activated_env(clean_env(ARTSTORE_URL=str(tmp_path / "from_env")))
    for order in ("configure_first", "jax_first"):
        explicit = tmp_path / order
        code = (
            f"import artifactstore\nartifactstore.configure({str(explicit)!r})\n"
            if order == "configure_first"
            else f"import jax\nimport artifactstore\nartifactstore.configure({str(explicit)!r})\n"
        ) + (
            "import jax, jax.numpy as jnp\n"
            "jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((16, 16))).block_until_ready()\n"
            "print(artifactstore.process_stats()['compiles'])\n"
        )
        assert int(python(code, env).stdout) >= 1
        assert list(explicit.glob("**/*.db")), order
    assert not (tmp_path / "from_env").exists()  # never opened: replaced before a compile


def test_a_users_sitecustomize_still_runs_beside_the_pth_hook(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = activated_env(clean_env(ARTSTORE_URL=str(tmp_path / "store"), PYTHONPATH=str(other)))
    out = run_program("plain_jax.py", env)
    assert out["activated"]
    code = "import os; print(os.environ.get('CHAINED'))"
    assert python(code, env).stdout.strip() == "yes"


def test_a_broken_configuration_never_stops_the_program(tmp_path: Path, pg_url: str) -> None:
    reference = run_program("plain_jax.py", clean_env())["result"]
    broken = {
        "malformed URL": {"ARTSTORE_URL": "s3:/no-bucket"},
        "S3 without an index": {"ARTSTORE_URL": "s3://bucket/cache"},
        "unreachable S3": {
            "ARTSTORE_URL": "s3://bucket/cache", "ARTSTORE_INDEX": pg_url,
            "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9", "ARTSTORE_TIMEOUT": "2",
            "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s3cr3t-never-shown",
        },
    }  # fmt: skip
    for what, settings in broken.items():
        env = activated_env(clean_env(**settings))
        out = run_program("plain_jax.py", env)
        assert out["result"] == reference and out["xla_compiles"] >= 1, what
        said = [line for line in out["_stderr"].splitlines() if "artifactstore" in line]
        assert len(said) == 1, (what, out["_stderr"])
        assert "s3cr3t" not in out["_stderr"]


def _artstore_run(env: dict[str, str], *args: str, cwd: Path | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "artifactstore", "run", *args], env=env, cwd=cwd,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_run_activates_the_store_in_subprocesses_and_spawn_workers(
    tmp_path: Path,
) -> None:
    """`artstore run` activates the store in the program, its subprocess and its spawn worker.

    Slow: 10-18 s on 2 busy cores; three `artstore run`s, each starting three processes
    that import JAX (nine JAX interpreters).
    """
    # `artstore run` must work whatever the environment says: ARTSTORE_ACTIVATE=0 inherited.
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), PLAIN_SPAWN="1")
    program = [sys.executable, str(PROGRAMS / "plain_jax.py")]
    cold = _artstore_run(env, "--", *program)
    assert cold.returncode == 0, cold.stderr
    loaded, compiled, stored, processes = summary_of(cold.stderr)
    assert processes == 3 and compiled >= 2 and stored == compiled

    warm = _artstore_run(env, "--read-only", "--", *program)
    assert warm.returncode == 0, warm.stderr
    out = json.loads(warm.stdout.strip().splitlines()[-1])
    for who in (out, out["spawned"], out["subprocess"]):
        assert who["activated"] and who["xla_compiles"] == 0 and who["cache_hits"] >= 1, out
    assert summary_of(warm.stderr) == (loaded + compiled, 0, 0, 3)

    quiet = _artstore_run(env, "--quiet", "--namespace", "other", "--", *program)
    assert quiet.returncode == 0 and "artstore run:" not in quiet.stderr
    assert json.loads(quiet.stdout.strip().splitlines()[-1])["xla_compiles"] >= 1  # other ns


def test_run_keeps_the_commands_exit_code_and_says_what_is_wrong(tmp_path: Path) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    failing = _artstore_run(env, "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert failing.returncode == 3
    assert "no process used the store" in failing.stderr  # it never imported JAX

    missing = _artstore_run(env, "--", "no-such-command-here")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "artstore: error: command not found: 'no-such-command-here'"
    ]
    for args in ((), ("--",)):
        usage = _artstore_run(env, *args)
        assert usage.returncode == 2 and "Traceback" not in usage.stderr
        assert len(usage.stderr.strip().splitlines()) == 1

    # A store that cannot work never stops the command: it runs, compiling, told once.
    bad = _artstore_run(
        {**env, "ARTSTORE_URL": "s3:/bad"}, "--", sys.executable, "-c", "print('ran')"
    )
    assert bad.returncode == 0 and bad.stdout == "ran\n"
    assert bad.stderr.count("\n") == 1 and "running the command without the store" in bad.stderr


def test_a_typo_in_the_switch_is_said_once_where_it_leaves_the_store_off(
    tmp_path: Path,
) -> None:
    """`ARTSTORE_UR` or `ARTSTORE_URLS` and no ARTSTORE_URL: nothing turns the store on,
    and the program says so in one line when it imports JAX, naming ARTSTORE_URL. Known
    names alone (read by configure() and the CLI without ARTSTORE_URL) and
    ARTSTORE_ACTIVATE=0 (off on purpose) say nothing; a process that never imports JAX
    says nothing and loads the stdlib-only hook alone.

    Slow: 15-30 s on 2 busy cores; two JAX programs and four fresh interpreters, two of
    which import JAX.
    """
    base = activated_env(clean_env())
    for typo in ("ARTSTORE_UR", "ARTSTORE_URLS"):
        out = run_program("plain_jax.py", {**base, typo: str(tmp_path / "store")})
        said = [line for line in out["_stderr"].splitlines() if "ARTSTORE" in line]
        assert said == [
            f"artifactstore: the store is off: ARTSTORE_URL is not set, but {typo} "
            "(did you mean ARTSTORE_URL?) is set"
        ], out["_stderr"]
        assert not out["activated"] and out["xla_compiles"] >= 1
    assert not (tmp_path / "store").exists()

    env = {**base, "ARTSTORE_UR": str(tmp_path / "store")}
    assert _modules_at_startup(env) == ["artifactstore_startup"]
    assert python("print('ran')", env).stderr == ""
    import_jax = "import jax, jax.numpy; print('ran')"
    for quiet in ({**base, "ARTSTORE_NAMESPACE": "team"}, {**env, "ARTSTORE_ACTIVATE": "0"}):
        assert python(import_jax, quiet).stderr == "", quiet


def test_arming_later_turns_on_what_the_start_left_off() -> None:
    """A process started with ARTSTORE_* names but nothing that turns the store on waits
    for JAX only to say so; `pytest --artstore` arms it later (`arm`): the store then
    activates at JAX's import, as in a process started with no ARTSTORE_* name at all."""
    code = (
        "import sys, artifactstore_startup as s; s.arm('environment'); "
        "print([f.how for f in sys.meta_path if isinstance(f, s._JaxImportHook)])"
    )
    for env in (activated_env(clean_env(ARTSTORE_NAMESPACE="team")), clean_env()):
        assert python(code, env).stdout.strip() == "['environment']", env
