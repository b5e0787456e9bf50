"""Bundles (issue 18 item 5): `artstore export` / `artstore import` between stores, and
`ls --named` / `rm --name`.

A source store is filled once by a real JAX program; its bundle is imported into an
empty local store (SQLite) and into an empty team store (moto S3 over HTTP +
PostgreSQL), and the same program then runs against each target without compiling.
Damaged bundles (a flipped byte, a missing or an extra member, a path trick, a link,
signatures the target does not trust) are refused whole, with one line, and leave
the target without a single entry, object or manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import TEAM_SIGNING, OpenStore, artstore, clean_env, run_program

from artifactstore.config import keyfiles
from artifactstore.config.host import compute
from artifactstore.formats import named as named_format
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.put import Put
from artifactstore.index.repo import Filters
from artifactstore.named import keys as named_keys
from artifactstore.store import Store

FP = compute(platform_name="cpu", platform_version="v", device_kind="cpu-test",
             device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(_ok(proc).stdout)


def _refused(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """A failure as every failure ends: non-zero, one line on stderr (progress shows only
    on a terminal), no traceback."""
    assert proc.returncode != 0, proc.stdout
    stderr = proc.stderr
    assert stderr.count("\n") == 1, proc.stderr
    assert stderr.startswith("artstore: error:") and "Traceback" not in proc.stderr
    for word in words:
        assert word in stderr, proc.stderr
    return stderr


def _empty(store: Store) -> None:
    """Nothing of a refused bundle reached the store."""
    assert store.parts.index.stats().entries == 0
    assert list(store.parts.blobs.iter_blobs()) == []
    assert list(store.parts.blobs.iter_manifest_keys()) == []


def _job(env: dict[str, str]) -> dict[str, Any]:
    return run_program("job.py", dict(env, JOB_SMALL_JITS="1"))


# -- a source store, filled once by a real program, and its bundle -------------------
@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("source")
    # Signed by the team tests' writer key: a team store loads only signed entries.
    env = clean_env(ARTSTORE_URL=str(base / "store"), **TEAM_SIGNING)
    out = _job(env)
    assert out["xla_compiles"] and out["store"]["stored"] >= 2, out
    bundle = base / "all.tzst"
    report = _json(artstore("export", str(bundle), "--all", "--json", env=env))
    assert report["entries"] == out["store"]["stored"] == report["objects"]
    return {"env": env, "bundle": bundle, "entries": report["entries"], "keys": report["keys"],
            "results": out["results"]}  # fmt: skip


def _target(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(ARTSTORE_URL=str(tmp_path / "target"), **extra)


def test_bundle_into_a_local_store_serves_a_fresh_process(
    source: dict[str, Any], tmp_path: Path, open_store: OpenStore
) -> None:
    """Export -> import into an empty local store + SQLite: a fresh process running the
    same program compiles nothing there; a second import skips every entry."""
    env = _target(tmp_path)
    first = _json(artstore("import", str(source["bundle"]), "--json", env=env))
    assert (first["entries"], first["imported"], first["skipped"]) == (source["entries"],) * 2 + (
        0,
    )
    assert first["bytes"] > 0
    again = _ok(artstore("import", str(source["bundle"]), env=env))
    assert "imported 0 entries (0 B)" in again.stdout
    assert f"{source['entries']} already present (skipped)" in again.stdout

    out = _job(env)
    assert out["xla_compiles"] == [], out["xla_compiles"]
    assert out["store"]["hits"] == source["entries"] and out["store"].get("misses", 0) == 0
    assert out["results"] == source["results"]
    store = open_store(env)
    assert sorted(e.key for e in store.parts.index.iter_entries()) == sorted(source["keys"])


def test_bundle_into_a_team_store_serves_a_fresh_process(
    source: dict[str, Any], team_env: dict[str, str], open_store: OpenStore
) -> None:
    """The same bundle into an empty bucket + PostgreSQL: rows and manifests as any put
    leaves them, so a fresh process loads everything without compiling."""
    report = _json(artstore("import", str(source["bundle"]), "--json", env=team_env))
    assert (report["imported"], report["skipped"]) == (source["entries"], 0)
    store = open_store(team_env)
    assert sorted(store.parts.blobs.iter_manifest_keys()) == sorted(source["keys"])
    assert store.parts.index.stats().entries == source["entries"]

    out = _job(team_env)
    assert out["xla_compiles"] == [], out["xla_compiles"]
    assert out["store"]["hits"] == source["entries"]
    again = _json(artstore("import", str(source["bundle"]), "--json", env=team_env))
    assert (again["imported"], again["skipped"]) == (0, source["entries"])

    # Named executables on PostgreSQL: selected in SQL by module prefix and pattern.
    key = named_keys.key("foo_1", "1", FP.digest)
    assert store.put(Put(key, _named(500), FP, named_keys.module_name("foo_1", "1"), 1.0))
    rows = _json(artstore("ls", "--named", "--json", env=team_env))
    assert [(r["name"], r["key"]) for r in rows] == [("foo_1", key)]
    assert [
        e.key for e in store.parts.index.iter_entries(Filters(module_glob="named:foo?1@*"))
    ] == [key]
    assert list(store.parts.index.iter_entries(Filters(module_glob="named:foo\\_1@*"))) == []
    _ok(artstore("rm", "--name", "foo_1", env=team_env))
    assert store.parts.index.stats().entries == source["entries"]


# -- damaged bundles: refused whole ---------------------------------------------------
Edit = Callable[[list[tuple[tarfile.TarInfo, bytes]]], list[tuple[tarfile.TarInfo, bytes]]]


def _members(bundle: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with bundle.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as z:
        with tarfile.open(fileobj=z, mode="r|") as tar:
            out = []
            for m in tar:
                f = tar.extractfile(m)
                out.append((m, f.read() if f is not None else b""))
    return out


def _named(size: int) -> bytes:
    """A named entry's payload of `size` random body bytes: a named frame, as every named
    entry holds (the verifier refuses any other payload under a `named:` module name)."""
    return named_format.frame({"kind": "native"}, os.urandom(size))


def _rewrite(bundle: Path, target: Path, edit: Edit) -> Path:
    members = edit(_members(bundle))
    with target.open("wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as z:
        with tarfile.open(fileobj=z, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for info, data in members:
                info.size = len(data) if info.isreg() else 0
                tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return target


def _flip(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
    info, data = members[0]
    assert info.name.startswith("objects/")
    middle = len(data) // 2
    return [(info, data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :]), *members[1:]]


def _extra(name: str, kind: bytes = tarfile.REGTYPE) -> Edit:
    def edit(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
        data = b"x" * 10 if kind == tarfile.REGTYPE else b""
        return [(info, data), *members]

    return edit


def _unlisted(ms: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
    """An object member whose name is its true digest, but that no record lists."""
    data = b"an object no record lists"
    info = tarfile.TarInfo("objects/" + hashlib.sha256(data).hexdigest())
    return [(info, data), *ms]


_FAKE = "objects/" + "ab" * 32
CASES: dict[str, tuple[Edit, tuple[str, ...]]] = {
    "flipped byte": (_flip, ("objects/", "damaged or altered")),
    "missing member": (lambda ms: ms[1:], ("is missing",)),
    "extra member": (_extra(_FAKE), ("objects/ab",)),
    "unlisted object": (_unlisted, ("not listed",)),
    "path trick": (_extra("../../etc/cron.d/evil"), ("not one an artifactstore bundle has",)),
    "absolute path": (_extra("/tmp/evil"), ("refused",)),
    "symlink": (_extra("objects/link", tarfile.SYMTYPE), ("not a plain file",)),
    "no manifest": (lambda ms: [m for m in ms if m[0].name != "manifest.json"], ("manifest",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_bundles_are_refused_whole(
    case: str, source: dict[str, Any], tmp_path: Path, open_store: OpenStore
) -> None:
    edit, words = CASES[case]
    bad = _rewrite(source["bundle"], tmp_path / "bad.tzst", edit)
    env = _target(tmp_path)
    _refused(artstore("import", str(bad), env=env), *words)
    _empty(open_store(env))


def _signed_source(tmp_path: Path, open_store: OpenStore, key: Path | None) -> Path:
    """A bundle of two entries (fake payloads, named foo@1), signed by `key` if given."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "signed-src"))
    store = open_store(env, **({"signing_key": str(key)} if key else {}))
    for fp in (FP, named_keys.PORTABLE):
        key = named_keys.key("foo", "1", fp.digest)
        assert store.put(Put(key, _named(2000), fp, named_keys.module_name("foo", "1"), 1.0))
    bundle = tmp_path / "signed.tzst"
    _ok(artstore("export", str(bundle), "--name", "foo", env=env))
    return bundle


def test_signatures_are_checked_where_the_target_trusts_keys(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """A target listing trusted keys refuses a bundle with an unsigned entry, or one
    signed by another key, and takes one signed by a key it trusts (signatures kept)."""
    key_a, pub_a = keyfiles.generate("team-a", tmp_path)
    _, pub_b = keyfiles.generate("team-b", tmp_path)
    unsigned = _signed_source(tmp_path / "u", open_store, None)
    signed = _signed_source(tmp_path / "s", open_store, key_a)

    trusts_b = _target(tmp_path / "b", ARTSTORE_TRUSTED_KEYS=str(pub_b))
    _refused(artstore("import", str(unsigned), env=trusts_b), "unsigned")
    _refused(artstore("import", str(signed), env=trusts_b), "team-a", "not trusted")
    _empty(open_store(trusts_b))

    trusts_a = _target(tmp_path / "a", ARTSTORE_TRUSTED_KEYS=str(pub_a))
    assert _json(artstore("import", str(signed), "--json", env=trusts_a))["imported"] == 2
    named = _json(artstore("ls", "--named", "--json", env=trusts_a))
    assert sorted(r["platform"] for r in named) == ["cpu", "portable"]
    assert {r["signer"] for r in named} == {"team-a"}


def test_a_signature_moved_to_another_record_is_refused(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """A manifest whose record claims another signature than its object carries."""
    key_a, _ = keyfiles.generate("team-a", tmp_path)
    signed = _signed_source(tmp_path / "s", open_store, key_a)

    def forge(ms: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        out = []
        for info, data in ms:
            if info.name == "manifest.json":
                body = json.loads(data)
                body["entries"][0]["signer"] = "someone-else"
                data = json.dumps(body).encode()
            out.append((info, data))
        return out

    bad = _rewrite(signed, tmp_path / "forged.tzst", forge)
    env = _target(tmp_path)
    _refused(artstore("import", str(bad), env=env), "another signature")
    _empty(open_store(env))


# -- named executables: ls --named, rm --name -------------------------------------------
def test_ls_named_and_rm_name(tmp_path: Path, open_store: OpenStore) -> None:
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = open_store(env)
    for name, version in (("foo", "1"), ("foo", "2"), ("bar", "1")):
        for fp in (FP, named_keys.PORTABLE):
            key = named_keys.key(name, version, fp.digest)
            store.put(Put(key, _named(1000), fp, named_keys.module_name(name, version), 1.0))
    store.put(Put("c" * 64, os.urandom(1000), FP, "jit_other", 1.0))

    rows = _json(artstore("ls", "--named", "--json", env=env))
    assert sorted((r["name"], r["version"], r["platform"]) for r in rows) == sorted(
        (n, v, p)
        for n, v in (("foo", "1"), ("foo", "2"), ("bar", "1"))
        for p in ("cpu", "portable")
    )
    table = _ok(artstore("ls", "--named", env=env)).stdout
    assert table.splitlines()[0].split()[:3] == ["NAME", "VERSION", "PLATFORM"]
    assert "portable" in table and "jit_other" not in table

    def modules(glob: str) -> list[str]:
        return sorted(
            e.module_name for e in store.parts.index.iter_entries(Filters(module_glob=glob))
        )

    assert modules("named:[fb]*@1") == ["named:bar@1"] * 2 + ["named:foo@1"] * 2
    assert modules("named:[!f]*") == ["named:bar@1"] * 2
    assert modules("jit_?ther") == ["jit_other"]
    assert modules("jit%") == [] and modules("jit_") == []

    def named() -> set[tuple[str, str]]:
        """What the index holds, asked in this process (as `ls --named` asks it)."""
        return {named_keys.parse_module_name(e.module_name) or ("-", "-")
                for e in store.parts.index.iter_entries()}  # fmt: skip

    one = _ok(artstore("rm", "--name", "foo@1", "--yes", env=env))
    assert "removed 2 entries, 2 objects" in one.stdout
    assert named() == {("foo", "2"), ("bar", "1"), ("-", "-")}
    every = _ok(artstore("rm", "--name", "foo", "--yes", env=env))
    assert "removed 2 entries, 2 objects" in every.stdout
    assert named() == {("bar", "1"), ("-", "-")}
    assert store.parts.index.stats().entries == 3  # bar's two and jit_other
    assert store.parts.blobs.get_manifest(named_keys.portable_key("foo", "2")) is None
    _refused(artstore("rm", "--name", "nothing", env=env), "no named executable", "nothing")


def test_export_by_name_module_and_fingerprint(tmp_path: Path, open_store: OpenStore) -> None:
    """Selectors choose in the index; a store with an object that fails verification
    refuses to export it (naming the entry) and writes no file."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"))
    store = open_store(env)
    other = Fingerprint.from_dict({**FP.to_dict(), "device_kind": "cpu-other"})
    for fp in (FP, other):
        store.put(
            Put(
                named_keys.key("foo", "1", fp.digest),
                _named(500),
                fp,
                named_keys.module_name("foo", "1"),
                1.0,
            )
        )
    store.put(Put("d" * 64, os.urandom(500), FP, "jit_train_step", 1.0))

    def keys(*selector: str) -> list[str]:
        path = tmp_path / "sel.tzst"
        report = _json(artstore("export", str(path), "--force", "--json", *selector, env=env))
        return sorted(report["keys"])

    assert keys("--name", "fo*") == sorted(
        named_keys.key("foo", "1", f.digest) for f in (FP, other)
    )
    assert keys("--module", "jit_train*") == ["d" * 64]
    assert keys("--name", "foo", "--fingerprint", other.digest[:10]) == [
        named_keys.key("foo", "1", other.digest)
    ]
    _refused(artstore("export", str(tmp_path / "none.tzst"), "--name", "zzz", env=env),
             "no entry")  # fmt: skip

    entry = store.parts.index.lookup("d" * 64)
    assert entry is not None
    path = Path(env["ARTSTORE_URL"])
    (obj,) = [p for p in path.rglob(entry.digest) if p.is_file()]
    data = bytearray(obj.read_bytes())
    data[-1] ^= 1
    obj.chmod(0o600)
    obj.write_bytes(bytes(data))
    _refused(artstore("export", str(tmp_path / "bad.tzst"), "--all", env=env), "dddddddddddd")
    assert not (tmp_path / "bad.tzst").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


# -- bad input ---------------------------------------------------------------------------
def test_bad_input_ends_in_one_line(source: dict[str, Any], tmp_path: Path) -> None:
    env = _target(tmp_path)
    _refused(artstore("import", str(tmp_path / "nope.tzst"), env=env), "no bundle")
    junk = tmp_path / "junk.tzst"
    junk.write_bytes(os.urandom(4096))
    _refused(artstore("import", str(junk), env=env), "not a readable artifactstore bundle")
    text = tmp_path / "text.tzst"
    text.write_bytes(zstandard.ZstdCompressor().compress(b"hello, not a tar"))
    _refused(artstore("import", str(text), env=env), "bundle")
    _refused(artstore("export", str(tmp_path / "x.tzst"), env=source["env"]), "--all")
    _refused(artstore("export", str(tmp_path / "x.tzst"), "--all", "--name", "a",
                      env=source["env"]), "--all")  # fmt: skip
    reader = dict(env, ARTSTORE_READ_ONLY="1", ARTSTORE_URL=source["env"]["ARTSTORE_URL"])
    _refused(artstore("import", str(source["bundle"]), env=reader), "read-only")
