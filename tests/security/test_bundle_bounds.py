"""Issue 29 point 6: `artstore import` of a hostile bundle costs little memory and no
spool, and ends in one line naming the limit and how to raise it.

On main, a 65 KB bundle spooled 1.97 GiB to TMPDIR and a 5.7 KB one reached 1.7 GB of
memory. Each bundle below is crafted by hand (zstd over raw tar blocks) and imported
by `artstore import` in a fresh process whose TMPDIR is a directory of the test's:
its peak resident memory and that directory's peak size are watched while it runs
(and the process is stopped at once past twice the bound, to spare the machine), and
afterwards the directory is empty and the store holds nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import TEAM_SIGNING, OpenStore, artstore, clean_env
from test_bundles import FP, _empty, _refused

from artifactstore.formats import named as named_format
from artifactstore.formats.put import Put
from artifactstore.named import keys as named_keys

MAX_RSS = 300 * 1024 * 1024
MAX_SPOOL = 100 * 1024 * 1024
MIB = 1024 * 1024
BLOCK = tarfile.BLOCKSIZE


class Watched:
    """One `artstore import` run: its result, peak RSS and peak spool (TMPDIR) bytes."""

    def __init__(
        self, proc: subprocess.CompletedProcess[str], rss: int, spool: int, killed: bool
    ) -> None:
        self.proc, self.rss, self.spool, self.killed = proc, rss, spool, killed


def _disk(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _vmrss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


# The CLI, reporting its peak RSS at exit: VmHWM counts from exec (a forked child's
# ru_maxrss counts the test process's pages it shared before exec).
HWM = """
import atexit, os, runpy, sys
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            open(os.environ["HWM_FILE"], "w").write(line.split()[1])
atexit.register(hwm)
sys.argv = ["artstore", *sys.argv[1:]]
runpy.run_module("artifactstore", run_name="__main__")
"""


def _import(bundle: Path, env: dict[str, str], tmp: Path, *options: str) -> Watched:
    """`artstore import BUNDLE` with TMPDIR=tmp/spool, watched; stopped past 2x a bound."""
    spool = tmp / "spool"
    spool.mkdir(exist_ok=True)
    out, err, hwm = tmp / "stdout", tmp / "stderr", tmp / "hwm"
    hwm.unlink(missing_ok=True)
    with out.open("w") as o, err.open("w") as e:
        child = subprocess.Popen(
            [sys.executable, "-c", HWM, "import", str(bundle), *options],
            env=dict(env, TMPDIR=str(spool), HWM_FILE=str(hwm)),
            stdout=o,
            stderr=e,
        )
    peak_rss = peak_spool = 0
    deadline = time.monotonic() + 240
    killed = False
    while True:
        pid, status, _ = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        peak_rss = max(peak_rss, _vmrss(child.pid))
        peak_spool = max(peak_spool, _disk(spool))
        over = peak_rss > 2 * MAX_RSS or peak_spool > 2 * MAX_SPOOL
        if not killed and (over or time.monotonic() > deadline):
            os.kill(child.pid, signal.SIGKILL)  # not Popen.kill: it would reap the child
            killed = True
        time.sleep(0.02)
    child.returncode = os.waitstatus_to_exitcode(status)
    if hwm.exists():
        peak_rss = max(peak_rss, int(hwm.read_text()) * 1024)
    proc = subprocess.CompletedProcess(
        child.args, child.returncode, out.read_text(), err.read_text()
    )
    if killed:  # by this test: what it left is not the importer's doing
        shutil.rmtree(spool)
    else:
        assert _disk(spool) == 0 and not list(spool.iterdir()), "temporary files left behind"
    return Watched(proc, peak_rss, peak_spool, killed)


def _small(run: Watched) -> None:
    assert not run.killed, f"stopped at {run.rss // MIB} MiB RSS, {run.spool // MIB} MiB spooled"
    assert run.rss < MAX_RSS, f"peak RSS {run.rss // MIB} MiB: {run.proc.stderr[-300:]}"
    assert run.spool < MAX_SPOOL, f"spooled {run.spool // MIB} MiB: {run.proc.stderr[-300:]}"


# -- crafting bundles: zstd over raw tar blocks ------------------------------------------
def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE, fmt: int = 0) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode, info.mtime = size, kind, 0o644, 0
    return info.tobuf(format=fmt or tarfile.USTAR_FORMAT)


def _pad(size: int) -> bytes:
    return bytes(-size % BLOCK)


def _zeros(size: int) -> Iterator[bytes]:
    chunk = bytes(MIB)
    for _ in range(size // MIB):
        yield chunk
    yield bytes(size % MIB) + _pad(size)


def _write(path: Path, chunks: Iterable[bytes]) -> Path:
    with path.open("wb") as raw:
        with zstandard.ZstdCompressor(level=1).stream_writer(raw) as z:
            for chunk in chunks:
                z.write(chunk)
            z.write(bytes(2 * BLOCK))  # end of archive
    return path


FAKE = "objects/" + "ab" * 32


def _bomb(size: int) -> Iterator[bytes]:
    """One object member of `size` zero bytes, its header honest."""
    yield _header(FAKE, size)
    yield from _zeros(size)


def _million() -> Iterator[bytes]:
    """A million tiny members, each a valid object name (its content's sha256): only
    their number is wrong. Headers patched from one template (tobuf is too slow)."""
    template = bytearray(_header("objects/" + "0" * 64, 8))
    template[148:156] = b" " * 8
    base = sum(template) - sum(template[:72])
    batch: list[bytes] = []
    for i in range(1_000_000):
        content = b"%08d" % i
        name = b"objects/" + hashlib.sha256(content).hexdigest().encode()
        check = b"%06o\0 " % (base + sum(name))
        batch.append(name + template[72:148] + check + template[156:] + content + bytes(504))
        if len(batch) == 4096:
            yield b"".join(batch)
            batch.clear()
    yield b"".join(batch)


def _pax_path(size: int) -> Iterator[bytes]:
    """A pax extended header carrying a path of `size` bytes ("deep path")."""
    body = len(b" path=") + size + 1
    length = body + len(str(body)) + 1
    yield _header("././@PaxHeader", length, tarfile.XHDTYPE)
    yield str(length).encode() + b" path="
    for _ in range(size // MIB):
        yield b"a/" * (MIB // 2)
    yield b"\n" + _pad(length)
    yield _header(FAKE, 0)


def _gnu_longname(size: int) -> Iterator[bytes]:
    yield _header("././@LongLink", size, tarfile.GNUTYPE_LONGNAME, tarfile.GNU_FORMAT)
    yield from _zeros(size)
    yield _header(FAKE, 0)


def _pax_chain(count: int) -> Iterator[bytes]:
    record = b"13 comment=x\n"
    for _ in range(count):
        yield _header("././@PaxHeader", len(record), tarfile.XHDTYPE) + record + _pad(13)
    yield _header(FAKE, 0)


def _sparse_chain(blocks: int) -> Iterator[bytes]:
    """A GNU sparse member whose header says 'more sparse maps follow', forever."""
    head = bytearray(_header(FAKE, 0, tarfile.GNUTYPE_SPARSE, tarfile.GNU_FORMAT))
    head[482] = 1  # isextended
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    yield bytes(head)
    ext = bytearray((b"%011o\0" % 1) * 2 * 21 + bytes(BLOCK - 504))
    ext[504] = 1
    for _ in range(blocks // 1024):
        yield bytes(ext) * 1024


def _manifest(size: int, unit: bytes) -> Iterator[bytes]:
    """manifest.json of about `size` bytes: `unit` repeated in a JSON list."""
    chunk = unit * (MIB // len(unit))
    count = size // MIB
    length = 1 + count * len(chunk) + 2
    yield _header("manifest.json", length)
    yield b"["
    for _ in range(count):
        yield chunk
    yield b"0]" + _pad(length)


# case -> (bundle, words of the one line[, settings of the importer])
HOSTILE: dict[str, tuple[Any, ...]] = {
    # a few KB of zstd that unpacks to 2 GiB (under the 4 GiB per-object limit)
    "zstd bomb member": (lambda: _bomb(2 * 1024**3), ("ARTSTORE_BUNDLE_MAX_SIZE", "64x")),
    # a header that claims 1 TB where the stream holds nothing
    "lying size header": (
        lambda: iter([_header(FAKE, 10**12, fmt=tarfile.GNU_FORMAT)]),
        ("ARTSTORE_MAX_OBJECT_SIZE", "object size limit"),
    ),
    "a million tiny members": (_million, ("more than 10000 entries", "--max-entries")),
    "deep path (pax)": (lambda: _pax_path(384 * MIB), ("extended (pax) header",)),
    "deep path (GNU long name)": (lambda: _gnu_longname(384 * MIB), ("not a plain file",)),
    "chained extended headers": (lambda: _pax_chain(5000), ("two extended headers",)),
    "endless sparse map": (lambda: _sparse_chain(2_000_000), ("not a plain file",)),
    "huge manifest": (
        lambda: _manifest(200 * MIB, b"[],"),
        ("manifest.json", "ARTSTORE_BUNDLE_MAX_ENTRIES"),
    ),
    # under the manifest's byte bound; the total raised, as for a large genuine bundle
    "manifest of many values": (
        lambda: _manifest(30 * MIB, b"[],"),
        ("JSON values", "ARTSTORE_BUNDLE_MAX_ENTRIES"),
        {"ARTSTORE_BUNDLE_MAX_SIZE": "1GiB"},
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundles_are_refused_within_small_memory_and_spool(
    case: str, tmp_path: Path, open_store: OpenStore
) -> None:
    make, words, *settings = HOSTILE[case]
    bundle = _write(tmp_path / "hostile.tzst", make())
    env = clean_env(ARTSTORE_URL=str(tmp_path / "target"))
    run = _import(bundle, dict(env, **(settings[0] if settings else {})), tmp_path)
    _small(run)
    _refused(run.proc, "bundle", *words)
    _empty(open_store(env))


def test_a_bomb_into_a_team_store(
    tmp_path: Path, team_env: dict[str, str], open_store: OpenStore
) -> None:
    """The same bomb against moto S3 + PostgreSQL: refused before any write."""
    bundle = _write(tmp_path / "bomb.tzst", _bomb(2 * 1024**3))
    assert bundle.stat().st_size < 1024 * 1024
    run = _import(bundle, team_env, tmp_path)
    _small(run)
    _refused(run.proc, "ARTSTORE_BUNDLE_MAX_SIZE")
    _empty(open_store(team_env))


# -- genuine bundles: imported, and the limits are settings ------------------------------
def _named(size: int) -> bytes:
    """A named entry's payload: a named frame, as every named entry holds (the verifier
    refuses any other payload under a `named:` module name)."""
    return named_format.frame({"kind": "native"}, os.urandom(size))


def _genuine(tmp_path: Path, open_store: OpenStore, entries: int = 3) -> Path:
    """A bundle of `entries` entries (fake payloads of 300 KiB: no JAX compile)."""
    # Signed by the team tests' key: a team store loads (and imports) only signed entries.
    env = clean_env(ARTSTORE_URL=str(tmp_path / "source"), **TEAM_SIGNING)
    store = open_store(env)
    for i in range(entries):
        key = named_keys.key(f"foo{i}", "1", FP.digest)
        assert store.put(
            Put(key, _named(300 * 1024), FP, named_keys.module_name(f"foo{i}", "1"), 1.0)
        )
    bundle = tmp_path / "genuine.tzst"
    done = artstore("export", str(bundle), "--all", env=env)
    assert done.returncode == 0, done.stderr
    return bundle


def test_a_genuine_bundle_still_imports(
    tmp_path: Path, any_env: dict[str, str], open_store: OpenStore
) -> None:
    bundle = _genuine(tmp_path, open_store)
    run = _import(bundle, any_env, tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    assert "imported 3 entries" in run.proc.stdout
    assert run.rss < MAX_RSS
    assert open_store(any_env).parts.index.stats().entries == 3


def test_the_limits_are_settings_and_options(tmp_path: Path, open_store: OpenStore) -> None:
    """Entries, total and per-object limits from the environment or `import`'s options;
    each refusal names the limit and how to raise it; raised, the bundle imports."""
    bundle = _genuine(tmp_path, open_store)  # 3 objects of ~300 KiB
    env = clean_env(ARTSTORE_URL=str(tmp_path / "target"))
    refusals = [
        ({"ARTSTORE_BUNDLE_MAX_ENTRIES": "2"}, (), "more than 2 entries"),
        ({}, ("--max-entries", "2"), "ARTSTORE_BUNDLE_MAX_ENTRIES"),
        ({"ARTSTORE_BUNDLE_MAX_SIZE": "500KiB"}, (), "ARTSTORE_BUNDLE_MAX_SIZE"),
        ({}, ("--max-size", "500KiB"), "--max-size SIZE"),
        ({"ARTSTORE_MAX_OBJECT_SIZE": "100KiB"}, (), "ARTSTORE_MAX_OBJECT_SIZE"),
    ]
    for extra, options, words in refusals:
        run = _import(bundle, dict(env, **extra), tmp_path, *options)
        _refused(run.proc, words)
        _empty(open_store(env))
    bad = _import(bundle, dict(env, ARTSTORE_BUNDLE_MAX_SIZE="lots"), tmp_path)
    _refused(bad.proc, "ARTSTORE_BUNDLE_MAX_SIZE")
    raised = dict(env, ARTSTORE_BUNDLE_MAX_ENTRIES="3", ARTSTORE_BUNDLE_MAX_SIZE="2MiB")
    run = _import(bundle, raised, tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    assert open_store(env).parts.index.stats().entries == 3
