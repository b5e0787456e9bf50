"""The torch-xla adapter's parts that need no torch: keys, the private directory, the
fingerprint's facts, the compile-time match, and activation on `import torch_xla`.

The adapter end to end, with torch-xla compiling in fresh processes, is
tests/torch/test_torch_xla.py; hostile stored files are tests/security/test_hostile_torch_xla.py.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import stat
import subprocess
import sys
from itertools import chain
from pathlib import Path

import pytest
from conftest import PROGRAMS, REPO, artstore, clean_env

from artifactstore import config
from artifactstore.errors import UnsafeDirectory
from artifactstore.formats import torchxla
from artifactstore.formats.counters import NAMES
from artifactstore.runtime import process
from artifactstore.torch_xla import adapter, fill, platform
from artifactstore.torch_xla.cachedir import CacheDir
from artifactstore.torch_xla.newfiles import compile_secs

FP = "ab" * 32
STAND_IN = PROGRAMS / "stand_in"  # a torch_xla (and torch) that needs no torch


def test_keys_list_by_fingerprint_and_bind_the_name() -> None:
    key = torchxla.entry_key(FP, "123")
    assert len(key) == 64 and key.startswith(torchxla.key_prefix(FP)) and key.isalnum()
    assert torchxla.entry_key(FP, "124") != key
    assert torchxla.entry_key("cd" * 32, "123")[16:] != key[16:]  # the rest binds the platform
    assert torchxla.parse_module_name(torchxla.module_name("123")) == "123"
    assert torchxla.parse_module_name("torch-xla:../x") is None
    assert torchxla.parse_module_name("jit_f") is None
    for bad in ("", "1a", "../1", "1/2", "1.2", "1" * 41, " 1", "1\n"):
        with pytest.raises(ValueError):
            torchxla.check_file_name(bad)


def _settings(tmp_path: Path) -> config.Settings:
    return config.resolve({"url": str(tmp_path / "store"), "local_tier": str(tmp_path / "tier")})


def test_the_cache_directory_is_private_and_its_own(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    a = CacheDir.make(settings, FP)
    b = CacheDir.make(settings, FP)
    assert a.path != b.path and a.path.parent == b.path.parent  # one per process and platform
    assert stat.S_IMODE(a.path.stat().st_mode) == 0o700
    assert a.place("123", b"graph") and not a.place("123", b"other")  # never replaced
    assert (a.path / "123").read_bytes() == b"graph"
    with pytest.raises(ValueError):
        a.place("../123", b"x")
    # What the scan of torch-xla's files takes: graph names, regular files, no links.
    (a.path / "notes.txt").write_bytes(b"x")
    (a.path / "456").symlink_to(a.path / "123")
    (a.path / "789").mkdir()
    assert [(f.name, f.size) for f in a.files()] == [("123", 5)]
    a.remove()
    assert not a.path.exists() and b.path.exists()


def test_directories_of_exited_processes_are_removed(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    first = CacheDir.make(settings, FP)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    host = first.path.name.split("-")[0]
    stale = first.path.parent / f"{host}-{gone.stdout.strip()}-{'0' * 8}"
    other_host = first.path.parent / f"elsewhere-{gone.stdout.strip()}-{'0' * 8}"
    stale.mkdir()
    other_host.mkdir()
    CacheDir.make(settings, FP)
    assert first.path.exists() and other_host.exists()  # running, or not this host's
    assert not stale.exists()


def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    shared = tmp_path / "tier" / "torch-xla"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(UnsafeDirectory):
        CacheDir.make(settings, FP)


def test_the_fingerprint_facts_of_the_cpu_and_its_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    assert platform.devices("CPU") == ("cpu", 1)
    monkeypatch.setenv("CPU_NUM_DEVICES", "4")
    assert platform.devices("CPU") == ("cpu", 4)
    assert platform.plugin_version("CPU") == "builtin"
    before = platform._env_digest()
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert platform._env_digest() != before  # compiler flags change what is built
    flagged = platform._env_digest()
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "3")
    counted = platform._env_digest()
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "1")
    assert platform._env_digest() == counted != flagged  # how many, not which


def test_a_file_is_timed_by_the_compile_that_ended_nearest_it() -> None:
    samples = [(100.0, 0.5), (103.0, 2.0), (110.0, 0.01)]
    assert compile_secs(103.004, samples) == 2.0
    assert compile_secs(109.999, samples) == 0.01
    assert compile_secs(106.5, samples) is None  # none within MATCH_SECS: unknown
    assert compile_secs(100.0, []) is None


def test_what_the_adapter_counts_is_declared() -> None:
    """The fill's report and torch-xla's own counters reach the process's counters under
    names formats/counters.py declares (mapped, so the literal scan of tests/test_counters
    does not see them); every name the fill reports is mapped."""
    reported = set(re.findall(r'counts?[(\[]"(\w+)"', inspect.getsource(fill)))
    assert reported == set(adapter.FILLED) and "placed" in reported
    mapped = {*adapter.FILLED.values(), *chain(*adapter.TORCH_XLA_COUNTERS.values())}
    assert not mapped - set(NAMES)


def test_the_adapters_share_the_process_session_and_follow_a_new_one(tmp_path: Path) -> None:
    """runtime.process: the second adapter joins the first's session where its settings
    are equal; other settings make a new one, which the other adapter is moved to; the
    session is the caller's to close once no adapter uses it."""
    first, other = _settings(tmp_path), _settings(tmp_path / "other")
    moved: list[object] = []
    try:
        made = process.use("jax", first)
        joined = process.use("torch-xla", _settings(tmp_path), move=moved.append)
        assert made.new and not joined.new and joined.session is made.session
        assert joined.session.settings == first  # resolved twice, equal
        again = process.use("jax", other)
        assert again.new and again.replaced is made.session and moved == [again.session]
        again.replaced.close()
        assert process.leave("jax") is None  # torch-xla still uses it
        assert process.leave("torch-xla") is again.session and process.current() is None
    finally:
        for user in ("jax", "torch-xla"):
            left = process.leave(user)
            if left is not None:
                left.close()
    again.session.close()


@pytest.mark.parametrize(
    ("compiled", "said"),
    [
        ("1", "torch-xla compiled before the store was turned on"),
        ("0", "torch-xla not using the store (ZeroDivisionError"),
    ],
)
def test_importing_torch_xla_turns_the_adapter_on_and_never_breaks_the_program(
    tmp_path: Path, compiled: str, said: str
) -> None:
    """With ARTSTORE_URL set, `import torch_xla` activates the adapter; a torch_xla that
    compiled already, or whose cache cannot be set, costs one warning and leaves nothing
    behind, and the program goes on (the stand-in torch_xla: tests/programs/stand_in).
    Importing artifactstore.torch_xla itself imports neither torch nor torch_xla."""
    env = clean_env(
        ARTSTORE_URL=str(tmp_path / "store"),
        FAKE_TORCH_XLA_COMPILED=compiled,
        FAKE_TORCH_XLA_INIT="fail",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PYTHONPATH=os.pathsep.join([str(REPO / "artifactstore" / "startup"), str(STAND_IN)]),
    )
    env.pop("ARTSTORE_ACTIVATE")
    code = (
        "import sys, artifactstore.torch_xla; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_xla'))); "
        "import torch_xla; print('went on')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "went on"]
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr
    left = tmp_path / "cache" / "artifactstore" / "torch-xla"
    assert [p for p in left.glob("*/*")] == []  # no cache directory left behind


def test_the_fingerprint_command_for_torch_xla() -> None:
    """`artstore fingerprint --torch-xla`: the adapter's fingerprint where torch_xla
    imports (the torch venv), else one line saying so. Slow in the torch venv only: the
    command imports torch_xla (seconds, tens of them on a loaded machine)."""
    both = artstore("fingerprint", "--torch-xla", "--backend", "cpu")
    assert both.returncode == 2 and "not both" in both.stderr
    proc = artstore("fingerprint", "--torch-xla", "--json", env=clean_env(PJRT_DEVICE="CPU"))
    assert "Traceback" not in proc.stderr
    if importlib.util.find_spec("torch_xla") is None:
        assert proc.returncode == 1
        assert proc.stderr.startswith("artstore: error: torch_xla does not import")
        assert "pip install 'artifactstore[torch-xla]'" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert (found["platform"], found["device_kind"]) == (torchxla.PLATFORM, "cpu")
