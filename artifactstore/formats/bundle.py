"""The bundle file: what `artstore export` writes and `artstore import` accepts.

A bundle is one zstd-compressed tar stream (so both ends stream it, never holding it
whole) of flat members only:

    objects/<sha256>   each entry's object exactly as the object store holds it (the
                       codec envelope: compressed, with its metadata and signature)
    manifest.json      last, written once every object in it was read and verified

The manifest (MANIFEST_FORMAT, version FORMAT_VERSION) is one JSON object:

    {"format": "artifactstore-bundle", "version": 1, "created": ISO time,
     "artifactstore": version of the writer, "namespace": the exporting namespace,
     "entries": [record, ...]}

and each record carries what the store's manifest and index row do (see `Record`).
Nothing here trusts a bundle: the importer checks every member name against
`object_member` / MANIFEST, every record with `parse_manifest`, and every object with
the store's own verification.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from artifactstore.errors import ArtstoreError
from artifactstore.formats.codec import Encoded, check_digest
from artifactstore.formats.fingerprint import Fingerprint
from artifactstore.formats.manifest import Manifest, check_key
from artifactstore.formats.put import Put
from artifactstore.formats.records import load_record

MANIFEST_FORMAT = "artifactstore-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OBJECTS = "objects/"
_OBJECT_MEMBER = re.compile(r"objects/([0-9a-f]{64})")
_MAX_SIZE = 2**63 - 1


class BundleError(ArtstoreError):
    """A bundle that cannot be written or is refused; the message is one line."""


def object_member(digest: str) -> str:
    return OBJECTS + check_digest(digest)


def member_digest(name: str) -> str | None:
    """The digest an object member is named by; None for any other name."""
    found = _OBJECT_MEMBER.fullmatch(name)
    return found.group(1) if found else None


@dataclass(frozen=True)
class Record:
    """One entry of a bundle: its manifest's fields, its fingerprint in full (so the
    target's index holds the platform facts), and who signed its object."""

    key: str
    namespace: str
    module_name: str
    fingerprint: dict[str, Any]  # Fingerprint.to_dict()
    fingerprint_digest: str
    digest: str  # the object's sha256, also its member name
    size: int  # the object's bytes
    raw_size: int  # the executable's bytes
    compile_secs: float
    callbacks: int | None
    producer_host: str
    signer: str | None
    signature: str | None

    def manifest(self) -> Manifest:
        """The record as the store's manifest, for `ReadPath.verify`."""
        return Manifest(
            key=self.key,
            digest=self.digest,
            fingerprint=self.fingerprint_digest,
            compile_secs=self.compile_secs,
            raw_size=self.raw_size,
            size=self.size,
            module_name=self.module_name,
            callbacks=self.callbacks,
            signer=self.signer,
        )

    def platform(self) -> Fingerprint:
        return Fingerprint.from_dict(self.fingerprint)

    def put(self, data: bytes) -> Put:
        """The put of this entry's object `data`, stored byte for byte as its writer
        encoded (and signed) it, for its writer's host."""
        encoded = Encoded(data, self.digest, self.raw_size, self.signer, self.signature)
        return Put(
            self.key,
            encoded,
            self.platform(),
            self.module_name,
            self.compile_secs,
            self.callbacks,
            self.producer_host,
        )

    @classmethod
    def parse(cls, raw: Any) -> Record:
        """A record as a bundle holds it; ValueError / KeyError / TypeError otherwise."""
        if not isinstance(raw, dict):
            raise TypeError("a record is not an object")
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
        fingerprint = raw["fingerprint"]
        if not isinstance(fingerprint, dict):
            raise TypeError("fingerprint is not an object")
        record = cls(
            key=check_key(_text(raw["key"], 128)),
            namespace=_text(raw["namespace"], 255),
            module_name=_text(raw["module_name"], 255),
            fingerprint=fingerprint,
            fingerprint_digest=check_digest(raw["fingerprint_digest"]),
            digest=check_digest(raw["digest"]),
            size=_size(raw["size"]),
            raw_size=_size(raw["raw_size"]),
            compile_secs=_seconds(raw["compile_secs"]),
            callbacks=None if raw["callbacks"] is None else _size(raw["callbacks"]),
            producer_host=_text(raw["producer_host"], 255),
            signer=None if raw["signer"] is None else _text(raw["signer"], 64),
            signature=None if raw["signature"] is None else _text(raw["signature"], 512),
        )
        if record.platform().digest != record.fingerprint_digest:
            raise ValueError("its fingerprint does not have its fingerprint digest")
        return record

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BundleManifest:
    created: str
    artifactstore: str
    namespace: str
    records: list[Record]

    def encode(self) -> bytes:
        body = {
            "format": MANIFEST_FORMAT,
            "version": FORMAT_VERSION,
            "created": self.created,
            "artifactstore": self.artifactstore,
            "namespace": self.namespace,
            "entries": [r.to_json() for r in self.records],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def parse_manifest(data: bytes) -> BundleManifest:
    """The bundle's manifest, every record checked; BundleError naming the first
    problem (the record's key prefix where it has one)."""
    try:  # nested at most a few levels, checked before parsing (no RecursionError)
        raw = load_record(data)
    except ValueError:
        raise BundleError(f"{MANIFEST} is not JSON, or nested too deep") from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise BundleError(f"{MANIFEST} is not an artifactstore bundle manifest")
    if raw.get("version") != FORMAT_VERSION:
        raise BundleError(
            f"{MANIFEST} has bundle format version {str(raw.get('version'))[:20]!r}; "
            f"this artifactstore reads version {FORMAT_VERSION}"
        )
    entries = raw.get("entries")
    if not isinstance(entries, list):
        raise BundleError(f"{MANIFEST} has no list of entries")
    records: list[Record] = []
    keys: set[str] = set()
    for i, item in enumerate(entries):
        where = f"entry {i}"
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            where += f" (key {item['key'][:12]})"
        try:
            record = Record.parse(item)
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleError(f"{MANIFEST}: {where} is malformed ({_why(exc)})") from None
        if record.key in keys:
            raise BundleError(f"{MANIFEST}: {where} is listed twice")
        keys.add(record.key)
        records.append(record)
    try:
        return BundleManifest(
            created=_text(raw.get("created"), 64),
            artifactstore=_text(raw.get("artifactstore"), 64),
            namespace=_text(raw.get("namespace"), 255),
            records=records,
        )
    except (ValueError, TypeError) as exc:
        raise BundleError(f"{MANIFEST} is malformed ({_why(exc)})") from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    return str(exc)[:200]


def _text(value: Any, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise TypeError("a text field is not text of the right length")
    return value


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_SIZE:
        raise ValueError("a size is not a size")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("compile_secs is not a number")
    secs = float(value)
    if not 0 <= secs < 1e9:  # also false for NaN
        raise ValueError("compile_secs out of range")
    return secs
