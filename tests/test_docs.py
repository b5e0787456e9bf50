"""The documentation runs: the `bash` blocks of two pages, and the site's strict build.

`docs/getting-started.md` and `docs/team-setup.md` are run as written: every fenced `bash`
block of a page, in order, in one `bash -euo pipefail` shell (`sh` blocks are shown, not
run: installs, and commands for servers a test does not have), in the checkout's root as a
reader who cloned the repository stands there: its `artifactstore/` first on `python -m`'s
path, shadowing the installed package. A `python` block with a `title="FILE"` is the file
FILE in the shell's directory. What a reader would have differs only where the test
supplies it: `python` and `artstore` on PATH are this interpreter and this checkout, the
root is a directory of links to the checkout's entries (what the pages write stays out of
the checkout), HOME is a temporary directory, and on the team page the four site settings
that the page's own `<!-- test: site -->` block exports (bucket, namespace, database,
endpoint) point at a moto server and a fresh PostgreSQL database.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import devstack
import pytest
from conftest import FAKE_AWS, IN_CI, REPO, TEST_CACHE

DOCS = REPO / "docs"
_FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_TITLE = re.compile(r'title="([^"]+)"')
_SITE = "<!-- test: site -->"
# Settings a reader's shell may hold that would change what the pages' commands do.
_FOREIGN = ("ARTSTORE_", "AWS_", "PG", "PROMETHEUS_", "JAX_", "XLA_")


def _blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, title, body) of every fenced block of `page`, in order."""
    out = []
    for match in _FENCE.finditer(page.read_text()):
        title = _TITLE.search(match.group(2))
        out.append((match.group(1), title.group(1) if title else "", match.group(3)))
    return out


def _site_exports(page: Path) -> set[str]:
    """The names the page's site block exports (the settings a reader edits)."""
    text = page.read_text()
    assert _SITE in text, f"{page.name}: no {_SITE} block"
    block = _FENCE.search(text, text.index(_SITE))
    assert block is not None and block.group(1) == "sh", f"{page.name}: site block"
    return set(re.findall(r"^export (\w+)=", block.group(3), re.MULTILINE))


def _bin(tmp_path: Path) -> Path:
    """`python` and `artstore` as a reader's activated venv has them: this interpreter."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, line in (("python", ""), ("artstore", " -m artifactstore")):
        script = bindir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}"{line} "$@"\n')
        script.chmod(0o755)
    return bindir


def _run_page(page: Path, tmp_path: Path, **settings: str) -> str:
    """Run the page's bash blocks in the checkout's root (as links) and a fresh HOME."""
    work = tmp_path / "checkout"
    home = tmp_path / "home"
    work.mkdir()
    home.mkdir()
    for entry in REPO.iterdir():  # the checkout's root, less its tools' state
        if not entry.name.startswith(".") and entry.name not in ("site", "build"):
            (work / entry.name).symlink_to(entry)
    script = ["set -euo pipefail"]
    for n, (language, title, body) in enumerate(_blocks(page)):
        if language == "python" and title:
            assert not (work / title).is_symlink(), f"{title}: a file of the checkout"
            (work / title).write_text(body)
        elif language == "bash":
            script += [f"echo '>>> {page.name}, block {n}' >&2", body]
    assert len(script) > 1, f"{page.name} has no bash block"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    env.update(
        PATH=f"{_bin(tmp_path)}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        JAX_PLATFORMS="cpu",  # what CI has; a reader's default backend works the same
        **settings,
    )
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=work, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{page.name}: exit {proc.returncode}\n{output[-6000:]}"
    return output


def _run_hits(output: str) -> list[int]:
    """The hits of each `artstore run` summary line, in order."""
    return [int(n) for n in re.findall(r"^artstore run: hits (\d+)", output, re.MULTILINE)]


@pytest.mark.slow
def test_getting_started_runs(tmp_path: Path) -> None:
    """The page's commands do what it says: the second run of the example loads both steps.

    Slow: 40-60 s on 2 busy cores; it runs the page as written, where every command is a
    fresh process and five of them import JAX (doctor, the first program twice, and
    `artstore run` twice on the bundled example).
    """
    output = _run_page(DOCS / "getting-started.md", tmp_path)
    hits = _run_hits(output)
    assert len(hits) == 2 and hits[1] >= 2, output[-4000:]  # the second loads both steps


@pytest.mark.slow
def test_team_setup_runs(tmp_path: Path, moto_endpoint: str, postgres: None) -> None:
    """The page sets up a signed team store from nothing: a writer stores, and both a reader
    and a node prepared by `artstore pull` load what it stored.

    Slow: 60-95 s on 2 busy cores; it runs the page as written: roles and schema with psql,
    a key, a writer's `artstore warm`, the operator's quota, gc and stats, a reader's run
    and a pull, each command a fresh process.
    """
    page = DOCS / "team-setup.md"
    tag = uuid.uuid4().hex[:10]
    bucket, database, namespace = f"docs-{tag}", f"artstore_docs_{tag}", f"docs-{tag}"
    site = {
        "ARTSTORE_URL": f"s3://{bucket}/cache",
        "ARTSTORE_NAMESPACE": namespace,
        "TEAM_DB": f"{devstack.HOST}:{devstack.PG_PORT}/{database}",
        "AWS_ENDPOINT_URL_S3": moto_endpoint,
    }
    assert _site_exports(page) == set(site), "the page's site block and this test disagree"
    devstack.create_bucket(moto_endpoint, bucket)
    devstack.create_database(database)
    try:
        output = _run_page(page, tmp_path, **site, **FAKE_AWS)
    finally:
        devstack.drop_database(database)
        devstack.drop_roles(f"artstore_ns_{namespace}")
    assert "entries added" in output, output[-4000:]  # the writer's warm stored something
    hits = _run_hits(output)  # the reader's run, and the pulled node's
    assert len(hits) == 2 and min(hits) >= 2, output[-4000:]


def test_site_builds_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict`: every link and anchor resolves, and the generated references
    (settings from artifactstore.config, the CLI from click) agree with the code."""
    if importlib.util.find_spec("mkdocs") is None:
        if IN_CI:
            pytest.fail("mkdocs is not installed: CI installs it with the dev extra ('.[docs]')")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "XDG_CACHE_HOME": str(TEST_CACHE)}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_readme_links_to_pages_that_exist() -> None:
    """The README is the front door: each docs/ page it links to is there."""
    readme = (REPO / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", readme))
    assert linked, "the README links to no docs page"
    assert [link for link in sorted(linked) if not (REPO / link).is_file()] == []
    assert len(readme.splitlines()) <= 250


def _readme_program() -> str:
    """The README's "In ten lines" program, as written there."""
    readme = REPO / "README.md"
    text = readme.read_text()
    section = text[text.index("## In ten lines") :]
    blocks = [body for language, _, body in _blocks_of(section) if language == "python"]
    assert blocks, "the README's ten-line section has no python block"
    return blocks[0]


def _blocks_of(text: str) -> list[tuple[str, str, str]]:
    return [(m.group(1), "", m.group(3)) for m in _FENCE.finditer(text)]


def _code_lines(source: str) -> list[str]:
    """Statements without comments, blank lines and type hints' differences in `def`."""
    out = []
    for line in source.splitlines():
        line = line.split("  #")[0].rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        out.append(re.sub(r": jax\.Array|-> jax\.Array", "", line).replace(" :", ":"))
    return out


def test_readme_ten_lines_is_the_example_and_loads_on_the_second_run(tmp_path: Path) -> None:
    """The README's ten lines are examples/ten_lines.py's program, and run as written twice
    (fresh processes, embedded store) the second loads every executable the first stored:
    on a fast CPU every compile of the step is under the default 0.1 s threshold, so a
    program without `min_compile_secs=0` would store nothing (seen before this test). The
    `stored` it prints is what `artstore ls` lists (measured before: it printed 9 while an
    upload still ran, and ls listed 10)."""
    program = _readme_program()
    example = (REPO / "examples" / "ten_lines.py").read_text()
    shown = ("process_stats", "artifactstore.flush()")  # the example's report, not README's
    example_code = [
        ln for ln in _code_lines(example.split('"""', 2)[2]) if not any(w in ln for w in shown)
    ]
    assert _code_lines(program) == example_code
    script = tmp_path / "ten_lines.py"
    script.write_text(example)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        stats = proc.stdout.strip().splitlines()[-1]
        runs.append({k: int(v) for k, v in re.findall(r"'(\w+)': (\d+)", stats)})
        if len(runs) == 1:
            listed = subprocess.run(
                [sys.executable, "-m", "artifactstore", "ls", "--json"],
                env=env, capture_output=True, text=True, timeout=300, check=True,
            )  # fmt: skip
            assert runs[0].get("stored", 0) == len(json.loads(listed.stdout)) > 0, runs
    assert runs[0].get("hits", 0) == 0, runs
    assert runs[1].get("hits", 0) == runs[0]["compiles"] and runs[1].get("compiles", 0) == 0, runs
