"""Issue 47: native modules as store entries, without IREE or JAX (these run everywhere).

A module built for CPU features this host lacks is never asked for, so never served;
gc and quotas evict native entries by LRU with the others; `ls` shows them by platform;
`export --name` carries them and `import` verifies them (a malformed module, even one a
trusted key signed, is refused whole); `artstore native pull` fills a tier with what a
reader here asks for, so `native get` runs without the object store or the index; what
cannot go native is refused by name.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import zstandard
from conftest import TEAM_PUB, TEAM_SIGNING, OpenStore, artstore, clean_env
from test_bundles import _json, _ok, _refused

from artifactstore import config
from artifactstore.config.host import compute, cpu_arch, host_cpu_features
from artifactstore.errors import ConfigError
from artifactstore.formats import codec
from artifactstore.formats import native as native_format
from artifactstore.formats.fingerprint import _ARM_FEATURES, _X86_FEATURES
from artifactstore.formats.manifest import Manifest
from artifactstore.formats.put import Put
from artifactstore.named import container, keys
from artifactstore.named.signature import Leaf, Signature
from artifactstore.native import fetch
from artifactstore.native.convention import Convention, encode
from artifactstore.native.errors import NativeBuildError, NativeNotFound
from artifactstore.native.lower import refuse_unsupported
from artifactstore.native.target import Cpu, candidates, parse_cpu
from artifactstore.runtime.session import Session
from artifactstore.store import Store
from artifactstore.store.tiers import open_tier

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COMPILER = "3.13.0"
STABLEHLO = "cd" * 32
SIGNATURE = Signature("*", (Leaf((4,), "float32"),))
XLA_FP = compute(platform_name="cpu", platform_version="v", device_kind="cpu-test",
                 device_count=1, jax_version="1", jaxlib_version="1")  # fmt: skip


def _convention(wanted: fetch.Wanted, cpu: Cpu, stablehlo: str = STABLEHLO) -> Convention:
    return Convention(wanted.name, wanted.version, Signature({"tuple": ["*"]}, SIGNATURE.leaves),
                      SIGNATURE, stablehlo, wanted.target, cpu.kind, cpu.arch, cpu.features,
                      wanted.compiler)  # fmt: skip


def _put(
    store: object, wanted: fetch.Wanted, cpu: Cpu, body: bytes, stablehlo: str = STABLEHLO
) -> str:
    key, _ = wanted.key(stablehlo, cpu)
    put = Put(key, encode(_convention(wanted, cpu, stablehlo), body), cpu.fingerprint(
              wanted.target, wanted.compiler), keys.module_name(wanted.name, wanted.version),
              1.0)  # fmt: skip
    assert store.put(put)  # type: ignore[attr-defined]
    return key


def _module_body(name: str, version: str, cpu: str) -> bytes:
    return f"the module of {name}@{version} for {cpu}".encode()


def _named(
    store: Store, name: str, version: str, cpus: tuple[str, ...] = ("generic",)
) -> dict[str, str]:
    """NAME@VERSION as `artstore native build` leaves it, without JAX or IREE: the portable
    form (a stand-in body: a module is keyed by its digest) and a module per CPU spec.
    Returns key by what: `portable`, and each spec."""
    header = container.Header("portable", name, version, Signature({"tuple": ["*"]},
                              SIGNATURE.leaves), SIGNATURE, "0", (0,), "cpu")  # fmt: skip
    body = f"the jax.export serialization of {name}@{version}".encode()
    out = {"portable": keys.portable_key(name, version)}
    put = Put(out["portable"], container.encode(header, body), keys.PORTABLE,
              keys.module_name(name, version), 1.0)  # fmt: skip
    assert store.put(put)
    wanted = fetch.Wanted(name, version, "llvm-cpu", COMPILER)
    stablehlo = hashlib.sha256(body).hexdigest()
    for spec in cpus:
        out[spec] = _put(
            store, wanted, parse_cpu(spec), _module_body(name, version, spec), stablehlo
        )
    return out


def _lacking() -> str:
    """A code-generation feature this host's CPU does not have."""
    known = _ARM_FEATURES if cpu_arch() in ("aarch64", "arm64") else _X86_FEATURES
    return sorted(known - set(host_cpu_features()))[0]


def test_a_module_for_features_this_host_lacks_is_never_served(
    store_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(store_env)
    wanted = fetch.Wanted("mlp", "1", "llvm-cpu", "3.13.0")
    lacking = _lacking()
    foreign = Cpu("features", cpu_arch(), (lacking,))
    _put(store, wanted, foreign, b"needs " + lacking.encode())
    _put(store, wanted, parse_cpu("generic"), b"baseline")
    assert foreign.missing_here() == [lacking]
    asked = candidates(None)
    assert [c.kind for c in asked] == ["host", "generic"]  # this host's exact CPU, then generic
    assert candidates(f"+{lacking}") == []  # named: not asked for at all
    session = Session(config.resolve({}, environ=store_env))
    try:
        served = [fetch.module(session, wanted, STABLEHLO, cpu) for cpu in asked]
        assert served[0] is None and served[1] is not None
        assert served[1][1] == b"baseline"
    finally:
        session.close()
    other_arch = Cpu("generic", "riscv64", ())
    assert other_arch.missing_here() == ["architecture riscv64"]


def test_gc_and_quotas_evict_native_entries_by_lru_with_the_others(
    store_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(store_env)
    modules = [fetch.Wanted("mlp", str(v), "llvm-cpu", COMPILER) for v in range(3)]
    keys_ = [_put(store, w, parse_cpu("generic"), os.urandom(3000)) for w in modules]
    jit = "e" * 64  # an executable of JAX's, stored with them
    assert store.put(Put(jit, os.urandom(3000), XLA_FP, "jit_step", 1.0))
    keys_.append(jit)
    # Least recently used first: mlp@1, jit_step, mlp@0, mlp@2.
    for minutes, key in zip((5, 0, 10, 2), keys_, strict=True):
        store.parts.index.record_access({key: (0, T0 + timedelta(minutes=minutes))})
    sizes = {k: store.parts.index.lookup(k).size for k in keys_}  # type: ignore[union-attr]
    limit = sum(sizes.values()) - 1
    proc = artstore("gc", "--json", "--max-size", str(limit), "--grace", "0", env=store_env)
    assert proc.returncode == 0, proc.stderr
    removed = {r["key"] for r in json.loads(proc.stdout)["removed"] if r["kind"] == "entry"}
    assert removed == {keys_[1]}
    listing = json.loads(artstore("ls", "--named", "--json", env=store_env).stdout)
    assert sorted(row["version"] for row in listing) == ["0", "2"]
    assert {row["platform"] for row in listing} == {"iree-llvm-cpu"}

    # A namespace quota counts native entries' bytes and evicts in the same LRU order.
    quota = sizes[keys_[2]]
    _ok(artstore("quota", "set", "default", str(quota), env=store_env))
    held = sum(sizes[k] for k in (keys_[0], keys_[2], jit))
    assert _json(artstore("quota", "ls", "--json", env=store_env)) == [
        {"namespace": "default", "max_bytes": quota, "bytes": held}
    ]
    out = _json(artstore("gc", "--json", "--grace", "0", env=store_env))
    assert {r["key"] for r in out["removed"] if r["kind"] == "entry"} == {jit, keys_[0]}
    assert out["summary"]["limit_bytes"] == quota
    assert [e.key for e in store.parts.index.iter_entries()] == [keys_[2]]


def test_ls_shows_native_entries_by_platform(
    store_env: dict[str, str], open_store: OpenStore
) -> None:
    store = open_store(store_env)
    mlp = _named(store, "mlp", "1")
    assert store.put(Put("e" * 64, os.urandom(500), XLA_FP, "jit_step", 1.0))
    rows = {r["key"]: r for r in _json(artstore("ls", "--json", env=store_env))}
    native = rows[mlp["generic"]]
    assert (native["module_name"], native["platform"], native["device_kind"]) == (
        "named:mlp@1", "iree-llvm-cpu", "generic")  # fmt: skip
    only = _json(artstore("ls", "--platform", "iree-llvm-cpu", "--json", env=store_env))
    assert [r["key"] for r in only] == [mlp["generic"]]
    named = _json(artstore("ls", "--named", "--json", env=store_env))
    assert sorted((r["name"], r["version"], r["platform"], r["device_kind"]) for r in named) == [
        ("mlp", "1", "iree-llvm-cpu", "generic"), ("mlp", "1", "portable", None)]  # fmt: skip
    table = _ok(artstore("ls", "--named", env=store_env)).stdout
    assert "iree-llvm-cpu/generic" in table and "jit_step" not in table


# -- bundles: export --name carries a name's modules, import verifies them ------------
Members = list[tuple[tarfile.TarInfo, bytes]]


def _members(bundle: Path) -> Members:
    with bundle.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as z:
        with tarfile.open(fileobj=z, mode="r|") as tar:
            out = []
            for m in tar:
                f = tar.extractfile(m)
                out.append((m, f.read() if f is not None else b""))
    return out


def _write(members: Members, target: Path) -> Path:
    with target.open("wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as z:
        with tarfile.open(fileobj=z, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for info, data in members:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return target


def _replaced(bundle: Path, key: str, obj: bytes, manifest: Manifest, target: Path) -> Path:
    """`bundle` with entry `key`'s object replaced by `obj` and its record rewritten to
    match it (digest, sizes, signature): consistent, as a forger would make it."""
    signature = codec.read_signature(obj)
    out: Members = []
    for info, data in _members(bundle):
        if info.name == "manifest.json":
            body = json.loads(data)
            (record,) = [r for r in body["entries"] if r["key"] == key]
            old = record["digest"]
            record.update(digest=manifest.digest, size=len(obj), raw_size=manifest.raw_size,
                          signer=signature and signature.signer,
                          signature=signature and signature.b64)  # fmt: skip
            data = json.dumps(body).encode()
        out.append((info, data))
    out = [(info, data) for info, data in out if info.name != f"objects/{old}"]
    new = tarfile.TarInfo(f"objects/{manifest.digest}")
    return _write([(new, obj), *out], target)


def test_export_by_name_carries_native_modules_and_import_verifies_them(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """`export --name mlp` holds mlp's portable form and native module (not another
    name's); a store trusting the signer imports them and serves the module as
    `native get` reads it. A flipped byte in the module's object, or a module re-framed
    as no native module (digest, record and signature all consistent, by a trusted
    key), is refused whole: nothing reaches the target."""
    source = clean_env(ARTSTORE_URL=str(tmp_path / "source"), **TEAM_SIGNING)
    store = open_store(source)
    mlp = _named(store, "mlp", "1")
    _named(store, "other", "1")
    bundle = tmp_path / "mlp.tzst"
    report = _json(artstore("export", str(bundle), "--name", "mlp", "--json", env=source))
    assert sorted(report["keys"]) == sorted(mlp.values())

    trusting = {"ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB)}
    target = clean_env(ARTSTORE_URL=str(tmp_path / "target"), **trusting)
    imported = _json(artstore("import", str(bundle), "--json", env=target))
    assert (imported["imported"], imported["skipped"]) == (2, 0)
    named = _json(artstore("ls", "--named", "--json", env=target))
    assert sorted((r["name"], r["platform"], r["signer"]) for r in named) == [
        ("mlp", "iree-llvm-cpu", "team-tests"), ("mlp", "portable", "team-tests")]  # fmt: skip
    session = Session(config.resolve({}, environ=target))
    try:
        wanted = fetch.Wanted("mlp", "1", "llvm-cpu", COMPILER)
        convention, module, cpu = fetch.find(session, wanted, [parse_cpu("generic")])
        with pytest.raises(NativeNotFound, match="no native module of mlp@1"):
            fetch.find(session, wanted, [Cpu("features", cpu_arch(), (_lacking(),))])
        counted = session.counters.snapshot()
        assert (counted["native_loads"], counted["native_not_found"]) == (1, 1)
    finally:
        session.close()
    assert module == _module_body("mlp", "1", "generic") and cpu.kind == "generic"
    assert (convention.name, convention.version, convention.cpu) == ("mlp", "1", "generic")

    # A flipped byte in the native module's object.
    digest = json.loads(store.parts.blobs.get_manifest(mlp["generic"]) or b"")["d"]
    flipped = []
    for info, data in _members(bundle):
        if info.name == f"objects/{digest}":
            data = data[:-1] + bytes([data[-1] ^ 1])
        flipped.append((info, data))
    fresh = clean_env(ARTSTORE_URL=str(tmp_path / "fresh"), **trusting)
    _refused(artstore("import", str(_write(flipped, tmp_path / "flipped.tzst")), env=fresh),
             f"objects/{digest[:12]}", "damaged or altered")  # fmt: skip

    # The same key holding no native module, signed by the trusted key: refused for its frame.
    forger = open_store(clean_env(ARTSTORE_URL=str(tmp_path / "forger"), **TEAM_SIGNING))
    bad = native_format.frame({"name": "mlp", "version": "1"}, b"not a module")
    put = Put(mlp["generic"], bad, parse_cpu("generic").fingerprint("llvm-cpu", COMPILER),
              keys.module_name("mlp", "1"), 1.0)  # fmt: skip
    assert forger.put(put)
    raw = forger.parts.blobs.get_manifest(mlp["generic"])
    assert raw is not None
    manifest = Manifest.decode(raw, mlp["generic"])
    obj = forger.parts.blobs.get(manifest.digest)
    assert obj is not None and codec.read_signature(obj) is not None
    forged = _replaced(bundle, mlp["generic"], obj, manifest, tmp_path / "forged.tzst")
    _refused(artstore("import", str(forged), env=fresh), mlp["generic"][:12],
             "malformed native module header")  # fmt: skip
    empty = open_store(fresh)
    assert empty.parts.index.stats().entries == 0
    assert list(empty.parts.blobs.iter_manifest_keys()) == []


# -- pull: a name's modules into this host's tier ----------------------------------------
NO_INDEX = "postgresql+psycopg://postgres@127.0.0.1:1/artstore"  # no server: never opened


def test_native_pull_fills_the_tier_so_get_needs_no_store(
    team_env: dict[str, str], open_store: OpenStore, tmp_path: Path
) -> None:
    """`artstore native pull mlp` fetches mlp's portable form and module for the CPUs this
    host asks for (not another name's, not a CPU it cannot run); `native get` then writes
    the module with the object store and the index unreachable. `artstore pull
    --fingerprint` of the module's fingerprint alone leaves the portable form behind."""
    writer = open_store(team_env, local_tier="off")
    mlp = _named(writer, "mlp", "1")
    other = _named(writer, "other", "1")
    foreign = Cpu("features", cpu_arch(), (_lacking(),))
    _put(writer, fetch.Wanted("mlp", "1", "llvm-cpu", COMPILER), foreign, b"foreign")
    reader = dict(team_env, ARTSTORE_INDEX=NO_INDEX, ARTSTORE_READ_ONLY="1",
                  ARTSTORE_LOCAL_TIER=str(tmp_path / "tier"))  # fmt: skip
    offline = dict(reader, AWS_ENDPOINT_URL_S3="http://127.0.0.1:1", ARTSTORE_TIMEOUT="2")
    get = ("native", "get", "mlp@1", "--compiler", COMPILER, "-o", str(tmp_path / "out"))

    digest = _ok(artstore("native", "fingerprint", "--compiler", COMPILER, env=reader)).stdout
    plain = _json(artstore("pull", "--json", "--fingerprint", digest.strip(),
                           "--module", "named:mlp@*", env=reader))  # fmt: skip
    assert (plain["fetched"], plain["other_module"]) == (1, 1)  # other's module: not fetched
    lacking = artstore(*get, env=offline)  # (and a warning: the store is unreachable)
    assert lacking.returncode == 1 and "error: no portable form of mlp@1" in lacking.stderr

    pulled = _json(artstore("native", "pull", "mlp", "--compiler", COMPILER, "--json",
                            env=reader))  # fmt: skip
    assert [p["pulled"] for p in pulled] == ["portable form", "cpu host", "cpu generic"]
    assert [(p["fetched"], p["present"]) for p in pulled] == [(1, 0), (0, 0), (0, 1)]
    tier = open_tier(config.resolve(environ=reader))
    assert tier is not None
    assert all(tier.lookup(k) is not None for k in (mlp["portable"], mlp["generic"]))
    assert all(tier.lookup(k) is None for k in other.values())

    _ok(artstore(*get, env=offline))
    assert (tmp_path / "out" / "mlp.vmfb").read_bytes() == _module_body("mlp", "1", "generic")
    calling = json.loads((tmp_path / "out" / "mlp.json").read_text())
    assert calling["cpu"] == "generic" and calling["name"] == "mlp"

    again = _ok(artstore("native", "pull", "mlp@1", "--compiler", COMPILER, env=reader)).stdout
    assert again.count("\n") == 3 and "fetched 0 entries" in again
    _refused(artstore("native", "pull", "nothing", "--compiler", COMPILER, env=reader),
             "no native module of nothing")  # fmt: skip


def _header(dtype: str) -> container.Header:
    leaves = (Leaf((2,), dtype),)
    return container.Header("portable", "f", "1", Signature({"tuple": ["*"]}, leaves),
                            Signature("*", leaves), "0", (0,), "cpu")  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "text", "said"),
    [
        ("float64", "", "input 0 is float64[2]"),
        (
            "float32",
            "stablehlo.custom_call @lapack_sgetrf_ffi(%0)",
            "custom call 'lapack_sgetrf_ffi'",
        ),
        (
            "float32",
            '{call_target_name = "xla_ffi_python_cpu_callback"}',
            "xla_ffi_python_cpu_callback",
        ),
        ("float32", "%0 = stablehlo.convert %a : (tensor<2xf32>) -> tensor<2xf64>", "float64"),
    ],
)
def test_what_cannot_go_native_is_refused_by_name(dtype: str, text: str, said: str) -> None:
    with pytest.raises(NativeBuildError, match="cannot go native") as raised:
        refuse_unsupported(text, _header(dtype))
    assert said in str(raised.value)


def test_cpu_specs() -> None:
    assert parse_cpu("generic").compiler_flags() == ["--iree-llvmcpu-target-cpu=generic"]
    assert parse_cpu("host").features == host_cpu_features()
    if cpu_arch() == "x86_64":
        cpu = parse_cpu("+avx2,+fma,sse4.1,+sse3")
        assert cpu.features == ("avx2", "fma", "pni", "sse4_1")  # the fingerprint's spelling
        assert (
            cpu.compiler_flags()[1] == "--iree-llvmcpu-target-cpu-features=+avx2,+fma,+sse3,+sse4.1"
        )
    with pytest.raises(ConfigError, match="unknown CPU feature 'warp-drive'"):
        parse_cpu("+warp-drive")
    fp = parse_cpu("generic").fingerprint("llvm-cpu", "3.13.0")
    assert fp.platform == "iree-llvm-cpu" and fp.platform_version == "iree 3.13.0"
    assert native_format.entry_key("a", "1", STABLEHLO, fp.digest) != native_format.entry_key(
        "a", "1", "ef" * 32, fp.digest
    )


def test_without_iree_one_line_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from artifactstore.native import iree

    monkeypatch.setitem(sys.modules, "iree.runtime", None)  # as where it is not installed
    with pytest.raises(iree.NativeUnavailable) as raised:
        iree.runtime()
    message = str(raised.value)
    assert "\n" not in message and "pip install 'artifactstore[native]'" in message
    monkeypatch.setattr(sys, "version_info", (3, 11, 9))
    with pytest.raises(iree.NativeUnavailable, match=r"no wheel for Python 3\.11"):
        iree.runtime()
