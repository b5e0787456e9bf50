"""One settings table (issue 39, item 5): every `ARTSTORE_*` variable declared once, and
what is derived from it (configure(), the environment, the reference, doctor, --help);
a mistyped name gets one warning naming the real one, in a program, the CLI and doctor,
and no module outside config/ reads a setting's variable itself."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROGRAMS, artstore, clean_env, run_program

from artifactstore import config
from artifactstore.config import table, variables
from artifactstore.config.values import seconds
from artifactstore.errors import ConfigError
from artifactstore.jaxhook import api

PACKAGE = Path(__file__).resolve().parents[1] / "artifactstore"
REPO = PACKAGE.parent
TYPOS = {"ARTSTORE_READONLY": "ARTSTORE_READ_ONLY", "ARTSTORE_NAMESPCE": "ARTSTORE_NAMESPACE"}


def _said(text: str, typo: str) -> list[str]:
    return [line for line in text.splitlines() if typo in line]


def test_each_variable_is_declared_once() -> None:
    names = [row.env for row in variables.VARIABLES]
    keywords = [row.keyword for row in config.SETTINGS]
    assert len(names) == len(set(names)) and len(keywords) == len(set(keywords))
    assert all(row.doc.strip() and row.kind for row in variables.VARIABLES)


def test_every_configure_keyword_maps_to_a_row_and_a_settings_attribute() -> None:
    explicit = [
        p.name
        for p in inspect.signature(api.configure).parameters.values()
        if p.kind is not p.VAR_KEYWORD
    ]
    assert set(explicit) <= set(table.BY_KEYWORD)
    built = config.resolve({}, {})
    for row in config.SETTINGS:
        assert getattr(config.Settings, row.attr) is row, row.env  # the row is the attribute
        if row.parse is not None and row.keyword != "require_signatures":  # scheme decides
            assert getattr(built, row.attr) == row.default, row.env
    with pytest.raises(ConfigError, match="unknown option 'read_onyl'"):
        config.resolve({"read_onyl": True}, {})


def test_a_row_added_to_the_table_is_a_settings_attribute_with_its_default() -> None:
    """A new setting is one row in the class body (here a subclass's, as the table's
    own would be): an attribute with its default, its value where given, in the rows,
    the repr and equality; and mypy reads its type from the row (`mypy artifactstore`)."""

    class Wider(config.Settings):
        new_secs = config.Var("NEW_SECS", "new_secs", "seconds", 2.5, "A new one.", seconds())

    where = {"blobs": config.BlobLocation("file", "/x"), "index_url": "sqlite:///x"}
    plain = Wider(**where)
    assert plain.new_secs == 2.5 and plain.namespace == config.defaults.DEFAULT_NAMESPACE
    assert Wider.rows()[-1] is Wider.new_secs and Wider.new_secs.env == "ARTSTORE_NEW_SECS"
    given = Wider(**where, new_secs=Wider.new_secs.parse("ARTSTORE_NEW_SECS", "7", 2.5))
    assert given.new_secs == 7.0 and "new_secs=7.0" in repr(given) and given != plain
    assert Wider(**where) == plain and hash(Wider(**where)) == hash(plain)
    with pytest.raises(AttributeError, match="immutable"):
        plain.new_secs = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="blobs"):
        Wider(index_url="sqlite:///x")  # where the store lives has no default
    with pytest.raises(TypeError, match="no 'new_sec'"):
        Wider(**where, new_sec=1.0)


def test_the_environment_is_parsed_by_the_rows() -> None:
    env = {"ARTSTORE_READ_ONLY": "1", "ARTSTORE_NAMESPACE": "team", "ARTSTORE_TIMEOUT": "2.5"}
    env |= {"ARTSTORE_LOCAL_TIER_SIZE": "1G", "ARTSTORE_PREFETCH": "0"}
    got = config.resolve({}, env)
    assert (got.read_only, got.namespace, got.timeout_secs) == (True, "team", 2.5)
    assert (got.local_tier_bytes, got.prefetch) == (1000**3, False)
    assert config.resolve({"namespace": "mine"}, env).namespace == "mine"  # arguments win
    with pytest.raises(ConfigError, match="ARTSTORE_TIMEOUT"):
        config.resolve({}, {"ARTSTORE_TIMEOUT": "0"})


def test_every_row_is_in_the_generated_reference() -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        import reference
    finally:
        sys.path.remove(str(REPO / "docs" / "hooks"))
    settings, others = reference.settings_table(), reference.variables_table()
    for row in config.SETTINGS:
        assert f"### `{row.env}`" in settings and f"`{row.keyword}=`" in settings, row.env
        assert " ".join(row.doc.split()) in settings, row.env
    for row in variables.OTHERS:
        assert f"`{row.env}`" in others, row.env


def test_help_texts_come_from_the_rows() -> None:
    proc = artstore("--help", env=clean_env())
    assert "ARTSTORE_NAMESPACE; default: default" in " ".join(proc.stdout.split())


def test_typos_name_the_nearest_variable() -> None:
    env = {**TYPOS, "ARTSTORE_RUN": "x", "ARTSTORE_WARM": "y", "ARTSTORE_TEST_READERS": "3"}
    env |= {"ARTSTORE_URL": "/x", "ARTSTORE_ZZZZZZZZ": "1", "HOME": "/"}
    found = dict(variables.typos(env))
    assert found == {**TYPOS, "ARTSTORE_ZZZZZZZZ": None}  # ours (internal too) never warn


def test_a_typo_in_a_program_is_one_warning(tmp_path: Path) -> None:
    base = {k: v for k, v in clean_env().items() if k != "ARTSTORE_ACTIVATE"}
    for typo, real in TYPOS.items():
        env = {**base, "ARTSTORE_URL": str(tmp_path / "store"), typo: "1"}
        out = run_program("plain_jax.py", env)
        assert out["activated"], out["_stderr"]
        said = _said(out["_stderr"], typo)
        assert len(said) == 1 and real in said[0], out["_stderr"]
    # An explicit configure() warns too, once, however often it is called.
    code = "import artifactstore as a; a.configure(); a.configure()"
    env = {**clean_env(ARTSTORE_URL=str(tmp_path / "store")), "ARTSTORE_READONLY": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=PROGRAMS,
    )
    said = _said(proc.stderr, "ARTSTORE_READONLY")
    assert len(said) == 1 and "ARTSTORE_READ_ONLY" in said[0], proc.stderr


def test_a_typo_in_a_cli_call_is_one_line_not_an_error(tmp_path: Path) -> None:
    for typo, real in TYPOS.items():
        proc = artstore("ls", env=clean_env(ARTSTORE_URL=str(tmp_path / "store"), **{typo: "1"}))
        assert proc.returncode == 0, proc.stderr
        said = _said(proc.stderr, typo)
        assert said == [f"artstore: warning: {said[0].split(': ', 2)[-1]}"], proc.stderr
        assert real in said[0]


def test_a_typo_is_a_row_of_doctor(tmp_path: Path) -> None:
    for typo, real in TYPOS.items():
        env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), **{typo: "1"})
        proc = artstore("doctor", "--json", env=env)
        row = json.loads(proc.stdout)["checks"]["variables"]
        assert row["status"] == "warn" and real in row["detail"] and typo in row["detail"]
        assert "ARTSTORE_URL" in row["set"]
        human = artstore("doctor", env=env)
        assert len(_said(human.stdout + human.stderr, typo)) == 1, human.stdout
        assert human.returncode == proc.returncode == 0, human.stdout  # a warning only


def test_doctor_says_off_where_a_typo_leaves_the_store_off(tmp_path: Path) -> None:
    """No ARTSTORE_URL but `ARTSTORE_URLS`: programs here compile without the store, so
    doctor's verdict is "off", naming the variable meant, exit 1. Known names alone, or
    ARTSTORE_ACTIVATE=0 (off on purpose), are not that.

    Slow: 15-25 s on 2 busy cores; four doctors, each importing JAX for its rows.
    """
    base = clean_env(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    base.pop("ARTSTORE_ACTIVATE")
    env = {**base, "ARTSTORE_URLS": str(tmp_path / "store")}
    proc = artstore("doctor", "--json", env=env)
    report = json.loads(proc.stdout)
    off = (
        "the store is off: ARTSTORE_URL is not set, but ARTSTORE_URLS (did you mean "
        "ARTSTORE_URL?) is set"
    )
    assert proc.returncode == 1 and report["verdict"] == off and report["used"] == "no"
    assert report["checks"]["activation"]["status"] == "fail"
    human = artstore("doctor", env=env)
    assert human.returncode == 1 and "verdict: the store is off" in human.stdout, human.stdout
    for meant in ({**env, "ARTSTORE_ACTIVATE": "0"}, {**base, "ARTSTORE_NAMESPACE": "team"}):
        proc = artstore("doctor", "--json", env=meant)
        report = json.loads(proc.stdout)
        assert proc.returncode == 0 and "would be used" in report["verdict"], report["verdict"]


# The startup hook runs before the package can be imported (standard library only): it
# reads the three variables that decide activation itself; a unit test keeps them equal.
_OUTSIDE_CONFIG = {"startup/artifactstore_startup.py": {"ARTSTORE_URL"}}


def _environment_reads(tree: ast.Module) -> set[str]:
    """`ARTSTORE_*` names read through os.environ / os.getenv / an `environ` mapping,
    literally or through a module-level constant."""
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }

    def name_of(arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return constants.get(arg.id) if isinstance(arg, ast.Name) else None

    def is_environ(node: ast.expr) -> bool:
        text = ast.unparse(node)
        return text.endswith("environ") or text in ("env", "environ")

    found = set()
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Subscript):  # a read, not a child's environment being set
            if isinstance(node.ctx, ast.Load) and is_environ(node.value):
                arg = node.slice
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "getenv", "pop"):
                if func.attr == "getenv" or is_environ(func.value):
                    arg = node.args[0]
        name = name_of(arg) if arg is not None else None
        if name and name.startswith(config.ENV_PREFIX):
            found.add(name)
    return found


def test_no_module_outside_config_reads_a_setting_from_the_environment() -> None:
    settings = {row.env for row in config.SETTINGS}
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("config/"):
            continue
        found = _environment_reads(ast.parse(path.read_text()))
        reads += [f"{rel}: {n}" for n in sorted(found & settings - _OUTSIDE_CONFIG.get(rel, set()))]
    assert reads == [], "read settings through artifactstore.config (resolve, from_environment)"


def test_the_reads_rule_catches_a_read() -> None:
    code = 'import os\nV = "ARTSTORE_TIMEOUT"\nos.environ.get(V)\nos.getenv("ARTSTORE_URL")\n'
    code += 'env["ARTSTORE_NAMESPACE"]\nenv["ARTSTORE_INDEX"] = "set for a child"\n'
    found = _environment_reads(ast.parse(code))
    assert found == {"ARTSTORE_TIMEOUT", "ARTSTORE_URL", "ARTSTORE_NAMESPACE"}
