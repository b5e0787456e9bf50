"""Where a store lives: the object store URL and the index URL, checked without
opening either (and without importing SQLAlchemy or boto3)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from artifactstore.errors import ConfigError

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class BlobLocation:
    """Where objects live: a local directory or an S3 bucket and prefix."""

    scheme: str  # "file" or "s3"
    path: str  # directory for file; key prefix for s3 (no leading/trailing "/")
    bucket: str = ""

    def describe(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.path}".rstrip("/")
        return self.path


def parse_blob_url(url: str) -> BlobLocation:
    """`file:///abs/dir`, a plain path, or `s3://bucket/prefix`."""
    text = url.strip()
    if not text:
        raise ConfigError("empty store URL: use a directory, file:///path or s3://bucket/prefix")
    if not text.isprintable():  # urlsplit would silently drop tabs and newlines
        raise ConfigError(
            "store URL contains control characters: use a directory, file:///path or "
            "s3://bucket/prefix"
        )
    if "://" not in text:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and not re.match(r"^[A-Za-z]:[\\/]", text):
            raise ConfigError(
                f"malformed store URL {text!r}: use a directory, file:///path or s3://bucket/prefix"
            )
        return BlobLocation("file", str(Path(text).expanduser().resolve()))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(
                f"file URL {text!r} names host {parts.netloc!r}: use file:///absolute/path"
            )
        if not parts.path:
            raise ConfigError(f"file URL {text!r} has no path: use file:///absolute/path")
        return BlobLocation("file", str(Path(unquote(parts.path)).resolve()))
    if scheme == "s3":
        bucket = parts.netloc
        if "@" in bucket:
            raise ConfigError(
                "S3 URLs must not carry credentials: use s3://bucket/prefix and "
                "boto3's standard credential chain (AWS_PROFILE, AWS_ACCESS_KEY_ID, ...)"
            )
        if not _BUCKET_RE.fullmatch(bucket):
            raise ConfigError(
                f"invalid S3 bucket name {bucket!r} in store URL: use s3://bucket/prefix "
                "with a 3-63 character lowercase bucket name"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"S3 URL {text!r} has a query or fragment: use s3://bucket/prefix")
        return BlobLocation("s3", parts.path.strip("/"), bucket=bucket)
    raise ConfigError(
        f"unsupported store URL scheme {scheme!r}: use a directory, file:///path or "
        "s3://bucket/prefix"
    )


def parse_index_url(url: str) -> str:
    """Accept SQLAlchemy URLs for SQLite and PostgreSQL, or a plain SQLite path.

    Checked with the standard library's URL parser rather than SQLAlchemy's so
    that configuring a process does not import SQLAlchemy: a process whose
    compiles all hit the local tier never needs it. `index.engine.open_engine`
    parses the URL fully when the index is opened.
    """
    text = url.strip()
    if "://" not in text:
        if not text:
            raise ConfigError("empty index URL: use sqlite:///path or postgresql+psycopg://...")
        return "sqlite:///" + str(Path(text).expanduser().resolve())
    malformed = ConfigError(
        "malformed index URL: use sqlite:///path/index.db or "
        "postgresql+psycopg://user@host:5432/dbname"
    )
    match = re.match(r"^([A-Za-z][A-Za-z0-9_]*)(?:\+([A-Za-z0-9_]+))?://", text)
    if match is None:
        raise malformed
    backend, driver = match.group(1).lower(), match.group(2)
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"unsupported index database {backend!r}: use sqlite:///path or "
            "postgresql+psycopg://user@host/db"
        )
    try:
        parts = urlsplit(text)
        _ = parts.port  # a non-numeric or out-of-range port
    except ValueError:
        raise malformed from None
    if parts.netloc.count("@") > 1 or (backend == "postgresql" and "@" in parts.path):
        # A password with a raw @ (or /) would be split into user, host and path, and the
        # parts after it would reach error messages: never echo such a URL.
        raise ConfigError(
            "the index URL's user or password contains a reserved character (@ / : #): "
            "percent-encode it (@ is %40) or leave the password out of the URL and use "
            "~/.pgpass or PGPASSWORD"
        )
    if backend == "postgresql" and driver is None:
        text = "postgresql+psycopg" + text[len(match.group(1)) :]
    return text
