"""Each extra the docs install, in a fresh venv on the newest Python, as pip resolves it
today (no constraints files: what a user gets), then what the page says works, run.

    python -m pytest -m docs_install tests/docs_install -n 0 -s

The venvs are built from this checkout (`pip install '.[EXTRA]'`, as `pip install
'artifactstore[EXTRA]'` would install the release) with the machine's own pip settings
(on this project's machines, a cap at torch 2.14.1). Each case prints its install time
and the venv's size. PyTorch's CPU index (docs/pytorch.md's CPU-only lines) is tried
only with ARTSTORE_DOCS_CPU_INDEX=1: this project's machines reach PyPI only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO, clean_env

pytestmark = [pytest.mark.docs_install, pytest.mark.slow]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Case:
    """One documented install: pip's arguments, then each command the page says works."""

    install: list[list[str]]
    runs: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)


EXAMPLE_TORCHAX = ["-m", "artifactstore.examples.torchax_mlp", "--store", "--steps", "2"]
EXAMPLE_TORCH_XLA = ["-m", "artifactstore.examples.torch_xla_mlp", "--store", "--steps", "2"]
CPU = {"PJRT_DEVICE": "CPU"}
CASES = {
    # docs/pytorch.md, torchax: the extra, then the example twice (the second loads).
    "torch": Case([[".[torch]"]], [["-c", "import torch, torchax, jax"], EXAMPLE_TORCHAX]),
    # docs/pytorch.md, torch-xla: the extra brings its torch; the example twice.
    "torch-xla": Case(
        [[".[torch-xla]"]], [["-c", "import torch, torch_xla"], EXAMPLE_TORCH_XLA], CPU
    ),
    # docs/team-setup.md, docs/operations.md: the index's driver and the metrics.
    "postgres,metrics": Case(
        [[".[postgres,metrics]"]], [["-c", "import psycopg, prometheus_client, artifactstore"]]
    ),
}
CPU_CASES = {
    "torch (CPU index)": Case(
        [["torch", "--index-url", CPU_INDEX], [".[torch]"]],
        [["-c", "import torch, torchax; assert '+cpu' in torch.__version__"], EXAMPLE_TORCHAX],
    ),
    "torch-xla (CPU index)": Case(
        [["torch==2.9.0", "--index-url", CPU_INDEX], [".[torch-xla]"]],
        [["-c", "import torch, torch_xla; assert '+cpu' in torch.__version__"], EXAMPLE_TORCH_XLA],
        CPU,
    ),
}
if os.environ.get("ARTSTORE_DOCS_CPU_INDEX") == "1":
    CASES |= CPU_CASES


def newest_python() -> str:
    """The newest CPython pyenv has (as .ci/run's newest end), else this one."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(
        (p for p in root.glob("3.*/bin/python3.*") if re.fullmatch(r"python3\.\d+", p.name)),
        key=lambda p: tuple(int(n) for n in p.parent.parent.name.split(".")[:2]),
    )
    return str(found[-1]) if found else sys.executable


@pytest.mark.parametrize("name", list(CASES))
def test_documented_install_works(name: str, tmp_path: Path) -> None:
    """Slow: a venv from the package index (PyTorch's extras: GBs, tens of minutes), then
    the page's commands; its example twice, the second served by the store."""
    case = CASES[name]
    venv = tmp_path / "venv"
    started = time.monotonic()
    subprocess.run([newest_python(), "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    for args in case.install:
        proc = subprocess.run(
            [python, "-m", "pip", "install", "-q", *args], cwd=REPO, capture_output=True, text=True
        )
        assert proc.returncode == 0, f"pip install {' '.join(args)}:\n{proc.stderr[-3000:]}"
    installed = time.monotonic() - started
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    versions = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True
    )
    wanted = {"torch", "torchax", "torch-xla", "torch_xla", "jax", "jaxlib", "flax"}
    listed = {p["name"]: p["version"] for p in json.loads(versions.stdout or "[]")}
    print(f"\n{name}: installed in {installed:.0f} s, {size / 2**30:.2f} GiB;", end=" ")
    print(", ".join(f"{k} {v}" for k, v in sorted(listed.items()) if k.lower() in wanted))

    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), **case.env)
    env.pop("ARTSTORE_ACTIVATE")
    env.pop("PYTHONPATH", None)
    outputs = []
    for host in ("host-a", "host-b"):  # the page's "twice": the second process is served
        for args in case.runs:
            run_env = {**env, "XDG_CACHE_HOME": str(tmp_path / host)}
            proc = subprocess.run(
                [python, *args], cwd=tmp_path, env=run_env, capture_output=True, text=True
            )
            assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stderr[-3000:]}"
            if args[0] == "-m":
                outputs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if outputs:
        first, second = outputs
        assert second["losses"] == first["losses"]
        served = second["store"].get("hits", 0) + second["store"].get("torch_xla_placed", 0)
        assert served > 0, second["store"]
    shutil.rmtree(venv, ignore_errors=True)  # GBs: not left until pytest's cleanup
