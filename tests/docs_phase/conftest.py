"""The docs phase's newcomer: a copy of the checkout, a fresh HOME, venvs as the pages build
them, and a site (moto bucket, PostgreSQL database) standing in for the team's.

Its tests run only when selected (`-m docs_phase`, CI's "docs as written" phase): they build
venvs from the package index, minutes that the README's test command does not spend.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import devstack
import pytest
from conftest import FAKE_AWS, REPO

from docs_phase.pages import Site

# Settings a reader's shell may hold that would change what the pages' commands do.
FOREIGN = ("ARTSTORE_", "AWS_", "PG", "PROMETHEUS_", "JAX_", "XLA_", "VIRTUAL_ENV", "PYTHON")


def newest_python() -> str:
    """The interpreter `python3` is on the pages: this one's, outside any venv."""
    return os.environ.get("DOCS_PHASE_PYTHON") or getattr(sys, "_base_executable", sys.executable)


class Newcomer:
    """One reader working through the pages in order, in one checkout and one HOME."""

    def __init__(self, root: Path, site: Site) -> None:
        self.site = site
        self.work = root / "checkout"
        self.home = root / "home"
        self.venvs = root / "venvs"
        self.bin = root / "bin"
        for path in (self.home, self.venvs, self.bin):
            path.mkdir()
        (self.bin / "python3").symlink_to(newest_python())
        files = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout.decode().split("\0")  # fmt: skip
        for name in filter(None, files):  # what a clone has, this working tree's state
            source, target = REPO / name, self.work / name
            if source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read_bytes())
                target.chmod(source.stat().st_mode)
        self.built: dict[str, Path] = {}  # install arguments -> venv
        self.times: list[str] = []

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    def shell_env(self) -> dict[str, str]:
        """A reader's shell: their HOME, the site's S3 credentials, the CPU."""
        home = str(self.home)
        return {**self.base_env(), **FAKE_AWS, "HOME": home,
                "XDG_CACHE_HOME": f"{home}/.cache", "JAX_PLATFORMS": "cpu"}  # fmt: skip

    def venv(self, args: str) -> Path:
        """The venv a page's install line `pip install ARGS` builds: built once, as written
        (unpinned, pip's own cache and index), in the checkout."""
        if args not in self.built:
            venv = self.venvs / f"venv-{len(self.built)}"
            line = f"python3 -m venv {venv} && {venv}/bin/pip install {args}"
            start = time.monotonic()
            proc = subprocess.run(
                ["bash", "-c", line], cwd=self.work, env=self.base_env(),
                capture_output=True, text=True, timeout=900, check=False,
            )  # fmt: skip
            said = proc.stdout + proc.stderr
            assert proc.returncode == 0, (
                f"pip install {args}: exit {proc.returncode}\n{said[-4000:]}"
            )
            versions = subprocess.run(
                [f"{venv}/bin/python", "-c", "import jax, jaxlib, sys; "
                 "print(sys.version.split()[0], jax.__version__, jaxlib.__version__)"],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            self.times.append(
                f"pip install {args}: {time.monotonic() - start:.0f} s (Python {versions[0]},"
                f" jax {versions[1]}, jaxlib {versions[2]})"
            )
            self.built[args] = venv
        return self.built[args]

    def link(self, args: str) -> str:
        """The shell that stands for the install line once its venv is built."""
        return f"ln -sfn {shlex.quote(str(self.venv(args)))} .venv"


@pytest.fixture(scope="session")
def site(moto_endpoint: str, postgres: None) -> Iterator[Site]:
    """An empty bucket and an empty database (the pages make the schema and the roles)."""
    tag = uuid.uuid4().hex[:10]
    made = Site(
        bucket=f"docs-{tag}",
        namespace=f"docs-{tag}",
        database=f"{devstack.HOST}:{devstack.PG_PORT}/artstore_docs_{tag}",
        endpoint=moto_endpoint,
    )
    devstack.create_bucket(moto_endpoint, made.bucket)
    devstack.create_database(f"artstore_docs_{tag}")
    try:
        yield made
    finally:
        devstack.drop_database(f"artstore_docs_{tag}")
        devstack.drop_roles(f"artstore_ns_{made.namespace}")


@pytest.fixture(scope="session")
def newcomer(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Newcomer]:
    reader = Newcomer(tmp_path_factory.mktemp("newcomer"), site)
    yield reader
    print("\nvenvs the pages built:\n  " + "\n  ".join(reader.times))
