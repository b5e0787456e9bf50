"""Issue 47: native modules as store entries, without IREE or JAX (these run everywhere).

A module built for CPU features this host lacks is never asked for, so never served;
gc evicts native entries by LRU like any; what cannot go native is refused by name.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from conftest import OpenStore, artstore

from artifactstore import config
from artifactstore.config.host import cpu_arch, host_cpu_features
from artifactstore.errors import ConfigError
from artifactstore.formats import native as native_format
from artifactstore.formats.fingerprint import _ARM_FEATURES, _X86_FEATURES
from artifactstore.formats.put import Put
from artifactstore.named import container, keys
from artifactstore.named.signature import Leaf, Signature
from artifactstore.native import fetch
from artifactstore.native.convention import Convention, encode
from artifactstore.native.errors import NativeBuildError
from artifactstore.native.lower import refuse_unsupported
from artifactstore.native.target import Cpu, candidates, parse_cpu
from artifactstore.runtime.session import Session

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STABLEHLO = "cd" * 32
SIGNATURE = Signature("*", (Leaf((4,), "float32"),))


def _convention(wanted: fetch.Wanted, cpu: Cpu) -> Convention:
    return Convention(wanted.name, wanted.version, Signature({"tuple": ["*"]}, SIGNATURE.leaves),
                      SIGNATURE, STABLEHLO, wanted.target, cpu.kind, cpu.arch, cpu.features,
                      wanted.compiler)  # fmt: skip


def _put(store: object, wanted: fetch.Wanted, cpu: Cpu, body: bytes) -> str:
    key, _ = wanted.key(STABLEHLO, cpu)
    put = Put(key, encode(_convention(wanted, cpu), body), cpu.fingerprint(wanted.target,
              wanted.compiler), keys.module_name(wanted.name, wanted.version), 1.0)  # fmt: skip
    assert store.put(put)  # type: ignore[attr-defined]
    return key


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


def test_gc_evicts_native_entries_by_lru(store_env: dict[str, str], open_store: OpenStore) -> None:
    store = open_store(store_env)
    modules = [fetch.Wanted("mlp", str(v), "llvm-cpu", "3.13.0") for v in range(3)]
    keys_ = [_put(store, w, parse_cpu("generic"), os.urandom(3000)) for w in modules]
    for minutes, key in zip((5, 0, 10), keys_, strict=True):  # the second: least recently used
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
