"""Issue 38 item 3: hostile bundles through `import_bundle`, the path `artstore import` runs.

A genuine bundle of two signed entries is built by hand (zstd over a PAX tar, as the
exporter writes), then altered: member names replaced or added (`../x`, NUL bytes,
unicode, long names), members duplicated, dropped or swapped, the manifest replaced by
hostile JSON, its records adversarially altered. Properties: a refusal is one
BundleError (nothing else escapes), and whatever the store holds afterwards loads only
the payload stored for its key, verified against the store's trusted key.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard
from conftest import TEAM_KEY, TEAM_PUB, clean_env
from hypothesis import example, given, reject
from hypothesis import strategies as st

from artifactstore import config
from artifactstore.bundles.importer import import_bundle
from artifactstore.formats.bundle import BundleError, Record
from artifactstore.store import Store
from security import hostile
from security.hostile import FP, PAYLOADS

ENCODED = {key: hostile.signed(key, payload) for key, payload in PAYLOADS.items()}
Members = list[tuple[str, bytes]]


def _record(key: str) -> dict[str, object]:
    enc = ENCODED[key]
    return Record(
        key=key,
        namespace="default",
        module_name="jit_f",
        fingerprint=FP.to_dict(),
        fingerprint_digest=FP.digest,
        digest=enc.digest,
        size=len(enc.data),
        raw_size=enc.raw_size,
        compile_secs=1.5,
        callbacks=0,
        producer_host="h",
        signer=enc.signer,
        signature=enc.signature,
    ).to_json()


RECORDS = [_record(key) for key in PAYLOADS]
MANIFEST = {
    "format": "artifactstore-bundle",
    "version": 1,
    "created": "2026-01-01",
    "artifactstore": "0.4",
    "namespace": "default",
    "entries": RECORDS,
}
GENUINE: Members = [(f"objects/{e.digest}", e.data) for e in ENCODED.values()] + [
    ("manifest.json", hostile.dump(MANIFEST))
]


def _bundle(members: Members) -> bytes:
    raw = io.BytesIO()
    try:
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    except (ValueError, UnicodeError):  # a name tar cannot hold: no bundle has it
        reject()
    return zstandard.ZstdCompressor().compress(raw.getvalue())


@st.composite
def members(draw: st.DrawFn) -> Members:
    """The genuine members, altered the ways a hostile bundle's maker would."""
    out = list(GENUINE)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(
                ["rename", "add", "drop", "dup", "swap", "manifest", "record", "truncate"]
            )
        )
        at = draw(st.integers(0, len(out) - 1)) if out else 0
        if how == "rename" and out:
            out[at] = (draw(hostile.names()), out[at][1])
        elif how == "add":
            out.insert(at, (draw(hostile.names()), draw(st.binary(max_size=64))))
        elif how == "drop" and out:
            out.pop(at)
        elif how == "dup" and out:
            out.append(out[at])
        elif how == "swap" and len(out) > 1:
            out[0], out[1] = (out[0][0], out[1][1]), (out[1][0], out[0][1])
        elif how == "manifest":
            out = [m for m in out if m[0] != "manifest.json"]
            out.append(("manifest.json", draw(hostile.records(MANIFEST, max_bytes=65536))))
        elif how == "record":
            entries = [draw(hostile.altered(RECORDS[0], RECORDS[1:])), RECORDS[1]]
            out = [m for m in out if m[0] != "manifest.json"]
            out.append(("manifest.json", hostile.dump(dict(MANIFEST, entries=entries))))
        elif how == "truncate" and out:
            name, data = out[at]
            out[at] = (name, data[: draw(st.integers(0, max(0, len(data) - 1)))])
    return out


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Path]]:
    root = tmp_path_factory.mktemp("import")
    env = clean_env(
        ARTSTORE_URL=str(root / "store"),
        ARTSTORE_SIGNING_KEY=str(TEAM_KEY),
        ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB),
    )
    store = Store.open(config.resolve({}, environ=env))
    yield store, root
    store.close()


@pytest.mark.hostile_record("bundle member", "bundle manifest")
@given(members())
@example([*GENUINE[:2], ("manifest.json", hostile.DEEP)])
@example([("../x", b"x"), *GENUINE])
@example([*GENUINE, ("objects/" + "0" * 64, b"")])
@example([(GENUINE[0][0], GENUINE[1][1]), (GENUINE[1][0], GENUINE[0][1]), GENUINE[2]])
def test_a_hostile_bundle_is_refused_whole_or_imports_only_genuine_entries(
    target: tuple[Store, Path], altered: Members
) -> None:
    store, root = target
    path = root / "bundle.tzst"
    path.write_bytes(_bundle(altered))
    try:
        report = import_bundle(store, path)
    except BundleError as exc:
        assert "\n" not in str(exc)  # one line
    else:
        assert report.imported + report.skipped == report.entries
    for entry in store.parts.index.iter_entries():
        hit = store.get(entry.key, FP.digest, callbacks=0)
        assert hit is not None and hit.payload == PAYLOADS.get(entry.key), entry.key


def test_the_genuine_bundle_imports(tmp_path: Path) -> None:
    """The property above is not vacuous: the unaltered bundle imports both entries."""
    env = clean_env(ARTSTORE_URL=str(tmp_path / "store"), ARTSTORE_TRUSTED_KEYS=str(TEAM_PUB))
    store = Store.open(config.resolve({}, environ=env))
    try:
        path = tmp_path / "genuine.tzst"
        path.write_bytes(_bundle(GENUINE))
        assert import_bundle(store, path).imported == 2
        for key, payload in PAYLOADS.items():
            hit = store.get(key, FP.digest, callbacks=0)
            assert hit is not None and hit.payload == payload
        assert json.loads(GENUINE[-1][1])["entries"][0]["key"] in PAYLOADS
    finally:
        store.close()
