"""Progress of the long commands (cli/progress.py) on an embedded store of a few entries.

On a terminal (a pseudo-terminal here) it is click's bar; off a terminal (a CI log, a
pipe) nothing unless `--progress` asks, and then each phase ends with a plain line of its
count on stderr, never a carriage-return bar; `--no-progress` shows nothing. Either way
stdout is the same report, so `--json` still parses.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TEAM_PUB, TEAM_SIGNING, OpenStore, artstore, clean_env

from artifactstore.bundles.export import Selection, export_bundle
from artifactstore.cli.progress import Progress
from artifactstore.config import host, keyfiles
from artifactstore.formats.put import Put

N = 6  # entries in the store
FP = host.compute(platform_name="cpu", platform_version="v", device_kind="cpu-progress",
                  device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip

# Each command: its arguments (BUNDLE: a bundle path), the plain lines it must end
# with (off a terminal), and what its --json report says of the N entries.
COMMANDS: dict[str, tuple[list[str], list[str], dict[str, int]]] = {
    "verify": (["verify"], [f"verifying objects: {N}/{N} (100%)"], {"objects_checked": N}),
    "sign": (["sign"], [f"signing entries: {N}/{N} (100%)"], {"signed": N, "entries": N}),
    "db rebuild": (
        ["db", "rebuild"],
        [f"reading manifests: {N}", f"reading objects: {N}"],
        {"manifests": N, "objects": N, "present": N},
    ),
    "export": (
        ["export", "BUNDLE", "--all"],
        [f"exporting entries: {N}/{N} (100%)"],
        {"entries": N},
    ),
    "import": (
        ["import", "BUNDLE"],
        [
            re.escape("reading bundle: ") + r"\S+ \S+/\S+ \S+ \(100%\)",
            f"verifying entries: {N}/{N} (100%)",
            f"importing entries: {N}/{N} (100%)",
        ],
        {"imported": N, "entries": N},
    ),
}


@pytest.fixture(params=list(COMMANDS))
def case(
    request: pytest.FixtureRequest, tmp_path: Path, open_store: OpenStore
) -> tuple[str, list[str], dict[str, str]]:
    """A command, its arguments and the environment of a store it has N entries to do."""
    name: str = request.param
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), **TEAM_SIGNING)
    store = open_store(env)
    for i in range(N):
        assert store.put(Put(f"{i:064x}", os.urandom(2000 + i), FP, f"jit_p{i}", 1.0))
    bundle = tmp_path / "entries.tar.zst"
    if name == "sign":  # re-sign what the team key signed with a new key
        new, _ = keyfiles.generate("progress-new", tmp_path)
        env = dict(env, ARTSTORE_SIGNING_KEY=str(new), ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB))
    elif name == "import":  # the entries, as a bundle, into another store
        export_bundle(store, bundle, Selection(everything=True))
        env = dict(env, ARTSTORE_URL=str(tmp_path / "other"))
    args = [str(bundle) if a == "BUNDLE" else a for a in COMMANDS[name][0]]
    return name, args, env


def _report(proc: subprocess.CompletedProcess[str], name: str) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    for field, value in COMMANDS[name][2].items():
        assert report[field] == value, (field, report)
    return report


def test_nothing_off_a_terminal_unless_asked(
    case: tuple[str, list[str], dict[str, str]],
) -> None:
    """Measured before: progress lines on stderr off a terminal, `--json` or not."""
    name, args, env = case
    for extra in (["--json"], []):
        proc = artstore(*args, *extra, *(["--force"] if name == "export" else []), env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""


def test_plain_lines_off_a_terminal(case: tuple[str, list[str], dict[str, str]]) -> None:
    name, args, env = case
    proc = artstore(*args, "--json", "--progress", env=env)
    _report(proc, name)
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr, repr(proc.stderr)
    lines = proc.stderr.splitlines()
    wanted = COMMANDS[name][1]
    # Short runs: no line every few seconds, only each phase's final count.
    assert len(lines) == len(wanted), proc.stderr
    for line, pattern in zip(lines, wanted, strict=True):
        assert re.fullmatch(pattern, line) or line == pattern, (line, pattern)


def test_no_progress_shows_nothing_and_the_same_report(
    case: tuple[str, list[str], dict[str, str]], tmp_path: Path
) -> None:
    name, args, env = case
    quiet = artstore(*args, "--json", "--no-progress", env=env)
    first = _report(quiet, name)
    assert quiet.stderr == ""
    if name in ("verify", "db rebuild"):  # the same run again, with progress: same stdout
        shown = artstore(*args, "--json", "--progress", env=env)
        assert _report(shown, name) == first and shown.stdout == quiet.stdout
        assert shown.stderr
    text = artstore(*args, "--no-progress", *(["--force"] if name == "export" else []), env=env)
    assert text.returncode == 0 and text.stderr == "", text.stderr
    json_text = text.stdout.strip()
    assert not json_text.startswith("{")  # the text report, not JSON


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal: exit code, stdout, terminal output."""
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "artifactstore", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=secondary,
        )
    finally:
        os.close(secondary)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    seen = bytearray()
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the command closed its end
                    chunk = b""
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=60)
    finally:
        os.close(primary)
        reader.join(60)
    return code, b"".join(out).decode(), seen.decode(errors="replace")


def test_a_bar_on_a_terminal(case: tuple[str, list[str], dict[str, str]]) -> None:
    name, args, env = case
    code, stdout, terminal = _on_a_terminal([*args, "--json"], env)
    assert code == 0, stdout + terminal
    report = json.loads(stdout)
    for field, value in COMMANDS[name][2].items():
        assert report[field] == value, (field, report)
    assert "\r" in terminal, repr(terminal)  # redrawn in place
    last = COMMANDS[name][1][-1]
    label = last.split(":")[0]
    if last.endswith("(100%)"):  # a known total: a full bar at the end
        assert re.search(re.escape(label) + rf"\s+\[#+\]\s+{N}/{N}\s+100%", terminal), terminal
    else:  # not known: a count
        assert re.search(re.escape(label) + rf"\s+\[[-# ]*\]\s+{N}\b", terminal), terminal
    assert f"{label}: " not in terminal  # no plain lines on a terminal


# -- the display itself ---------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_every_few_seconds_then_the_final_count() -> None:
    out, clock = io.StringIO(), _Clock()
    with Progress(True, stream=out, every_secs=5, clock=clock) as shown:
        shown.update("checking", 0, 10)  # begins it: no line
        for _ in range(10):
            clock.now += 1
            shown.update("checking", 1, 10)
        shown.update("reading", 3)
    assert out.getvalue().splitlines() == [
        "checking: 5/10 (50%)",  # 5 s after the phase began
        "checking: 10/10 (100%)",  # and again 5 s later: the last count, not repeated
        "reading: 3",  # a total not known: the count
    ]


def test_no_final_line_when_a_phase_ends_by_an_error() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), Progress(True, stream=out) as shown:
        shown.update("checking", 1, 10)
        raise RuntimeError("the store went away")
    assert out.getvalue() == ""  # the error's own line says what happened


def test_off_shows_nothing_and_more_than_the_total_is_a_count() -> None:
    out = io.StringIO()
    with Progress(False, stream=out) as shown:
        shown.update("checking", 5, 2)
    assert out.getvalue() == ""
    with Progress(stream=out) as shown:  # not a terminal, not asked for: nothing
        shown.update("checking", 5, 2)
    assert out.getvalue() == ""
    with Progress(True, stream=out, labels={"checking": "checking objects"}) as shown:
        shown.update("checking", 3, 2)  # the index's count was low: the listing had more
    assert out.getvalue() == "checking objects: 3\n"
