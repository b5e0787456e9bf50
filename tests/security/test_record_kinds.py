"""Issue 38 item 3: no kind of untrusted bytes without a hostile-record test and a table row.

Every kind a process reads from a bucket, a tier or a bundle is registered in
`artifactstore.blobstores.base.UNTRUSTED_KINDS`. This test fails when a registered kind

- has no Hypothesis test declaring it: a test function anywhere under tests/ decorated
  with `@pytest.mark.hostile_record("<kind name>", ...)` and with `@given(...)` (on
  itself, or on a function it defines and runs);
- has no row in docs/security.md's table of the trust boundary (first cell: the name);
- names a decoder that does not exist;

and when a test declares a kind the registry does not know (a typo would cover nothing).
The declarations are read from the test files' source (no import, no run), so a new test
file covers its kind by its decorator alone.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

from artifactstore.blobstores.base import UNTRUSTED_KINDS

TESTS = Path(__file__).resolve().parents[1]
SECURITY_PAGE = TESTS.parent / "docs" / "security.md"


def _name(node: ast.expr) -> str:
    """The dotted name of a decorator's callee (`pytest.mark.hostile_record`, `given`)."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _uses_given(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the test, or a function inside it (a test that needs a function-scoped
    fixture runs its `@given` function itself), is a Hypothesis test."""
    return any(
        isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(_name(d).split(".")[-1] == "given" for d in inner.decorator_list)
        for inner in ast.walk(node)
    )


def declarations(root: Path = TESTS) -> dict[str, list[str]]:
    """kind -> the Hypothesis tests (file::function) that declare it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if not _uses_given(node):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and _name(deco).endswith("mark.hostile_record"):
                    for arg in deco.args:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            where = f"{path.relative_to(root).as_posix()}::{node.name}"
                            found[arg.value].append(where)
    return found


def table_rows(page: Path = SECURITY_PAGE) -> set[str]:
    """The first cells of the page's table rows, without markup."""
    rows = set()
    for line in page.read_text().splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.add(line.strip("|").split("|")[0].strip().strip("*`").strip())
    return rows


def test_every_kind_has_a_hostile_record_test() -> None:
    declared = declarations()
    missing = [k.name for k in UNTRUSTED_KINDS if not declared.get(k.name)]
    assert not missing, (
        f"no Hypothesis test declares @pytest.mark.hostile_record({missing[0]!r}): write one "
        f"that drives hostile records of it through its real path (tests/security/hostile.py). "
        f"All missing: {missing}"
    )


def test_every_declared_kind_is_registered() -> None:
    known = {k.name for k in UNTRUSTED_KINDS}
    unknown = {k: v for k, v in declarations().items() if k not in known}
    assert not unknown, f"tests declare kinds the registry does not know: {unknown}"


def test_every_kind_has_a_row_in_the_security_page() -> None:
    rows = table_rows()
    missing = [k.name for k in UNTRUSTED_KINDS if k.name not in rows]
    assert not missing, f"docs/security.md's trust-boundary table has no row for {missing}"


def test_every_decoder_exists() -> None:
    for kind in UNTRUSTED_KINDS:
        module, _, qualname = kind.decoder.partition(":")
        target: object = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        assert callable(target), kind.decoder


def test_the_registry_test_sees_a_missing_declaration(tmp_path: Path) -> None:
    """The scan is not vacuous: a marker without @given, or none, covers nothing."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\nfrom hypothesis import given, strategies as st\n"
        '@pytest.mark.hostile_record("manifest")\n@given(st.binary())\ndef test_a(d): ...\n'
        '@pytest.mark.hostile_record("identity")\ndef test_b(): ...\n'
    )
    found = declarations(tmp_path)
    assert found == {"manifest": ["test_x.py::test_a"]}
    page = tmp_path / "page.md"
    page.write_text("| Kind | Who |\n|---|---|\n| **manifest** | writers |\n")
    assert table_rows(page) == {"Kind", "manifest"}
