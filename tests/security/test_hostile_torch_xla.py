"""Issue 40: hostile torch-xla files, through the decoder and through the fill that places them.

torch-xla loads whatever file of a graph's name it finds in its cache directory, so the
name and bytes of every stored torch-xla file are untrusted input (docs/security.md):
a writer who may sign entries, or anyone who may write an unsigned store, chooses them.
Each example stores hostile payloads as entries of a fingerprint of its own (signed by the
team tests' key, which the reader trusts: the objects pass every check but the frame's),
then fills a fresh cache directory from the store, as the adapter does before torch-xla's
first compile. Properties: no exception; exactly the well-formed files of their own key
are placed, under their own names, with their own bytes; nothing else is written, inside
the directory or beside it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TEAM_KEY, TEAM_PUB, clean_env
from hypothesis import example, given
from hypothesis import strategies as st

from artifactstore import config
from artifactstore.config.host import compute
from artifactstore.errors import CorruptObject
from artifactstore.formats import torchxla
from artifactstore.formats.put import Put
from artifactstore.runtime.session import Session
from artifactstore.store import Store
from artifactstore.torch_xla.cachedir import CacheDir
from artifactstore.torch_xla.fill import fill
from security import hostile

TRUST = {"ARTSTORE_SIGNING_KEY": str(TEAM_KEY), "ARTSTORE_TRUSTED_KEYS": str(TEAM_PUB)}
FP = compute(
    platform_name=torchxla.PLATFORM,
    platform_version="CPU; pjrt builtin; xla test",
    device_kind="cpu",
    device_count=1,
    jax_version="2.9.0",
    jaxlib_version="2.9.0",
)
NAMES = st.from_regex(r"[1-9][0-9]{0,38}", fullmatch=True)


def _hostile_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


# What a stored payload may be, for the file name its key was made for (`name`).
PAYLOADS = st.one_of(
    st.binary(max_size=64).map(lambda data: lambda name: torchxla.frame(name, data)),  # fine
    st.tuples(hostile.names(), st.binary(max_size=16)).map(
        lambda t: lambda name: torchxla.MAGIC + _hostile_name(t[0]) + b"\n" + t[1]
    ),
    NAMES.map(lambda other: lambda name: torchxla.frame(other, b"another graph's")),
    st.binary(max_size=128).map(lambda data: lambda name: data),
    st.sampled_from(
        [
            torchxla.MAGIC,
            torchxla.MAGIC + b"1" * 50 + b"\n",
            torchxla.MAGIC + b"../1\n",
            torchxla.MAGIC + b"1/2\n",
            torchxla.MAGIC + b"12",
            torchxla.MAGIC[:-1] + b"12\nx",
            hostile.DEEP[:256],
        ]
    ).map(lambda data: lambda name: data),
)


def _well_formed(stored: bytes, name: str) -> bytes | None:
    """The file bytes `stored` frames for `name`, decided without the decoder under test."""
    if not stored.startswith(torchxla.MAGIC):
        return None
    head, sep, data = stored[len(torchxla.MAGIC) :].partition(b"\n")
    return data if sep and head == name.encode() else None


class Reader:
    """A local store signed by the team tests' key, and a reader's session trusting it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        env = clean_env(ARTSTORE_URL=str(root / "store"), **TRUST)
        self.writer = Store.open(config.resolve({}, environ=env))
        self.settings = config.resolve({"local_tier": str(root / "tier")}, environ=env)
        self.session = Session(self.settings)
        self.platforms = itertools.count(2)

    def close(self) -> None:
        self.session.close()
        self.writer.close()


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    found = Reader(tmp_path_factory.mktemp("torch-xla"))
    yield found
    found.close()


@pytest.mark.hostile_record("torch-xla file")
def test_only_well_formed_files_of_their_own_key_are_placed(reader: Reader) -> None:
    @given(st.lists(st.tuples(NAMES, PAYLOADS), min_size=1, max_size=4, unique_by=lambda t: t[0]))
    @example([("7", lambda name: torchxla.frame("8", b"x"))])  # another graph's file
    @example([("7", lambda name: torchxla.MAGIC + b"../../7\n" + b"x")])
    def run(drawn: list[tuple[str, object]]) -> None:
        # A platform of its own per example: its keys are all the fill lists.
        fingerprint = dataclasses.replace(FP, device_count=next(reader.platforms))
        expected: dict[str, bytes] = {}
        for name, make in drawn:
            stored = make(name)  # type: ignore[operator]
            key = torchxla.entry_key(fingerprint.digest, name)
            reader.writer.put(Put(key, stored, fingerprint, torchxla.module_name(name), 1.0))
            data = _well_formed(stored, name)
            if data is not None:
                expected[name] = data
        directory = CacheDir.make(reader.settings, fingerprint.digest)
        parent = directory.path.parent
        counts, placed = fill(reader.session, fingerprint.digest, directory)
        assert set(placed) == set(expected)
        assert sorted(os.listdir(directory.path)) == sorted(placed)  # no temporary file left
        for name in placed:
            assert (directory.path / name).read_bytes() == expected[name]
        assert os.listdir(parent) == [directory.path.name]  # nothing beside it
        assert counts["refused"] == len(drawn) - len(expected)
        directory.remove()

    run()


@pytest.mark.hostile_record("torch-xla file")
@given(
    st.one_of(
        st.binary(max_size=256),
        st.binary(max_size=64).map(lambda b: torchxla.MAGIC + b),
        hostile.names().map(lambda n: torchxla.MAGIC + _hostile_name(n) + b"\nbody"),
        NAMES.map(lambda n: torchxla.frame(n, b"body")),
    ),
    NAMES,
)
@example(torchxla.frame("12", b"body"), "12")
@example(torchxla.MAGIC + b"12\x00\nbody", "12")
def test_unframe_refuses_or_names_the_key_it_was_stored_for(stored: bytes, name: str) -> None:
    key = torchxla.entry_key(FP.digest, name)
    try:
        found, data = torchxla.unframe(stored, key=key, fingerprint=FP.digest)
    except CorruptObject:
        assert _well_formed(stored, name) is None
        return
    assert found == name and found.isdigit() and "/" not in found
    assert data == _well_formed(stored, name)
