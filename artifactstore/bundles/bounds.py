"""How much `artstore import` unpacks: a bundle is untrusted input, so a small file
must not cost the importer more memory or temporary disk than a genuine bundle of
its size would (issue 29: a 65 KB bundle spooled 1.97 GiB; a 5.7 KB one took 1.7 GB
of memory).

Every bound is checked from a header before the bytes it announces are decompressed,
and enforced again on the bytes themselves, since headers lie:

- entries: members of the tar (objects, and the manifest) and records of the
  manifest, at most ARTSTORE_BUNDLE_MAX_ENTRIES;
- one member: at most ARTSTORE_MAX_OBJECT_SIZE, the bound every load of an object has;
- in all: at most ARTSTORE_BUNDLE_MAX_SIZE, by default RATIO times the bundle's own
  size plus SLACK: objects are compressed already, so a genuine bundle unpacks to
  about its size (one of many tiny entries to ~15x, its tar headers and manifest
  compressing well), where a decompression bomb unpacks to thousands of times it;
- the manifest (read whole, then parsed): a few KiB and JSON values per entry, so
  that parsing it costs a bounded multiple of the entry limit;
- tar headers: only plain files, and one extended (pax) header of at most a few KiB
  per member (the exporter writes none for its short names): no long-name, sparse
  or chained headers, which tarfile would read whole into memory;
- the zstd window, so that a frame cannot ask for a huge decompression buffer.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from typing import IO, Any

from artifactstore.config import Settings
from artifactstore.formats.bundle import MANIFEST, BundleError
from artifactstore.formats.sizes import format_limit, format_size, plural

RATIO = 64
SLACK = 16 * 1024 * 1024
MANIFEST_BYTES_PER_ENTRY = 4096  # a record is about 1 KiB (its fingerprint's CPU features)
MANIFEST_VALUES_PER_ENTRY = 160  # and about 90 JSON values; parsing costs <= ~60 B each
EXTENDED_HEADER_BYTES = 8192
MAX_WINDOW = 1 << 25  # 32 MiB; the exporter's level 3 uses 2 MiB at most
_PLAIN = (tarfile.REGTYPE, tarfile.AREGTYPE)

ENTRIES_HOW = "ARTSTORE_BUNDLE_MAX_ENTRIES or `artstore import --max-entries N` raise it"
SIZE_HOW = "ARTSTORE_BUNDLE_MAX_SIZE or `artstore import --max-size SIZE` raise it"
OBJECT_HOW = "ARTSTORE_MAX_OBJECT_SIZE raises it"


@dataclass(frozen=True)
class Limits:
    """The bounds of one import, from the store's settings and the command's options."""

    max_entries: int
    max_object_bytes: int
    max_bytes: int  # what the whole bundle may unpack to
    explicit_size: bool  # max_bytes was set, rather than derived from the file's size

    @classmethod
    def of(
        cls,
        settings: Settings,
        file_bytes: int,
        *,
        max_entries: int | None = None,
        max_bytes: int | None = None,
    ) -> Limits:
        entries = max_entries if max_entries is not None else settings.bundle_max_entries
        total = max_bytes if max_bytes is not None else settings.bundle_max_bytes
        return cls(
            max_entries=entries,
            max_object_bytes=settings.max_object_bytes,
            max_bytes=total if total is not None else RATIO * file_bytes + SLACK,
            explicit_size=total is not None,
        )

    @property
    def manifest_bytes(self) -> int:
        return 65536 + MANIFEST_BYTES_PER_ENTRY * self.max_entries

    @property
    def manifest_values(self) -> int:
        return 64 + MANIFEST_VALUES_PER_ENTRY * self.max_entries

    @property
    def _entries(self) -> str:
        return plural(self.max_entries, "entry", "entries")

    def too_many(self) -> BundleError:
        return BundleError(
            f"bundle refused: it has more than {self._entries}, the limit of "
            f"an import ({ENTRIES_HOW} if the bundle is genuine)"
        )

    def check_member(self, member: tarfile.TarInfo, index: int, unpacked: int) -> None:
        """Member number `index` (from 1), by its header, before its data is read;
        `unpacked`: what the bundle unpacked to so far."""
        shown = repr(member.name[:80])
        if index > self.max_entries + 1:  # the objects, and the manifest
            raise self.too_many()
        if member.name == MANIFEST:
            if member.size > self.manifest_bytes:
                raise BundleError(
                    f"bundle refused: its {MANIFEST} is {format_size(member.size)}, over "
                    f"{format_size(self.manifest_bytes)} for at most {self._entries} "
                    f"({ENTRIES_HOW} if the bundle is genuine)"
                )
        elif member.size > self.max_object_bytes:
            raise BundleError(
                f"bundle refused: member {shown} is {format_size(member.size)}, over the "
                f"object size limit {format_limit(self.max_object_bytes)} ({OBJECT_HOW})"
            )
        self.check_total(unpacked + member.size)

    def check_total(self, unpacked: int) -> None:
        if unpacked > self.max_bytes:
            bound = (format_limit if self.explicit_size else format_size)(self.max_bytes)
            if not self.explicit_size:
                bound += f" ({RATIO}x the bundle's size + {format_size(SLACK)})"
            raise BundleError(
                f"bundle refused: it unpacks to more than {bound}, the limit of an import "
                f"(a decompression bomb, or {SIZE_HOW} if the bundle is genuine)"
            )

    def check_manifest(self, data: bytes) -> None:
        """Before parsing: at most so many JSON values (each follows a `,` or a `:`, or
        opens a container; counting those inside strings only counts more)."""
        values = sum(data.count(c) for c in (b",", b":", b"{", b"["))
        if values > self.manifest_values:
            raise BundleError(
                f"bundle refused: its {MANIFEST} has more than {self.manifest_values} JSON "
                f"values, over {MANIFEST_VALUES_PER_ENTRY} an entry for at most "
                f"{self._entries} ({ENTRIES_HOW} if the bundle is genuine)"
            )


class Unpacked:
    """The decompressed stream, counted: past the bound (and the tar reader's
    read-ahead) it refuses, whatever the headers said."""

    def __init__(self, raw: IO[bytes], limits: Limits) -> None:
        self.raw = raw
        self.limits = limits
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            size = 1 << 20  # never all of it at once
        data = self.raw.read(size)
        self.count += len(data)
        if self.count > self.limits.max_bytes + (1 << 20):
            self.limits.check_total(self.count)
        return data


def header_class() -> type[tarfile.TarInfo]:
    """A new TarInfo class (its state is one import's) that refuses, from a member's
    512-byte header, what tarfile would otherwise read whole into memory (long names,
    sparse maps, chains of extended headers)."""

    class Header(tarfile.TarInfo):
        in_extended = False

        def _proc_member(self, tar: Any) -> Any:
            shown = repr(self.name[:80])
            if self.type in _PLAIN:
                return tarfile.TarInfo._proc_member(self, tar)  # type: ignore[attr-defined]
            if self.type != tarfile.XHDTYPE:
                raise BundleError(
                    f"bundle refused: member {shown} is not a plain file (tar type "
                    f"{self.type.decode(errors='replace')!r}); a bundle holds plain files only"
                )
            if Header.in_extended:
                raise BundleError("bundle refused: a member has two extended headers")
            if self.size > EXTENDED_HEADER_BYTES:
                raise BundleError(
                    f"bundle refused: an extended (pax) header of {format_size(self.size)}, "
                    f"over {format_size(EXTENDED_HEADER_BYTES)}; an artifactstore bundle's "
                    "member names are 72 characters"
                )
            Header.in_extended = True
            try:
                return tarfile.TarInfo._proc_member(self, tar)  # type: ignore[attr-defined]
            finally:
                Header.in_extended = False

    return Header
