"""README.md and docs/ as a newcomer follows them: each page's shell blocks, run as written.

The pages run in the order a reader meets them (PAGES), as one reader: one copy of the
checkout (this working tree's files), one HOME, and the venvs the pages' install lines build,
each install line once (pages with the same line share its venv: the line's place in the page
becomes a link to it), unpinned, as pip resolves it today. A page without an install line runs
in the venv the reader activated last. A `python` block with a `title="FILE"` is the file FILE,
saved in the checkout before the page runs. Each page is one `bash` process; its blocks run in
order, with the site's values in place of the page's placeholders (pages.SUBSTITUTIONS), and
each is checked as its `docs-test` comments say (pages.py): its exit code, its output.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from conftest import REPO

from docs_phase.conftest import Newcomer
from docs_phase.pages import INSTALL, Block, Site, blocks, files, substitute

DOCS = REPO / "docs"
# In the order a reader meets them; each page's path from the checkout's root.
PAGES = (
    "README.md",
    "docs/getting-started.md",
    "docs/team-setup.md",
    "docs/jax.md",
    "docs/operations.md",
    "docs/named.md",
)
# Pages with shell blocks that another phase runs, and why (a page in neither fails below).
ELSEWHERE = {
    "docs/native.md": "its installs (the native extra, IREE: 100 MB) and commands are what "
    "tests/test_native.py runs on CI's venvs with that extra (build, get, iree-run-module, "
    "native.load); add it to PAGES once its blocks carry docs-test comments",
    "docs/pytorch.md": "its installs (the torch extras) are CI's torch phase's; add it to "
    "PAGES once its blocks carry docs-test comments and that phase builds no venv of its own",
}
MARK = re.compile(r"^>>> block (\d+)$", re.MULTILINE)
EXIT = re.compile(r"^<<< exit (\d+)$", re.MULTILINE)


def script(page: list[Block], newcomer: Newcomer) -> list[str]:
    """The page as one shell script: each block that runs, after a line naming it."""
    lines = ["set -uo pipefail"]
    if not any(block.install and not block.skip for block in page):
        lines.append("source .venv/bin/activate  # the venv the reader activated last")
    for block in page:
        if block.skip:
            continue
        body = substitute(block.body, newcomer.site)
        if block.install:
            body = INSTALL.sub(lambda m: newcomer.link(m.group("args").strip()), body)
        lines.append(f"echo '>>> block {block.number}'")
        lines += [f"export {k}={substitute(v, newcomer.site)}" for k, v in block.env.items()]
        lines += ["set -e" if block.exit == 0 else "set +e", body]
        lines += ['echo "<<< exit $?"' if block.exit else "", "set +e"]
    return lines


def outputs(said: str) -> dict[int, str]:
    """Each block's output (stdout and stderr together), by its number."""
    parts = MARK.split(said)
    return {int(n): text for n, text in zip(parts[1::2], parts[2::2], strict=True)}


def checked(page: list[Block], code: int, stdout: str) -> list[str]:
    """What went otherwise than the page says, from the script's exit code and output."""
    said = outputs(stdout)
    ran = [block for block in page if block.number in said]
    if code != 0:
        return [f"{ran[-1].where if ran else page[0].page}: exit {code}"]
    problems = []
    for block in ran:
        codes = EXIT.findall(said[block.number])
        if block.exit and codes != [str(block.exit)]:
            problems.append(f"{block.where}: exit {codes}, not {block.exit}")
        problems += [f"{block.where}: no {pattern!r} in its output"
                     for pattern in block.expect
                     if not re.search(pattern, said[block.number], re.MULTILINE)]  # fmt: skip
    if len(ran) < len([block for block in page if not block.skip]):
        problems.append(f"{page[0].page}: ran {len(ran)} blocks")
    return problems


@pytest.mark.docs_phase
@pytest.mark.parametrize("path", PAGES)
def test_page_runs_as_written(path: str, newcomer: Newcomer) -> None:
    """Every block the page runs exits as it says and prints what it says.

    Slow: the install lines build venvs from the package index (once each), and the pages
    run the demo, programs and `artstore` commands in fresh processes.
    """
    page = blocks(REPO / path)
    assert page, f"{path} has no shell block"
    for name, text in files(REPO / path).items():  # as the reader saves them
        (newcomer.work / name).parent.mkdir(parents=True, exist_ok=True)
        (newcomer.work / name).write_text(text)
    start = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script(page, newcomer))], cwd=newcomer.work,
        env=newcomer.shell_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=1200, check=False,
    )  # fmt: skip
    problems = checked(page, proc.returncode, proc.stdout)
    assert problems == [], f"{problems[0]}\n{proc.stdout[-6000:]}"
    ran = outputs(proc.stdout)
    print(f"{path}: {len(ran)} blocks ran in {time.monotonic() - start:.0f} s")
    for block in page:
        if block.skip:
            print(f"  block {block.number} not run: {block.skip}")


def test_every_page_with_commands_is_followed() -> None:
    """A page with shell blocks is in PAGES or ELSEWHERE (says which phase runs it)."""
    pages = ["README.md", *(f"docs/{p.name}" for p in sorted(DOCS.glob("*.md")))]
    with_commands = [path for path in pages if blocks(REPO / path)]
    assert sorted(set(with_commands) - set(PAGES) - set(ELSEWHERE)) == []
    assert set(ELSEWHERE).isdisjoint(PAGES)


def test_a_page_that_does_otherwise_than_it_says_fails(tmp_path: Path) -> None:
    """The checks can fail: a block that prints another count, one whose exit code is not
    the one stated, and a command that fails where the page expects none to."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: expect: ^hits: [1-9] -->\n```sh\necho 'hits: 0'\n```\n"
        "<!-- docs-test: exit: 2 -->\n```bash\nfalse\n```\n```sh\nfalse\necho not reached\n```\n"
    )
    site = Site("bucket", "namespace", "host:5432/db", "http://127.0.0.1:9")
    steps = blocks(page)
    shell = "\n".join(script(steps, cast(Newcomer, SimpleNamespace(site=site))))
    proc = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=False)
    assert checked(steps, proc.returncode, proc.stdout) == ["page.md, shell block 2: exit 1"]
    assert checked(steps[:2], 0, proc.stdout) == [  # the first two, had the third not run
        "page.md, shell block 0: no '^hits: [1-9]' in its output",
        "page.md, shell block 1: exit ['1'], not 2",
    ]
