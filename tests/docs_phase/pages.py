"""A page's shell blocks, what the page says each should do, and the one substitution table.

A page's fenced `sh` and `bash` blocks are its commands, in order. HTML comments on the lines
just above a block (invisible on the site) say what the docs phase does with it:

    <!-- docs-test: skip: REASON -->         not run; REASON is printed with the page's result
    <!-- docs-test: exit: N -->               its last command exits N (otherwise every command 0)
    <!-- docs-test: expect: REGEX -->         its output matches REGEX (re.MULTILINE)
    <!-- docs-test: env: NAME=VALUE ... -->   what the reader's shell holds before it (the
                                              settings an earlier page exported)

A block without any is run and must exit 0. Placeholders a page writes for the reader's own
site (bucket, database, endpoint, namespace) are replaced by the phase's before a block runs:
SUBSTITUTIONS, the one table of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
DIRECTIVE = re.compile(r"^<!-- docs-test: (skip|exit|expect|env):\s*(.*?)\s*-->$")
# A page's install line: a fresh venv and what pip installs into it (`ARGS`, its variant).
INSTALL = re.compile(
    r"python3 -m venv \.venv && \.venv/bin/pip install (?P<args>[^&\n]+?)(?=\s*(?:&&|\n|$))"
)
SHELL = ("sh", "bash")
TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Site:
    """What the phase stands up in place of the team's own: a moto bucket, a database."""

    bucket: str
    namespace: str
    database: str  # host:port/name
    endpoint: str  # the moto server's URL


def substitutions(site: Site) -> dict[str, str]:
    """Each placeholder the pages write, and what replaces it (longest first when applied)."""
    return {
        "team-jax": site.bucket,  # s3://team-jax/cache, and the policy `sed` line
        "my-team": site.namespace,
        "db.internal:5432/artstore": site.database,
        "https://minio.internal:9000": site.endpoint,
    }


def substitute(text: str, site: Site) -> str:
    for placeholder, value in sorted(substitutions(site).items(), key=lambda kv: -len(kv[0])):
        text = text.replace(placeholder, value)
    return text


@dataclass
class Block:
    """One shell block of a page, and what the page says about it."""

    page: str
    number: int  # among the page's shell blocks, from 0
    body: str
    skip: str = ""  # the reason it is not run
    exit: int = 0
    expect: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def install(self) -> str | None:
        """The pip arguments of the block's install line, if it has one."""
        match = INSTALL.search(self.body)
        return match.group("args").strip() if match else None

    @property
    def where(self) -> str:
        return f"{self.page}, shell block {self.number}"


def blocks(page: Path) -> list[Block]:
    """The page's shell blocks in order, each with the directives just above it."""
    text = page.read_text()
    out: list[Block] = []
    for match in FENCE.finditer(text):
        if match.group(1) not in SHELL:
            continue
        block = Block(page.name, len(out), match.group(3))
        above = text[: match.start()].rstrip("\n").splitlines()
        while above and (said := DIRECTIVE.match(above[-1].strip())):
            _apply(block, said.group(1), said.group(2))
            above.pop()
        out.append(block)
    return out


def files(page: Path) -> dict[str, str]:
    """The files the page shows (`python` blocks with a title): name -> text."""
    out = {}
    for match in FENCE.finditer(page.read_text()):
        title = TITLE.search(match.group(2))
        if match.group(1) == "python" and title:
            out[title.group(1)] = match.group(3)
    return out


def _apply(block: Block, key: str, value: str) -> None:
    assert value, f"{block.where}: docs-test {key} says nothing"
    if key == "skip":
        block.skip = value
    elif key == "exit":
        block.exit = int(value)
    elif key == "expect":
        block.expect.append(value)
    else:
        block.env.update(pair.split("=", 1) for pair in value.split())  # type: ignore[misc]
