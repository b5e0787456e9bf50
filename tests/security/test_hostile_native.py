"""Issue 47: hostile native modules, through the verifier and the reader that serves them.

A native module's payload (frame, calling convention, module bytes) is untrusted input
like any record (docs/security.md): a writer who may sign entries, or anyone who may
write an unsigned store, chooses it. Each example stores hostile payloads as native
entries of a compiler version of its own (signed by the team tests' key, which the
reader trusts: the objects pass every check but their own payload's), then asks for
them as `artifactstore.native.load` does (`native.fetch.module`, through the session's
lookup chain). Properties: nothing but CorruptObject escapes; only a well-formed payload
of the very module asked for (name, version, StableHLO, target, CPU) is served, byte for
byte; everything else is a miss (refused by the verifier: its frame) or refused by the
reader (a legible frame that is another module's, or a calling convention that does not
parse). No IREE is needed: nothing here reaches it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TEAM_KEY, TEAM_PUB, clean_env
from hypothesis import example, given
from hypothesis import strategies as st

from artifactstore import config
from artifactstore.errors import CorruptObject
from artifactstore.formats import native as native_format
from artifactstore.formats.put import Put
from artifactstore.named import keys
from artifactstore.native import fetch
from artifactstore.native.convention import Convention, decode
from artifactstore.native.target import Cpu
from artifactstore.runtime.session import Session
from artifactstore.store import Store
from security import hostile

TRUST = {"ARTSTORE_SIGNING_KEY": str(TEAM_KEY), "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB)}
CPU = Cpu("generic", "x86_64", ())
STABLEHLO = "ab" * 32
LEAVES = [{"shape": [2], "dtype": "float32"}, {"shape": [], "dtype": "int32"}]
INPUTS = {"tree": {"tuple": [{"dict": [["b", "*"]]}, "*"]}, "leaves": LEAVES}
OUTPUTS = {"tree": "*", "leaves": [{"shape": [2], "dtype": "float32"}]}


def _good(wanted: fetch.Wanted) -> dict[str, Any]:
    return {
        "name": wanted.name, "version": wanted.version, "function": "main",
        "inputs": INPUTS, "outputs": OUTPUTS, "stablehlo": STABLEHLO, "target": wanted.target,
        "cpu": CPU.kind, "cpu_arch": CPU.arch, "cpu_features": [], "compiler": wanted.compiler,
        "check": [],
    }  # fmt: skip


# What a stored payload may be, given the module it is stored as (`good`: its header).
Make = Any
PAYLOADS: st.SearchStrategy[Make] = st.one_of(
    st.binary(min_size=1, max_size=64).map(
        lambda body: lambda good: native_format.frame(good, body)
    ),
    hostile.json_values().map(lambda h: lambda good: native_format.frame(h, b"module")),
    st.sampled_from(["name", "version", "stablehlo", "cpu", "target"]).map(
        lambda field: lambda good: native_format.frame({**good, field: "another"}, b"module")
    ),
    st.sampled_from(["inputs", "outputs"]).map(
        lambda field: (
            lambda good: native_format.frame(
                {**good, field: {"tree": "*", "leaves": []}}, b"module"
            )
        )
    ),
    st.binary(max_size=128).map(lambda data: lambda good: native_format.MAGIC + data),
    st.binary(max_size=128).map(lambda data: lambda good: data),
    hostile.nested(prefix=native_format.MAGIC + b"\x01\x00\x01\x00\x00").map(
        lambda data: lambda good: data
    ),
    st.integers(0, 40).map(lambda n: lambda good: native_format.frame(good, b"module")[:n]),
    st.just(lambda good: native_format.frame(good, b"")),
    st.just(lambda good: native_format.MAGIC + b"\x02" + native_format.frame(good, b"m")[17:]),
)


def _served(stored: bytes, good: dict[str, Any]) -> bytes | None:
    """The module bytes a reader may be served from `stored`, decided without the reader:
    exactly the frame of `good`'s header (an identical convention) and a body."""
    try:
        header, body = native_format.unframe(stored)
        convention, _ = decode(stored)
    except CorruptObject:
        return None
    if convention.to_json() != Convention.from_json(good).to_json() or header != good:
        return None
    return body


class Reader:
    """A local store signed by the team tests' key, and a reader's session trusting it."""

    def __init__(self, root: Path) -> None:
        env = clean_env(ARTSTORE_URL=str(root / "store"), **TRUST)
        self.writer = Store.open(config.resolve({}, environ=env))
        self.session = Session(config.resolve({"local_tier": str(root / "tier")}, environ=env))
        self.compilers = itertools.count()

    def close(self) -> None:
        self.session.close()
        self.writer.close()


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    found = Reader(tmp_path_factory.mktemp("native"))
    yield found
    found.close()


@pytest.mark.hostile_record("native module")
def test_only_the_module_asked_for_is_served(reader: Reader) -> None:
    @given(PAYLOADS)
    @example(lambda good: native_format.frame(good, b"the module"))  # well-formed: served
    @example(lambda good: native_format.frame({**good, "stablehlo": "cd" * 32}, b"m"))
    def run(make: Make) -> None:
        # A compiler version of its own per example: a key nobody stored before.
        wanted = fetch.Wanted("mlp", "1", "llvm-cpu", f"hostile-{next(reader.compilers)}")
        good = _good(wanted)
        stored = make(good)
        key, _digest = wanted.key(STABLEHLO, CPU)
        fingerprint = CPU.fingerprint(wanted.target, wanted.compiler)
        reader.writer.put(Put(key, stored, fingerprint, keys.module_name("mlp", "1"), 1.0))
        expected = _served(stored, good)
        try:
            found = fetch.module(reader.session, wanted, STABLEHLO, CPU)
        except CorruptObject:
            assert expected is None
            return
        if expected is None:
            assert found is None
            return
        assert found is not None
        convention, body = found
        assert body == expected and convention.name == "mlp" and convention.cpu == "generic"

    run()


@pytest.mark.hostile_record("native module")
@given(st.binary(max_size=256), hostile.json_values())
@example(native_format.MAGIC + b"\x01\xff\xff\xff\xff", None)
def test_unframe_refuses_or_returns_a_header_and_a_body(data: bytes, header: Any) -> None:
    for payload in (data, native_format.frame(header, data)):
        try:
            parsed, body = native_format.unframe(payload)
        except CorruptObject:
            continue
        assert isinstance(parsed, dict) and body
        for field, kind in native_format.REQUIRED.items():
            assert isinstance(parsed[field], kind)
